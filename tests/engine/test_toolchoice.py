"""engine.toolchoice: which tool_choice values make the reply a call the client runs, in the
three wire formats."""

from __future__ import annotations

from typing import Any

import pytest

from skillstate.engine.toolchoice import forces_tool_call

FORCING: list[Any] = [
    "required",  # chat completions, Responses
    {"type": "function", "function": {"name": "f"}},  # chat completions
    {"type": "custom", "custom": {"name": "apply_patch"}},
    {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": []}},
    {"type": "any"},  # Messages
    {"type": "tool", "name": "f"},
    {"type": "function", "name": "f"},  # Responses
    {"type": "allowed_tools", "mode": "required", "tools": []},
]
FREE: list[Any] = [
    None,
    "auto",
    "none",
    {"type": "auto"},
    {"type": "none"},
    {"type": "auto", "disable_parallel_tool_use": True},
    {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}},
    {"type": "allowed_tools", "mode": "auto", "tools": []},
    {"type": "web_search"},  # a hosted tool: the provider runs it, text may follow
    {"type": "mcp", "server_label": "deepwiki"},
    ["required"],
    7,
]


@pytest.mark.parametrize("choice", FORCING)
def test_a_forced_choice_is_read_in_every_format(choice: Any) -> None:
    assert forces_tool_call({"tool_choice": choice}) is True


@pytest.mark.parametrize("choice", FREE)
def test_a_free_or_hosted_choice_is_not(choice: Any) -> None:
    body: dict[str, Any] = {} if choice is None else {"tool_choice": choice}
    assert forces_tool_call(body) is False
