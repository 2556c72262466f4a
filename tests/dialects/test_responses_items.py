"""The Responses dialect's one definition of a call item (``dialects.responses.items``): which
items are calls the client runs, which are their outputs, and what every question of a
transcript or a reply makes of them (tool results, output shares, masking)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from skillstate.dialects.responses import RESPONSES
from skillstate.dialects.responses.items import (
    CALL_OUTPUTS,
    CLIENT_CALLS,
    in_model_turn,
    is_call_output,
    is_client_call,
)
from skillstate.dialects.responses.validate import INPUT_ITEM_TYPES
from skillstate.engine.mask import MASK_MARK, mask_transcript

PATCH = "*** Begin Patch\n*** Add File: a.py\n+print(1)\n*** End Patch\n"


def test_every_call_and_output_type_is_one_the_api_takes() -> None:
    assert set(CLIENT_CALLS) <= INPUT_ITEM_TYPES
    assert CALL_OUTPUTS <= INPUT_ITEM_TYPES


@pytest.mark.parametrize(
    ("item", "call", "output", "model"),
    [
        ({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}, 1, 0, 1),
        ({"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": ""}, 1, 0, 1),
        ({"type": "custom_tool_call_output", "call_id": "c", "output": "ok"}, 0, 1, 0),
        ({"type": "shell_call", "call_id": "c", "action": {"commands": []}}, 1, 0, 1),
        ({"type": "shell_call_output", "call_id": "c", "output": []}, 0, 1, 0),
        ({"type": "apply_patch_call", "call_id": "c", "operation": {}}, 1, 0, 1),
        ({"type": "apply_patch_call_output", "call_id": "c", "status": "completed"}, 0, 1, 0),
        ({"type": "local_shell_call", "call_id": "c", "action": {}}, 1, 0, 1),
        ({"type": "local_shell_call_output", "id": "c", "output": "{}"}, 0, 1, 0),
        ({"type": "computer_call", "call_id": "c", "action": {}}, 1, 0, 1),
        ({"type": "computer_call_output", "call_id": "c", "output": {}}, 0, 1, 0),
        ({"type": "mcp_approval_request", "id": "r", "name": "q", "arguments": "{}"}, 1, 0, 1),
        ({"type": "mcp_approval_response", "approval_request_id": "r", "approve": True}, 0, 1, 0),
        ({"type": "tool_search_call", "execution": "client", "arguments": {}}, 1, 0, 1),
        ({"type": "tool_search_output", "execution": "client", "tools": []}, 0, 1, 0),
        ({"type": "tool_search_call", "execution": "server", "arguments": {}}, 0, 0, 1),
        ({"type": "tool_search_output", "execution": "server", "tools": []}, 0, 0, 1),
        ({"type": "web_search_call", "action": {"type": "search"}}, 0, 0, 1),
        ({"type": "mcp_call", "name": "q", "arguments": "{}", "output": "x"}, 0, 0, 1),
        ({"type": "code_interpreter_call", "code": "1"}, 0, 0, 1),
        ({"type": "reasoning", "summary": []}, 0, 0, 1),
        ({"role": "user", "content": "hi"}, 0, 0, 0),
        ({"type": "message", "role": "assistant", "content": "hi"}, 0, 0, 0),
    ],
)
def test_what_each_item_is(item: dict[str, Any], call: int, output: int, model: int) -> None:
    assert (is_client_call(item), is_call_output(item), in_model_turn(item)) == (
        bool(call),
        bool(output),
        bool(model),
    )
    context = RESPONSES.context
    assert context.has_tool_calls(item) == bool(call)
    assert context.is_tool_result(item) == bool(output)
    user = item.get("role") == "user"
    assert context.is_user_turn(item) == (bool(output) or user)


def test_a_custom_tool_calls_input_is_its_share_of_the_output() -> None:
    """The output share the envelope took is measured against the reply's calls: a custom
    tool call's input (Codex's patch) counts, in a JSON reply and in its stream alike."""
    call = {"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": PATCH}
    hosted = {"type": "web_search_call", "action": {"type": "search", "query": "x" * 50}}
    resp = {"output": [hosted, {**call, "id": "ctc_1", "status": "completed"}]}
    assert RESPONSES.tool_call_chars(resp) == len("apply_patch") + len(PATCH)
    stripper = RESPONSES.stream_stripper()
    events = [
        {"type": "response.output_item.added", "output_index": 1, "item": {**call, "input": ""}},
        {"type": "response.custom_tool_call_input.delta", "output_index": 1, "delta": PATCH},
        {"type": "response.custom_tool_call_input.done", "output_index": 1, "input": PATCH},
        {"type": "response.output_item.done", "output_index": 1, "item": call},
    ]
    said = len("apply_patch") + len(PATCH)
    assert sum(stripper.tool_chars(e["type"], e) for e in events) == said


def test_mask_stands_in_for_the_outputs_of_every_client_call_in_the_apis_shape() -> None:
    big = "line of output\n" * 50
    shell = [{"stdout": big, "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]
    rounds: list[dict[str, Any]] = [
        ("custom_tool_call", {"input": PATCH, "name": "apply_patch"}, {"output": big}),
        ("shell_call", {"action": {"commands": ["ls"]}}, {"output": shell}),
        ("local_shell_call", {"action": {}}, {"output": big}),
        ("apply_patch_call", {"operation": {}}, {"output": big, "status": "completed"}),
    ]  # type: ignore[assignment]
    items: list[dict[str, Any]] = [{"role": "user", "content": "TASK"}]
    for k, (kind, call, out) in enumerate(rounds * 2):
        items.append({"type": kind, "call_id": f"c{k}", **call})
        items.append({"type": f"{kind}_output", "call_id": f"c{k}", **out})
    masked = mask_transcript("openai-responses", {"input": items}, keep=2)["input"]
    outputs = [m for m in masked if m.get("type", "").endswith("_output")]
    assert all(MASK_MARK in json.dumps(m) for m in outputs[:4])
    assert not any(MASK_MARK in json.dumps(m) for m in outputs[-2:])
    shell_out = outputs[1]["output"]
    assert isinstance(shell_out, list) and shell_out[0]["outcome"] == shell[0]["outcome"]
    assert shell_out[0]["stdout"].startswith(MASK_MARK) and shell_out[0]["stderr"] == ""
    assert [m for m in masked if not m.get("type", "").endswith("_output")] == [
        m for m in items if not m.get("type", "").endswith("_output")
    ]
