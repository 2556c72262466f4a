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

With ``api-request`` lines every call is rebuilt exactly as sent. A call whose request cannot
be (its line is missing or corrupt, or a tail hash no line holds, or one of those is its
base) and every call of an older log without them is rebuilt from the message chain: the
messages above its reply, following ``parentUuid`` (an abandoned branch after a rewind is
not in it) back to the root or the last compaction, consecutive user lines merged into one
message (as the client does), the system prompt and tools from its ``api-request`` line or
unknown, breakpoints where the client puts them (end of system, end of the last message).
An assistant message with the model ``<synthetic>`` is an error Claude Code wrote itself: no
call, and not sent back. ``summary``, ``attachment``, ``file-history-snapshot`` and the
other bookkeeping lines are not messages.

What real logs hold besides: a line written twice (same ``uuid``; the second is dropped) or a
block repeated under one ``message.id`` (kept once); a sub-agent's lines in its parent's file
(``isSidechain``, older versions: not replayed, a note says how many calls); a sub-agent's
own file (``subagents/agent-<id>.jsonl``, whose ``sessionId`` is the parent's: labelled
``<parent>/agent-<id>``); a resumed session's copy of earlier calls (same ``message.id`` and
``requestId`` as in another file: counted in the first file read only).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any

import orjson

from skillstate.cost.usage import Usage, optional_token_count

from .jsonstream import EmptyLog, LogError, iter_json_lines
from .session import Call, Reply, Session

__all__ = ["LINE_TYPES", "is_bookkeeping_line", "is_claude_code_line", "read_claude_code"]

SYNTHETIC_MODEL = "<synthetic>"  # the model Claude Code names on the messages it writes itself

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


def is_bookkeeping_line(obj: Any) -> bool:
    """A line of a type Claude Code writes, whatever else it holds (a ``summary`` or a
    ``file-history-snapshot`` names no session)."""
    return isinstance(obj, dict) and obj.get("type") in LINE_TYPES


def _text(value: Any) -> str | None:
    """An id or a name from the log: a string, or None (a value of another type is not one)."""
    return value if isinstance(value, str) and value else None


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
    # The writes' split by TTL: Claude Code mostly caches for an hour, billed above the
    # five-minute writes.
    split = u.get("cache_creation")
    hour = 0
    if isinstance(split, dict):
        hour = optional_token_count(split, "ephemeral_1h_input_tokens") or 0
    return Usage(plain + read + write, out, read, write, min(hour, write))


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

    first: str  # the key of its first line: the chain above it is what its call sent
    blocks: list[Any] = field(default_factory=list)
    usage: Usage | None = None
    request: str | None = None
    at: float | None = None
    model: str | None = None
    message_id: str | None = None
    request_id: str | None = None  # the API's; a resumed session's copy has the same

    def take_blocks(self, content: Any) -> None:
        """A line's blocks; a block the message already has (a line written twice) is not
        added again."""
        for block in content if isinstance(content, list) else []:
            if block in self.blocks or _has_tool_use(self.blocks, block):
                continue
            self.blocks.append(block)

    def message(self) -> dict[str, Any]:
        return {"role": "assistant", "content": self.blocks}


@dataclass(frozen=True, slots=True)
class _Node:
    """A line of the message chain, by its ``uuid``: a user message, a line of an assistant
    message (``item`` = its message id), a compaction boundary (the chain ends there), or
    another line the chain passes through (an attachment, a synthetic error message)."""

    kind: str  # user | assistant | boundary | link
    parent: str | None
    index: int  # its place in the file
    item: Any = None  # user: the message; assistant: the message id


