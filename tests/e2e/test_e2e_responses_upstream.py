"""A chat-completions client (the openai SDK) and a Messages client (the anthropic SDK, as
Claude Code) in front of an upstream of kind ``openai-responses`` (a Responses-only model:
gpt-5-codex, o3-pro), through the real proxy, the fake provider serving ``/v1/responses``
as the API does (it refuses chat's members there, and unpaired calls). JSON and streams,
tool calls both ways, refusals, cut-off replies, usage and cost in the ledger, errors in
the client's dialect, and the state mode on top (the window and auto modes across these
bridges: ``test_e2e_window_translated``)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from skillstate.engine.context import STATE_MARK
from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply, ToolCall
from tests.helpers import SESSION_HEADER, ant, oai

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
CHAT_TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "custom", "custom": {"name": "apply_patch", "description": "Patch files."}},
]
MESSAGES_TOOLS: list[Any] = [{"name": "get_weather", "input_schema": WEATHER}]


def start(fake: FakeProvider, start_proxy: StartProxy, mode: str = "passthrough") -> Proxy:
    up = {"name": "up", "url": fake.url + "/v1", "kind": "openai-responses", "api_key": "sk-u"}
    return start_proxy(None, "--schema", "facts,notes", "--mode", mode, config={"upstreams": [up]})


def chat(p: Proxy) -> openai.OpenAI:
    return oai(p, "sk-client")


def messages(p: Proxy) -> anthropic.Anthropic:
    return ant(p, "sk-client")


def envelope(patch: dict[str, Any]) -> str:
    return "Done.\n```json\n" + json.dumps({"state_patch": patch, "action": "next"}) + "\n```"


def ask_chat(p: Proxy, streamed: bool, session: str, **kw: Any) -> Any:
    """One chat completion (through the SDK's stream accumulator when ``streamed``)."""
    kw = {"model": "gpt-4o", "extra_headers": {SESSION_HEADER: session}, **kw}
    if streamed:
        with chat(p).chat.completions.stream(**kw) as s:
            return s.get_final_completion()
    return chat(p).chat.completions.create(**kw)


def ask_chat_raw(p: Proxy, streamed: bool, session: str, **kw: Any) -> dict[str, Any]:
    """One chat completion as a dict, a stream's chunks put together by hand: the SDK's
    accumulator refuses a custom tool call (openai-python #2530) and a cut-off reply."""
    kw = {"model": "gpt-4o", "extra_headers": {SESSION_HEADER: session}, **kw}
    if not streamed:
        return chat(p).chat.completions.create(**kw).model_dump()
    message: dict[str, Any] = {"content": None, "tool_calls": []}
    finish = None
    for chunk in chat(p).chat.completions.create(**kw, stream=True):
        for choice in chunk.choices:
            delta = choice.delta.model_dump(exclude_none=True)
            if "content" in delta:
                message["content"] = (message["content"] or "") + delta["content"]
            for piece in delta.get("tool_calls") or ():
                calls = message["tool_calls"]
                if piece["index"] == len(calls):
                    calls.append(piece)
                    continue
                kind = "function" if "function" in piece else "custom"
                member = "arguments" if kind == "function" else "input"
                calls[piece["index"]][kind][member] += piece[kind][member]
            finish = choice.finish_reason or finish
    return {"choices": [{"message": message, "finish_reason": finish}]}


def ask_messages(p: Proxy, streamed: bool, session: str, **kw: Any) -> Any:
    kw = {"model": "gpt-4o", "max_tokens": 300, "extra_headers": {SESSION_HEADER: session}, **kw}
    if streamed:
        with messages(p).messages.stream(**kw) as s:
            return s.get_final_message()
    return messages(p).messages.create(**kw)


# -- chat completions -> Responses ------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True])
def test_a_chat_request_reaches_the_responses_api_in_its_form(
    fake: FakeProvider, start_proxy: StartProxy, streamed: bool
) -> None:
    """System messages are the instructions, the rest input items (an image as an
    input_image), each member under its Responses name; nothing is stored upstream; the
    reply's text, usage (cached and reasoning tokens) and finish_reason come back as chat
    has them, reasoning items left out."""
    p = start(fake, start_proxy)
    reasoning = {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA-opaque"}
    usage = {"prompt_tokens": 1500, "cached_tokens": 1024, "reasoning_tokens": 7}
    fake.enqueue(Reply(text="Sunny in Oslo.", usage=usage, items=[reasoning]))
    image = "data:image/png;base64,iVBORw0KGgo="
    question = [
        {"type": "text", "text": "Weather in Oslo?"},
        {"type": "image_url", "image_url": {"url": image, "detail": "low"}},
    ]
    r = ask_chat(
        p,
        streamed,
        "chat-1",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": "Answer in English."},
            {"role": "user", "content": question},
        ],
        max_completion_tokens=200,
        temperature=0.5,
        reasoning_effort="high",
        user="u-1",
        metadata={"k": "v"},
        prompt_cache_key="pk",
        logprobs=True,
        top_logprobs=2,
        **({"stream_options": {"include_usage": True}} if streamed else {}),
    )
    sent = fake.last
    assert sent.path == "/v1/responses" and sent.status == 200 and sent.stream is streamed
    body = sent.json
    assert body["instructions"] == "Be brief.\n\nAnswer in English."
    assert body["input"] == [
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Weather in Oslo?"},
            {"type": "input_image", "image_url": image, "detail": "low"},
        ]},
    ]  # fmt: skip
    assert body["store"] is False and body["max_output_tokens"] == 200
    assert body["reasoning"] == {"effort": "high"} and body["temperature"] == 0.5
    assert (body["user"], body["metadata"], body["prompt_cache_key"]) == ("u-1", {"k": "v"}, "pk")
    assert "stream_options" not in body  # chat's include_usage: Responses always sends usage
    assert body["include"] == ["message.output_text.logprobs"] and body["top_logprobs"] == 2
    choice = r.choices[0]
    assert choice.message.content == "Sunny in Oslo." and choice.finish_reason == "stop"
    assert not choice.message.tool_calls and r.model == "gpt-4o"
    assert r.usage is not None and r.usage.prompt_tokens == 1500
    assert r.usage.prompt_tokens_details.cached_tokens == 1024
    assert r.usage.completion_tokens_details.reasoning_tokens == 7
    cost = p.get("/cost", params={"session": "chat-1"}).json()["totals"]
    assert cost["requests"] == 1 and cost["input_tokens"] == 1500
    assert cost["cache_read_tokens"] == 1024 and cost["output_tokens"] == r.usage.completion_tokens
    assert cost["cost_usd"] > 0


