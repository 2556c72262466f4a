"""Codex CLI rollouts (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``).

One ``{"timestamp", "type", "payload"}`` a line (codex-rs ``RolloutLine``):

* ``session_meta``: the session's ``id``, ``model_provider`` and ``base_instructions``
  (``{"text"}``: Codex sends them as the first developer message of every request);
* ``response_item``: a Responses API item as sent or received: ``message`` (roles
  developer, user, assistant), ``reasoning``, ``function_call`` / ``function_call_output``
  (joined by ``call_id``), ``custom_tool_call`` / ``custom_tool_call_output``,
  ``local_shell_call``, ``web_search_call``;
* ``event_msg`` with ``payload.type == "token_count"``: after each model call,
  ``info.last_token_usage`` = that call's ``input_tokens`` (cached included),
  ``cached_input_tokens``, ``output_tokens`` (``info`` may be null);
* ``turn_context``: per turn, the ``model``;
* ``compacted``: the history is replaced (``replacement_history``, or the summary
  ``message`` as one user message).

A model call is a run of output items (assistant message, reasoning, tool calls); its
request is every item before it. The tool definitions are not logged, so they are not
replayed (the truth check shows the tokens they cost). Keys Codex keeps for itself
(``internal_chat_message_metadata_passthrough``) are dropped, and so are the items it keeps
in the rollout but does not send (``ghost_snapshot``, system messages: see ``SENT_ITEMS``).

A fork (``session_meta.forked_from_id``) copies its parent's ``session_meta``, items and
``token_count`` events after its own ``session_meta``: the session keeps the id of its first
``session_meta``, and a call another file already had (the same output items and usage) is
counted there only. A session with no model call is an ``EmptyLog``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import datetime
from typing import IO, Any

import orjson

from skillstate.cost.usage import Usage, optional_token_count

from .jsonstream import EmptyLog, LogError, iter_json_lines
from .session import Call, Reply, Session

__all__ = ["LINE_TYPES", "is_codex_line", "is_legacy_meta", "read_codex"]

LINE_TYPES = frozenset(
    {
        "session_meta",
        "response_item",
        "event_msg",
        "turn_context",
        "compacted",
        "world_state",
        "token_usage_record",
    }
)
OUTPUT_ITEMS = frozenset(
    {
        "reasoning",
        "function_call",
        "custom_tool_call",
        "local_shell_call",
        "web_search_call",
        "image_generation_call",
        "tool_search_call",
    }
)
# The item types Codex sends back to the model (codex-rs ``is_api_message``: every
# ``ResponseItem`` but a system message, ``ghost_snapshot`` (its undo checkpoints),
# ``compaction_trigger`` and the types it does not know); a rollout keeps the others too.
SENT_ITEMS = frozenset(
    {
        "message",
        "agent_message",
        "reasoning",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "tool_search_call",
        "tool_search_output",
        "local_shell_call",
        "web_search_call",
        "image_generation_call",
        "compaction",
        "compaction_summary",  # compaction's older name
        "context_compaction",
    }
)
_PRIVATE_KEYS = ("internal_chat_message_metadata_passthrough",)


def is_codex_line(obj: Any) -> bool:
    return (
        isinstance(obj, dict) and obj.get("type") in LINE_TYPES and "payload" in obj
    ) or is_legacy_meta(obj)


def is_legacy_meta(obj: Any) -> bool:
    """The first line of a rollout written before Codex wrapped its lines (openai/codex
    #3380, September 2025): the bare session meta, ``{id, timestamp, instructions, git}``;
    the lines after it are bare ``ResponseItem``s and ``{"record_type": "state"}``."""
    return (
        isinstance(obj, dict)
        and "type" not in obj
        and isinstance(obj.get("id"), str)
        and isinstance(obj.get("timestamp"), str)
        and ("instructions" in obj or "git" in obj)
    )


def _wrapped(line: dict[str, Any]) -> dict[str, Any] | None:
    """A rollout line in the wrapped shape (``{timestamp, type, payload}``): a legacy
    rollout's bare lines as the wrapped ones they became; None for a line that says
    nothing about the calls (a legacy ``record_type`` line, or no object payload)."""
    if isinstance(line.get("payload"), dict):
        return line
    if is_legacy_meta(line):
        return {"type": "session_meta", "payload": line, "timestamp": line.get("timestamp")}
    if "record_type" not in line and "payload" not in line and isinstance(line.get("type"), str):
        return {"type": "response_item", "payload": line}
    return None


def is_sent(item: Any) -> bool:
    """Whether Codex sends this rollout item to the model."""
    return (
        isinstance(item, dict)
        and item.get("type") in SENT_ITEMS
        and not (item.get("type") == "message" and item.get("role") == "system")
    )


def _is_output(item: dict[str, Any]) -> bool:
    kind = item.get("type")
    return kind in OUTPUT_ITEMS or (kind == "message" and item.get("role") == "assistant")


def _time(stamp: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _usage(info: Any) -> Usage | None:
    last = info.get("last_token_usage") if isinstance(info, dict) else None
    if not isinstance(last, dict):
        return None
    counts = [
        optional_token_count(last, k)
        for k in (
            "input_tokens",
            "output_tokens",
            "cached_input_tokens",
            "cache_write_input_tokens",
        )
    ]
    if any(c is None for c in counts):
        return None
    prompt, out, read, write = (int(c or 0) for c in counts)
    return Usage(prompt, out, min(read, prompt), min(write, prompt - min(read, prompt)))


def reply_of(items: list[dict[str, Any]], usage: Usage | None) -> Reply:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type")
        if kind == "message":
            texts.extend(
                str(c.get("text", ""))
                for c in item.get("content") or []
                if isinstance(c, dict) and c.get("type") == "output_text"
            )
        elif kind in ("function_call", "custom_tool_call"):
            args = item.get("arguments")
            if not isinstance(args, str):
                args = orjson.dumps({"input": item.get("input")}).decode()
            fn = {"name": item.get("name"), "arguments": args}
            calls.append({"id": item.get("call_id"), "type": "function", "function": fn})
    return Reply("".join(texts), tuple(calls), usage.output_tokens if usage else None)


class _Rollout:
    """The state of one pass over a rollout."""

    def __init__(self, session: Session) -> None:
        self.s = session
        self.history: list[int] = []
        self.out_start: int | None = None  # where the current call's output items begin
        self.out_at: float | None = None
        self.pending_usage: Call | None = None  # the last call still without its usage
        self.outputs: list[list[int]] = []  # per call: its output items (pool indices)

    def item(self, item: dict[str, Any], at: float | None) -> None:
        if not is_sent(item):
            return
        item = {k: v for k, v in item.items() if k not in _PRIVATE_KEYS}
        if _is_output(item):
            if self.out_start is None:
                self.out_start, self.out_at = len(self.history), at
        else:
            self.close()
        self.history.append(self.s.add(item))

    def close(self) -> None:
        """End the call whose output items are the tail of the history."""
        if self.out_start is None:
            return
        request, out = self.history[: self.out_start], self.history[self.out_start :]
        self.out_start = None
        if not request:
            return
        call = Call(request, reply_of([self.s.pool[i] for i in out], None), None, self.out_at)
        self.s.calls.append(call)
        self.outputs.append(out)
        self.pending_usage = call

    def usage(self, info: Any) -> None:
        usage = _usage(info)
        if usage is None:
            return
        self.close()
        call = self.pending_usage
        if call is not None:
            call.usage = usage
            call.reply = Reply(call.reply.text, call.reply.tool_calls, usage.output_tokens)
            self.pending_usage = None

    def compacted(self, payload: dict[str, Any]) -> None:
        self.close()
        history = payload.get("replacement_history")
        if isinstance(history, list):
            self.history = [self.s.add(i) for i in history if is_sent(i)]
        else:
            text = str(payload.get("message") or "")
            summary = {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": text}],
            }
            self.history = [*self.history[:1], self.s.add(summary)]


def read_codex(f: IO[bytes], name: str, seen_calls: set[Any] | None = None) -> Session:
    """The session in one rollout (EmptyLog when it holds no model call, LogError when none
    could be read). ``seen_calls``: the calls read from other files, by fingerprint; a call
    among them (a fork's copy of its parent's) is left out here."""
    session = Session(id=name, source="codex", dialect="responses", provider="openai", model=None)
    run = _Rollout(session)
    named = forked_from = None
    for _, raw in iter_json_lines(f, session.skipped):
        line = _wrapped(raw) if isinstance(raw, dict) else None
        if line is None:
            continue
        kind, payload, at = line.get("type"), line["payload"], _time(line.get("timestamp"))
        if kind == "session_meta":
            # The first names the session; a fork's copy of its parent's does not rename it.
            if named is None:
                named, forked_from = _text(payload.get("id")) or name, payload.get("forked_from_id")
                session.id = named
            _take_instructions(run, payload)
        elif kind == "turn_context" and _text(payload.get("model")):
            session.model = session.model or payload["model"]
        elif kind == "response_item":
            run.item(payload, at)
        elif kind == "event_msg" and payload.get("type") == "token_count":
            run.usage(payload.get("info"))
        elif kind == "compacted":
            run.compacted(payload)
    run.close()
    copies = _drop_calls_seen(run, seen_calls)
    _notes(session, copies, _text(forked_from))
    if not session.calls:
        if session.skipped:
            raise LogError(
                "; ".join([*session.skipped[:1], "no model calls in this Codex rollout"])
            )
        if copies:
            raise EmptyLog(f"all {copies} call(s) also in another file; counted once there")
        raise EmptyLog("an empty session (no model calls in this Codex rollout); skipped")
    return session


def _text(value: Any) -> str | None:
    """An id or a name from the log: a string, or None (a value of another type is not one)."""
    return value if isinstance(value, str) and value else None


def _take_instructions(run: _Rollout, payload: dict[str, Any]) -> None:
    """``base_instructions``: Codex sends them as the first developer message."""
    instructions = payload.get("base_instructions")
    text = instructions.get("text") if isinstance(instructions, dict) else None
    if isinstance(text, str) and text and not run.history:
        first = {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": text}],
        }
        run.history.append(run.s.add(first))


def _fingerprint(run: _Rollout, call: Call, out: list[int]) -> str:
    """A call by what it was sent last, answered (its output items: encrypted reasoning, ids)
    and billed: the same in a fork's copy as in its parent."""
    pool = run.s.pool
    usage = call.usage
    data = orjson.dumps(
        [
            len(call.messages),
            pool[call.messages[-1]] if call.messages else None,
            [pool[i] for i in out],
            [usage.input_tokens, usage.output_tokens] if usage else None,
        ],
        option=orjson.OPT_SORT_KEYS,
        default=str,
    )
    return hashlib.sha256(data).hexdigest()


def _drop_calls_seen(run: _Rollout, seen_calls: set[Any] | None) -> int:
    """Leave out the calls another file already had; how many."""
    kept, keys, copies = [], [], 0
    for call, out in zip(run.s.calls, run.outputs, strict=True):
        key = ("codex", _fingerprint(run, call, out))
        if seen_calls is not None and key in seen_calls:
            copies += 1
            continue
        kept.append(call)
        keys.append(key)
    run.s.calls, run.s.call_keys = kept, keys
    return copies


def _notes(session: Session, copies: int, forked_from: str | None) -> None:
    if copies and session.calls:
        session.notes.append(f"{copies} call(s) also in another file; counted once")
    elif forked_from and not copies:
        session.notes.append(
            f"a fork of session {forked_from}: the calls copied from it are counted here too "
            "(replay its rollout with this one to count them once)"
        )
    unreadable = sum(1 for c in session.calls if c.usage is None)
    if unreadable:
        session.notes.append(f"usage unreadable on {unreadable} call(s): not checked")


def iter_sessions(f: IO[bytes], name: str) -> Iterator[Session]:
    yield read_codex(f, name)