@dataclass
class _Log:
    """What one pass over the file collects."""

    session_id: str | None = None
    sidechain: bool | None = None
    agent_id: str | None = None
    call_keys: list[tuple[str | None, str | None] | None] = field(default_factory=list)
    other_chain: set[str] = field(default_factory=set)  # the other chain's assistant ids
    shapes: dict[str, Any] = field(default_factory=dict)
    blobs: dict[str, Any] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    assistants: dict[str, _Assistant] = field(default_factory=dict)  # by message id
    nodes: dict[str, _Node] = field(default_factory=dict)
    users: list[Any] = field(default_factory=list)  # the user messages, in file order
    # Per assistant message id: the user lines answering its tool calls. Parallel tool calls'
    # results can each name their own tool_use line as parent, off the path a later line's
    # parents take; the client sends them all.
    results: dict[str, list[str]] = field(default_factory=dict)
    last: str | None = None  # the last chain line (the parent of a line that names none)

    def take(self, obj: dict[str, Any]) -> None:
        kind = obj.get("type")
        if isinstance(obj.get("uuid"), str) and obj["uuid"] in self.nodes:
            return  # a line written twice: the first is the chain's
        if kind == "api-request-shape" and isinstance(obj.get("shape"), dict):
            self.shapes[str(obj.get("shapeHash"))] = obj["shape"]
        elif kind == "api-request-blob" and isinstance(obj.get("message"), dict):
            self.blobs[str(obj.get("hash"))] = obj["message"]
        elif kind == "api-request":
            self.requests.append(obj)
        elif kind in ("user", "assistant") and isinstance(obj.get("message"), dict):
            self._message(kind, obj)
        elif kind == "system" and obj.get("subtype") == "compact_boundary":
            self._link(obj, "boundary")
        elif isinstance(obj.get("uuid"), str):
            self._link(obj, "link")

    def _link(self, obj: dict[str, Any], kind: str, item: Any = None) -> str:
        """Record a chain line; its key (the ``uuid``, or its place for a line with none)."""
        key = obj["uuid"] if isinstance(obj.get("uuid"), str) else f"#{len(self.nodes)}"
        parent = obj.get("parentUuid") if "parentUuid" in obj else self.last
        if kind == "boundary" or not isinstance(parent, str):
            parent = None  # the context restarts after a compaction
        self.nodes[key] = _Node(kind, parent, len(self.nodes), item)
        self.last = key
        return key

    def _message(self, kind: str, obj: dict[str, Any]) -> None:
        side = bool(obj.get("isSidechain"))
        message = obj["message"]
        if self.sidechain is None:
            self.sidechain, self.session_id = side, _text(obj.get("sessionId"))
            self.agent_id = _text(obj.get("agentId"))
        if side != self.sidechain:
            # A sub-agent's lines in its parent's file (older versions): counted, not replayed.
            if kind == "assistant" and message.get("model") != SYNTHETIC_MODEL:
                self.other_chain.add(str(_text(message.get("id")) or obj.get("uuid")))
            return
        if kind == "assistant" and message.get("model") == SYNTHETIC_MODEL:
            # The error text Claude Code shows when a call failed: no model call, and the
            # client leaves it out of the requests after it.
            self._link(obj, "link")
            return
        if kind == "user":
            self.users.append(message)
            key = self._link(obj, "user", message)
            parent = self.nodes.get(self.nodes[key].parent or "")
            if parent is not None and parent.kind == "assistant" and _answers_tools(message):
                self.results.setdefault(parent.item, []).append(key)
            return
        self._assistant(obj, message)

    def _assistant(self, obj: dict[str, Any], message: dict[str, Any]) -> None:
        # A message logged without its id (some gateways) is gathered by its request's.
        message_id, request_id = _text(message.get("id")), _text(obj.get("requestId"))
        mid = str(message_id or request_id or obj.get("uuid"))
        key = self._link(obj, "assistant", mid)
        entry = self.assistants.get(mid)
        if entry is None:
            entry = self.assistants[mid] = _Assistant(key, at=_time(obj.get("timestamp")))
            entry.message_id, entry.request_id = message_id, request_id
        entry.take_blocks(message.get("content"))
        entry.usage = _usage(message.get("usage")) or entry.usage
        entry.request = _text(obj.get("requestRef")) or entry.request
        entry.model = _text(message.get("model")) or entry.model

    def path(self, start: str) -> list[tuple[str, Any]]:
        """The messages above chain line ``start``, oldest first, up to the chain's root or
        the last compaction: ``("user", keys)`` per run of user lines (the client sends them
        as one message) and ``("assistant", message id)``."""
        above: list[tuple[str, _Node]] = []
        seen: set[str] = set()
        key = self.nodes[start].parent
        while key is not None and key not in seen:
            seen.add(key)
            node = self.nodes.get(key)
            if node is None or node.kind == "boundary":
                break
            if node.kind in ("user", "assistant"):
                above.append((key, node))
            key = node.parent
        out: list[tuple[str, Any]] = []
        for key, node in reversed(above):
            if node.kind == "assistant":
                if out[-1:] != [("assistant", node.item)]:
                    out.append(("assistant", node.item))
                continue
            if not out or out[-1][0] != "user":
                answers = self.results.get(out[-1][1], []) if out else []
                out.append(("user", list(answers)))
            if key not in out[-1][1]:
                out[-1][1].append(key)
        return [
            (kind, sorted(item, key=lambda u: self.nodes[u].index) if kind == "user" else item)
            for kind, item in out
        ]


