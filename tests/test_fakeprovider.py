"""The fake provider must be indistinguishable from the real APIs to the official SDKs."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from openai.types.responses.input_token_count_params import InputTokenCountParams

from tests.fakeprovider import (
    DEFAULT_TEXT,
    INPUT_TOKENS_FIELDS,
    FakeProvider,
    Reply,
    ToolCall,
    estimate_tokens,
)

USER = [{"role": "user", "content": "hello there"}]
WEATHER = [("get_weather", {"city": "Oslo"}), ("get_time", {"tz": "CET"}), ("noop", {})]


@pytest.fixture(scope="module")
def server():
    with FakeProvider() as fp:
        yield fp


@pytest.fixture
def fp(server):
    server.reset()
    yield server
    server.reset()


@pytest.fixture
def oai(fp):
    with openai.OpenAI(base_url=fp.url + "/v1", api_key="sk-test", max_retries=0) as c:
        yield c


@pytest.fixture
def ant(fp):
    with anthropic.Anthropic(base_url=fp.url, api_key="sk-ant-test", max_retries=0) as c:
        yield c


def sse_data(raw: bytes) -> list[str]:
    return [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]


def post(fp, path, body, headers=None, **kw):
    h = {"authorization": "Bearer sk-test", **(headers or {})}
    return httpx.post(fp.url + path, json=body, headers=h, timeout=5, **kw)


# ---- OpenAI ------------------------------------------------------------------------------


def test_openai_default_reply_and_wire_shape(fp, oai):
    r = oai.chat.completions.create(model="gpt-4o-mini", messages=USER)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    assert r.model == "gpt-4o-mini" and r.system_fingerprint
    msg = r.choices[0].message
    assert (msg.role, msg.content, msg.refusal, msg.tool_calls) == (
        "assistant",
        DEFAULT_TEXT,
        None,
        None,
    )
    assert r.choices[0].finish_reason == "stop"
    u = r.usage
    assert u.prompt_tokens == estimate_tokens(USER)
    assert u.completion_tokens == 13 and u.total_tokens == u.prompt_tokens + 13
    assert u.prompt_tokens_details.cached_tokens == 0
    assert u.completion_tokens_details.reasoning_tokens == 0
    rec = fp.last
    assert rec.path == "/v1/chat/completions" and rec.json["messages"] == USER
    assert rec.headers["authorization"] == "Bearer sk-test"
    assert rec.completed and not rec.disconnected and rec.status == 200
    assert json.loads(rec.response_body)["choices"][0]["message"]["content"] == DEFAULT_TEXT


def test_openai_queue_responder_and_overrides(fp, oai):
    fp.enqueue("first", Reply(text="second", model="gpt-x", usage={"prompt_tokens": 7}))
    fp.responder = lambda rec: Reply(text=f"echo {len(rec.json['messages'])}")
    texts = [oai.chat.completions.create(model="m", messages=USER) for _ in range(3)]
    assert [t.choices[0].message.content for t in texts] == ["first", "second", "echo 1"]
    assert texts[1].model == "gpt-x" and texts[1].usage.prompt_tokens == 7
    assert fp.pending == 0 and [r.reply.text for r in fp.requests] == ["first", "second", "echo 1"]
    fp.enqueue(Reply(text="x", usage={"cached_tokens": 5, "completion_tokens": 3}))
    u = oai.chat.completions.create(model="m", messages=USER).usage
    assert (u.prompt_tokens_details.cached_tokens, u.completion_tokens) == (5, 3)
    with pytest.raises(ValueError):
        Reply(usage={"prompt": 1})


def test_openai_stream_text_without_usage(fp):
    fp.enqueue(Reply(text="The quick brown fox jumps over the lazy dog"))
    body = {"model": "m", "messages": USER, "stream": True}
    r = post(fp, "/v1/chat/completions", body)
    assert r.headers["content-type"].startswith("text/event-stream")
    data = sse_data(r.content)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and "usage" not in c for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    text_deltas = [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]]
    assert len(text_deltas) > 3 and "".join(text_deltas) == fp.last.reply.text
    assert chunks[-1]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert len({c["id"] for c in chunks}) == 1


def test_openai_stream_with_usage_via_sdk(fp, oai):
    fp.enqueue(Reply(text="streamed words here", usage={"prompt_tokens": 11}))
    stream = oai.chat.completions.create(
        model="m", messages=USER, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "streamed words here"
    )
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage.prompt_tokens == 11
    assert last.usage.completion_tokens == 5 and last.usage.total_tokens == 16
    raw = [json.loads(d) for d in sse_data(fp.last.response_body)[:-1]]
    assert all("usage" in c and c["usage"] is None for c in raw[:-1])


def test_openai_parallel_tool_calls(fp, oai):
    fp.enqueue(Reply(tool_calls=[*WEATHER[:2], ToolCall("fixed", {"a": 1}, id="call_fixed")]))
    r = oai.chat.completions.create(model="m", messages=USER)
    msg = r.choices[0].message
    assert msg.content is None and r.choices[0].finish_reason == "tool_calls"
    assert [tc.function.name for tc in msg.tool_calls] == ["get_weather", "get_time", "fixed"]
    assert all(tc.id.startswith("call_") and tc.type == "function" for tc in msg.tool_calls)
    assert msg.tool_calls[2].id == "call_fixed"
    assert json.loads(msg.tool_calls[0].function.arguments) == {"city": "Oslo"}


def test_openai_stream_parallel_tool_calls_wire(fp, oai):
    fp.enqueue(Reply(tool_calls=WEATHER))
    r = post(fp, "/v1/chat/completions", {"model": "m", "messages": USER, "stream": True})
    chunks = [json.loads(d) for d in sse_data(r.content)[:-1]]
    first = chunks[0]["choices"][0]["delta"]
    assert first["role"] == "assistant" and first["content"] is None
    calls: dict[int, dict] = {}
    for c in chunks[:-1]:
        for tc in c["choices"][0]["delta"].get("tool_calls", []):
            if tc["index"] not in calls:  # the opening fragment of a call
                assert set(tc) == {"index", "id", "type", "function"}
                assert tc["function"]["arguments"] == "" and tc["id"].startswith("call_")
                calls[tc["index"]] = {"name": tc["function"]["name"], "args": ""}
            else:
                assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
                calls[tc["index"]]["args"] += tc["function"]["arguments"]
    assert sorted(calls) == [0, 1, 2]
    assert [(calls[i]["name"], json.loads(calls[i]["args"])) for i in range(3)] == WEATHER
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # and the SDK's own accumulator agrees
    fp.enqueue(Reply(text="Let me check.", tool_calls=WEATHER[:2]))
    with oai.chat.completions.stream(model="m", messages=USER) as s:
        final = s.get_final_completion()
    msg = final.choices[0].message
    assert msg.content == "Let me check."
    assert [(t.function.name, json.loads(t.function.arguments)) for t in msg.tool_calls] == (
        WEATHER[:2]
    )


def test_openai_validation(fp, oai):
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    asked = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]}]
    ok = oai.chat.completions.create(
        model="m", messages=[*asked, {"role": "tool", "tool_call_id": "call_1", "content": "1"}]
    )
    assert ok.choices[0].message.content == DEFAULT_TEXT
    bad_cases = [
        [*asked, {"role": "tool", "tool_call_id": "call_2", "content": "1"}],
        [*USER, {"role": "tool", "tool_call_id": "call_1", "content": "1"}],
        [*asked, {"role": "user", "content": "skipped the tool result"}],
        [],
        [{"role": "wizard", "content": "x"}],
    ]
    for messages in bad_cases:
        with pytest.raises(openai.BadRequestError) as ei:
            oai.chat.completions.create(model="m", messages=messages)
        err = ei.value.body
        assert err["type"] == "invalid_request_error" and set(err) == {
            "message",
            "type",
            "param",
            "code",
        }
    assert fp.last.status == 400 and fp.last.reply is None
    assert fp.last.completed


PATCH = "*** Begin Patch\n*** Add File: a.txt\n+hello\n*** End Patch\n"
CUSTOM_TOOL = {
    "type": "custom",
    "custom": {
        "name": "apply_patch",
        "description": "Edit files.",
        "format": {"type": "grammar", "grammar": {"syntax": "lark", "definition": "start: /.+/"}},
    },
}


def test_openai_custom_tool_call_json_and_stream(fp, oai):
    """A scripted custom call as chat completions sends it: in JSON the SDK's
    ChatCompletionMessageCustomToolCall; streamed, a head piece {"index", "id", "type":
    "custom", "custom": {"name", "input": ""}} then {"index", "custom": {"input"}} pieces
    (the SDK's chunk type has no custom member: openai-python #2530)."""
    call = ToolCall("apply_patch", PATCH, id="call_p", custom=True)
    fp.enqueue(Reply(tool_calls=[call]))
    r = oai.chat.completions.create(model="gpt-5", messages=USER, tools=[CUSTOM_TOOL])
    (tc,) = r.choices[0].message.tool_calls
    assert tc.type == "custom" and tc.id == "call_p"
    assert (tc.custom.name, tc.custom.input) == ("apply_patch", PATCH)
    assert r.choices[0].finish_reason == "tool_calls"
    fp.enqueue(Reply(tool_calls=[call]))
    body = {"model": "gpt-5", "messages": USER, "tools": [CUSTOM_TOOL], "stream": True}
    chunks = [json.loads(d) for d in sse_data(post(fp, "/v1/chat/completions", body).content)[:-1]]
    pieces = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert pieces[0] == {"index": 0, "id": "call_p", "type": "custom",
                         "custom": {"name": "apply_patch", "input": ""}}  # fmt: skip
    assert all(set(p) == {"index", "custom"} and set(p["custom"]) == {"input"} for p in pieces[1:])
    assert "".join(p["custom"]["input"] for p in pieces) == PATCH


def test_openai_refuses_an_unanswered_custom_call_and_a_flat_grammar(fp, oai):
    call = {"id": "call_p", "type": "custom", "custom": {"name": "apply_patch", "input": PATCH}}
    asked = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]}]
    with pytest.raises(openai.BadRequestError, match="did not have response messages: call_p"):
        oai.chat.completions.create(model="gpt-5", messages=[*asked, *USER])
    fp.enqueue(Reply(text="done"))
    answer = {"role": "tool", "tool_call_id": "call_p", "content": "Success."}
    r = oai.chat.completions.create(model="gpt-5", messages=[*asked, answer], tools=[CUSTOM_TOOL])
    assert r.choices[0].message.content == "done"
    # Responses' flat spelling of the grammar is not chat's: the API's 400 names the member.
    flat = {
        "type": "custom",
        "custom": {
            "name": "apply_patch",
            "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
        },
    }
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="gpt-5", messages=USER, tools=[flat])
    assert e.value.param == "tools[0].custom.format.grammar"
    no_input = {"id": "call_q", "type": "custom", "custom": {"name": "apply_patch"}}
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(
            model="gpt-5",
            messages=[*USER, {"role": "assistant", "tool_calls": [no_input]},
                      {"role": "tool", "tool_call_id": "call_q", "content": "x"}],
        )  # fmt: skip
    assert e.value.param == "messages[1].tool_calls[0].custom.input"


