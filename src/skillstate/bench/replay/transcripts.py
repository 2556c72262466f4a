"""OpenAI-format transcripts: ``{"id", "tools", "messages"}`` (chat-completions messages),
one per JSON file or a JSON list of them (the shared SWE-bench traces' format; ``model``
and ``source`` are read when present). Every assistant message is one model call whose
request is the messages before it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any

import orjson

from .jsonstream import LogError, iter_json_array
from .session import Call, Reply, Session

__all__ = ["is_transcript", "iter_transcript_list", "read_transcript", "session_of"]


def is_transcript(obj: Any) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("messages"), list)


def _reply(message: dict[str, Any]) -> Reply:
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    logged = message.get("tool_calls")
    calls = (
        tuple(_call(c) for c in logged if isinstance(c, dict)) if isinstance(logged, list) else ()
    )
    return Reply(content if isinstance(content, str) else "", calls)


def _call(logged: dict[str, Any]) -> dict[str, Any]:
    """A logged tool call in the shape the simulated upstream answers with (Reply's): a
    ``function`` with JSON text ``arguments``, whatever the log held there."""
    fn = logged.get("function")
    fn = fn if isinstance(fn, dict) else {}
    args = fn.get("arguments")
    if not isinstance(args, str):
        args = orjson.dumps(args if args is not None else {}).decode()
    return {**logged, "type": "function", "function": {**fn, "arguments": args}}


def session_of(obj: Any, name: str) -> Session:
    """One transcript as a session (LogError when it is not one, or has no model call)."""
    if not is_transcript(obj):
        raise LogError(f"{name}: not a transcript ({{id, tools, messages}})")
    messages = [m for m in obj["messages"] if isinstance(m, dict)]
    if len(messages) != len(obj["messages"]):
        raise LogError(f"{name}: a message is not an object")
    model = obj.get("model")
    tools = obj.get("tools")
    session = Session(
        id=str(obj.get("id") or name),
        source="transcript",
        dialect="openai",
        provider="openai",
        model=model if isinstance(model, str) else None,
        tools=tools if isinstance(tools, list) and tools else None,
    )
    for i, message in enumerate(messages):
        session.add(message)
        if message.get("role") == "assistant" and i > 0:
            session.calls.append(Call(list(range(i)), _reply(message), at=float(i)))
    if not session.calls:
        raise LogError(f"{name}: no assistant message (no model call to replay)")
    return session


def read_transcript(f: IO[bytes], name: str) -> Session:
    try:
        obj = orjson.loads(f.read())
    except orjson.JSONDecodeError as e:
        raise LogError(f"not JSON ({str(e).split(':', 1)[0]})") from None
    return session_of(obj, name)


def iter_transcript_list(f: IO[bytes], name: str) -> Iterator[Session | LogError]:
    """The sessions of a JSON list, one at a time; an element that is not a transcript is a
    LogError yielded in its place (the others still replay)."""
    for k, obj in enumerate(iter_json_array(f), 1):
        label = str(obj.get("id")) if isinstance(obj, dict) and obj.get("id") else f"#{k}"
        try:
            yield session_of(obj, f"element {k} ({label})")
        except LogError as e:
            yield e
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            # As sources.iter_sessions says of a whole file: an element of another shape
            # than the reader expects is its own problem line; the elements after it replay.
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}" if str(e) else ""
            yield LogError(f"element {k} ({label}): a transcript this replay cannot read ({why})")
