"""Whether a request forces the model to call a tool, in any of the three wire formats.

A reply to such a request is a tool call (Anthropic prefills it: no text comes before the
``tool_use`` block), so it cannot carry an envelope; a window checkpoint is then folded by a
call of its own (``turn.window``, ``turn.fold``), which goes without the ``tool_choice``.
The formats' values do not collide, so one reading serves them all:

* chat completions: ``"required"``, ``{"type": "function" | "custom", ...}``,
  ``{"type": "allowed_tools", "allowed_tools": {"mode": "required"}}``;
* Messages: ``{"type": "any"}``, ``{"type": "tool", "name": ...}``;
* Responses: ``"required"``, ``{"type": "function" | "custom", "name": ...}``,
  ``{"type": "allowed_tools", "mode": "required"}``. A hosted tool's choice
  (``{"type": "web_search"}``, ``mcp``, ...) is not counted: the provider runs that call
  itself and the model goes on to write text in the same reply.
"""

from __future__ import annotations

from typing import Any

__all__ = ["forces_tool_call"]

_FORCING_TYPES = frozenset({"any", "tool", "function", "custom"})


def forces_tool_call(body: dict[str, Any]) -> bool:
    """True when ``body``'s ``tool_choice`` makes the reply a call the client runs."""
    choice = body.get("tool_choice")
    if choice == "required":
        return True
    if not isinstance(choice, dict):
        return False
    kind = choice.get("type")
    if kind == "allowed_tools":
        nested = choice.get("allowed_tools")
        mode = nested.get("mode") if isinstance(nested, dict) else choice.get("mode")
        return mode == "required"
    return kind in _FORCING_TYPES