def test_auth_and_parse_errors(fp):
    r = httpx.post(fp.url + "/v1/chat/completions", json={"model": "m", "messages": USER})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = post(fp, "/v1/chat/completions", None, content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    body = {"model": "m", "max_tokens": 5, "messages": USER}
    r = httpx.post(fp.url + "/v1/messages", json=body, headers={"x-api-key": "k"})
    assert r.status_code == 400 and "anthropic-version" in r.json()["error"]["message"]
    r = httpx.post(fp.url + "/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error" and r.json()["type"] == "error"
    assert fp.pending == 0 and all(rec.reply is None for rec in fp.requests)


def test_models_list(fp, oai, ant):
    ids = [m.id for m in oai.models.list()]
    assert "gpt-4o-mini" in ids
    assert [m.id for m in ant.models.list()] == ids


def test_max_tokens_truncates(fp, oai, ant):
    fp.enqueue("x" * 100, "y" * 100)
    r = oai.chat.completions.create(model="m", messages=USER, max_tokens=5)
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.content == "x" * 20
    m = ant.messages.create(model="c", max_tokens=5, messages=USER)
    assert m.stop_reason == "max_tokens" and m.content[0].text == "y" * 20


def test_openai_n_choices_are_each_answered_and_all_billed(fp, oai):
    """``n``: that many choices, and the usage counts the tokens of all of them (OpenAI:
    "you will be charged based on the number of generated tokens across all of the
    choices"), in JSON and in a stream (each choice's deltas under its index)."""
    fp.enqueue("x" * 100, "x" * 100)
    r = oai.chat.completions.create(model="m", messages=USER, max_tokens=5, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.message.content == "x" * 20 and c.finish_reason == "length" for c in r.choices)
    assert r.usage.completion_tokens == 15
    chunks = list(
        oai.chat.completions.create(
            model="m", messages=USER, max_tokens=5, n=2, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    text = {0: "", 1: ""}
    for c in chunks:
        for choice in c.choices:
            text[choice.index] += choice.delta.content or ""
    assert text == {0: "x" * 20, 1: "x" * 20}
    assert chunks[-1].usage.completion_tokens == 10


def test_a_limit_above_the_models_output_maximum_is_refused(fp, oai, ant):
    fp.max_output_tokens = {"m": 10, "c": 10}
    try:
        with pytest.raises(openai.BadRequestError) as e:
            oai.chat.completions.create(model="m", messages=USER, max_completion_tokens=11)
        assert "supports at most 10 completion tokens" in e.value.message
        with pytest.raises(anthropic.BadRequestError) as a:
            ant.messages.create(model="c", max_tokens=11, messages=USER)
        assert "max_tokens: 11 > 10" in a.value.message
        fp.enqueue("fine")
        assert oai.chat.completions.create(model="m", messages=USER, max_tokens=10).choices
    finally:
        fp.max_output_tokens = {}


def test_responses_compact_wire_shape(fp, oai):
    """``POST /v1/responses/compact`` as the openai SDK's ``responses.compact`` reads it: the
    user messages, then one opaque compaction item, and the pass's usage."""
    fp.enqueue(Reply(text="the summary", usage={"completion_tokens": 7, "reasoning_tokens": 3}))
    history = [
        {"role": "user", "content": "fix calc.py"},
        {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
    ]
    r = oai.responses.compact(model="gpt-5", input=history, instructions="be brief")
    assert r.object == "response.compaction" and r.id.startswith("resp_")
    *users, item = r.output
    assert [(u.type, u.role, u.content[0].text) for u in users] == [
        ("message", "user", "fix calc.py"),
        ("message", "user", "thanks"),
    ]
    assert item.type == "compaction" and item.id.startswith("cmp_")
    assert item.encrypted_content.startswith("gAAAAA") and "summary" not in item.encrypted_content
    assert r.usage.output_tokens == 7 and r.usage.output_tokens_details.reasoning_tokens == 3
    assert r.usage.input_tokens == estimate_tokens(["be brief", history])
    assert r.usage.total_tokens == r.usage.input_tokens + 7
    assert fp.last.path == "/v1/responses/compact" and fp.last.json["input"] == history


def test_responses_compact_refuses_what_the_api_refuses(fp, oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.compact(model="gpt-5", input="hi", extra_body={"stream": True})
    assert e.value.body["code"] == "unknown_parameter" and e.value.body["param"] == "stream"
    orphan = [{"type": "function_call_output", "call_id": "nope", "output": "x"}]
    with pytest.raises(openai.BadRequestError, match="No tool call found"):
        oai.responses.compact(model="gpt-5", input=orphan)
    fp.enqueue(Reply(status=429, error_body="slow down"))
    with pytest.raises(openai.RateLimitError, match="slow down"):
        oai.responses.compact(model="gpt-5", input="hi")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"max_tokens": 5}, "max_tokens"),
        ({"stop": ["x"]}, "stop"),
        ({"messages": USER}, "messages"),
        (
            {"stream": True, "stream_options": {"include_usage": True}},
            "stream_options.include_usage",
        ),
    ],
)
def test_responses_refuses_chat_completions_members(fp, oai, extra, param):
    """What a chat request carries and ``/v1/responses`` does not take is the API's
    unknown_parameter 400 (what a translation that leaks chat's members meets)."""
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model="gpt-5", input="hi", extra_body=extra)
    assert e.value.body["code"] == "unknown_parameter" and e.value.body["param"] == param


def test_responses_refusal_and_failed_stream(fp, oai):
    """A refusal part (JSON, and streamed as response.refusal.* events the SDK accumulates),
    and a stream that fails: response.failed, which the SDK's stream raises on."""
    fp.enqueue(Reply(refusal="No can do."), Reply(refusal="No can do."))
    r = oai.responses.create(model="gpt-5", input="hi")
    assert r.output[0].content[0].type == "refusal" and r.output_text == ""
    with oai.responses.stream(model="gpt-5", input="hi") as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert "response.refusal.delta" in kinds and "response.refusal.done" in kinds
    assert final.output[0].content[0].refusal == "No can do."
    fp.enqueue(Reply(fail="It broke."))
    events = list(oai.responses.create(model="gpt-5", input="hi", stream=True))
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.failed",
    ]
    assert events[-1].response.status == "failed"
    assert events[-1].response.error.message == "It broke."


