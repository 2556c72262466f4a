"""The window context (``mode: window``): what goes upstream each turn, and where the window
of verbatim messages starts. Pure: functions of (request body, state, window mark).

Each turn sends, in the client's wire format:

1. the stable prefix (system text, tools, the task (``engine.context.Split``), the window
   contract), byte-identical on every turn;
2. the state as committed at the last checkpoint;
3. every message of the client's transcript since the window's start, verbatim.

Between checkpoints a request is the previous one plus the new messages (append-only), so a
provider's prompt cache reads everything up to the previous turn. A checkpoint turn appends
one instruction after the latest observation (the cached prefix stays intact) asking for
the envelope; after a valid checkpoint the window restarts at the last ``keep`` exchanges.

An *exchange* is an assistant message with its tool results, or a user message with the
reply to it: it starts at a user message that is no tool result, or at an assistant-side
message right after a tool result. Starting a window only there keeps every tool call
paired with its result (and a Responses reasoning item with its calls).

The window's start is kept as a :class:`WindowMark`: a position in the client's transcript
plus a digest of the messages before it. A client that compacts, edits or restarts its
transcript changes those messages; the mark then no longer holds, and a fresh window starts,
with the state as it is, at the new transcript's start: all of it after the task (as after
Claude Code's ``/compact``: its summary, the messages it keeps after it and the new prompt).
None of it leaves the window unfolded: when it passes ``window_max_tokens`` the checkpoint
policy makes that turn a checkpoint, whose envelope folds it into the state before the window
restarts at the kept exchanges. No message is sent twice, none out of order, none dropped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import orjson

from ..cost.tokens import estimate_tokens
from .context import CONTRACT_MARK, DialectContext, Split, split_transcript

__all__ = [
    "CHECKPOINT_MARK",
    "WindowMark",
    "WindowMarks",
    "WindowPlan",
    "build_window",
    "checkpoint_text",
    "conversation_root",
    "exchange_starts",
    "fold_parts",
    "fold_text",
    "kept_exchanges",
    "kept_start",
    "mark_of",
    "plan_window",
    "prefix_task",
    "transcript_digest",
    "window_contract_text",
]

CHECKPOINT_MARK = "[skillstate] CHECKPOINT"
_ENVELOPE = '{"state_patch": {...}, "action": "..."}'


def window_contract_text(allowed_keys: Sequence[str]) -> str:
    """The window form's contract. Byte-identical for a given schema (prompt caching)."""
    keys = ", ".join(allowed_keys) if allowed_keys else "any"
    return (
        f"{CONTRACT_MARK}\n"
        "Older messages are not shown: the CURRENT STATE below is your memory of them. The "
        "messages after it are the recent conversation, as it happened.\n"
        "Reply normally. End your reply with the envelope only when the last message asks "
        "for a checkpoint; then finish it with exactly one ```json block:\n"
        f"{_ENVELOPE}\n"
        "- state_patch: a JSON object merged into the state (RFC 7386): null deletes a key; "
        "arrays are replaced whole, so resend the full array.\n"
        "- action: a short string naming what you do next.\n"
        f"Allowed top-level state keys: {keys}."
    )


def checkpoint_text() -> str:
    """The instruction a checkpoint turn appends after the latest observation."""
    return (
        f"{CHECKPOINT_MARK}: the older messages above leave your context after this reply. "
        "Reply as you would, then end your reply with exactly one ```json block: "
        f"{_ENVELOPE} whose state_patch keeps in the state everything from them that you "
        "will still need (facts, file contents you will quote, decisions, progress)."
    )


def fold_text() -> str:
    """The instruction of a fold: a call that only folds the messages it shows into the
    state, before a window too big for the model's context is sent (``fold_parts``)."""
    return (
        f"{CHECKPOINT_MARK}: the messages above leave your context now, before the "
        "conversation goes on: it does not fit your context whole. Do not answer or act on "
        f"them: reply with only one ```json block: {_ENVELOPE} whose state_patch keeps in the "
        "state everything from them that you will still need (facts, file contents you will "
        "quote, decisions, progress)."
    )


