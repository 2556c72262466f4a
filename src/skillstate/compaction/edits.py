"""Anthropic context editing (``context_management.edits``) applied by the proxy, for
upstreams that are not Anthropic-kind (Anthropic applies the edits itself: there the field
passes through untouched). Pure: a function of the request body.

Strategies (``anthropic`` SDK ``BetaContextManagementConfigParam``; defaults from
platform.claude.com/docs/en/build-with-claude/context-editing):

* ``clear_tool_uses_20250919``: once the prompt passes ``trigger`` (default 100,000 input
  tokens; or a count of tool uses), the results of all but the last ``keep`` tool uses
  (default 3) are replaced by a placeholder, oldest first, unless that clears fewer than
  ``clear_at_least`` tokens. Tools named in ``exclude_tools`` are never cleared;
  ``clear_tool_inputs`` (true, or a list of tool names) also empties the calls' inputs.
* ``clear_thinking_20251015``: thinking blocks of all but the last ``keep`` assistant turns
  that have them (default 1; ``"all"`` keeps every one) are removed.

The placeholder is the ``mask`` mode's (:func:`skillstate.engine.mask.placeholder`): a cleared
result keeps its block, position and ``tool_use_id``, so every call stays paired with its
result. What was done is reported as the API reports it: ``applied_edits`` entries
(``cleared_tool_uses`` / ``cleared_thinking_turns``, ``cleared_input_tokens``), only for the
edits that changed something.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..cost.tokens import estimate_tokens
from ..engine.mask import placeholder
from ..errors import ProxyError

__all__ = ["CLEAR_THINKING", "CLEAR_TOOL_USES", "COMPACT", "EditResult", "apply_edits", "edits_of"]

JSON = dict[str, Any]
CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
COMPACT = "compact_20260112"
DEFAULT_TRIGGER_TOKENS = 100_000
DEFAULT_KEEP_TOOL_USES = 3
DEFAULT_KEEP_THINKING_TURNS = 1
_THINKING = ("thinking", "redacted_thinking")


@dataclass
class EditResult:
    """The edited body (without ``context_management``) and the ``applied_edits``."""

    body: JSON
    applied: list[JSON] = field(default_factory=list)


def _bad(message: str) -> ProxyError:
    return ProxyError("invalid_request", message, param="context_management")


def edits_of(body: JSON) -> list[JSON] | None:
    """The request's ``context_management.edits`` (validated), None when it has none."""
    cm = body.get("context_management")
    if cm is None:
        return None
    if not isinstance(cm, dict):
        raise _bad("context_management: expected an object")
    edits = cm.get("edits", [])
    if not isinstance(edits, list) or not all(isinstance(e, dict) for e in edits):
        raise _bad("context_management.edits: expected a list of objects")
    for e in edits:
        if e.get("type") not in (CLEAR_TOOL_USES, CLEAR_THINKING, COMPACT):
            raise _bad(f"context_management.edits: unknown edit type {e.get('type')!r}")
    return edits


def _count(spec: Any, kinds: tuple[str, ...], default: int, where: str) -> tuple[str, int]:
    """A ``{"type": kind, "value": n}`` setting, or the default (kind ``kinds[0]``)."""
    if spec is None:
        return kinds[0], default
    if not isinstance(spec, dict) or spec.get("type") not in kinds:
        raise _bad(f"{where}: expected {{'type': one of {list(kinds)}, 'value': n}}")
    value = spec.get("value")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _bad(f"{where}.value: expected a non-negative integer")
    return str(spec["type"]), value


def _blocks(msg: Any) -> list[Any]:
    content = msg.get("content") if isinstance(msg, dict) else None
    return content if isinstance(content, list) else []


@dataclass(frozen=True, slots=True)
class _ToolUse:
    name: str
    call: tuple[int, int]  # (message, block) of the tool_use
    result: tuple[int, int] | None  # of its tool_result, when the transcript has it


def _tool_uses(messages: list[Any]) -> list[_ToolUse]:
    results: dict[str, tuple[int, int]] = {}
    for m, msg in enumerate(messages):
        for b, block in enumerate(_blocks(msg)):
            if isinstance(block, dict) and block.get("type") == "tool_result":
                results.setdefault(str(block.get("tool_use_id")), (m, b))
    uses = []
    for m, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") != "assistant":
            continue
        for b, block in enumerate(_blocks(msg)):
            if isinstance(block, dict) and block.get("type") == "tool_use":
                uses.append(
                    _ToolUse(str(block.get("name")), (m, b), results.get(str(block.get("id"))))
                )
    return uses