def test_responses_input_tokens(fp, oai):
    """``POST /v1/responses/input_tokens`` as the openai SDK's ``responses.input_tokens.count``
    reads it: the fake's count of what ``/v1/responses`` would bill; a field the endpoint does
    not take (the SDK's InputTokenCountParams are the list) is the API's unknown_parameter."""
    assert set(InputTokenCountParams.__annotations__) == INPUT_TOKENS_FIELDS
    tools = [{"type": "function", "name": "ls", "parameters": {"type": "object"}}]
    r = oai.responses.input_tokens.count(
        model="gpt-5", instructions="be brief", input="list the files", tools=tools
    )
    assert r.object == "response.input_tokens"
    assert r.input_tokens == estimate_tokens(tools) + estimate_tokens(
        ["be brief", "list the files"]
    )
    assert fp.last.path == "/v1/responses/input_tokens" and fp.last.dialect == "responses"
    for extra in ({"max_output_tokens": 10}, {"stream": True}, {"store": False}):
        with pytest.raises(openai.BadRequestError) as e:
            oai.responses.input_tokens.count(model="gpt-5", input="hi", extra_body=extra)
        assert e.value.body["code"] == "unknown_parameter"
        assert e.value.body["param"] == next(iter(extra))


def test_responses_refuses_a_call_that_no_later_item_answers(fp, oai):
    call = {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"}
    out = {"type": "function_call_output", "call_id": "c1", "output": "a.txt"}
    with pytest.raises(openai.BadRequestError, match="No tool output found for function call c1"):
        oai.responses.create(model="gpt-5", input=["hi", call])
    assert fp.requests[-1].status == 400
    custom = {"type": "custom_tool_call", "call_id": "c2", "name": "patch", "input": "x"}
    with pytest.raises(openai.BadRequestError, match="custom tool call c2"):
        oai.responses.create(model="gpt-5", input=[call, out, custom])
    fp.enqueue(Reply(text="ok"))
    assert oai.responses.create(model="gpt-5", input=["hi", call, out]).output_text == "ok"


# ---- Anthropic ---------------------------------------------------------------------------


def test_anthropic_create_text(fp, ant):
    fp.enqueue(Reply(text="Hi!", usage={"cache_read": 4, "cache_write": 2}))
    m = ant.messages.create(model="claude-x", max_tokens=100, messages=USER, system="be brief")
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant"
    assert m.model == "claude-x" and m.stop_reason == "end_turn" and m.stop_sequence is None
    assert [(b.type, b.text) for b in m.content] == [("text", "Hi!")]
    assert m.usage.input_tokens == estimate_tokens(USER) + estimate_tokens("be brief")
    assert (m.usage.output_tokens, m.usage.cache_read_input_tokens) == (1, 4)
    assert m.usage.cache_creation_input_tokens == 2
    h = fp.last.headers  # SDK versions differ: x-api-key or Authorization: Bearer
    assert "sk-ant-test" in (h.get("x-api-key"), h.get("authorization", "")[7:])
    assert "anthropic-version" in h
    assert fp.last.dialect == "anthropic"


def test_anthropic_tool_use_create_and_stream(fp, ant):
    fp.enqueue(Reply(text="Checking.", tool_calls=WEATHER[:2]), Reply(tool_calls=WEATHER))
    m = ant.messages.create(model="c", max_tokens=100, messages=USER)
    assert m.stop_reason == "tool_use" and [b.type for b in m.content] == [
        "text",
        "tool_use",
        "tool_use",
    ]
    assert m.content[1].id.startswith("toolu_") and m.content[1].input == {"city": "Oslo"}
    with ant.messages.stream(model="c", max_tokens=100, messages=USER) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in final.content] == WEATHER
    assert final.usage.input_tokens == estimate_tokens(USER) and final.usage.output_tokens > 1


