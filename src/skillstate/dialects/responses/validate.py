"""Structural checks of a Responses API request (``POST /v1/responses``): types and required
members, so the translators and the state context can read the body without checking again.
Values an upstream may refuse (an unknown model, a tool type) are the upstream's to judge."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..base import JSON
from ..checks import bad_request as _bad
from ..checks import check_bounds, is_one_of, validate_allowed_tools

_ROLES = frozenset({"user", "assistant", "system", "developer"})
_TOOL_CHOICE_MODES = frozenset({"none", "auto", "required"})
_FORMATS = frozenset({"text", "json_object", "json_schema"})
_WINDOWS = frozenset({None, "soonest", "2h", "8h"})  # background_options.completion_window
# Every input item type the API takes (the openai SDK's ResponseInputItemParam union, 3.57):
# one of these goes to a Responses upstream as it came (the translations to other kinds carry
# message, function_call and function_call_output; see translate.input_to_messages); any
# other type is a 400 here, as it is there, instead of an item dropped without a word.
INPUT_ITEM_TYPES = frozenset(
    {
        "message",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "reasoning",
        "compaction",
        "compaction_trigger",
        "item_reference",
        "file_search_call",
        "web_search_call",
        "computer_call",
        "computer_call_output",
        "code_interpreter_call",
        "image_generation_call",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "mcp_call",
        "tool_search_call",
        "tool_search_output",
        "additional_tools",
        "configuration_update",
        "program",
        "program_output",
    }
)
# What a required member of an item must be: a check and its name in the 400's message.
_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "id": (lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
    "string": (lambda v: isinstance(v, str), "a string"),
    "text or parts": (lambda v: isinstance(v, (str, list)), "a string or an array"),
    "array": (lambda v: isinstance(v, list), "an array"),
    "object": (lambda v: isinstance(v, dict), "an object"),
    "boolean": (lambda v: isinstance(v, bool), "a boolean"),
    "patch outcome": (lambda v: v in ("completed", "failed"), '"completed" or "failed"'),
}
_STRING_KINDS = frozenset({"id", "string", "patch outcome"})
# The members each client call and its output require (the openai SDK's input item types,
# 3.57, their Required members; dialects.responses.items.CLIENT_CALLS): the ids that pair
# a call with its output and what the call and its output say. Left out, as the API fills
# them on the items it returns and a client may send its own without them: a call's
# ``status``, a local shell or computer call's ``id`` and ``pending_safety_checks``.
_REQUIRED: dict[str, tuple[tuple[str, str], ...]] = {
    "function_call": (("call_id", "id"), ("name", "id"), ("arguments", "string")),
    # call_id is not Required here in the SDK 3.57 (``Optional[str]``; a program's calls are
    # answered by ``caller``): an upstream of the Responses kind judges one without it, and
    # a translation, which must pair it with its call, refuses it (translate._tool_message)
    "function_call_output": (("output", "text or parts"),),
    "custom_tool_call": (("call_id", "id"), ("name", "id"), ("input", "string")),
    "custom_tool_call_output": (("call_id", "id"), ("output", "text or parts")),
    "local_shell_call": (("call_id", "id"), ("action", "object")),
    # its ``id`` is the local shell call's call_id
    "local_shell_call_output": (("id", "id"), ("output", "string")),
    "shell_call": (("call_id", "id"), ("action", "object")),
    "shell_call_output": (("call_id", "id"), ("output", "array")),
    "apply_patch_call": (("call_id", "id"), ("operation", "object")),
    "apply_patch_call_output": (("call_id", "id"), ("status", "patch outcome")),
    "computer_call": (("call_id", "id"),),
    "computer_call_output": (("call_id", "id"), ("output", "object")),
    "mcp_approval_request": (
        ("id", "id"),
        ("server_label", "string"),
        ("name", "id"),
        ("arguments", "string"),
    ),
    "mcp_approval_response": (("approval_request_id", "id"), ("approve", "boolean")),
}
# Content parts whose text the translations to other upstream kinds read (and join).
_TEXT_OF_PART = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}


def validate_responses_request(body: JSON, checked: int = 0) -> None:
    """Raise ProxyError 400 naming the first structural problem of a Responses request.
    ``checked``: the leading input items that passed this check before (each item is judged
    on its own; ``skillstate.sessions.transcripts``)."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _bad("'model' is required and must be a non-empty string", "model")
    _validate_request(body, checked)


