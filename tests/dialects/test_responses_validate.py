"""The Responses request checks of a client call's and its output's required members
(``dialects.responses.validate``): each a 400 in OpenAI's error format naming the member, as
the openai SDK's input item types mark them Required; the items the API takes still pass."""

from __future__ import annotations

from typing import Any

import pytest

from skillstate.dialects.responses.validate import validate_responses_request
from skillstate.errors import ProxyError

# One valid item of each call and output type, as the openai SDK's input item types define them.
VALID: dict[str, dict[str, Any]] = {
    "custom_tool_call": {"type": "custom_tool_call", "call_id": "c", "name": "apply_patch",
                         "input": "*** Begin Patch"},
    "custom_tool_call_output": {"type": "custom_tool_call_output", "call_id": "c",
                                "output": "done"},
    "local_shell_call": {"type": "local_shell_call", "id": "ls_1", "call_id": "c",
                         "status": "completed", "action": {"type": "exec", "command": ["ls"],
                                                           "env": {}}},
    "local_shell_call_output": {"type": "local_shell_call_output", "id": "c", "output": "a.py"},
    "shell_call": {"type": "shell_call", "call_id": "c", "action": {"commands": ["ls"]}},
    "shell_call_output": {"type": "shell_call_output", "call_id": "c", "output": [
        {"stdout": "a.py\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]},
    "apply_patch_call": {"type": "apply_patch_call", "call_id": "c", "status": "completed",
                         "operation": {"type": "delete_file", "path": "x"}},
    "apply_patch_call_output": {"type": "apply_patch_call_output", "call_id": "c",
                                "status": "failed", "output": "no such file"},
    "computer_call": {"type": "computer_call", "id": "cu_1", "call_id": "c",
                      "action": {"type": "screenshot"}, "pending_safety_checks": [],
                      "status": "completed"},
    "computer_call_output": {"type": "computer_call_output", "call_id": "c",
                             "output": {"type": "computer_screenshot", "file_id": "f"}},
    "mcp_approval_request": {"type": "mcp_approval_request", "id": "ma_1", "arguments": "{}",
                             "name": "t", "server_label": "s"},
    "mcp_approval_response": {"type": "mcp_approval_response", "approval_request_id": "ma_1",
                              "approve": False},
}  # fmt: skip

# (item type, member, a bad value or None to leave it out, the message's tail)
BAD: list[tuple[str, str, Any, str]] = [
    ("custom_tool_call", "call_id", None, "required, a non-empty string"),
    ("custom_tool_call", "call_id", "", "required, a non-empty string"),
    ("custom_tool_call", "name", None, "required, a non-empty string"),
    ("custom_tool_call", "input", None, "required, a string"),
    ("custom_tool_call", "input", {"patch": "x"}, "required, a string"),
    ("custom_tool_call_output", "call_id", None, "required, a non-empty string"),
    ("custom_tool_call_output", "output", None, "required, a string or an array"),
    ("custom_tool_call_output", "output", {"text": "x"}, "required, a string or an array"),
    ("local_shell_call", "call_id", None, "required, a non-empty string"),
    ("local_shell_call", "action", None, "required, an object"),
    ("local_shell_call", "action", "ls", "required, an object"),
    ("local_shell_call_output", "id", None, "required, a non-empty string"),
    ("local_shell_call_output", "output", None, "required, a string"),
    ("local_shell_call_output", "output", ["a.py"], "required, a string"),
    ("shell_call", "call_id", 7, "required, a non-empty string"),
    ("shell_call", "action", None, "required, an object"),
    ("shell_call_output", "call_id", None, "required, a non-empty string"),
    ("shell_call_output", "output", "a.py", "required, an array"),
    ("apply_patch_call", "call_id", None, "required, a non-empty string"),
    ("apply_patch_call", "operation", None, "required, an object"),
    ("apply_patch_call_output", "call_id", None, "required, a non-empty string"),
    ("apply_patch_call_output", "status", None, 'required, "completed" or "failed"'),
    ("apply_patch_call_output", "status", "in_progress", 'required, "completed" or "failed"'),
    ("computer_call", "call_id", None, "required, a non-empty string"),
    ("computer_call_output", "call_id", None, "required, a non-empty string"),
    ("computer_call_output", "output", None, "required, an object"),
    ("computer_call_output", "output", "data:image/png;base64,AA", "required, an object"),
    ("mcp_approval_request", "id", None, "required, a non-empty string"),
    ("mcp_approval_request", "name", None, "required, a non-empty string"),
    ("mcp_approval_request", "server_label", None, "required, a string"),
    ("mcp_approval_request", "arguments", {}, "required, a string"),
    ("mcp_approval_response", "approval_request_id", None, "required, a non-empty string"),
    ("mcp_approval_response", "approve", None, "required, a boolean"),
    ("mcp_approval_response", "approve", "yes", "required, a boolean"),
]


def body_with(item: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m-1", "input": [{"role": "user", "content": "hi"}, item]}


def test_every_call_and_output_type_the_checks_cover_has_a_valid_item() -> None:
    """Each valid item passes, and a bad case exists for every type it covers."""
    for item in VALID.values():
        validate_responses_request(body_with(item))
    assert {t for t, *_ in BAD} == set(VALID)


@pytest.mark.parametrize(("itype", "member", "value", "tail"), BAD)
def test_a_missing_or_mistyped_required_member_is_a_400_naming_it(
    itype: str, member: str, value: Any, tail: str
) -> None:
    item = {k: v for k, v in VALID[itype].items() if k != member}
    if value is not None:
        item[member] = value
    with pytest.raises(ProxyError) as e:
        validate_responses_request(body_with(item))
    assert e.value.status == 400
    assert e.value.param == f"input[1].{member}"
    assert e.value.message == f"input[1].{member}: {tail}"
    if value is None:
        assert e.value.code == "missing_required_parameter"
    else:
        assert e.value.code == ("invalid_value" if value in ("", "in_progress") else "invalid_type")


def test_members_the_api_fills_on_its_own_items_are_not_required() -> None:
    """A call's status, a computer or local shell call's id and pending safety checks, an
    apply patch output's log and a custom tool output given as parts all pass."""
    for itype, left_out in [
        ("local_shell_call", ("id", "status")),
        ("apply_patch_call", ("status",)),
        ("computer_call", ("id", "status", "pending_safety_checks", "action")),
        ("apply_patch_call_output", ("output",)),
    ]:
        validate_responses_request(
            body_with({k: v for k, v in VALID[itype].items() if k not in left_out})
        )
    parts = [{"type": "input_text", "text": "done"}, {"type": "input_image", "file_id": "f"}]
    validate_responses_request(body_with({**VALID["custom_tool_call_output"], "output": parts}))


def test_a_custom_tool_outputs_parts_and_a_shell_outputs_chunks_are_checked() -> None:
    bad_part = {**VALID["custom_tool_call_output"], "output": [{"type": "input_text"}]}
    with pytest.raises(ProxyError) as e:
        validate_responses_request(body_with(bad_part))
    assert e.value.param == "input[1].output[0].text"
    bad_chunk = {**VALID["shell_call_output"], "output": ["a.py"]}
    with pytest.raises(ProxyError) as e:
        validate_responses_request(body_with(bad_chunk))
    assert e.value.param == "input[1].output[0]"


@pytest.mark.parametrize(("call_id", "code"), [("", "invalid_value"), (7, "invalid_type")])
def test_a_function_call_outputs_call_id_is_optional_but_an_id_when_given(
    call_id: Any, code: str
) -> None:
    """The SDK 3.57's FunctionCallOutput has ``call_id: Optional[str]`` (every other output
    requires its call's id): left out or null it passes (the upstream, or a translation,
    judges it); given, it is a non-empty string."""
    output = {"type": "function_call_output", "output": "sunny"}
    validate_responses_request(body_with(output))
    validate_responses_request(body_with({**output, "call_id": None}))
    with pytest.raises(ProxyError) as e:
        validate_responses_request(body_with({**output, "call_id": call_id}))
    assert (e.value.param, e.value.code) == ("input[1].call_id", code)