def test_anthropic_stream_event_sequence(fp):
    fp.enqueue(Reply(text="Some streamed text", tool_calls=WEATHER[:1]))
    body = {"model": "c", "max_tokens": 50, "messages": USER, "stream": True}
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    r = httpx.post(fp.url + "/v1/messages", json=body, headers=headers)
    events = [e for e in r.text.split("\n\n") if e]
    names, datas = [], []
    for e in events:
        ev, data = e.split("\n")
        assert ev.startswith("event: ") and data.startswith("data: ")
        names.append(ev[7:])
        datas.append(json.loads(data[6:]))
        assert datas[-1]["type"] == names[-1]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    start = datas[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == estimate_tokens(USER)
    assert names.count("content_block_start") == names.count("content_block_stop") == 2
    text = "".join(
        d["delta"]["text"] for d in datas if d.get("delta", {}).get("type") == "text_delta"
    )
    assert text == "Some streamed text"
    tool_start = [d for d in datas if d["type"] == "content_block_start"][1]
    assert tool_start["index"] == 1 and tool_start["content_block"]["input"] == {}
    partial = [d["delta"]["partial_json"] for d in datas if d.get("index") == 1 and "delta" in d]
    assert json.loads("".join(partial)) == {"city": "Oslo"}
    assert datas[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    # The API repeats the input and cache counts in message_delta (since 2025).
    assert set(datas[-2]["usage"]) == {
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
        "output_tokens",
    }


def test_anthropic_thinking_blocks_json_and_stream(fp, ant):
    thinking = [
        {"type": "thinking", "thinking": "hmm, let me look", "signature": "c2ln"},
        {"type": "redacted_thinking", "data": "RU5D"},
    ]
    reply = Reply(thinking=thinking, tool_calls=[ToolCall("f", {"a": 1}, id="toolu_1")])
    fp.enqueue(reply, reply)
    plain = ant.messages.create(model="c", max_tokens=99, messages=USER)
    with ant.messages.stream(model="c", max_tokens=99, messages=USER) as s:
        streamed = s.get_final_message()
    for msg in (plain, streamed):
        blocks = [b.model_dump(exclude_none=True) for b in msg.content]
        assert blocks[:2] == thinking and blocks[2]["type"] == "tool_use"
    deltas = [b'"type":"thinking_delta"', b'"type":"signature_delta","signature":"c2ln"']
    assert all(d in fp.last.response_body for d in deltas)


def test_anthropic_system_messages_inside_messages(fp, ant):
    """Claude Code 2.1.x sends its environment as a system message (text only)."""
    env = {"role": "system", "content": [{"type": "text", "text": "# Env"}]}
    ok = ant.messages.create(model="c", max_tokens=99, messages=[*USER, env])
    assert ok.content[0].text == DEFAULT_TEXT


def test_anthropic_validation(fp, ant):
    use = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
    asked = [*USER, {"role": "assistant", "content": [use]}]

    def result(tid):
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tid}]}

    ok = ant.messages.create(model="c", max_tokens=99, messages=[*asked, result("toolu_1")])
    assert ok.content[0].text == DEFAULT_TEXT
    after = {
        "role": "user",
        "content": [*result("toolu_1")["content"], {"type": "text", "text": "x"}],
    }
    prefill = {"role": "assistant", "content": ""}  # empty content: a final assistant only
    for fine in ([*asked, after], [*USER, prefill]):
        assert ant.messages.create(model="c", max_tokens=9, messages=fine).content
    bad_cases = [
        [*asked, result("toolu_2")],
        [*USER, result("toolu_1")],
        [*asked, {"role": "user", "content": "no result"}],
        [{"role": "system", "content": [{"type": "image", "source": {}}]}, *USER],
        [],
        # text before the results: they no longer answer "immediately after"
        [
            *asked,
            {
                "role": "user",
                "content": [{"type": "text", "text": "x"}, *result("toolu_1")["content"]],
            },
        ],
        [{"role": "user", "content": [{"type": "text", "text": ""}]}],
        [{"role": "user", "content": ""}],
        [*USER, {"role": "assistant", "content": ""}, *USER],
    ]
    for messages in bad_cases:
        with pytest.raises(anthropic.BadRequestError) as ei:
            ant.messages.create(model="c", max_tokens=10, messages=messages)
        assert ei.value.body["type"] == "error"
        assert ei.value.body["error"]["type"] == "invalid_request_error"
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    r = httpx.post(fp.url + "/v1/messages", json={"model": "c", "messages": USER}, headers=headers)
    assert r.status_code == 400 and r.json()["error"]["message"] == "max_tokens: Field required"


