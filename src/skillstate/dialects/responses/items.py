"""What a Responses API item is, for the proxy's questions of a transcript or a reply: does
this reply call a tool, which items are tool results, which belong to the model's turn.

The API has more calls than ``function_call`` (the openai SDK's ResponseOutputItem and
ResponseInputItemParam unions). Two kinds matter here:

* **client calls**: the model asks the client to run something and the client answers with
  an output item paired by ``call_id`` (an MCP approval request by its ``id``): a function
  call, a custom tool call (Codex's ``apply_patch`` freeform tool), a local shell, shell or
  apply_patch call, a computer action, an MCP approval request, a tool search the client
  executes. A reply with one of these is a tool call: the agent's loop goes on with the
  outputs, so it needs no text for the user, and its envelope is optional (``tool-noop``).
* **hosted calls**: the API ran the tool within the response and the item carries its result
  (web and file search, code interpreter, image generation, an MCP call, MCP tool listing,
  programmatic tool calling's program): part of the model's own turn, like reasoning. A
  reply with only these and text is a final answer, judged as a text reply.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

# A client call's type -> the type of the item the client answers it with.
CLIENT_CALLS: Final = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "local_shell_call": "local_shell_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "computer_call": "computer_call_output",
    "mcp_approval_request": "mcp_approval_response",
    "tool_search_call": "tool_search_output",  # when the client executes it
}
CALL_OUTPUTS: Final = frozenset(CLIENT_CALLS.values())
# Executed by the client or the server, as the item's ``execution`` says.
_EITHER_SIDE: Final = frozenset({"tool_search_call", "tool_search_output"})
# Items of the model's turn besides its messages and client calls.
_MODEL_TURN: Final = frozenset(
    {
        "reasoning",
        "web_search_call",
        "file_search_call",
        "code_interpreter_call",
        "image_generation_call",
        "mcp_call",
        "mcp_list_tools",
        "program",
        "program_output",
    }
)


def item_type(item: Any) -> str:
    """An item's type ("message" when it has none, as the API reads it; "" for no item)."""
    if not isinstance(item, dict):
        return ""
    t = item.get("type", "message")
    return t if isinstance(t, str) else ""


def _client_side(item: dict[str, Any]) -> bool:
    return item.get("execution") == "client"


def is_client_call(item: Any) -> bool:
    """A call the client runs and answers with an output item (see the module docstring)."""
    t = item_type(item)
    return t in CLIENT_CALLS and (t not in _EITHER_SIDE or _client_side(item))


def is_call_output(item: Any) -> bool:
    """The client's output for one of its calls: a tool result."""
    t = item_type(item)
    return t in CALL_OUTPUTS and (t not in _EITHER_SIDE or _client_side(item))


def in_model_turn(item: Any) -> bool:
    """An item of the model's turn that is no message: reasoning, a client call, a hosted
    call (with a tool search the server ran, and its output)."""
    t = item_type(item)
    server_ran = t in _EITHER_SIDE and not _client_side(item)
    return t in _MODEL_TURN or server_ran or is_client_call(item)


def call_chars(item: Any) -> int:
    """Characters of what a client call says (its name and its input: arguments, a custom
    tool's input, an action or operation), the share of a reply's output it took; 0 for
    any other item."""
    if not is_client_call(item):
        return 0
    total = len(str(item.get("name") or ""))
    for key in ("arguments", "input", "action", "operation"):
        value = item.get(key)
        if isinstance(value, str):
            total += len(value)
        elif value is not None:
            total += len(orjson.dumps(value, default=str))
    return total
