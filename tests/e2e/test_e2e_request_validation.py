"""Malformed requests through a real proxy against the fake provider, sent with the real SDKs
and raw HTTP: each one a 400 in the route's dialect (OpenAI's error object on chat
completions and Responses, Anthropic's on Messages) naming the member at fault, and nothing
sent upstream. Beside them, the shapes the real APIs accept that look alike (a role:"system"
message inside Anthropic ``messages``, ``max_tokens: 0``, every Responses input item type)
still go through.

Where each rule comes from (the providers' SDKs are generated from their API references):
chat content parts per role and their required members, the numeric bounds and the tool
message pairing are the openai SDK's ChatCompletion*Param types and docstrings and the API's
own 400s; Anthropic's ranges, ``thinking.budget_tokens >= 1024``, ``max_tokens: 0`` (cache
pre-warming) and role:"system" messages are the anthropic SDK's MessageCreateParams and
SystemMessageParam; the Responses item types are the openai SDK's ResponseInputItemParam."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import InProcessProxy, StartProxy
from tests.fakeprovider import FakeProvider, RecordedRequest, Reply
from tests.helpers import ant, envelope, oai, session

JSON = dict[str, Any]
MODES = ["passthrough", "state"]
ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01", "x-api-key": "k"}


def start(fake: FakeProvider, start_proxy: StartProxy, kind: str) -> InProcessProxy:
    url = fake.url if kind == "anthropic" else fake.url + "/v1"
    up = {"name": "up", "url": url, "kind": kind, "api_key": "sk-upstream"}
    return start_proxy(None, config={"upstreams": [up], "schema": ["facts", "notes"]})


def sent(fake: FakeProvider) -> list[RecordedRequest]:
    return list(fake.requests)


def error_of(r: httpx.Response, anthropic_shape: bool) -> JSON:
    """The error object, after checking the envelope is the dialect's own."""
    body = r.json()
    if anthropic_shape:
        assert body["type"] == "error" and set(body) == {"type", "error"}, r.text
    else:
        assert list(body) == ["error"], r.text
    error: JSON = body["error"]
    assert error["type"] == "invalid_request_error", r.text
    return error


def post(p: InProcessProxy, path: str, body: JSON, mode: str, **headers: str) -> httpx.Response:
    h = {**session("v1"), "x-skillstate-mode": mode, **headers}
    return httpx.post(p.url + path, json=body, headers=h, timeout=30)


# -- chat completions ------------------------------------------------------------------------

USER = {"role": "user", "content": "Fix the failing test"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "sh", "arguments": "{}"}}
CALL2 = {"id": "call_2", "type": "function", "function": {"name": "sh", "arguments": "{}"}}


def parts(*p: Any) -> list[JSON]:
    return [USER, {"role": "user", "content": list(p)}]