def validate_input_tokens_request(body: JSON, checked: int = 0) -> None:
    """The checks of ``POST /responses/input_tokens``: a turn's, but ``model`` is optional
    there (the SDK's InputTokenCountParams and the API reference: "model: optional string");
    given, it is a non-empty string."""
    if "model" in body and (not isinstance(body["model"], str) or not body["model"]):
        raise _bad("'model' must be a non-empty string", "model")
    _validate_request(body, checked)


def _validate_request(body: JSON, checked: int) -> None:
    raw = body.get("input")
    if isinstance(raw, list):
        for i, item in enumerate(raw[checked:] if checked else raw, checked):
            _validate_item(item, f"input[{i}]")
    elif not isinstance(raw, str) and not (raw is None and body.get("previous_response_id")):
        raise _bad("'input' must be a string or an array of input items", "input")
    for key in ("instructions", "previous_response_id", "prompt_cache_key", "user"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise _bad(f"'{key}' must be a string", key)
    for key in ("stream", "store", "parallel_tool_calls", "background"):
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise _bad(f"'{key}' must be a boolean", key)
    if body.get("background") is True and body.get("store") is False:
        raise _bad("a background response is stored: 'store' cannot be false", "store")
    options = body.get("background_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("'background_options' must be an object", "background_options")
    if isinstance(options, dict) and options.get("completion_window") not in _WINDOWS:
        raise _bad(
            "'background_options.completion_window' must be 'soonest', '2h' or '8h'",
            "background_options.completion_window",
        )
    check_bounds(body, "max_output_tokens", 1, None, integer=True)
    check_bounds(body, "temperature", 0, 2)
    check_bounds(body, "top_p", 0, 1)
    check_bounds(body, "top_logprobs", 0, 20, integer=True)
    for key in ("metadata", "reasoning", "text"):
        if body.get(key) is not None and not isinstance(body[key], dict):
            raise _bad(f"'{key}' must be an object", key)
    if body.get("include") is not None and not (
        isinstance(body["include"], list) and all(isinstance(x, str) for x in body["include"])
    ):
        raise _bad("'include' must be an array of strings", "include")
    if body.get("tools") is not None:
        _validate_tools(body["tools"])
    if body.get("tool_choice") is not None:
        _validate_tool_choice(body["tool_choice"])
    text = body.get("text")
    if isinstance(text, dict) and text.get("format") is not None:
        _validate_format(text["format"])


def _validate_item(item: Any, path: str) -> None:
    if not isinstance(item, dict):
        raise _bad(f"{path} must be an object", path)
    itype = item.get("type", "message")
    if not isinstance(itype, str):
        raise _bad(f"{path}.type must be a string", f"{path}.type")
    if itype not in INPUT_ITEM_TYPES:
        raise _bad(
            f"Invalid value: {itype[:64]!r} for '{path}.type'. Supported values are: "
            + ", ".join(repr(t) for t in sorted(INPUT_ITEM_TYPES)),
            f"{path}.type",
            "invalid_value",
        )
    if itype == "message":
        role = item.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            allowed = ", ".join(sorted(_ROLES))
            raise _bad(f"{path}.role must be one of {allowed}; got {role!r}", f"{path}.role")
        content = item.get("content")
        if isinstance(content, list):
            for k, part in enumerate(content):
                _validate_part(part, f"{path}.content[{k}]")
        elif not isinstance(content, str):
            raise _bad(f"{path}.content must be a string or an array of parts", path)
    else:
        _validate_members(item, itype, path)
    # the other types go to a Responses upstream as they are, and no other kind reads them


def _validate_members(item: dict[str, Any], itype: str, path: str) -> None:
    """The members a call or output item requires (``_REQUIRED``), each of its JSON type
    (the 400's code as the API names the fault: ``_fault``), and a function call output's
    optional ``call_id`` a non-empty string when given;
    the parts of an output given as an array are checked as a message's are."""
    for key, kind in _REQUIRED.get(itype, ()):
        accepts, what = _KINDS[kind]
        value = item.get(key)
        if not accepts(value):
            raise _bad(f"{path}.{key}: required, {what}", f"{path}.{key}", _fault(value, kind))
    call_id = item.get("call_id")
    if itype == "function_call_output" and call_id is not None and not _KINDS["id"][0](call_id):
        raise _bad(
            f"{path}.call_id: must be a non-empty string", f"{path}.call_id", _fault(call_id, "id")
        )
    output = item.get("output")
    if itype in ("function_call_output", "custom_tool_call_output") and isinstance(output, list):
        for k, part in enumerate(output):
            _validate_part(part, f"{path}.output[{k}]")
    elif itype == "shell_call_output" and isinstance(output, list):
        for k, chunk in enumerate(output):
            if not isinstance(chunk, dict):
                raise _bad(f"{path}.output[{k}] must be an object", f"{path}.output[{k}]")


def _fault(value: Any, kind: str) -> str:
    """The API's code for a required member that fails its check: absent, of another JSON
    type, or a string that is not one the member takes (an empty id, another outcome)."""
    if value is None:
        return "missing_required_parameter"
    return "invalid_value" if isinstance(value, str) and kind in _STRING_KINDS else "invalid_type"


def _validate_part(part: Any, path: str) -> None:
    """A content part: an object with a type, its text (or refusal) a string when it has one."""
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise _bad(f"{path} must be an object with a type", path)
    member = _TEXT_OF_PART.get(part["type"])
    if member is not None and not isinstance(part.get(member), str):
        raise _bad(f"{path}.{member} must be a string", f"{path}.{member}")


def _validate_tools(tools: Any) -> None:
    if not isinstance(tools, list):
        raise _bad("'tools' must be an array of tool objects", "tools")
    for i, tool in enumerate(tools):
        path = f"tools[{i}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise _bad(f"{path} must be an object with a string 'type'", path)
        if tool["type"] not in ("function", "custom"):
            continue  # hosted and other tools: the upstream's to accept or refuse
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise _bad(f"{path}.name: required, a non-empty string", f"{path}.name")
        if tool["type"] == "custom":
            _validate_custom_format(tool.get("format"), f"{path}.format")
        elif tool.get("parameters") is not None and not isinstance(tool["parameters"], dict):
            raise _bad(f"{path}.parameters must be an object", f"{path}.parameters")


def _validate_custom_format(fmt: Any, path: str) -> None:
    """A custom tool's ``format`` (optional): ``{"type": "text"}`` or ``{"type": "grammar",
    "syntax": "lark" | "regex", "definition": str}`` (the SDK's CustomToolInputFormat); a
    chat upstream is sent the grammar re-nested, so its members must be there."""
    if fmt is None:
        return
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "grammar"):
        raise _bad(f'{path}: must be an object with type "text" or "grammar"', path)
    if fmt["type"] == "grammar":
        if fmt.get("syntax") not in ("lark", "regex"):
            raise _bad(f'{path}.syntax: must be "lark" or "regex"', f"{path}.syntax")
        if not isinstance(fmt.get("definition"), str):
            raise _bad(f"{path}.definition: required, a string", f"{path}.definition")


def _validate_tool_choice(choice: Any) -> None:
    if isinstance(choice, str) and choice in _TOOL_CHOICE_MODES:
        return
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        validate_allowed_tools(choice.get("mode"), choice.get("tools"), "tool_choice")
        return
    if (
        isinstance(choice, dict)
        and isinstance(choice.get("type"), str)
        and (
            choice["type"] not in ("function", "custom")
            or (isinstance(choice.get("name"), str) and choice["name"])
        )
    ):
        return
    raise _bad(
        'tool_choice: must be "none", "auto", "required" or {"type": "function", "name": ...}',
        "tool_choice",
    )


def _validate_format(fmt: Any) -> None:
    if not isinstance(fmt, dict) or not is_one_of(fmt.get("type"), _FORMATS):
        raise _bad(
            'text.format: must be an object with type "text", "json_object" or "json_schema"',
            "text.format",
        )
    if fmt["type"] == "json_schema" and (
        not isinstance(fmt.get("name"), str) or not isinstance(fmt.get("schema"), dict)
    ):
        raise _bad("text.format: json_schema needs a 'name' and a 'schema' object", "text.format")
