"""Context construction: what goes upstream each turn.

State mode sends A_t = (P, Σ_t, O_t): a stable prefix (the client's system messages and tools,
the task, the state contract), then the current state, then the latest observation. The task
is the user's input before anything else happened: the first user message and the user
messages right after it (Codex sends its environment, then the prompt, as two). The prefix
is byte-identical on every turn of a session, the first one included, so a provider's prompt
cache can serve it. The algorithm is shared; each dialect's adapter (``Dialect.context``, in
``skillstate.dialects``) knows where its format keeps system text and tool results.
Everything here is a pure function of (request body, state).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import orjson

CONTRACT_MARK = "[skillstate] STATE CONTRACT"
STATE_MARK = "[skillstate] CURRENT STATE (JSON):"
CORRECTION_MARK = "[skillstate] CORRECTION"


# How this turn's reply carries the envelope:
#   "block": the reply ends with a ```json block. Also under constrained decoding, where the
#            grammar only lets the bare object out: asking for the bare object instead was
#            measured worse with SmolLM2-135M (1/30 valid first attempts against 23/30,
#            docs/benchmarks.md);
#   "none": the request brought its own output format, which the reply must follow, so it
#           cannot carry an envelope: the state is context only and this turn changes nothing.
EnvelopeForm = Literal["block", "none"]

_ENVELOPE = '{"state_patch": {...}, "action": "..."}'


def contract_text(allowed_keys: Sequence[str], form: EnvelopeForm = "block") -> str:
    """Short, stable instructions. Byte-identical for a given schema and form (prompt caching)."""
    memory = "Earlier turns are not shown. The CURRENT STATE below is your memory"
    if form == "none":
        return (
            f"{CONTRACT_MARK}\n{memory} of them. Answer in the response format you were given; "
            "this reply does not change the state."
        )
    keys = ", ".join(allowed_keys) if allowed_keys else "any"
    return (
        f"{CONTRACT_MARK}\n"
        f"{memory}: keep in it everything you will need later.\n"
        "Finish every reply with exactly one ```json block:\n"
        f"{_ENVELOPE}\n"
        "- state_patch: a JSON object merged into the state (RFC 7386): null deletes a key; "
        "arrays are replaced whole, so resend the full array.\n"
        "- action: a short string naming what you do next.\n"
        f"Allowed top-level state keys: {keys}."
    )


def state_text(state: dict[str, Any]) -> str:
    return STATE_MARK + "\n" + orjson.dumps(state).decode()


def correction_text(errors: Sequence[str]) -> str:
    """The re-ask after an invalid envelope (a "none" turn has none to get wrong)."""
    listed = "; ".join(errors) if errors else "no valid state envelope"
    return (
        f"{CORRECTION_MARK}: your last reply had no valid state envelope ({listed}). "
        f"Reply again and end with exactly one ```json block: {_ENVELOPE} using only the "
        "allowed keys."
    )


@dataclass(frozen=True, slots=True)
class Split:
    """Where the parts of a transcript are. Indexes into the message list."""

    system_end: int  # messages[:system_end] are leading system/developer messages
    task: int | None  # index of the first user message
    observation: int  # messages[observation:] is the latest observation
    # messages[task:task_end] are the task: the first user message and the user messages
    # (no tool results) right after it, before any other message; 0 when there is no task
    task_end: int

    def in_task(self, k: int) -> bool:
        """Whether ``messages[k]`` is part of the task."""
        return self.task is not None and self.task <= k < self.task_end


class DialectContext(Protocol):
    """What the shared algorithm needs to know about one wire format."""

    transcript_key: str  # the body's list of messages: ``messages`` (Responses: ``input``)

    def is_system(self, msg: dict[str, Any]) -> bool: ...
    def is_user_turn(self, msg: dict[str, Any]) -> bool: ...
    def is_tool_result(self, msg: dict[str, Any]) -> bool: ...
    def has_tool_calls(self, msg: dict[str, Any]) -> bool: ...
    def compact(
        self, body: dict[str, Any], split: Split, contract: str, state: dict[str, Any]
    ) -> dict[str, Any]: ...
    def correction(
        self, body: dict[str, Any], reply_text: str, errors: Sequence[str]
    ) -> dict[str, Any]: ...
    def full(self, body: dict[str, Any], contract: str) -> dict[str, Any]: ...
    def instruct(self, body: dict[str, Any], text: str) -> dict[str, Any]:
        """``body`` with ``text`` as a user instruction after its latest message."""
        ...


def split_transcript(messages: list[dict[str, Any]], d: DialectContext) -> Split:
    n = len(messages)
    system_end = 0
    while system_end < n and d.is_system(messages[system_end]):
        system_end += 1
    task = next((i for i in range(system_end, n) if d.is_user_turn(messages[i])), None)
    task_end = 0
    if task is not None:
        task_end = task + 1
        while (
            task_end < n
            and d.is_user_turn(messages[task_end])
            and not d.is_tool_result(messages[task_end])
        ):
            task_end += 1

    # The latest observation: the trailing run of user/tool-result messages (plus anything
    # after it, such as an assistant prefill). When that run holds tool results, it starts
    # at the assistant message that made the calls, so calls and results stay paired, with
    # any user message between them (a Responses input may hold one); without that message
    # the run's results start it.
    last = next((i for i in range(n - 1, system_end - 1, -1) if d.is_user_turn(messages[i])), None)
    if last is None:
        return Split(system_end, task, system_end, task_end)
    start = last
    while start - 1 >= system_end and d.is_user_turn(messages[start - 1]):
        start -= 1
    run = messages[start : last + 1]
    if any(d.is_tool_result(m) for m in run):
        if start - 1 >= system_end and d.has_tool_calls(messages[start - 1]):
            start -= 1
        else:
            start += next(i for i, m in enumerate(run) if d.is_tool_result(m))
    else:
        start = last  # only the last user message is the observation
    return Split(system_end, task, start, task_end)


def observation(messages: list[dict[str, Any]], split: Split) -> list[dict[str, Any]]:
    """The latest observation: ``messages[split.observation:]`` without the task, which the
    compact context always keeps in its stable prefix (on the first turn the task is also
    the latest observation; it is not sent twice)."""
    tail = messages[split.observation :]
    if split.task is None or split.task_end <= split.observation:
        return list(tail)
    return [m for k, m in enumerate(tail, split.observation) if not split.in_task(k)]


def build_compact(
    d: DialectContext,
    body: dict[str, Any],
    allowed_keys: Sequence[str],
    state: dict[str, Any],
    form: EnvelopeForm = "block",
) -> dict[str, Any]:
    """The compact context (prefix, state, latest observation) of a transcript in the
    format whose adapter is ``d`` (a dialect's ``context``)."""
    split = split_transcript(body[d.transcript_key], d)
    return d.compact(body, split, contract_text(allowed_keys, form), state)


def build_full(
    d: DialectContext,
    body: dict[str, Any],
    allowed_keys: Sequence[str],
    form: EnvelopeForm = "block",
) -> dict[str, Any]:
    """The whole transcript with the state contract added to its system text."""
    return d.full(body, contract_text(allowed_keys, form))


def add_correction(
    d: DialectContext, body: dict[str, Any], reply_text: str, errors: Sequence[str]
) -> dict[str, Any]:
    """The re-ask after an invalid envelope: the reply and a correction appended."""
    return d.correction(body, reply_text, errors)