@pytest.mark.parametrize("streamed", [False, True])
def test_chat_tool_calls_round_trip_through_a_responses_upstream(
    fake: FakeProvider, start_proxy: StartProxy, streamed: bool
) -> None:
    """Parallel function and custom tool calls come back as chat's tool_calls; sent back
    with their results they are function_call / custom_tool_call items each answered by its
    output item (the fake refuses an unanswered call or an orphan output); the tools go
    flat with ``strict`` written (Responses makes a function strict when it is absent),
    a forced function choice in Responses' form."""
    p = start(fake, start_proxy)
    fake.enqueue(
        Reply(
            text="Checking.",
            tool_calls=[
                ToolCall("get_weather", {"city": "Oslo"}, id="call_a"),
                ToolCall("get_weather", {"city": "Rome"}, id="call_b"),
                ToolCall("apply_patch", "*** Begin Patch", id="call_c", custom=True),
            ],
        )
    )
    transcript: list[Any] = [{"role": "user", "content": "Weather in Oslo and Rome?"}]
    forced = {"type": "function", "function": {"name": "get_weather"}}
    r = ask_chat_raw(
        p,
        streamed,
        "tools-1",
        messages=transcript,
        tools=CHAT_TOOLS,
        tool_choice=forced,
        parallel_tool_calls=False,
    )
    body = fake.last.json
    assert body["tools"] == [
        {"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": False},
        {"type": "custom", "name": "apply_patch", "description": "Patch files."},
    ]
    assert body["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert body["parallel_tool_calls"] is False
    msg = r["choices"][0]["message"]
    assert r["choices"][0]["finish_reason"] == "tool_calls" and msg["content"] == "Checking."
    calls = msg["tool_calls"]
    assert [(c["id"], c["type"]) for c in calls] == [
        ("call_a", "function"), ("call_b", "function"), ("call_c", "custom")
    ]  # fmt: skip
    assert [json.loads(c["function"]["arguments"]) for c in calls[:2]] == [
        {"city": "Oslo"}, {"city": "Rome"}
    ]  # fmt: skip
    assert calls[2]["custom"] == {"name": "apply_patch", "input": "*** Begin Patch"}
    said = [{k: v for k, v in c.items() if k != "index"} for c in calls]
    transcript.append({"role": "assistant", "content": msg["content"], "tool_calls": said})
    for c, out in zip(calls, ("rain", "sun", "patched"), strict=True):
        transcript.append({"role": "tool", "tool_call_id": c["id"], "content": out})
    fake.enqueue(Reply(text="Rain in Oslo, sun in Rome."))
    r2 = ask_chat(p, streamed, "tools-1", messages=transcript, tools=CHAT_TOOLS)
    assert r2.choices[0].message.content == "Rain in Oslo, sun in Rome."
    assert fake.last.status == 200
    assert fake.last.json["input"][1:] == [
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "call_id": "call_a", "name": "get_weather",
         "arguments": '{"city":"Oslo"}'},
        {"type": "function_call", "call_id": "call_b", "name": "get_weather",
         "arguments": '{"city":"Rome"}'},
        {"type": "custom_tool_call", "call_id": "call_c", "name": "apply_patch",
         "input": "*** Begin Patch"},
        {"type": "function_call_output", "call_id": "call_a", "output": "rain"},
        {"type": "function_call_output", "call_id": "call_b", "output": "sun"},
        {"type": "custom_tool_call_output", "call_id": "call_c", "output": "patched"},
    ]  # fmt: skip