# case -> (messages or extra body fields, param, code, words in the message)
CHAT_CASES: dict[str, tuple[JSON, str, str | None, str]] = {
    "part not an object": (
        {"messages": parts("hi")},
        "messages[1].content[0]",
        "invalid_type",
        "expected an object, but got a string",
    ),
    "part type not a string": (
        {"messages": parts({"type": 3, "text": "hi"})},
        "messages[1].content[0].type",
        "invalid_type",
        "expected a string",
    ),
    "part without a type": (
        {"messages": parts({"text": "hi"})},
        "messages[1].content[0].type",
        "missing_required_parameter",
        "Missing required parameter",
    ),
    "text part without text": (
        {"messages": parts({"type": "text"})},
        "messages[1].content[0].text",
        "missing_required_parameter",
        "Missing required parameter: 'messages[1].content[0].text'",
    ),
    "text part with a number": (
        {"messages": parts({"type": "text", "text": 7})},
        "messages[1].content[0].text",
        "invalid_type",
        "expected a string, but got a number",
    ),
    "image_url without url": (
        {
            "messages": parts(
                {"type": "text", "text": "see"}, {"type": "image_url", "image_url": {}}
            )
        },
        "messages[1].content[1].image_url.url",
        "missing_required_parameter",
        "image_url.url",
    ),
    "image_url a string": (
        {"messages": parts({"type": "image_url", "image_url": "https://x/y.png"})},
        "messages[1].content[0].image_url",
        "invalid_type",
        "expected an object",
    ),
    "unknown part type": (
        {"messages": parts({"type": "input_text", "text": "hi"})},
        "messages[1].content[0].type",
        "invalid_value",
        "Supported values are: 'text', 'image_url', 'input_audio', 'file'",
    ),
    "image in a system message": (
        {
            "messages": [
                {"role": "system", "content": [{"type": "image_url", "image_url": {"url": "u"}}]},
                USER,
            ]
        },
        "messages[0].content[0].type",
        "invalid_value",
        "Supported values are: 'text'",
    ),
    "tool message answering nothing": (
        {"messages": [USER, {"role": "tool", "tool_call_id": "call_9", "content": "ok"}]},
        "messages[1].tool_call_id",
        None,
        "must answer a tool call",
    ),
    "tool message answering another id": (
        {
            "messages": [
                USER,
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_9", "content": "ok"},
            ]
        },
        "messages[2].tool_call_id",
        None,
        "'call_9'",
    ),
    "a call left unanswered": (
        {
            "messages": [
                USER,
                {"role": "assistant", "content": None, "tool_calls": [CALL, CALL2]},
                {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
                {"role": "user", "content": "and?"},
            ]
        },
        "messages[1].tool_calls",
        None,
        "no answer for: call_2",
    ),
    "tool message without content": (
        {
            "messages": [
                USER,
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1"},
            ]
        },
        "messages[2].content",
        "missing_required_parameter",
        "Missing required parameter: 'messages[2].content'",
    ),
    # A list or an object where a string names the kind: unhashable, so a set lookup raised
    # (a 500, and the connection closed under the client's next request).
    "response_format type a list": (
        {"response_format": {"type": ["json_object"]}},
        "response_format",
        None,
        "must be an object with type",
    ),
    "response_format type an object": (
        {"response_format": {"type": {"json_object": True}}},
        "response_format",
        None,
        "must be an object with type",
    ),
    "temperature above 2": ({"temperature": 2.5}, "temperature", "invalid_value", "between 0"),
    "top_p above 1": ({"top_p": 1.5}, "top_p", "invalid_value", "between 0 and 1"),
    "n of 0": ({"n": 0}, "n", "invalid_value", "between 1 and 128"),
    "negative max_tokens": ({"max_tokens": -5}, "max_tokens", "invalid_value", "at least 0"),
    "huge penalty": (
        {"presence_penalty": 1e300},
        "presence_penalty",
        "invalid_value",
        "between -2 and 2",
    ),
    "temperature a string": ({"temperature": "0.2"}, "temperature", "invalid_type", "a string"),
    "seed a float": ({"seed": 1.5}, "seed", "invalid_type", "an integer"),
    "logprobs a string": ({"logprobs": "yes"}, "logprobs", None, "boolean"),
}


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("mode", MODES)
def test_chat_completions_refuse_malformed_requests_before_upstream(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, mode: str
) -> None:
    p = start(fake, start_proxy, kind)
    for case, (fields, param, code, says) in CHAT_CASES.items():
        body = {"model": "m-1", "messages": [USER], **fields}
        for stream in (False, True):
            r = post(p, "/v1/chat/completions", {**body, "stream": stream}, mode)
            assert r.status_code == 400, (case, r.text)
            err = error_of(r, anthropic_shape=False)
            assert err["param"] == param, (case, err)
            assert says in err["message"], (case, err)
            if code is not None:
                assert err["code"] == code, (case, err)
    assert sent(fake) == []


def test_the_openai_sdk_surfaces_the_part_error(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai")
    with pytest.raises(openai.BadRequestError) as e:
        oai(p).chat.completions.create(
            model="m-1",
            messages=[{"role": "user", "content": [{"type": "text"}]}],  # type: ignore[typeddict-item]
        )
    assert e.value.status_code == 400
    assert e.value.param == "messages[0].content[0].text"  # type: ignore[attr-defined]
    assert e.value.code == "missing_required_parameter"
    assert sent(fake) == []


@pytest.mark.parametrize("mode", MODES)
def test_chat_completions_take_what_the_api_takes(
    fake: FakeProvider, start_proxy: StartProxy, mode: str
) -> None:
    """Every part type a role takes, a full tool round, the bounds' own edges: served."""
    p = start(fake, start_proxy, "openai")
    fake.enqueue(Reply(text=envelope({"notes": "ok"})))
    messages: list[JSON] = [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in the picture?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
                {"type": "file", "file": {"file_id": "file-1"}},
            ],
        },
        {"role": "assistant", "content": None, "tool_calls": [CALL, CALL2]},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "b"}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
        {"role": "user", "content": "go on"},
    ]
    r = post(
        p,
        "/v1/chat/completions",
        {"model": "m-1", "messages": messages, "temperature": 2, "top_p": 0, "n": 1, "seed": -3},
        mode,
    )
    assert r.status_code == 200, r.text
    assert len(sent(fake)) == 1


