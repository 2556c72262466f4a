"""Claude Code session logs (``~/.claude/projects/<project>/<session>.jsonl``).

One JSON object a line. The lines the replay reads:

* ``user`` / ``assistant``: ``message`` is the API message. An assistant message is
  written one content block a line, every line with the same ``message.id`` and ``usage``
  (``input_tokens`` excludes ``cache_read_input_tokens`` and
  ``cache_creation_input_tokens``); its blocks, in order, are the message the client sends
  back. ``isSidechain`` marks a sub-agent's lines, ``isCompactSummary`` the summary a
  compaction starts the next context with.
* ``system`` with ``subtype: compact_boundary``: the context restarts after it.
* Claude Code 2.1.3xx also logs each request exactly (as observed with 2.1.332 against a
  recording server; a mid-conversation ``system`` message goes on the wire a little
  differently from its blob, see :func:`_wire_system_message`): ``api-request-shape`` (the system
  blocks and tool definitions, by ``shapeHash``), ``api-request-blob`` (a message not
  logged elsewhere, e.g. the system reminders, by ``hash``: the SHA-256 of its JSON with
  sorted keys), and ``api-request`` (``params``, ``base`` = the previous request's id,
  ``keep`` = how many of its messages come first, ``tail`` = the hashes of the messages
  after them, ``cacheControl`` = the breakpoints' paths). An assistant line's
  ``requestRef`` names the request it answers.

With ``api-request`` lines every call is rebuilt exactly as sent (a tail hash that no
line holds drops that call, with a note). Without them (older versions) a call sends the
main chain's messages before its reply since the last compaction: consecutive user lines
merged into one message (as the client does), the system prompt and tools unknown (not
logged), breakpoints where the client puts them (end of system, end of the last message).
``summary``, ``attachment``, ``file-history-snapshot`` and the other bookkeeping lines are
not messages.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any

import orjson

from skillstate.cost.usage import Usage, optional_token_count

from .jsonstream import LogError, iter_json_lines
from .session import Call, Reply, Session

__all__ = ["LINE_TYPES", "is_claude_code_line", "read_claude_code"]

# Line types Claude Code writes (a first line of one of these, with a sessionId, is ours).
LINE_TYPES = frozenset(
    {
        "user",
        "assistant",
        "system",
        "summary",
        "attachment",
        "file-history-snapshot",
        "queue-operation",
        "api-request",
        "api-request-shape",
        "api-request-blob",
        "last-prompt",
        "atis-latch",
        "tools-used",
        "cost-state",
        "progress",
    }
)


def is_claude_code_line(obj: Any) -> bool:
    return (
        isinstance(obj, dict)
        and obj.get("type") in LINE_TYPES
        and ("sessionId" in obj or "leafUuid" in obj or "parentUuid" in obj)
    )


def message_hash(message: Any) -> str:
    """The hash Claude Code names a message by in ``api-request`` tails."""
    return hashlib.sha256(orjson.dumps(message, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _time(stamp: Any) -> float | None:
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _usage(u: Any) -> Usage | None:
    if not isinstance(u, dict):
        return None
    counts = [
        optional_token_count(u, k)
        for k in (
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
        )
    ]
    if any(c is None for c in counts) or "input_tokens" not in u:
        return None
    plain, out, read, write = (int(c or 0) for c in counts)
    return Usage(plain + read + write, out, read, write)


def reply_of(blocks: list[Any], usage: Usage | None) -> Reply:
    """An assistant message's blocks as the simulated upstream returns them."""
    texts = [b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
    calls = tuple(
        {
            "id": b.get("id"),
            "type": "function",
            "function": {"name": b.get("name"), "arguments": orjson.dumps(b.get("input")).decode()},
        }
        for b in blocks
        if isinstance(b, dict) and b.get("type") == "tool_use"
    )
    return Reply("".join(texts), calls, usage.output_tokens if usage else None)


@dataclass
class _Assistant:
    """One assistant message, gathered from its lines."""

    blocks: list[Any] = field(default_factory=list)
    usage: Usage | None = None
    request: str | None = None
    at: float | None = None
    model: str | None = None

    def message(self) -> dict[str, Any]:
        return {"role": "assistant", "content": self.blocks}


@dataclass
class _Log:
    """What one pass over the file collects."""

    session_id: str | None = None
    sidechain: bool | None = None
    shapes: dict[str, Any] = field(default_factory=dict)
    blobs: dict[str, Any] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    assistants: dict[str, _Assistant] = field(default_factory=dict)  # by message id
    # the main chain in file order: ("user", message) | ("assistant", id) | ("boundary", None)
    chain: list[tuple[str, Any]] = field(default_factory=list)
    user_at: dict[int, float | None] = field(default_factory=dict)

    def take(self, obj: dict[str, Any]) -> None:
        kind = obj.get("type")
        if kind == "api-request-shape" and isinstance(obj.get("shape"), dict):
            self.shapes[str(obj.get("shapeHash"))] = obj["shape"]
        elif kind == "api-request-blob" and isinstance(obj.get("message"), dict):
            self.blobs[str(obj.get("hash"))] = obj["message"]
        elif kind == "api-request":
            self.requests.append(obj)
        elif kind in ("user", "assistant") and isinstance(obj.get("message"), dict):
            self._message(kind, obj)
        elif kind == "system" and obj.get("subtype") == "compact_boundary":
            self.chain.append(("boundary", None))

    def _message(self, kind: str, obj: dict[str, Any]) -> None:
        side = bool(obj.get("isSidechain"))
        if self.sidechain is None:
            self.sidechain, self.session_id = side, obj.get("sessionId")
        if side != self.sidechain:
            return  # a sub-agent's lines in its parent's file (older versions)
        message = obj["message"]
        if kind == "user":
            self.chain.append(("user", message))
            self.user_at[len(self.chain) - 1] = _time(obj.get("timestamp"))
            return
        mid = str(message.get("id") or obj.get("uuid"))
        entry = self.assistants.get(mid)
        if entry is None:
            entry = self.assistants[mid] = _Assistant(at=_time(obj.get("timestamp")))
            self.chain.append(("assistant", mid))
        content = message.get("content")
        entry.blocks.extend(content if isinstance(content, list) else [])
        entry.usage = _usage(message.get("usage")) or entry.usage
        entry.request = obj.get("requestRef") or entry.request
        entry.model = message.get("model") or entry.model


def read_claude_code(f: IO[bytes], name: str) -> Session:
    """The session in one Claude Code log (LogError when it holds no model call)."""
    log = _Log()
    skipped: list[str] = []
    for _, obj in iter_json_lines(f, skipped):
        if isinstance(obj, dict):
            log.take(obj)
    session = Session(
        id=str(log.session_id or name),
        source="claude-code",
        dialect="anthropic",
        provider="anthropic",
        model=None,
        skipped=skipped,
    )
    if log.requests:
        _exact_calls(log, session)
    else:
        _chain_calls(log, session)
    if not session.calls:
        raise LogError("; ".join([*skipped[:1], "no model calls in this Claude Code log"]))
    return session


def _exact_calls(log: _Log, session: Session) -> None:
    """Calls rebuilt from the ``api-request`` lines."""
    by_hash: dict[str, int] = {}

    def index(h: str, message: Any, params: dict[str, Any]) -> int:
        if h not in by_hash:
            if message.get("role") == "system":
                message = _wire_system_message(message, params)
            by_hash[h] = session.add(message)
        return by_hash[h]

    known: dict[str, Any] = dict(log.blobs)
    for kind, item in log.chain:
        if kind == "user":
            known.setdefault(message_hash(item), item)
    for gathered in log.assistants.values():
        known.setdefault(message_hash(gathered.message()), gathered.message())
    replies = {e.request: e for e in log.assistants.values() if e.request}
    sent: dict[str, list[int] | None] = {}
    for req in log.requests:
        rid = str(req.get("id"))
        base = sent.get(str(req.get("base"))) if req.get("base") else []
        tail = [h for h in req.get("tail") or [] if isinstance(h, str)]
        missing = [h for h in tail if h not in known]
        if base is None or missing:
            sent[rid] = None
            session.notes.append(f"request {rid}: a message it sent is not in the log")
            continue
        keep = req["keep"] if isinstance(req.get("keep"), int) else 0
        params: dict[str, Any] = req["params"] if isinstance(req.get("params"), dict) else {}
        sent[rid] = messages = base[:keep] + [index(h, known[h], params) for h in tail]
        entry = replies.get(rid)
        if entry is None:
            continue  # no answer logged (an error or an abort): not a billed call
        shape: dict[str, Any] = log.shapes.get(str(req.get("shapeHash"))) or {}
        if session.model is None:
            session.model = params.get("model") or entry.model
            session.system = shape.get("system")
            session.tools = shape.get("tools")
            betas = params.get("betas")
            if isinstance(betas, list) and betas:
                session.headers["anthropic-beta"] = ",".join(str(b) for b in betas)
            session.params = {k: v for k, v in params.items() if k not in ("model", "betas")}
        marks = _cache_marks(req.get("cacheControl"))
        session.calls.append(
            Call(messages, reply_of(entry.blocks, entry.usage), entry.usage, entry.at, marks)
        )


def _cache_marks(logged: Any) -> list[tuple[Any, ...]]:
    """The breakpoints' paths an ``api-request`` line logs (a list of ``{"path": [...]}``);
    anything else in their place is no breakpoint."""
    if not isinstance(logged, list):
        return []
    return [
        tuple(m["path"])
        for m in logged
        if isinstance(m, dict) and isinstance(m.get("path"), list) and m["path"]
    ]


def _wire_system_message(message: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """A mid-conversation system message as Claude Code sends it (not as its blob has it):
    one text block goes as a string (the breakpoint the request puts on it makes it a block
    again, see forms.RequestBuilder), and the request's ``output_config`` rides along (the
    per-turn-control beta)."""
    content = message.get("content")
    if (
        isinstance(content, list)
        and len(content) == 1
        and isinstance(content[0], dict)
        and set(content[0]) == {"type", "text"}
        and content[0]["type"] == "text"
    ):
        message = {**message, "content": content[0]["text"]}
    if "output_config" in params:
        message = {**message, "output_config": params["output_config"]}
    return message


def _chain_calls(log: _Log, session: Session) -> None:
    """Calls rebuilt from the message chain (logs without ``api-request`` lines)."""
    context: list[int] = []
    last_user: int | None = None  # pool index of a user message still open to merging
    for kind, item in log.chain:
        if kind == "boundary":
            context, last_user = [], None
        elif kind == "user":
            if last_user is not None:
                merged = session.pool[last_user]
                session.pool[last_user] = {
                    "role": "user",
                    "content": _blocks(merged) + _blocks(item),
                }
            else:
                last_user = session.add({"role": "user", "content": item.get("content")})
                context.append(last_user)
        else:
            entry = log.assistants[item]
            if entry.usage is None and not entry.blocks:
                continue
            if session.model is None:
                session.model = entry.model
            if context:
                session.calls.append(
                    Call(list(context), reply_of(entry.blocks, entry.usage), entry.usage, entry.at)
                )
            context.append(session.add(entry.message()))
            last_user = None
    if session.calls:
        session.notes.append("no api-request lines: system prompt and tools not logged")


def _blocks(message: dict[str, Any]) -> list[Any]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def iter_sessions(f: IO[bytes], name: str) -> Iterator[Session]:
    yield read_claude_code(f, name)