@pytest.mark.parametrize("streamed", [False, True])
def test_chat_structured_output_refusal_and_a_cut_off_reply(
    fake: FakeProvider, start_proxy: StartProxy, streamed: bool
) -> None:
    """``response_format`` json_schema is ``text.format``; a refusal part is chat's
    ``refusal``; a response incomplete at max_output_tokens finishes with ``length``."""
    p = start(fake, start_proxy)
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}
    fake.enqueue(Reply(refusal="I can't help with that."))
    r = ask_chat(
        p, streamed, "fmt-1", messages=[{"role": "user", "content": "x?"}], response_format=fmt
    )
    assert fake.last.json["text"] == {
        "format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}
    }
    msg = r.choices[0].message
    assert msg.refusal == "I can't help with that." and not msg.content
    fake.enqueue(Reply(text="word " * 400))
    ask = [{"role": "user", "content": "go"}]
    cut = ask_chat_raw(p, streamed, "fmt-2", messages=ask, max_tokens=20)["choices"][0]
    assert fake.last.json["max_output_tokens"] == 20
    assert cut["finish_reason"] == "length" and cut["message"]["content"].startswith("word word")


@pytest.mark.parametrize(
    ("member", "value"),
    [("stop", ["\n\n"]), ("n", 2), ("modalities", ["text", "audio"])],
)
def test_what_the_responses_api_has_no_form_for_is_a_400(
    fake: FakeProvider, start_proxy: StartProxy, member: str, value: Any
) -> None:
    p = start(fake, start_proxy)
    with pytest.raises(openai.BadRequestError) as e:
        chat(p).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], extra_body={member: value}
        )
    assert e.value.body["param"] == ("audio" if member == "modalities" else member)  # type: ignore[index]
    assert "openai-responses" in e.value.message or "Responses API" in e.value.message
    assert not [r for r in fake.requests if r.path == "/v1/responses"]