# -- Anthropic Messages ----------------------------------------------------------------------

A_USER = {"role": "user", "content": "Fix the failing test"}
TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"cmd": "ls"}}


def result(tid: str) -> JSON:
    return {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": tid, "content": "x"}],
    }


ANTHROPIC_CASES: dict[str, tuple[JSON, str, str]] = {
    "temperature above 1": ({"temperature": 1.5}, "temperature", "between 0 and 1"),
    "negative temperature": ({"temperature": -0.5}, "temperature", "between 0 and 1"),
    "top_p above 1": ({"top_p": 2}, "top_p", "between 0 and 1"),
    "top_k a float": ({"top_k": 2.5}, "top_k", "an integer"),
    "negative max_tokens": ({"max_tokens": -1}, "max_tokens", "non-negative"),
    "thinking budget below 1024": (
        {"thinking": {"type": "enabled", "budget_tokens": 512}},
        "thinking.budget_tokens",
        ">= 1024",
    ),
    "thinking budget missing": (
        {"thinking": {"type": "enabled"}},
        "thinking.budget_tokens",
        ">= 1024",
    ),
    "thinking not an object": ({"thinking": True}, "thinking", "an object"),
    "image in a system message": (
        {
            "messages": [
                A_USER,
                {
                    "role": "system",
                    "content": [{"type": "image", "source": {"type": "url", "url": "u"}}],
                },
            ]
        },
        "messages[1].content[0].type",
        "a system message may only contain",
    ),
    "tool_result answering nothing": (
        {"messages": [A_USER, {"role": "assistant", "content": "ok"}, result("toolu_1")]},
        "messages[2].content[0].tool_use_id",
        "unexpected tool_use_id 'toolu_1'",
    ),
    "tool_result answering an older turn": (
        {
            "messages": [
                A_USER,
                {"role": "assistant", "content": [TOOL_USE]},
                result("toolu_1"),
                {"role": "assistant", "content": "done"},
                result("toolu_1"),
            ]
        },
        "messages[4].content[0].tool_use_id",
        "corresponding tool_use block",
    ),
    "tool_choice type a list": (
        {"tool_choice": {"type": ["auto"]}},
        "tool_choice",
        "must be an object with type",
    ),
    "tool_use ids used twice": (
        {
            "messages": [
                A_USER,
                {"role": "assistant", "content": [TOOL_USE]},
                result("toolu_1"),
                {"role": "assistant", "content": [TOOL_USE]},
                result("toolu_1"),
            ]
        },
        "messages[3].content[0].id",
        "tool_use ids must be unique",
    ),
}


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_messages_refuse_malformed_requests_before_upstream(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, mode: str, path: str
) -> None:
    p = start(fake, start_proxy, kind)
    for case, (fields, param, says) in ANTHROPIC_CASES.items():
        body = {"model": "m-1", "max_tokens": 2048, "messages": [A_USER], **fields}
        if path.endswith("count_tokens"):
            body.pop("max_tokens")
            if param == "max_tokens":
                continue
        r = post(p, path, body, mode, **ANTHROPIC_HEADERS)
        assert r.status_code == 400, (case, r.text)
        err = error_of(r, anthropic_shape=True)
        assert err["message"].startswith(param.split(".")[0]) or param in err["message"], err
        assert says in err["message"], (case, err)
    assert sent(fake) == []