class _Editor:
    """Copy-on-write edits of one transcript (unchanged messages stay the same objects)."""

    def __init__(self, messages: list[Any]) -> None:
        self.messages = list(messages)
        self._copied: set[int] = set()

    def block(self, at: tuple[int, int]) -> JSON:
        block: JSON = self.messages[at[0]]["content"][at[1]]
        return block

    def replace(self, at: tuple[int, int], new: JSON) -> None:
        m, b = at
        if m not in self._copied:
            self.messages[m] = {**self.messages[m], "content": list(self.messages[m]["content"])}
            self._copied.add(m)
        self.messages[m]["content"][b] = new

    def drop_blocks(self, m: int, keep: Callable[[Any], bool]) -> None:
        content = [blk for blk in self.messages[m]["content"] if keep(blk)]
        self.messages[m] = {**self.messages[m], "content": content}
        self._copied.add(m)


def _clear_tool_uses(edit: JSON, body: JSON, ed: _Editor) -> JSON | None:
    kind, threshold = _count(
        edit.get("trigger"), ("input_tokens", "tool_uses"), DEFAULT_TRIGGER_TOKENS, "trigger"
    )
    _, keep = _count(edit.get("keep"), ("tool_uses",), DEFAULT_KEEP_TOOL_USES, "keep")
    _, at_least = _count(edit.get("clear_at_least"), ("input_tokens",), 0, "clear_at_least")
    exclude = edit.get("exclude_tools") or []
    inputs = edit.get("clear_tool_inputs", False)
    if not isinstance(exclude, list) or not isinstance(inputs, (bool, list)):
        raise _bad("exclude_tools must be a list; clear_tool_inputs a boolean or a list")
    uses = _tool_uses(ed.messages)
    size = (
        len(uses)
        if kind == "tool_uses"
        else estimate_tokens([body.get("system"), ed.messages, body.get("tools")])
    )
    if size <= threshold:
        return None
    clearable = [u for u in uses if u.name not in exclude]
    old = clearable[: max(0, len(clearable) - keep)]
    cleared_tokens, cleared = 0, 0
    plan: list[tuple[tuple[int, int], JSON]] = []
    for use in old:
        changed = False
        if use.result is not None:
            block = ed.block(use.result)
            content = block.get("content", "")
            stand_in = placeholder(content)
            if content != stand_in:
                plan.append((use.result, {**block, "content": stand_in}))
                cleared_tokens += max(0, estimate_tokens(content) - estimate_tokens(stand_in))
                changed = True
        if inputs is True or (isinstance(inputs, list) and use.name in inputs):
            call = ed.block(use.call)
            if call.get("input") not in ({}, None):
                plan.append((use.call, {**call, "input": {}}))
                cleared_tokens += max(0, estimate_tokens(call.get("input")) - 1)
                changed = True
        cleared += changed
    if cleared == 0 or cleared_tokens < at_least:
        return None
    for at, new in plan:
        ed.replace(at, new)
    return {
        "type": CLEAR_TOOL_USES,
        "cleared_tool_uses": cleared,
        "cleared_input_tokens": cleared_tokens,
    }


def _clear_thinking(edit: JSON, ed: _Editor) -> JSON | None:
    spec = edit.get("keep")
    if spec == "all" or (isinstance(spec, dict) and spec.get("type") == "all"):
        return None
    _, keep = _count(spec, ("thinking_turns",), DEFAULT_KEEP_THINKING_TURNS, "keep")
    turns = [
        m
        for m, msg in enumerate(ed.messages)
        if isinstance(msg, dict)
        and msg.get("role") == "assistant"
        and any(isinstance(b, dict) and b.get("type") in _THINKING for b in _blocks(msg))
    ]
    old = turns[: max(0, len(turns) - keep)]
    if not old:
        return None
    tokens = 0
    for m in old:
        gone = [
            b for b in _blocks(ed.messages[m]) if isinstance(b, dict) and b.get("type") in _THINKING
        ]
        tokens += estimate_tokens(gone)
        ed.drop_blocks(m, lambda b: not (isinstance(b, dict) and b.get("type") in _THINKING))
        if not ed.messages[m]["content"]:  # a turn that was only thinking keeps its place
            ed.messages[m]["content"] = [{"type": "text", "text": placeholder(gone)}]
    return {
        "type": CLEAR_THINKING,
        "cleared_thinking_turns": len(old),
        "cleared_input_tokens": tokens,
    }


def apply_edits(body: JSON, edits: list[JSON]) -> EditResult:
    """``body`` with ``edits`` applied in order and ``context_management`` removed (the
    compaction edit, ``compact_20260112``, is the caller's: it is skipped here)."""
    messages = body.get("messages")
    ed = _Editor(messages if isinstance(messages, list) else [])
    applied: list[JSON] = []
    for edit in edits:
        kind = edit.get("type")
        done = None
        if kind == CLEAR_TOOL_USES:
            done = _clear_tool_uses(edit, body, ed)
        elif kind == CLEAR_THINKING:
            done = _clear_thinking(edit, ed)
        if done is not None:
            applied.append(done)
    out = {k: v for k, v in body.items() if k != "context_management"}
    if isinstance(messages, list):
        out["messages"] = ed.messages
    return EditResult(out, applied)
