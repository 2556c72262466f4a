"""Anthropic's server-side compaction (the ``compact_20260112`` edit), as the proxy serves
it from the session's state (pure functions; the turn is ``skillstate.web.compaction``'s).

The API's shapes (anthropic SDK ``types/beta``): the edit ``{"type": "compact_20260112",
"trigger": {"type": "input_tokens", "value"} (default 150,000), "pause_after_compaction",
"instructions"}``; the response's ``{"type": "compaction", "content", "encrypted_content"}``
content block (streamed as ``content_block_start`` and one ``compaction_delta``), with
``stop_reason: "compaction"`` when paused; later requests send the block back in an
assistant message, and everything before the last one is dropped.

Here the block's ``encrypted_content`` is a compaction token (``compaction.token``) and its
``content`` says where the history went; in its place upstream goes the state its
checkpoint committed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ProxyError
from .edits import COMPACT
from .items import restored_state, token_id

JSON = dict[str, Any]
DEFAULT_TRIGGER_TOKENS = 150_000


@dataclass(frozen=True, slots=True)
class CompactEdit:
    """A request's ``compact_20260112`` edit."""

    trigger: int
    pause: bool


def compact_edit(edits: list[JSON]) -> CompactEdit | None:
    found = [e for e in edits if e.get("type") == COMPACT]
    if not found:
        return None
    edit = found[-1]
    trigger = edit.get("trigger")
    value: Any = DEFAULT_TRIGGER_TOKENS
    if trigger is not None:
        value = trigger.get("value") if isinstance(trigger, dict) else None
        ok = isinstance(trigger, dict) and trigger.get("type") == "input_tokens"
        if not ok or isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ProxyError(
                "invalid_request",
                "compact_20260112.trigger: expected {'type': 'input_tokens', 'value': n}",
                param="context_management",
            )
    return CompactEdit(value, bool(edit.get("pause_after_compaction")))


def compaction_block(token: str, step: int) -> JSON:
    note = (
        f"[skillstate] The conversation before this point is in the session's state (step {step})."
    )
    return {"type": "compaction", "content": note, "encrypted_content": token}


def last_compaction(messages: list[Any]) -> tuple[int, int] | None:
    """(message, block) of the last compaction block of an assistant message."""
    for m in range(len(messages) - 1, -1, -1):
        msg = messages[m]
        if not isinstance(msg, dict) or msg.get("role") != "assistant":
            continue
        content = msg.get("content")
        if not isinstance(content, list):
            continue
        for b in range(len(content) - 1, -1, -1):
            block = content[b]
            if isinstance(block, dict) and block.get("type") == "compaction":
                return m, b
    return None


def after_compaction(messages: list[Any], at: tuple[int, int], state: JSON, step: int) -> list[Any]:
    """The transcript as the upstream gets it: the state in place of everything up to the
    compaction block, then what followed it."""
    m, b = at
    restored = restored_state(state, step)["content"][0]["text"]
    out: list[Any] = [{"role": "user", "content": [{"type": "text", "text": restored}]}]
    rest = messages[m]["content"][b + 1 :]
    if rest:
        out.append({**messages[m], "content": rest})
    return [*out, *messages[m + 1 :]]


def paused_message(model: str, block: JSON, token: str, usage: JSON | None) -> JSON:
    """The reply when ``pause_after_compaction``: the compaction block alone. Its id is a
    digest of the compaction's token, so the same checkpoint served again (a retry under
    its Idempotency-Key) is the same message, byte for byte."""
    return {
        "id": token_id("msg_", token, "message\n"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [block],
        "stop_reason": "compaction",
        "stop_sequence": None,
        "usage": usage or {"input_tokens": 0, "output_tokens": 0},
    }


def block_events(block: JSON, index: int) -> list[JSON]:
    """A compaction block as stream events (start, one compaction_delta, stop)."""
    return [
        {"type": "content_block_start", "index": index,
         "content_block": {"type": "compaction", "content": None}},
        {"type": "content_block_delta", "index": index,
         "delta": {"type": "compaction_delta", "content": block["content"],
                   "encrypted_content": block["encrypted_content"]}},
        {"type": "content_block_stop", "index": index},
    ]  # fmt: skip


def message_events(message: JSON) -> list[JSON]:
    """A paused reply (a compaction block only) as its event stream."""
    start = {**message, "content": [], "stop_reason": None}
    return [
        {"type": "message_start", "message": start},
        *block_events(message["content"][0], 0),
        {"type": "message_delta", "delta": {"stop_reason": "compaction", "stop_sequence": None},
         "usage": {"output_tokens": message["usage"].get("output_tokens", 0)}},
        {"type": "message_stop"},
    ]  # fmt: skip


def shifted_event(data: JSON, block: JSON) -> list[JSON]:
    """One event of a stream whose content gains ``block`` at index 0."""
    if isinstance(data.get("index"), int):
        data = {**data, "index": data["index"] + 1}
    if data.get("type") == "message_start":
        return [data, *block_events(block, 0)]
    return [data]