def test_the_anthropic_sdk_surfaces_the_error(fake: FakeProvider, start_proxy: StartProxy) -> None:
    p = start(fake, start_proxy, "anthropic")
    with pytest.raises(anthropic.BadRequestError) as e:
        ant(p).messages.create(
            model="m-1",
            max_tokens=4096,
            messages=[{"role": "user", "content": "hi"}],
            thinking={"type": "enabled", "budget_tokens": 1000},
        )
    assert e.value.status_code == 400
    assert e.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "thinking.budget_tokens" in e.value.message and "1024" in e.value.message
    assert sent(fake) == []


@pytest.mark.parametrize("mode", MODES)
def test_messages_take_what_the_api_takes(
    fake: FakeProvider, start_proxy: StartProxy, mode: str
) -> None:
    """A mid-conversation role:"system" message (Claude Code sends one; no beta header is
    needed), a tool round, the ranges' edges, a
    thinking budget above max_tokens (interleaved thinking allows it) and ``max_tokens: 0``
    (prompt-cache pre-warming, sent in passthrough: a state turn needs a reply) all reach
    the upstream."""
    p = start(fake, start_proxy, "anthropic")
    messages = [
        A_USER,
        {"role": "system", "content": [{"type": "text", "text": "# Environment\ncwd: /w"}]},
        {"role": "assistant", "content": [TOOL_USE]},
        result("toolu_1"),
        {"role": "system", "content": "Be brief now."},
    ]
    fake.enqueue(Reply(text=envelope({"notes": "ok"})), Reply(text=envelope({"notes": "ok"})))
    first = {
        "model": "m-1",
        "max_tokens": 2000,
        "messages": messages,
        "temperature": 1,
        "top_p": 0,
        "top_k": 0,
        "thinking": {"type": "enabled", "budget_tokens": 4096},
    }
    r = post(p, "/v1/messages", first, mode, **ANTHROPIC_HEADERS)
    assert r.status_code == 200, r.text
    system_texts = [m for m in sent(fake)[0].json["messages"] if m.get("role") == "system"]
    assert system_texts, "the role:system messages went upstream in their place"
    prewarm = {**first, "max_tokens": 0}
    prewarm.pop("thinking")
    r = post(p, "/v1/messages", prewarm, "passthrough", **ANTHROPIC_HEADERS)
    assert r.status_code == 200, r.text
    assert sent(fake)[-1].json["max_tokens"] == 0


# -- Responses -------------------------------------------------------------------------------