# ---- faults ------------------------------------------------------------------------------


def test_error_statuses(fp, oai, ant):
    fp.enqueue(Reply(status=500), Reply(status=429, retry_after=2))
    with pytest.raises(openai.InternalServerError) as ei:
        oai.chat.completions.create(model="m", messages=USER)
    assert ei.value.body["type"] == "server_error"
    with pytest.raises(openai.RateLimitError) as ei:
        oai.chat.completions.create(model="m", messages=USER)
    assert ei.value.response.headers["retry-after"] == "2"
    assert ei.value.body["code"] == "rate_limit_exceeded"
    fp.enqueue(Reply(status=529, error_body="Overloaded"), Reply(status=429))
    with pytest.raises(anthropic.InternalServerError) as ei:
        ant.messages.create(model="c", max_tokens=10, messages=USER)
    assert ei.value.body["error"] == {"type": "overloaded_error", "message": "Overloaded"}
    with pytest.raises(anthropic.RateLimitError):
        ant.messages.create(model="c", max_tokens=10, messages=USER)
    fp.enqueue(Reply(status=418, error_body={"custom": True}))
    r = post(fp, "/v1/chat/completions", {"model": "m", "messages": USER})
    assert (r.status_code, r.json()) == (418, {"custom": True})


def test_drop_is_a_connection_error(fp, oai):
    fp.enqueue(Reply(drop=True))
    with pytest.raises(openai.APIConnectionError):
        oai.chat.completions.create(model="m", messages=USER)
    rec = fp.wait_for(lambda rs: rs[-1].ended_at and rs[-1])
    assert rec.dropped and not rec.disconnected and not rec.completed and rec.status is None