def _has_tool_use(blocks: list[Any], block: Any) -> bool:
    """Whether ``block`` is a tool call ``blocks`` already has (by its id)."""
    if not isinstance(block, dict) or block.get("type") != "tool_use" or "id" not in block:
        return False
    return any(
        isinstance(b, dict) and b.get("type") == "tool_use" and b.get("id") == block["id"]
        for b in blocks
    )


def _answers_tools(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


def read_claude_code(f: IO[bytes], name: str, seen_calls: set[Any] | None = None) -> Session:
    """The session in one Claude Code log (EmptyLog when it holds no model call, LogError
    when none could be read). ``seen_calls``: the (message id, request id) of the calls read
    from other files; a call among them is left out here (and this file's are added)."""
    log = _Log()
    skipped: list[str] = []
    for _, obj in iter_json_lines(f, skipped):
        if isinstance(obj, dict):
            log.take(obj)
    session = Session(
        id=_session_label(log, name),
        source="claude-code",
        dialect="anthropic",
        provider="anthropic",
        model=None,
        skipped=skipped,
    )
    _calls(log, session)
    copies = _drop_calls_seen(log, session, seen_calls)
    if not session.calls:
        if skipped:
            raise LogError("; ".join([*skipped[:1], "no model calls in this Claude Code log"]))
        if copies:
            raise EmptyLog(f"all {copies} call(s) also in another file; counted once there")
        raise EmptyLog("an empty session (no model calls in this Claude Code log); skipped")
    return session


def _session_label(log: _Log, name: str) -> str:
    """The session's id; a sub-agent's log (its lines carry the parent's ``sessionId``) is
    ``<parent>/agent-<id>``."""
    if not log.sidechain:
        return log.session_id or name
    agent = name if name.startswith("agent-") or not log.agent_id else f"agent-{log.agent_id}"
    return f"{log.session_id}/{agent}" if log.session_id else agent


def _drop_calls_seen(log: _Log, session: Session, seen_calls: set[Any] | None) -> int:
    """Leave out the calls another file already had (a resumed session copies them, with the
    same message and request ids); how many."""
    session.call_keys = list(log.call_keys)
    if seen_calls is None:
        return 0
    kept, keys, copies = [], [], 0
    for call, key in zip(session.calls, log.call_keys, strict=True):
        if key is not None and key in seen_calls:
            copies += 1
            continue
        kept.append(call)
        keys.append(key)
    session.calls, session.call_keys = kept, keys
    if copies and kept:
        session.notes.append(f"{copies} call(s) also in another file; counted once")
    return copies


def _calls(log: _Log, session: Session) -> None:
    """A call per assistant message: rebuilt from its ``api-request`` line, or, where there is
    none (older versions) or it cannot be rebuilt (a corrupt line, a message not logged), from
    the message chain above the reply."""
    logged = {str(req.get("id")): req for req in log.requests}
    sent = _exact_requests(log, session) if log.requests else {}
    chain = _ChainPool(log, session)
    rebuilt = 0
    for entry in log.assistants.values():
        if entry.usage is None and not entry.blocks:
            continue
        reply = reply_of(entry.blocks, entry.usage)
        line = logged.get(entry.request or "")
        if line is not None:
            _take_request_shape(log, session, line, entry)
        messages = sent.get(entry.request or "")
        both = entry.message_id and entry.request_id
        log.call_keys.append((entry.message_id, entry.request_id) if both else None)
        if line is not None and messages is not None:
            marks = _cache_marks(line.get("cacheControl"))
            session.calls.append(Call(messages, reply, entry.usage, entry.at, marks))
            continue
        messages = chain.context(entry)
        if messages:
            session.calls.append(Call(messages, reply, entry.usage, entry.at))
            rebuilt += 1
        else:
            log.call_keys.pop()
    if session.model is None:
        session.model = next((e.model for e in log.assistants.values() if e.model), None)
    _usage_notes(log, session)
    if not rebuilt:
        return
    if not log.requests:
        session.notes.append("no api-request lines: system prompt and tools not logged")
    else:
        session.notes.append(
            f"{rebuilt} call(s) rebuilt from the message chain (their api-request line is "
            "missing, unreadable or names a message not in the log)"
        )


def _usage_notes(log: _Log, session: Session) -> None:
    """What the log holds that the replay leaves out of its bill: calls whose usage is no
    counts, and a sub-agent's calls in its parent's file."""
    unreadable = sum(1 for c in session.calls if c.usage is None)
    if unreadable:
        session.notes.append(f"usage unreadable on {unreadable} call(s): not checked")
    if log.other_chain:
        n = len(log.other_chain)
        session.notes.append(f"{n} sub-agent call(s) (isSidechain) not replayed")


def _exact_requests(log: _Log, session: Session) -> dict[str, list[int]]:
    """The messages (pool indices) of each request the ``api-request`` lines rebuild, by id
    (one whose base or a message it sent is not in the log is left out, and so are those
    built on it)."""
    by_hash: dict[str, int] = {}

    def index(h: str, message: Any, params: dict[str, Any]) -> int:
        if h not in by_hash:
            if message.get("role") == "system":
                message = _wire_system_message(message, params)
            by_hash[h] = session.add(message)
        return by_hash[h]

    known: dict[str, Any] = dict(log.blobs)
    for user in log.users:
        known.setdefault(message_hash(user), user)
    for gathered in log.assistants.values():
        known.setdefault(message_hash(gathered.message()), gathered.message())
    sent: dict[str, list[int]] = {}
    for req in log.requests:
        base = sent.get(str(req.get("base"))) if req.get("base") else []
        tail = [h for h in req.get("tail") or [] if isinstance(h, str)]
        if base is None or any(h not in known for h in tail):
            continue
        keep = req["keep"] if isinstance(req.get("keep"), int) else 0
        params: dict[str, Any] = req["params"] if isinstance(req.get("params"), dict) else {}
        sent[str(req.get("id"))] = base[:keep] + [index(h, known[h], params) for h in tail]
    return sent


def _take_request_shape(
    log: _Log, session: Session, req: dict[str, Any], entry: _Assistant
) -> None:
    """The session's model, system blocks, tools, betas and parameters, from its first
    rebuilt request."""
    if session.model is not None:
        return
    params: dict[str, Any] = req["params"] if isinstance(req.get("params"), dict) else {}
    shape: dict[str, Any] = log.shapes.get(str(req.get("shapeHash"))) or {}
    session.model = _text(params.get("model")) or entry.model
    session.system = shape.get("system")
    session.tools = shape.get("tools")
    betas = params.get("betas")
    if isinstance(betas, list) and betas:
        session.headers["anthropic-beta"] = ",".join(str(b) for b in betas)
    session.params = {k: v for k, v in params.items() if k not in ("model", "betas")}


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


class _ChainPool:
    """The message chain's messages in the session's pool, each added once (the calls
    share them)."""

    def __init__(self, log: _Log, session: Session) -> None:
        self.log, self.session = log, session
        self._index: dict[tuple[str, Any], int] = {}

    def context(self, entry: _Assistant) -> list[int]:
        """What the call answered by ``entry`` sent: the chain above its first line."""
        return [
            self._pooled(kind, item)
            for kind, item in self.log.path(entry.first)
            if kind == "user" or self.log.assistants[item].blocks
        ]

    def _pooled(self, kind: str, item: Any) -> int:
        key = (kind, tuple(item) if kind == "user" else item)
        found = self._index.get(key)
        if found is None:
            if kind == "assistant":
                message = self.log.assistants[item].message()
            else:
                users = [self.log.nodes[k].item for k in item]
                content = (
                    users[0].get("content")
                    if len(users) == 1
                    else [b for user in users for b in _blocks(user)]
                )
                message = {"role": "user", "content": content}
            found = self._index[key] = self.session.add(message)
        return found


def _blocks(message: dict[str, Any]) -> list[Any]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def iter_sessions(f: IO[bytes], name: str) -> Iterator[Session]:
    yield read_claude_code(f, name)