# One input item of every type the API takes (the openai SDK's ResponseInputItemParam).
EVERY_ITEM: list[JSON] = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix it"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"},
    {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin"},
    {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"},
    {"type": "local_shell_call", "id": "ls_1", "call_id": "c3", "status": "completed",
     "action": {"type": "exec", "command": ["ls"], "env": {}}},
    {"type": "local_shell_call_output", "id": "c3", "output": "a.py"},
    {"type": "shell_call", "call_id": "c4", "action": {"commands": ["ls"]}},
    {"type": "shell_call_output", "call_id": "c4", "output": []},
    {"type": "apply_patch_call", "call_id": "c5", "status": "completed",
     "operation": {"type": "delete_file", "path": "x"}},
    {"type": "apply_patch_call_output", "call_id": "c5", "status": "completed"},
    {"type": "computer_call", "id": "cu_1", "call_id": "c6", "action": {"type": "screenshot"},
     "pending_safety_checks": [], "status": "completed"},
    {"type": "computer_call_output", "call_id": "c6",
     "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,AA"}},
    {"type": "web_search_call", "id": "ws_1", "status": "completed",
     "action": {"type": "search", "query": "q"}},
    {"type": "file_search_call", "id": "fs_1", "queries": ["q"], "status": "completed"},
    {"type": "code_interpreter_call", "id": "ci_1", "code": "1", "container_id": "k",
     "outputs": [], "status": "completed"},
    {"type": "image_generation_call", "id": "ig_1", "result": None, "status": "completed"},
    {"type": "mcp_list_tools", "id": "ml_1", "server_label": "s", "tools": []},
    {"type": "mcp_approval_request", "id": "ma_1", "arguments": "{}", "name": "t",
     "server_label": "s"},
    {"type": "mcp_approval_response", "approval_request_id": "ma_1", "approve": True},
    {"type": "mcp_call", "id": "mc_1", "arguments": "{}", "name": "t", "server_label": "s"},
    {"type": "tool_search_call", "arguments": {}, "call_id": "c7"},
    {"type": "tool_search_output", "call_id": "c7", "tools": []},
    {"type": "additional_tools", "tools": []},
    {"type": "configuration_update", "id": "cfg_1"},
    {"type": "item_reference", "id": "msg_1"},
    {"type": "program", "id": "p_1", "code": "1"},
    {"type": "program_output", "id": "po_1", "output": "1"},
    {"role": "user", "content": "and now?"},
]  # fmt: skip
# The proxy answers these two itself (its compaction: tests/e2e/test_e2e_compaction.py): a
# compaction item is one of its own tokens, a compaction_trigger asks it to compact.
COMPACTION_ITEMS = {"compaction", "compaction_trigger"}


def test_every_input_item_type_the_api_takes_is_listed() -> None:
    """The test's items cover the proxy's list of types, and the list is the SDK's union."""
    import typing

    from openai.types.responses import response_input_item_param as sdk

    from skillstate.dialects.responses.validate import INPUT_ITEM_TYPES

    names: set[str] = set()
    for member in typing.get_args(sdk.ResponseInputItemParam):
        hint = typing.get_type_hints(member)["type"]
        names.update(a for a in typing.get_args(hint) if isinstance(a, str))
        for inner in typing.get_args(hint):  # Optional[Literal[...]]
            names.update(a for a in typing.get_args(inner) if isinstance(a, str))
    assert names == INPUT_ITEM_TYPES
    assert {i.get("type", "message") for i in EVERY_ITEM} | COMPACTION_ITEMS == INPUT_ITEM_TYPES


@pytest.mark.parametrize("kind", ["openai-responses", "openai", "anthropic"])
@pytest.mark.parametrize("mode", MODES)
def test_an_unknown_input_item_type_is_a_400(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, mode: str
) -> None:
    p = start(fake, start_proxy, kind)
    c = oai(p, default_headers={**session("r1"), "x-skillstate-mode": mode})
    for bogus in ("bogus_call", "function_call_outputs", "", "Message"):
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as e:
                c.responses.create(
                    model="m-1",
                    input=[{"role": "user", "content": "hi"}, {"type": bogus, "call_id": "c"}],  # type: ignore[list-item,misc]
                    stream=stream,
                )
            assert e.value.status_code == 400
            assert e.value.param == "input[1].type"  # type: ignore[attr-defined]
            assert e.value.code == "invalid_value"
            assert (
                "Supported values are" in e.value.message and "'function_call'" in e.value.message
            )
    assert sent(fake) == []