def test_drop_after_mid_stream(fp, oai):
    fp.enqueue(Reply(text="a fairly long answer that streams", drop_after=3))
    stream = oai.chat.completions.create(model="m", messages=USER, stream=True)
    got = []
    with pytest.raises((httpx.RemoteProtocolError, openai.APIConnectionError)):
        for chunk in stream:
            got.append(chunk)
    assert len(got) == 3
    rec = fp.wait_for(lambda rs: rs[-1].ended_at and rs[-1])
    assert rec.events_sent == 3 and rec.dropped and not rec.completed


def test_drop_after_non_streaming_truncates_body(fp):
    fp.enqueue(Reply(drop_after=10))
    with pytest.raises(httpx.RemoteProtocolError):
        post(fp, "/v1/chat/completions", {"model": "m", "messages": USER})
    assert fp.wait_for(lambda rs: rs[-1].ended_at and rs[-1]).response_body.startswith(b'{"id":')


def test_stall_then_client_close_marks_disconnected(fp, oai):
    fp.enqueue(Reply(stall_after=2))
    stream = oai.chat.completions.create(model="m", messages=USER, stream=True)
    it = iter(stream)
    next(it), next(it)
    fp.wait_for(lambda rs: rs[-1].events_sent == 2)
    assert not fp.last.disconnected
    stream.close()
    rec = fp.wait_for(lambda rs: rs[-1].disconnected and rs[-1], timeout=3)
    assert not rec.completed and not rec.dropped and rec.events_sent == 2