@dataclass(frozen=True, slots=True)
class WindowMark:
    """Where a conversation's window starts in the client's transcript: ``start`` (an index
    into its message list), the digest of the messages before it, and the conversation
    (``root``: :func:`conversation_root`; "" in a mark stored before marks named theirs)."""

    start: int
    digest: str
    root: str = ""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"start": self.start, "digest": self.digest}
        if self.root:
            out["root"] = self.root
        return out

    @classmethod
    def from_dict(cls, value: Any) -> WindowMark | None:
        """The mark stored with a session; None for anything that is not one."""
        if not isinstance(value, dict):
            return None
        start, digest, root = value.get("start"), value.get("digest"), value.get("root", "")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            return None
        if not isinstance(digest, str) or not isinstance(root, str):
            return None
        return cls(start, digest, root)


# A session's window marks, one per conversation root (see :func:`conversation_root`).
WindowMarks = Mapping[str, WindowMark]


def conversation_root(messages: Sequence[Any], split: Split) -> str:
    """Which conversation of its session a transcript belongs to: a digest of its task (the
    first user messages, ``Split``). One session name often carries several conversations:
    Claude Code sends its sub-agents' transcripts and its side calls (a title, a command's
    prefix) with the session header it sends its own; each keeps its own window, so that one
    does not restart another's. A conversation's own rewrite (an edit, a compaction that
    keeps its task) stays one conversation; a compaction that replaces the task (Claude
    Code's summary) or a new task is another, which starts its window afresh, as a changed
    transcript did."""
    if split.task is None:
        return ""
    task = messages[split.task : split.task_end]
    return transcript_digest(task, len(task))[:32]


def mark_of(marks: WindowMarks | None, root: str) -> WindowMark | None:
    """The mark of the conversation ``root`` (a mark stored before marks named their
    conversation stands for any)."""
    if not marks:
        return None
    return marks.get(root) or marks.get("")


# Text block types whose one-block ``content`` a client may send as the bare string.
_TEXT_BLOCKS = frozenset({"text", "input_text", "output_text"})


def _one_text(content: Any) -> Any:
    """A one-text-block ``content`` as its string (what else it carries being cache markers
    or empty lists such as ``annotations``), anything else as it is."""
    if not isinstance(content, list) or len(content) != 1 or not isinstance(content[0], dict):
        return content
    block = content[0]
    text = block.get("text")
    if block.get("type") not in _TEXT_BLOCKS or not isinstance(text, str):
        return content
    rest = (v for k, v in block.items() if k not in ("type", "text", "cache_control"))
    return text if all(v in (None, []) for v in rest) else content


# Members of a content part whose empty list means the same as the member left out.
_EMPTY_AS_ABSENT = frozenset({"annotations", "logprobs"})


