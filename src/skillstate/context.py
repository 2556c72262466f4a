"""Context construction: what goes upstream each turn.

State mode sends A_t = (P, Σ_t, O_t): a stable prefix (the client's system messages, the task =
the first user message, the state contract), then the current state, then the latest
observation. The algorithm is shared; two small adapters know where each dialect keeps
system text and tool results. Everything here is a pure function of (request body, state).
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


class DialectContext(Protocol):
    """What the shared algorithm needs to know about one wire format."""

    def is_system(self, msg: dict[str, Any]) -> bool: ...
    def is_user_turn(self, msg: dict[str, Any]) -> bool: ...
    def is_tool_result(self, msg: dict[str, Any]) -> bool: ...
    def has_tool_calls(self, msg: dict[str, Any]) -> bool: ...
    def compact(
        self, body: dict[str, Any], split: Split, contract: str, state: dict[str, Any]
    ) -> dict[str, Any]: ...
    def full(self, body: dict[str, Any], contract: str) -> dict[str, Any]: ...
    def correction(
        self, body: dict[str, Any], reply_text: str, errors: Sequence[str]
    ) -> dict[str, Any]: ...


def split_transcript(messages: list[dict[str, Any]], d: DialectContext) -> Split:
    n = len(messages)
    system_end = 0
    while system_end < n and d.is_system(messages[system_end]):
        system_end += 1
    task = next((i for i in range(system_end, n) if d.is_user_turn(messages[i])), None)

    # The latest observation: the trailing run of user/tool-result messages (plus anything
    # after it, such as an assistant prefill). When that run holds tool results, it starts
    # at the assistant message that made the calls, so calls and results stay paired.
    last = next((i for i in range(n - 1, system_end - 1, -1) if d.is_user_turn(messages[i])), None)
    if last is None:
        return Split(system_end, task, system_end)
    start = last
    while start - 1 >= system_end and d.is_user_turn(messages[start - 1]):
        start -= 1
    run = messages[start : last + 1]
    if any(d.is_tool_result(m) for m in run):
        first_result = start + next(i for i, m in enumerate(run) if d.is_tool_result(m))
        if first_result - 1 >= system_end and d.has_tool_calls(messages[first_result - 1]):
            start = first_result - 1
        else:
            start = first_result
    else:
        start = last  # only the last user message is the observation
    return Split(system_end, task, start)


# -- OpenAI chat completions ----------------------------------------------------------------


class OpenAIContext:
    def is_system(self, msg: dict[str, Any]) -> bool:
        return msg.get("role") in ("system", "developer")

    def is_user_turn(self, msg: dict[str, Any]) -> bool:
        return msg.get("role") in ("user", "tool", "function")

    def is_tool_result(self, msg: dict[str, Any]) -> bool:
        return msg.get("role") in ("tool", "function")

    def has_tool_calls(self, msg: dict[str, Any]) -> bool:
        return msg.get("role") == "assistant" and bool(
            msg.get("tool_calls") or msg.get("function_call")
        )

    def compact(
        self, body: dict[str, Any], split: Split, contract: str, state: dict[str, Any]
    ) -> dict[str, Any]:
        msgs = body["messages"]
        out = list(msgs[: split.system_end])
        if split.task is not None and split.task < split.observation:
            out.append(msgs[split.task])
        out.append({"role": "user", "content": contract + "\n\n" + state_text(state)})
        out.extend(msgs[split.observation :])
        return {**body, "messages": out}

    def full(self, body: dict[str, Any], contract: str) -> dict[str, Any]:
        msgs = body["messages"]
        end = split_transcript(msgs, self).system_end
        out = [*msgs[:end], {"role": "system", "content": contract}, *msgs[end:]]
        return {**body, "messages": out}

    def correction(
        self, body: dict[str, Any], reply_text: str, errors: Sequence[str]
    ) -> dict[str, Any]:
        extra = [
            {"role": "assistant", "content": reply_text},
            {"role": "user", "content": correction_text(errors)},
        ]
        return {**body, "messages": [*body["messages"], *extra]}


# -- Anthropic Messages ---------------------------------------------------------------------


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content) if isinstance(content, list) else []


class AnthropicContext:
    # Anthropic keeps system text in a top-level field, so no message is a system message.
    def is_system(self, msg: dict[str, Any]) -> bool:
        return False

    def is_user_turn(self, msg: dict[str, Any]) -> bool:
        return msg.get("role") == "user"

    def is_tool_result(self, msg: dict[str, Any]) -> bool:
        content = msg.get("content")
        return isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content
        )

    def has_tool_calls(self, msg: dict[str, Any]) -> bool:
        content = msg.get("content")
        return (
            msg.get("role") == "assistant"
            and isinstance(content, list)
            and any(isinstance(b, dict) and b.get("type") == "tool_use" for b in content)
        )

    def compact(
        self, body: dict[str, Any], split: Split, contract: str, state: dict[str, Any]
    ) -> dict[str, Any]:
        msgs = body["messages"]
        head: list[Any] = []
        if split.task is not None and split.task < split.observation:
            head.extend(_blocks(msgs[split.task].get("content")))
        head.append({"type": "text", "text": contract})
        head.append({"type": "text", "text": state_text(state)})
        obs = list(msgs[split.observation :])
        # Keep user/assistant alternation: the observation's leading user turn joins the
        # prefix turn instead of following it as a second user message.
        if obs and obs[0].get("role") == "user":
            first = obs.pop(0)
            head.extend(_blocks(first.get("content")))
        return {**body, "messages": [{"role": "user", "content": head}, *obs]}

    def full(self, body: dict[str, Any], contract: str) -> dict[str, Any]:
        system = body.get("system")
        if system is None or system == "":
            new_system: Any = contract
        elif isinstance(system, str):
            new_system = system + "\n\n" + contract
        else:
            new_system = [*system, {"type": "text", "text": contract}]
        return {**body, "system": new_system}

    def correction(
        self, body: dict[str, Any], reply_text: str, errors: Sequence[str]
    ) -> dict[str, Any]:
        extra = [
            {"role": "assistant", "content": reply_text or "(no text)"},
            {"role": "user", "content": correction_text(errors)},
        ]
        return {**body, "messages": [*body["messages"], *extra]}


DIALECT_CONTEXTS: dict[str, DialectContext] = {
    "openai": OpenAIContext(),
    "anthropic": AnthropicContext(),
}


def build_compact(
    dialect: str,
    body: dict[str, Any],
    allowed_keys: Sequence[str],
    state: dict[str, Any],
    form: EnvelopeForm = "block",
) -> dict[str, Any]:
    d = DIALECT_CONTEXTS[dialect]
    split = split_transcript(body["messages"], d)
    return d.compact(body, split, contract_text(allowed_keys, form), state)


def build_full(
    dialect: str, body: dict[str, Any], allowed_keys: Sequence[str], form: EnvelopeForm = "block"
) -> dict[str, Any]:
    return DIALECT_CONTEXTS[dialect].full(body, contract_text(allowed_keys, form))


def add_correction(
    dialect: str, body: dict[str, Any], reply_text: str, errors: Sequence[str]
) -> dict[str, Any]:
    return DIALECT_CONTEXTS[dialect].correction(body, reply_text, errors)