def test_anthropic_stall_then_close(fp, ant):
    fp.enqueue(Reply(text="hello world", stall_after=3))
    with ant.messages.stream(model="c", max_tokens=10, messages=USER) as s:
        events = iter(s)  # the SDK swallows the ping (3rd event), so two come through
        assert [next(events).type for _ in range(2)] == ["message_start", "content_block_start"]
        fp.wait_for(lambda rs: rs[-1].events_sent == 3)
    assert fp.wait_for(lambda rs: rs[-1].disconnected, timeout=3)


def test_delay_and_client_timeout_marks_disconnected(fp):
    fp.enqueue(Reply(delay=5))
    client = openai.OpenAI(base_url=fp.url + "/v1", api_key="k", max_retries=0, timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model="m", messages=USER)
    assert time.monotonic() - t0 < 2
    rec = fp.wait_for(lambda rs: rs[-1].disconnected and rs[-1], timeout=3)
    assert rec.status is None and not rec.completed


def test_delay_and_chunk_delay_timing(fp, oai):
    fp.enqueue(Reply(text="abcdefgh" * 4, delay=0.2, chunk_delay=0.05))
    t0 = time.monotonic()
    stream = oai.chat.completions.create(model="m", messages=USER, stream=True)
    first = time.monotonic() - t0
    list(stream)
    total = time.monotonic() - t0
    assert first >= 0.2 and total >= 0.2 + 0.05 * (fp.last.events_sent - 1)