def _digest_form(value: Any, level: int = 0) -> Any:
    """A message as the digest sees it. What a client changes on messages it already sent
    without changing what they say is ignored: ``cache_control`` markers (Claude Code moves
    its breakpoints to its newest messages on every turn); a ``content`` that is one text
    block or the same text as a string (SDKs that rebuild their history from their own
    objects send either); a Responses item's ``"type": "message"``, which the API defaults
    (the Agents SDK sends ``{"role", "content"}``, the proxy's own list of a string input
    has the type); and on the message and its parts (``level`` 0 and 1), a member whose value
    is ``null`` (an SDK object's ``model_dump()`` writes ``"status": null``, ``"id": null``,
    ``"refusal": null``... that ``exclude_none`` leaves out: the three APIs read an optional
    member sent as null as one not sent), and a part's empty ``annotations``/``logprobs``.
    Deeper values (a tool call's input, a JSON schema) are free JSON, where ``null`` is a
    value: only their cache markers go (a ``content`` there is no message's). Only the
    digest: the upstream gets the client's bytes."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "cache_control" or (level <= 1 and _absent(k, v, level)):
                continue
            if level == 0 and k == "type" and v == "message":
                continue
            # a message's or a part's content (deeper, "content" is a key of free JSON)
            v = _one_text(v) if k == "content" and level <= 1 else v
            # A message's list members hold its parts (level 1); an object member is a
            # value of its own (a tool call's action or arguments).
            out[k] = _digest_form(v, level + 1 if isinstance(v, list) else level + 2)
        return out
    if isinstance(value, list):
        return [_digest_form(v, level) for v in value]
    return value


def _absent(key: str, value: Any, level: int) -> bool:
    """A member that says what leaving it out says (see :func:`_digest_form`)."""
    return value is None or (level == 1 and key in _EMPTY_AS_ABSENT and value == [])


def transcript_digest(messages: Sequence[Any], end: int) -> str:
    """A digest of ``messages[:end]`` (keys sorted, in :func:`_digest_form`)."""
    h = hashlib.sha256()
    for message in messages[:end]:
        h.update(orjson.dumps(_digest_form(message), option=orjson.OPT_SORT_KEYS))
        h.update(b"\n")
    return h.hexdigest()


def _is_result(msg: Any, d: DialectContext) -> bool:
    return isinstance(msg, dict) and d.is_user_turn(msg) and d.is_tool_result(msg)


def exchange_starts(messages: Sequence[Any], d: DialectContext, lo: int = 0) -> list[int]:
    """The indexes from ``lo`` on where an exchange starts (see the module docstring). None
    falls between a tool call and its result: a Responses input may hold a user message (or
    the model's text) between a call and its output, and a window starting there would send
    the output without its call. So no exchange starts at a message after which a tool result
    comes before any message with tool calls (that result answers a call made before it)."""
    starts = []
    result_ahead = False  # a tool result follows, before any message with tool calls
    for k in range(len(messages) - 1, lo - 1, -1):
        msg = messages[k]
        if not isinstance(msg, dict) or d.is_system(msg):
            continue
        if d.is_user_turn(msg):
            if d.is_tool_result(msg):
                result_ahead = True
            elif not result_ahead:
                starts.append(k)
            continue
        calls = d.has_tool_calls(msg)
        after_result = k > 0 and _is_result(messages[k - 1], d)
        if after_result and (calls or not result_ahead):
            starts.append(k)
        if calls:
            result_ahead = False
    starts.reverse()
    return starts


def kept_start(
    messages: Sequence[Any], d: DialectContext, lo: int, keep: int, room: int | None = None
) -> int:
    """Where a window that keeps the last ``keep`` exchanges after ``lo`` starts (``lo``
    itself when there are no more than ``keep``). ``room``: the estimated tokens the kept
    messages may fill (the model's context, not the bill, sets it): fewer exchanges are kept
    where the last ``keep`` would not fit, and the latest one always."""
    starts = exchange_starts(messages, d, lo)
    if keep <= 0:
        return starts[-1] if starts else lo
    start = starts[-keep] if len(starts) > keep else lo
    if room is None or not starts:
        return start
    candidates = [start, *(k for k in starts if k > start)]
    fits, end, tokens = candidates[-1], len(messages), 0
    for s in reversed(candidates):  # each message measured once
        tokens += estimate_tokens(messages[s:end])
        if tokens > room:
            break
        fits = end = s
    return fits


def kept_exchanges(
    messages: Sequence[Any], d: DialectContext, lo: int, keep: int
) -> list[tuple[int, int]]:
    """The ``[start, end)`` ranges of the exchanges a checkpoint keeps (from
    :func:`kept_start` to the transcript's end), oldest first."""
    start = kept_start(messages, d, lo, keep)
    cuts = [k for k in exchange_starts(messages, d, start) if k > start]
    bounds = [start, *cuts, len(messages)]
    return list(pairwise(bounds))


def fold_parts(
    messages: Sequence[Any], d: DialectContext, start: int, room: int
) -> tuple[list[tuple[int, int]], int]:
    """How a window from ``start`` that does not fit ``room`` estimated tokens is sent:
    the parts folded into the state first, one call each (``[lo, hi)`` ranges, each cut at
    exchange starts and within ``room`` unless one exchange alone is bigger), and where the
    window the turn then sends starts (the latest exchanges that fit, the latest always).
    Every message is in one part or in the window, in order."""
    fit = kept_start(messages, d, start, len(messages) + 1, room)
    cuts = [k for k in exchange_starts(messages, d, start) if start < k < fit] + [fit]
    parts: list[tuple[int, int]] = []
    lo, prev, tokens = start, start, 0
    for cut in cuts:
        size = estimate_tokens(messages[prev:cut])
        if prev > lo and tokens + size > room:
            parts.append((lo, prev))
            lo, tokens = prev, 0
        tokens += size
        prev = cut
    if lo < fit:
        parts.append((lo, fit))
    return parts, fit


@dataclass(frozen=True, slots=True)
class WindowPlan:
    """Where this turn's window starts, and why.

    ``reason``: ``kept`` (the stored mark holds), ``new`` (no mark: the whole transcript
    after the task is the window) or ``changed`` (the client's transcript changed before
    the mark: a fresh window, the whole new transcript after the task)."""

    split: Split
    start: int
    reason: str
    exchanges: int  # exchanges in the window

    def mark(self, messages: Sequence[Any]) -> WindowMark:
        root = conversation_root(messages, self.split)
        return WindowMark(self.start, transcript_digest(messages, self.start), root)


def plan_window(messages: list[Any], d: DialectContext, marks: WindowMarks | None) -> WindowPlan:
    """Where the window of this transcript starts, given the session's stored marks: where
    its conversation's mark says while it holds, else at the start, so that no message of
    the client's leaves the window without a checkpoint: ``new`` for a session with no
    window yet, ``changed`` for a transcript the session's windows do not continue (the
    client changed its own, or another conversation came: the others' marks stay)."""
    split = split_transcript(messages, d)
    mark = mark_of(marks, conversation_root(messages, split))
    if mark is not None and _holds(mark, messages, split):
        start, reason = mark.start, "kept"
    else:
        start, reason = split.system_end, "changed" if marks else "new"
    return WindowPlan(split, start, reason, len(exchange_starts(messages, d, start)))


def prefix_task(split: Split, lo: int, messages: Sequence[Any], d: DialectContext) -> int | None:
    """The task's index when it goes in the stable prefix of a window from ``lo``; None when
    messages other than system text come before it in the window (a chat that opens with the
    assistant's greeting): it then stays in its place among them, in order."""
    task = split.task
    if task is None or task <= lo:
        return task
    return None if any(not d.is_system(m) for m in messages[lo:task]) else task


def _holds(mark: WindowMark, messages: list[Any], split: Split) -> bool:
    """Whether the messages before ``mark`` are as they were, and the window from it holds
    what the model is to answer. A transcript that ends at the mark (a rewind to an earlier
    request) would leave the window empty, the latest message unsent unless it is the task
    (in the prefix): it is taken as changed."""
    n = len(messages)
    if mark.start > n or (mark.start == n and not split.in_task(n - 1)):
        return False
    return transcript_digest(messages, mark.start) == mark.digest


def build_window(
    d: DialectContext,
    body: dict[str, Any],
    plan: WindowPlan,
    allowed_keys: Sequence[str],
    state: dict[str, Any],
) -> dict[str, Any]:
    """The window context of ``body`` (in the format whose adapter is ``d``): the stable
    prefix, the state, and the messages from ``plan.start`` on (the task, in the prefix
    unless messages before it are in the window, is not sent twice). Each dialect lays it
    out as its compact context, with the window in place of the latest observation."""
    messages = body[d.transcript_key]
    split = _window_split(plan.split, plan.start, messages, d)
    return d.compact(body, split, window_contract_text(allowed_keys), state)


def _window_split(split: Split, lo: int, messages: Sequence[Any], d: DialectContext) -> Split:
    """The split a window from ``lo`` is laid out by: the task in the prefix or not
    (:func:`prefix_task`), the window as the latest observation."""
    task = prefix_task(split, lo, messages, d)
    return Split(split.system_end, task, lo, split.task_end if task is not None else 0)


def build_fold(
    d: DialectContext,
    body: dict[str, Any],
    plan: WindowPlan,
    part: tuple[int, int],
    allowed_keys: Sequence[str],
    state: dict[str, Any],
) -> dict[str, Any]:
    """A fold call's body: the stable prefix, the state, the messages of ``part`` and the
    fold instruction after them."""
    lo, hi = part
    messages = body[d.transcript_key]
    shown = {**body, d.transcript_key: messages[:hi]}
    split = _window_split(plan.split, lo, messages, d)
    return d.instruct(
        d.compact(shown, split, window_contract_text(allowed_keys), state), fold_text()
    )


def with_checkpoint(d: DialectContext, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with the checkpoint instruction after its latest message."""
    return d.instruct(body, checkpoint_text())