def test_upstream_errors_reach_a_chat_client_in_its_dialect(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """An HTTP error of the Responses API is chat's error (status and message); a stream
    that fails after it started (response.failed) ends with chat's error chunk."""
    p = start(fake, start_proxy)
    fake.enqueue(Reply(status=400, error_body="Invalid 'input[0]': too long."))
    ask = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as e:
        chat(p).chat.completions.create(model="gpt-4o", messages=ask)
    assert "too long" in e.value.message
    fake.enqueue(Reply(fail="The model crashed."))
    stream = chat(p).chat.completions.stream(model="gpt-4o", messages=ask)  # type: ignore[arg-type]
    with pytest.raises(openai.APIError) as failed, stream as s:
        s.get_final_completion()
    assert "The model crashed." in str(failed.value)


# -- Messages -> Responses (through chat completions) -----------------------------------------


@pytest.mark.parametrize("streamed", [False, True])
def test_a_messages_client_on_a_responses_upstream(
    fake: FakeProvider, start_proxy: StartProxy, streamed: bool
) -> None:
    """The anthropic SDK, as Claude Code: system and tools reach the Responses API as
    instructions and flat function tools, a tool_use comes back, its tool_result goes back
    as a function_call_output after its call; a thinking block of an earlier turn is not
    sent (its signature is Anthropic's); usage counts cache reads apart from input, as
    Anthropic does, and the ledger has both turns."""
    p = start(fake, start_proxy)
    usage = {"prompt_tokens": 1300, "cached_tokens": 1024}
    fake.enqueue(Reply(tool_calls=[ToolCall("get_weather", {"city": "Oslo"}, id="call_w")]))
    convo: list[Any] = [{"role": "user", "content": "Weather in Oslo?"}]
    kw = {"system": "You are terse.", "tools": MESSAGES_TOOLS}
    m = ask_messages(p, streamed, "msg-1", messages=convo, **kw)
    sent = fake.last.json
    assert sent["instructions"] == "You are terse." and sent["max_output_tokens"] == 300
    assert sent["tools"] == [
        {"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": False}
    ]
    assert sent["store"] is False
    assert m.stop_reason == "tool_use"
    use = m.content[-1]
    assert use.type == "tool_use" and use.id == "call_w" and use.input == {"city": "Oslo"}
    thinking = {"type": "thinking", "thinking": "Hmm.", "signature": "sig-anthropic"}
    convo += [
        {"role": "assistant", "content": [thinking, use.model_dump(exclude_none=True)]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_w", "content": "rain"}
        ]},
    ]  # fmt: skip
    fake.enqueue(Reply(text="Rain.", usage=usage))
    m = ask_messages(p, streamed, "msg-1", messages=convo, **kw)
    assert fake.last.status == 200 and "sig-anthropic" not in fake.last.body.decode()
    assert fake.last.json["input"][1:] == [
        {"type": "function_call", "call_id": "call_w", "name": "get_weather",
         "arguments": '{"city":"Oslo"}'},
        {"type": "function_call_output", "call_id": "call_w", "output": "rain"},
    ]  # fmt: skip
    assert m.stop_reason == "end_turn" and m.content[0].text == "Rain."  # type: ignore[union-attr]
    assert (m.usage.input_tokens, m.usage.cache_read_input_tokens) == (276, 1024)
    cost = p.get("/cost", params={"session": "msg-1"}).json()["totals"]
    assert cost["requests"] == 2 and cost["cache_read_tokens"] == 1024 and cost["cost_usd"] > 0


def test_a_claude_code_shaped_request_reaches_the_responses_api_without_anthropics_members(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """What Claude Code sends beside the transcript (its anthropic-beta header, system
    blocks and tools with cache_control, metadata.user_id, thinking with a budget, an
    effort) does not reach the Responses API, which has none of it; the effort is its
    reasoning.effort."""
    p = start(fake, start_proxy)
    fake.enqueue(Reply(text="Ready."))
    mark = {"type": "ephemeral"}
    m = messages(p).messages.create(
        model="gpt-5-codex",
        max_tokens=2048,
        system=[{"type": "text", "text": "You are Claude Code.", "cache_control": mark}],
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "Fix the bug.", "cache_control": mark}],
            }
        ],
        tools=[{**MESSAGES_TOOLS[0], "cache_control": mark}],
        metadata={"user_id": "user_abc"},
        thinking={"type": "enabled", "budget_tokens": 1024},
        extra_body={"output_config": {"effort": "high"}},
        extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"},
    )
    assert m.content[0].text == "Ready."  # type: ignore[union-attr]
    sent = fake.last
    assert sent.status == 200 and sent.json["reasoning"] == {"effort": "high"}
    assert not {"anthropic-beta", "anthropic-version", "x-api-key"} & set(sent.headers)
    for anthropics in ("cache_control", "thinking", "budget_tokens", "user_abc"):
        assert anthropics not in sent.body.decode(), anthropics