def test_every_input_item_type_reaches_a_responses_upstream_untouched(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai-responses")
    fake.enqueue(Reply(text="fine"))
    r = post(p, "/v1/responses", {"model": "m-1", "input": EVERY_ITEM}, "passthrough")
    assert r.status_code == 200, r.text
    assert "x-skillstate-dropped-items" not in r.headers
    (upstream,) = sent(fake)
    assert upstream.json["input"] == EVERY_ITEM


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_items_without_a_chat_form_are_named_when_left_out(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    """A chat (or Anthropic) upstream gets the messages, function calls and outputs (and a
    chat upstream the custom tool calls and outputs); the other items have no form there, and
    the reply names their types instead of leaving them out unsaid."""
    p = start(fake, start_proxy, kind)
    fake.enqueue(Reply(text="fine"))
    r = post(p, "/v1/responses", {"model": "m-1", "input": EVERY_ITEM}, "passthrough")
    assert r.status_code == 200, r.text
    named = r.headers["x-skillstate-dropped-items"].split(",")
    sent_types = {"message", "function_call", "function_call_output"}
    if kind == "openai":
        sent_types |= {"custom_tool_call", "custom_tool_call_output"}
    assert named == sorted({i.get("type", "message") for i in EVERY_ITEM} - sent_types)
    (upstream,) = sent(fake)
    text = json.dumps(upstream.json)
    assert "Fix it" in text and "and now?" in text
    assert ("apply_patch" in text) == (kind == "openai")


RESPONSES_BOUNDS: dict[str, tuple[JSON, str]] = {
    "temperature above 2": ({"temperature": 3}, "temperature"),
    "top_p below 0": ({"top_p": -1}, "top_p"),
    "max_output_tokens of 0": ({"max_output_tokens": 0}, "max_output_tokens"),
    "top_logprobs above 20": ({"top_logprobs": 99}, "top_logprobs"),
}


def test_responses_numeric_bounds(fake: FakeProvider, start_proxy: StartProxy) -> None:
    p = start(fake, start_proxy, "openai-responses")
    for case, (fields, param) in RESPONSES_BOUNDS.items():
        r = post(p, "/v1/responses", {"model": "m-1", "input": "hi", **fields}, "passthrough")
        assert r.status_code == 400, (case, r.text)
        err = error_of(r, anthropic_shape=False)
        assert (err["param"], err["code"]) == (param, "invalid_value"), (case, err)
    assert sent(fake) == []


@pytest.mark.parametrize("kind", ["openai-responses", "openai", "anthropic"])
@pytest.mark.parametrize("mode", MODES)
def test_a_format_type_that_is_no_string_is_a_400(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, mode: str
) -> None:
    """``text.format.type`` a list or an object: a 400 naming ``text.format``. It was
    unhashable in the check's set lookup: a 500, and the connection closed under the next
    request on it."""
    p = start(fake, start_proxy, kind)
    with httpx.Client(timeout=30) as c:  # one connection: the 400 must leave it usable
        for kind_of_format in (["json_object"], {"json_object": True}):
            for stream in (False, True):
                body = {"model": "m-1", "input": "hi", "stream": stream}
                body["text"] = {"format": {"type": kind_of_format}}
                h = {**session("f1"), "x-skillstate-mode": mode}
                r = c.post(p.url + "/v1/responses", json=body, headers=h)
                assert r.status_code == 400, r.text
                err = error_of(r, anthropic_shape=False)
                assert err["param"] == "text.format", err
                assert "must be an object with type" in err["message"], err
    assert sent(fake) == []


# -- /v1/models/{id} -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_model_id_over_256_characters_is_refused_in_the_dialect(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    p = start(fake, start_proxy, kind)
    long_id = "m" * 257
    with pytest.raises(openai.BadRequestError) as e:
        oai(p).models.retrieve(long_id)
    assert e.value.param == "model" and "at most 256" in e.value.message  # type: ignore[attr-defined]
    with pytest.raises(anthropic.BadRequestError) as ea:
        ant(p).models.retrieve(long_id)
    assert ea.value.body["type"] == "error"  # type: ignore[index]
    assert "at most 256" in ea.value.message
    r = httpx.get(p.url + "/v1/models/" + "x" * 8_000, timeout=30)
    assert r.status_code in (400, 414), r.text[:200]
    assert sent(fake) == []
    # At the cap, the id is looked up (the fake knows no such model: its 404, relayed).
    with pytest.raises(openai.NotFoundError):
        oai(p).models.retrieve("m" * 256)
    assert [s.path for s in sent(fake)] == ["/v1/models/" + "m" * 256]


def test_the_pairing_is_checked_on_a_sessions_next_turn_too(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """The checks skip the transcript items a session's previous request passed; a tool
    answer appended on the next turn is still judged against the calls before it."""
    p = start(fake, start_proxy, "openai")
    fake.enqueue(Reply(text="first"))
    turn1 = [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}]
    turn1.append({"role": "tool", "tool_call_id": "call_1", "content": "ok"})
    r = post(p, "/v1/chat/completions", {"model": "m-1", "messages": turn1}, "passthrough")
    assert r.status_code == 200, r.text
    turn2 = [*turn1, {"role": "assistant", "content": "first"}]
    turn2.append({"role": "tool", "tool_call_id": "call_1", "content": "again"})
    r = post(p, "/v1/chat/completions", {"model": "m-1", "messages": turn2}, "passthrough")
    assert r.status_code == 400, r.text
    assert error_of(r, anthropic_shape=False)["param"] == "messages[4].tool_call_id"
    assert len(sent(fake)) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_malformed_client_call_output_is_a_400_through_the_sdk(
    fake: FakeProvider, start_proxy: StartProxy, stream: bool
) -> None:
    """A custom tool call's output with no call_id, and one whose output is no string (nor an
    array of parts), are refused in OpenAI's error format before anything goes upstream."""
    p = start(fake, start_proxy, "openai-responses")
    c = oai(p, default_headers={**session("r1"), "x-skillstate-mode": "state"})
    call = {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** B"}
    for output, param, code in [
        ({"type": "custom_tool_call_output", "output": "done"}, "input[2].call_id",
         "missing_required_parameter"),
        ({"type": "custom_tool_call_output", "call_id": "c2", "output": {"ok": True}},
         "input[2].output", "invalid_type"),
    ]:  # fmt: skip
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.create(
                model="m-1",
                input=[{"role": "user", "content": "patch it"}, call, output],  # type: ignore[list-item]
                stream=stream,
            )
        assert e.value.status_code == 400
        assert e.value.param == param  # type: ignore[attr-defined]
        assert e.value.code == code
        assert param in e.value.message
    assert sent(fake) == []


def test_a_function_call_output_without_call_id_is_the_upstreams_or_a_translations_400(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """The SDK (3.57) has a function_call_output's call_id optional: an openai-responses
    upstream is sent the item and answers for itself (the fake, as the API, cannot pair it);
    a translation must name the call its tool message answers: a 400 in the Responses shape,
    in the API's words for a missing member, nothing sent. An empty call_id is a 400 on both."""
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    orphan = {"type": "function_call_output", "output": "sunny"}
    items = [{"role": "user", "content": "weather?"}, call, orphan]
    native = start(fake, start_proxy, "openai-responses")
    with pytest.raises(openai.BadRequestError) as e:
        oai(native).responses.create(model="m-1", input=items)  # type: ignore[arg-type]
    assert "No tool call found for function call output" in e.value.message
    assert orphan in sent(fake)[-1].json["input"]  # went upstream as it came
    for kind in ("openai", "anthropic"):
        fake.requests.clear()
        p = start(fake, start_proxy, kind)
        with pytest.raises(openai.BadRequestError) as e:
            oai(p).responses.create(model="m-1", input=items)  # type: ignore[arg-type]
        assert (e.value.param, e.value.code) == ("input[2].call_id", "missing_required_parameter")  # type: ignore[attr-defined]
        assert e.value.body["message"].startswith(  # type: ignore[index]
            "Missing required parameter: 'input[2].call_id'."
        )
        assert sent(fake) == []
    fake.requests.clear()
    with pytest.raises(openai.BadRequestError) as e:
        oai(native).responses.create(model="m-1", input=[*items[:2], {**orphan, "call_id": ""}])  # type: ignore[arg-type]
    assert e.value.param == "input[2].call_id"  # type: ignore[attr-defined]
    assert sent(fake) == []