def test_hold_keeps_the_reply_until_the_event_is_set(fp, oai):
    gate = threading.Event()
    fp.enqueue(Reply(text="held", hold=gate), Reply(text="not held"))
    answers: list[str] = []
    first = threading.Thread(
        target=lambda: answers.append(
            oai.chat.completions.create(model="m", messages=USER).choices[0].message.content
        )
    )
    first.start()
    fp.wait_for(lambda rs: len(rs) == 1)
    # The server keeps serving while one reply is held.
    assert oai.chat.completions.create(model="m", messages=USER).choices[0].message.content == (
        "not held"
    )
    assert answers == [] and fp.requests[0].status is None
    gate.set()
    first.join(10)
    assert answers == ["held"] and fp.requests[0].completed


async def test_async_clients_and_wait_for_async(fp):
    fp.enqueue(Reply(text="async hi"))
    async with openai.AsyncOpenAI(base_url=fp.url + "/v1", api_key="k", max_retries=0) as c:
        r = await c.chat.completions.create(model="m", messages=USER)
    assert r.choices[0].message.content == "async hi"
    assert (await fp.wait_for_async(lambda rs: rs and rs[-1].completed)) is True


def test_standalone_process():
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("fakeprovider.py")), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on http://127.0.0.1:")
        url = line.removeprefix("listening on ")
        httpx.post(url + "/_fake/enqueue", json={"text": "scripted", "tool_calls": [["f", {}]]})
        client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
        msg = client.chat.completions.create(model="m", messages=USER).choices[0].message
        assert msg.content == "scripted" and msg.tool_calls[0].function.name == "f"
        log = httpx.get(url + "/_fake/requests").json()
        assert log[0]["completed"] and log[0]["json"]["messages"] == USER
    finally:
        proc.terminate()
        proc.wait(5)