def test_upstream_errors_reach_a_messages_client_in_its_dialect(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy)
    ask = [{"role": "user", "content": "hi"}]
    fake.enqueue(Reply(status=400, error_body="Invalid 'input[0]': too long."))
    with pytest.raises(anthropic.BadRequestError) as e:
        messages(p).messages.create(model="gpt-4o", max_tokens=50, messages=ask)  # type: ignore[arg-type]
    assert e.value.body["type"] == "error" and "too long" in e.value.message  # type: ignore[index]
    fake.enqueue(Reply(fail="The model crashed."))
    streamed = messages(p).messages.stream(model="gpt-4o", max_tokens=50, messages=ask)  # type: ignore[arg-type]
    with pytest.raises(anthropic.APIStatusError) as failed, streamed as s:
        s.get_final_message()
    assert "The model crashed." in str(failed.value)
    with pytest.raises(anthropic.BadRequestError) as refused:
        messages(p).messages.create(
            model="gpt-4o",
            max_tokens=50,
            messages=ask,
            stop_sequences=["END"],  # type: ignore[arg-type]
        )
    assert refused.value.body["error"]["message"].startswith("stop_sequences")  # type: ignore[index]


def test_a_messages_token_count_is_the_responses_apis(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """``count_tokens`` (which has no ``max_tokens``) is translated as a turn is and counted
    at the upstream's ``/responses/input_tokens``, with only the fields it takes."""
    p = start(fake, start_proxy)
    ask: Any = [{"role": "user", "content": "How many tokens is this?"}]
    counted = messages(p).messages.count_tokens(
        model="gpt-4o", system="Be brief.", messages=ask, tools=MESSAGES_TOOLS
    )
    sent = fake.last
    assert sent.path == "/v1/responses/input_tokens" and sent.status == 200
    assert set(sent.json) == {"model", "input", "instructions", "tools"}
    assert sent.json["instructions"] == "Be brief."
    assert counted.input_tokens == json.loads(sent.response_body)["input_tokens"] > 0


# -- the state mode on top --------------------------------------------------------------------


@pytest.mark.parametrize("client", ["chat", "messages"])
@pytest.mark.parametrize("streamed", [False, True])
def test_state_mode_across_a_responses_upstream(
    fake: FakeProvider, start_proxy: StartProxy, client: str, streamed: bool
) -> None:
    """The envelope is asked for in the client's format and sent in the Responses API's;
    the reply's state is committed, the client sees the reply without it, and the next
    request carries the state."""
    p = start(fake, start_proxy, mode="state")
    session = f"state-{client}-{streamed}"
    fake.enqueue(Reply(text=envelope({"facts": "oslo rains"})), Reply(text=envelope({})))
    ask = ask_chat if client == "chat" else ask_messages
    convo: list[Any] = [{"role": "user", "content": "TASK: the weather."}]
    r = ask(p, streamed, session, messages=convo)
    text = r.choices[0].message.content if client == "chat" else r.content[0].text
    assert text == "Done."
    assert p.state(session)["state"] == {"facts": "oslo rains"}
    convo += [{"role": "assistant", "content": text}, {"role": "user", "content": "More?"}]
    ask(p, streamed, session, messages=convo)
    assert fake.last.path == "/v1/responses" and fake.last.status == 200
    assert STATE_MARK in fake.last.body.decode() and "oslo rains" in fake.last.body.decode()
