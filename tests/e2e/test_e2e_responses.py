"""/v1/responses through the real proxy, driven by the openai SDK's own Responses methods
(create, stream with its accumulator, parse), against the fake provider as each upstream kind:
native (openai-responses), chat completions (openai) and Anthropic Messages (anthropic)."""

from __future__ import annotations

import json
from typing import Any

import openai
import pydantic
import pytest

from skillstate.engine.context import CONTRACT_MARK, STATE_MARK
from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, oai

KINDS = ["openai-responses", "openai", "anthropic"]
UPSTREAM_PATH = {
    "openai-responses": "/v1/responses",
    "openai": "/v1/chat/completions",
    "anthropic": "/v1/messages",
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
    {
        "type": "function",
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
    },
]


def envelope(patch: dict[str, Any], action: str = "next") -> str:
    return f"Done.\n```json\n{json.dumps({'state_patch': patch, 'action': action})}\n```"


def start(fake: FakeProvider, start_proxy: StartProxy, kind: str, *args: str) -> Proxy:
    url = fake.url if kind == "anthropic" else fake.url + "/v1"
    up = {"name": "up", "url": url, "kind": kind, "api_key": "sk-upstream"}
    return start_proxy(None, "--schema", "facts,notes", *args, config={"upstreams": [up]})


def client(proxy: Proxy) -> openai.OpenAI:
    return oai(proxy, "sk-client")


@pytest.mark.parametrize("kind", KINDS)
def test_create_text(fake: FakeProvider, start_proxy: StartProxy, kind: str) -> None:
    p = start(fake, start_proxy, kind, "--mode", "passthrough")
    fake.enqueue(Reply(text="Bonjour.", usage={"prompt_tokens": 40, "cached_tokens": 8}))
    r = client(p).responses.create(
        model="m-1", instructions="Be brief.", input="Say hello in French", max_output_tokens=50
    )
    assert r.output_text == "Bonjour."
    assert r.status == "completed" and r.object == "response" and r.id.startswith("resp_")
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    # Anthropic counts cache reads apart from input_tokens; OpenAI's input includes them.
    assert r.usage is not None and r.usage.input_tokens == (48 if kind == "anthropic" else 40)
    assert r.usage.input_tokens_details.cached_tokens == 8 and r.usage.output_tokens > 0
    sent = fake.last
    assert sent.path == UPSTREAM_PATH[kind]
    if kind == "openai-responses":
        assert sent.json["input"] == "Say hello in French"
        assert sent.json["instructions"] == "Be brief." and sent.json["max_output_tokens"] == 50
    elif kind == "openai":
        assert sent.json["messages"] == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Say hello in French"},
        ]
        assert sent.json["max_tokens"] == 50
    else:
        assert sent.json["system"] == "Be brief." and sent.json["max_tokens"] == 50
        assert sent.json["messages"][0]["role"] == "user"


@pytest.mark.parametrize("kind", KINDS)
def test_stream_text_through_the_sdk_accumulator(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    p = start(fake, start_proxy, kind, "--mode", "passthrough")
    text = "A longer answer that arrives in several pieces over the stream. " * 3
    fake.enqueue(Reply(text=text))
    deltas: list[str] = []
    types: list[str] = []
    seqs: list[int] = []
    with client(p).responses.stream(model="m-1", input="Tell me") as stream:
        for event in stream:
            types.append(event.type)
            seqs.append(event.sequence_number)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert "".join(deltas) == text == final.output_text
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    for name in ("output_item.added", "content_part.added", "output_text.done", "content_part.done",
                 "output_item.done"):  # fmt: skip
        assert types.count("response." + name) == 1, name
    assert seqs == list(range(len(seqs)))
    assert final.usage is not None and final.usage.output_tokens > 0
    assert fake.last.path == UPSTREAM_PATH[kind] and fake.last.stream


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("streamed", [False, True])
def test_parallel_tool_calls(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, streamed: bool
) -> None:
    p = start(fake, start_proxy, kind, "--mode", "passthrough")
    calls = [("get_weather", {"city": "Lyon"}), ("get_time", {"tz": "Europe/Paris"})]
    fake.enqueue(Reply(tool_calls=calls))
    c = client(p)
    args: dict[str, Any] = {"model": "m-1", "input": "Weather and time?", "tools": TOOLS}
    if streamed:
        with c.responses.stream(**args, parallel_tool_calls=True) as stream:
            arg_deltas: dict[int, str] = {}
            for event in stream:
                if event.type == "response.function_call_arguments.delta":
                    arg_deltas[event.output_index] = arg_deltas.get(event.output_index, "") + (
                        event.delta
                    )
            r = stream.get_final_response()
        assert [json.loads(a) for a in arg_deltas.values()] == [a for _, a in calls]
    else:
        r = c.responses.create(**args, parallel_tool_calls=True)
    fcs = [o for o in r.output if o.type == "function_call"]
    assert [(f.name, json.loads(f.arguments)) for f in fcs] == calls
    assert all(f.call_id and f.status == "completed" for f in fcs)
    assert len({f.call_id for f in fcs}) == 2
    sent = fake.last.json
    if kind == "openai":
        assert [t["function"]["name"] for t in sent["tools"]] == ["get_weather", "get_time"]
        assert sent["parallel_tool_calls"] is True
    elif kind == "anthropic":
        assert [t["name"] for t in sent["tools"]] == ["get_weather", "get_time"]
    else:
        assert sent["tools"] == TOOLS


@pytest.mark.parametrize("kind", KINDS)
def test_tool_round_trip_items_reach_the_upstream(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    p = start(fake, start_proxy, kind, "--mode", "passthrough")
    fake.enqueue(Reply(text="It is sunny in Lyon."))
    items: list[Any] = [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Lyon?"}]},
        {"type": "function_call", "call_id": "call_a", "name": "get_weather",
         "arguments": '{"city":"Lyon"}'},
        {"type": "function_call", "call_id": "call_b", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_b", "output": "noon"},
    ]  # fmt: skip
    r = client(p).responses.create(model="m-1", input=items, tools=TOOLS)
    assert r.output_text == "It is sunny in Lyon."
    sent = fake.last.json
    if kind == "openai-responses":
        assert sent["input"] == items
    elif kind == "openai":
        msgs = sent["messages"]
        assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool"]
        assert [t["id"] for t in msgs[1]["tool_calls"]] == ["call_a", "call_b"]
        assert (msgs[2]["tool_call_id"], msgs[2]["content"]) == ("call_a", "sunny")
    else:
        msgs = sent["messages"]
        assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
        assert [b["id"] for b in msgs[1]["content"]] == ["call_a", "call_b"]
        assert [b["tool_use_id"] for b in msgs[2]["content"]] == ["call_a", "call_b"]


class Person(pydantic.BaseModel):
    name: str
    age: int


@pytest.mark.parametrize("kind", KINDS)
def test_parse_structured_output(fake: FakeProvider, start_proxy: StartProxy, kind: str) -> None:
    p = start(fake, start_proxy, kind, "--mode", "passthrough")
    fake.enqueue(Reply(text='{"name": "Ann", "age": 31}'))
    r = client(p).responses.parse(model="m-1", input="Who?", text_format=Person)
    assert r.output_parsed == Person(name="Ann", age=31)
    sent = fake.last.json
    if kind == "openai-responses":
        assert sent["text"]["format"]["type"] == "json_schema"
    elif kind == "openai":
        assert sent["response_format"]["json_schema"]["schema"]["required"] == ["name", "age"]
    else:
        assert sent["output_config"]["format"]["type"] == "json_schema"


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_hosted_tools_are_dropped_for_other_upstream_kinds(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    """Codex sends web_search and a namespace tool by default: a chat upstream gets the
    function tools only, and the reply says what was dropped."""
    p = start(fake, start_proxy, kind, "--mode", "passthrough")
    fake.enqueue(Reply(text="ok"))
    tools = [
        TOOLS[0],
        {"type": "web_search", "external_web_access": True},
        {"type": "namespace", "name": "multi_agent_v1", "tools": []},
    ]
    raw = client(p).responses.with_raw_response.create(model="m", input="hi", tools=tools)  # type: ignore[arg-type]
    assert raw.parse().output_text == "ok"
    assert raw.headers["x-skillstate-dropped-tools"] == "web_search,multi_agent_v1"
    names = [t.get("name") or t["function"]["name"] for t in fake.last.json["tools"]]
    assert names == ["get_weather"]
    # Streamed too (the header comes with the stream's headers).
    fake.enqueue(Reply(text="ok"))
    with client(p).responses.with_streaming_response.create(
        model="m",
        input="hi",
        tools=tools,
        stream=True,  # type: ignore[arg-type]
    ) as streamed:
        assert streamed.headers["x-skillstate-dropped-tools"] == "web_search,multi_agent_v1"
        assert b"response.completed" in streamed.read()


def test_unsupported_tools_reject(fake: FakeProvider, start_proxy: StartProxy) -> None:
    up = {"name": "up", "url": fake.url + "/v1", "kind": "openai", "api_key": "k"}
    p = start_proxy(
        None, "--mode", "passthrough", config={"upstreams": [up], "unsupported_tools": "reject"}
    )
    with pytest.raises(openai.BadRequestError) as e:
        client(p).responses.create(
            model="m",
            input="hi",
            tools=[TOOLS[0], {"type": "web_search"}],  # type: ignore[list-item]
        )
    assert e.value.code == "unsupported_tools" and "web_search" in e.value.message
    assert fake.requests == []
    fake.enqueue(Reply(text="fine"))  # function tools alone are fine
    assert client(p).responses.create(model="m", input="hi", tools=TOOLS).output_text == "fine"


def test_hosted_tools_reach_a_native_upstream(fake: FakeProvider, start_proxy: StartProxy) -> None:
    p = start(fake, start_proxy, "openai-responses", "--mode", "passthrough")
    fake.enqueue(Reply(text="ok"))
    tools = [TOOLS[0], {"type": "web_search", "external_web_access": True}]
    raw = client(p).responses.with_raw_response.create(model="m", input="hi", tools=tools)  # type: ignore[arg-type]
    assert fake.last.json["tools"] == tools
    assert "x-skillstate-dropped-tools" not in raw.headers


BAD_BODIES: list[tuple[Any, str]] = [
    ({"input": "hi"}, "model"),
    ({"model": "m"}, "input"),
    ({"model": "m", "input": 5}, "input"),
    ({"model": "m", "input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"model": "m", "input": [{"role": [], "content": "x"}]}, "input[0].role"),  # (was a 500)
    ({"model": "m", "input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id"),
    ({"model": "m", "input": [{"type": "function_call_output", "call_id": "c"}]},
     "input[0].output"),
    ({"model": "m", "input": "hi", "tools": [{"type": "function"}]}, "tools[0].name"),
    ({"model": "m", "input": "hi", "tools": {"a": 1}}, "tools"),
    ({"model": "m", "input": "hi", "tools": [{"type": "custom"}]}, "tools[0].name"),
    ({"model": "m", "input": "hi", "tools": [{"type": "custom", "name": "p",
      "format": {"type": "grammar", "syntax": "lark"}}]}, "tools[0].format.definition"),
    ({"model": "m", "input": "hi", "tools": [{"type": "custom", "name": "p",
      "format": {"type": "grammar", "grammar": {"syntax": "lark", "definition": "x"}}}]},
     "tools[0].format.syntax"),
    ({"model": "m", "input": "hi", "tools": [{"type": "custom", "name": "p", "format": "text"}]},
     "tools[0].format"),
    ({"model": "m", "input": "hi", "tool_choice": {"type": "custom"}}, "tool_choice"),
    ({"model": "m", "input": "hi", "tool_choice": "sometimes"}, "tool_choice"),
    ({"model": "m", "input": "hi", "stream": "yes"}, "stream"),
    ({"model": "m", "input": "hi", "max_output_tokens": -3}, "max_output_tokens"),
    ({"model": "m", "input": "hi", "temperature": "hot"}, "temperature"),
    ({"model": "m", "input": "hi", "text": {"format": {"type": "xml"}}}, "text.format"),
    ({"model": "m", "input": "hi", "previous_response_id": 7}, "previous_response_id"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "param"), BAD_BODIES)
def test_bad_input_is_a_400_in_openai_error_shape(
    fake: FakeProvider, proxy: Proxy, body: Any, param: str
) -> None:
    r = proxy.http.post(proxy.v1 + "/responses", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert err["message"]
    assert fake.requests == []


def test_sdk_raises_bad_request(fake: FakeProvider, proxy: Proxy) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client(proxy).responses.create(model="m", input=[{"role": "robot", "content": "x"}])  # type: ignore[list-item]
    assert e.value.status_code == 400 and "role" in e.value.message


# -- store and previous_response_id, kept by the proxy ------------------------------------------


@pytest.mark.parametrize("streamed", [False, True])
def test_previous_response_id_against_a_chat_completions_upstream(
    fake: FakeProvider, start_proxy: StartProxy, streamed: bool
) -> None:
    """A chat-completions upstream has no server-side state: the proxy rebuilds the chain."""
    p = start(fake, start_proxy, "openai", "--mode", "passthrough")
    c = client(p)
    fake.enqueue(Reply(tool_calls=[("get_weather", {"city": "Lyon"})]))
    if streamed:
        with c.responses.stream(model="m", input="Weather in Lyon?", tools=TOOLS) as s:
            first = s.get_final_response()
    else:
        first = c.responses.create(model="m", input="Weather in Lyon?", tools=TOOLS)
    call = first.output[0]
    assert call.type == "function_call"
    fake.enqueue(Reply(text="Sunny."))
    second = c.responses.create(
        model="m",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=TOOLS,
    )
    assert second.output_text == "Sunny." and second.previous_response_id == first.id
    msgs = fake.last.json["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool"]
    assert msgs[0]["content"] == "Weather in Lyon?"
    assert msgs[1]["tool_calls"][0]["id"] == call.call_id
    assert msgs[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}
    # A third turn chains on the second: the whole history again.
    fake.enqueue(Reply(text="You are welcome."))
    third = c.responses.create(model="m", previous_response_id=second.id, input="Thanks")
    roles = [m["role"] for m in fake.last.json["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant", "user"]
    # What the third response was generated from: the whole chain, then its own input.
    listed = c.responses.input_items.list(third.id, order="asc").data
    assert [i.type for i in listed] == [
        "message", "function_call", "function_call_output", "message", "message"
    ]  # fmt: skip


def test_previous_response_id_to_a_native_upstream_is_rebuilt_too(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai-responses", "--mode", "passthrough")
    c = client(p)
    fake.enqueue(Reply(text="First."))
    first = c.responses.create(model="m", input="one")
    fake.enqueue(Reply(text="Second."))
    c.responses.create(model="m", input="two", previous_response_id=first.id)
    sent = fake.last.json
    assert "previous_response_id" not in sent
    assert [i.get("role") for i in sent["input"]] == ["user", "assistant", "user"]
    assert sent["input"][1]["content"][0]["text"] == "First."


def test_input_items_come_in_the_apis_pages(fake: FakeProvider, start_proxy: StartProxy) -> None:
    p = start(fake, start_proxy, "openai", "--mode", "passthrough")
    c = client(p)
    fake.enqueue(Reply(text="Read them."))
    said = [f"note {n}" for n in range(25)]
    r = c.responses.create(model="m", input=[{"role": "user", "content": text} for text in said])

    def texts(items: Any) -> list[str]:
        return [i.content[0].text for i in items]

    first = c.responses.input_items.list(r.id)  # the API's page: 20, newest first
    assert texts(first.data) == said[::-1][:20] and first.has_more
    assert texts(c.responses.input_items.list(r.id)) == said[::-1]  # the SDK walks the pages
    page = c.responses.input_items.list(r.id, order="asc", limit=10)
    assert texts(page.data) == said[:10] and page.has_more
    assert page.last_id == page.data[-1].id
    rest = c.responses.input_items.list(r.id, order="asc", limit=100, after=page.last_id)
    assert texts(rest.data) == said[10:] and not rest.has_more
    for query, param in (
        ({"limit": 0}, "limit"),
        ({"limit": 101}, "limit"),
        ({"order": "sideways"}, "order"),
        ({"after": "item_nowhere"}, "after"),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.input_items.list(r.id, **query)  # type: ignore[arg-type]
        assert e.value.body["param"] == param  # type: ignore[index]


def test_get_delete_and_input_items(fake: FakeProvider, start_proxy: StartProxy) -> None:
    p = start(fake, start_proxy, "openai", "--mode", "passthrough")
    c = client(p)
    fake.enqueue(Reply(text="Stored."))
    r = c.responses.create(model="m", input="keep me", metadata={"k": "v"})
    got = c.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == "Stored."
    items = c.responses.input_items.list(r.id, order="asc")
    assert [i.type for i in items.data] == ["message"]
    assert items.data[0].content[0].text == "keep me"  # type: ignore[union-attr]
    c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.create(model="m", input="again", previous_response_id=r.id)
    assert e.value.body["param"] == "previous_response_id"  # type: ignore[index]
    # store: false keeps nothing
    fake.enqueue(Reply(text="Forgotten."))
    gone = c.responses.create(model="m", input="x", store=False)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(gone.id)


def test_previous_response_id_continues_that_responses_session(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai")
    c = client(p)
    fake.enqueue(Reply(text=envelope({"notes": "one"})))
    raw = c.responses.with_raw_response.create(
        model="m", input="one", extra_headers={SESSION_HEADER: "codex_1"}
    )
    first = raw.parse()
    fake.enqueue(Reply(text=envelope({"facts": "two"})))
    raw = c.responses.with_raw_response.create(
        model="m", input="two", previous_response_id=first.id
    )
    assert raw.headers[SESSION_HEADER] == "codex_1"
    assert raw.headers["x-skillstate-step"] == "2"
    assert p.state("codex_1")["state"] == {"notes": "one", "facts": "two"}


# -- state mode --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_state_mode_compacts_a_responses_transcript(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    """The compact context of a Responses transcript: prefix, task, state, then the latest
    observation = the last tool round (all parallel calls and outputs, reasoning byte-exact)."""
    p = start(fake, start_proxy, kind, "--mode", "state")
    reasoning = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "encrypted_content": "gAAAAB\u00e9+/=opaque",
    }
    items: list[Any] = [
        {"role": "developer", "content": "You are an agent."},
        {"role": "user", "content": "Task: check the weather."},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Old reply"}]},
        {"role": "user", "content": "Old question"},
        reasoning,
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": "noon"},
    ]  # fmt: skip
    fake.enqueue(Reply(text=envelope({"facts": "sunny at noon"})))
    raw = client(p).responses.with_raw_response.create(
        model="m", input=items, tools=TOOLS, extra_headers={SESSION_HEADER: "st1"}
    )
    assert raw.headers["x-skillstate-transition"] == "valid"
    assert p.state("st1")["state"] == {"facts": "sunny at noon"}
    sent = fake.last
    if kind == "openai-responses":
        got = sent.json["input"]
        assert "Old reply" not in sent.body.decode() and "Old question" not in sent.body.decode()
        assert got[0] == items[0] and got[1] == items[1]
        assert STATE_MARK in got[2]["content"][0]["text"]
        assert got[3:] == items[4:]
        # the reasoning item's bytes as the client sent them
        assert (
            json.dumps(reasoning, separators=(",", ":"), ensure_ascii=False).encode() in sent.body
        )
    else:
        text = sent.body.decode()
        assert "Old reply" not in text and "Old question" not in text
        assert CONTRACT_MARK in text and "sunny" in text and "noon" in text


# -- /cost ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_cost_meters_stream_and_json_alike(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    p = start(fake, start_proxy, kind, "--mode", "passthrough")
    c = client(p)
    usage = {"prompt_tokens": 1200, "cached_tokens": 200, "completion_tokens": 30}
    totals = []
    for i, streamed in enumerate((False, True)):
        session = {SESSION_HEADER: f"cost{i}"}
        fake.enqueue(Reply(text="Metered.", usage=usage))
        if streamed:
            with c.responses.stream(model="gpt-4o", input="hi", extra_headers=session) as s:
                s.get_final_response()
        else:
            c.responses.create(model="gpt-4o", input="hi", extra_headers=session)
        cost = p.get("/cost", params={"session": f"cost{i}"}).json()["totals"]
        totals.append(cost)
    json_row, stream_row = totals
    assert json_row["requests"] == stream_row["requests"] == 1
    for key in ("input_tokens", "output_tokens", "cache_read_tokens", "cost_usd"):
        assert json_row[key] == stream_row[key], key
    assert json_row["output_tokens"] == 30 and json_row["cache_read_tokens"] == 200
    assert json_row["cost_usd"] > 0


@pytest.mark.parametrize("kind", KINDS)
def test_parse_in_state_mode_keeps_the_clients_format(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    """text.format is the request's own output format: the reply cannot carry an envelope,
    so the proxy does not ask for one (and does not re-ask)."""
    p = start(fake, start_proxy, kind, "--mode", "state")
    fake.enqueue(Reply(text='{"name": "Ann", "age": 31}'))
    r = client(p).responses.with_raw_response.parse(model="m", input="Who?", text_format=Person)
    assert r.parse().output_parsed == Person(name="Ann", age=31)
    assert r.headers["x-skillstate-retries"] == "0" and len(fake.requests) == 1
    assert "```json" not in fake.last.body.decode()


@pytest.mark.parametrize("kind", KINDS)
def test_state_mode_stream_commits_before_the_terminal_event(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    p = start(fake, start_proxy, kind, "--mode", "state")
    fake.enqueue(Reply(text=envelope({"notes": "streamed"})))
    seen: list[str] = []
    with client(p).responses.stream(
        model="m", input="go", extra_headers={SESSION_HEADER: "sst"}
    ) as stream:
        for event in stream:
            seen.append(event.type)
            if event.type == "response.completed":
                # committed before the terminal event went out
                assert p.state("sst")["state"] == {"notes": "streamed"}
        final = stream.get_final_response()
    # reply_envelope strip (the default): the client gets the prose, not the envelope
    assert seen[-1] == "response.completed" and final.output_text == "Done."


CODEX_TOOLS: list[Any] = [
    {"type": "function", "name": "exec_command", "strict": False,
     "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                    "required": ["cmd"]}},
    {"type": "namespace", "name": "multi_agent_v1",
     "tools": [{"type": "function", "name": "spawn"}]},
    {"type": "web_search", "external_web_access": True},
]  # fmt: skip


@pytest.mark.parametrize("mode", ["state", "passthrough"])
def test_a_codex_shaped_turn_against_a_chat_completions_upstream(
    fake: FakeProvider, start_proxy: StartProxy, mode: str
) -> None:
    """What Codex 0.169 sends by default (developer messages, encrypted reasoning asked for,
    client_metadata, hosted tools, store false, a stream), against a chat upstream with no
    extra configuration: the shell call comes back, and the next turn's reasoning item and
    call/output pair are accepted."""
    p = start(fake, start_proxy, "openai", "--mode", mode)
    body: dict[str, Any] = {
        "model": "gpt-5-codex",
        "instructions": "",
        "input": [
            {"type": "message", "role": "developer",
             "content": [{"type": "input_text", "text": "You are Codex."}]},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "<environment_context/>"}]},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "list the files"}]},
        ],
        "tools": CODEX_TOOLS, "tool_choice": "auto", "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"}, "store": False, "stream": True,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "thread-1",
        "client_metadata": {"originator": "codex_exec"},
    }  # fmt: skip
    fake.enqueue(Reply(text=envelope({"notes": "listing"}) if mode == "state" else "",
                       tool_calls=[("exec_command", {"cmd": "ls"})]))  # fmt: skip
    session = {SESSION_HEADER: "codex"}
    with p.http.stream("POST", p.v1 + "/responses", json=body, headers=session) as r:
        assert r.status_code == 200
        assert r.headers["x-skillstate-dropped-tools"] == "multi_agent_v1,web_search"
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    call = next(i for i in done if i["type"] == "function_call")
    assert call["name"] == "exec_command" and json.loads(call["arguments"]) == {"cmd": "ls"}
    sent = fake.last.json
    assert [t["function"]["name"] for t in sent["tools"]] == ["exec_command"]
    assert sent["prompt_cache_key"] == "thread-1" and "client_metadata" not in sent
    # Turn 2: Codex echoes the reasoning and the call, and adds the output.
    body["input"] = [
        *body["input"],
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "enc=="},
        {**call, "status": "completed"},
        {"type": "function_call_output", "call_id": call["call_id"], "output": "a.txt\nb.txt"},
    ]
    fake.enqueue(Reply(text=envelope({"notes": "done"}) if mode == "state" else "Two files."))
    with p.http.stream("POST", p.v1 + "/responses", json=body, headers=session) as r:
        assert r.status_code == 200
        assert any('"response.completed"' in line for line in r.iter_lines())
    msgs = fake.last.json["messages"]
    assert msgs[-2]["tool_calls"][0]["id"] == call["call_id"]
    assert msgs[-1] == {"role": "tool", "tool_call_id": call["call_id"], "content": "a.txt\nb.txt"}


def tool_loop(repeat: int) -> list[Any]:
    """A task, then eight function calls, each answered by an output that names it
    (``OUTPUT-i``, ``repeat`` times)."""
    items: list[Any] = [{"role": "user", "content": "Task: read the files."}]
    for i in range(8):
        items += [
            {"type": "function_call", "call_id": f"c{i}", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{i}", "output": f"OUTPUT-{i} " * repeat},
        ]
    return items


def test_mask_mode_masks_old_function_call_outputs(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai-responses", "--mode", "mask")
    items = tool_loop(repeat=50)
    fake.enqueue(Reply(text="ok"))
    client(p).responses.create(model="m", input=items, tools=TOOLS)
    sent = fake.last.json["input"]
    assert len(sent) == len(items)
    assert [i.get("call_id") for i in sent] == [i.get("call_id") for i in items]
    outputs = [i["output"] for i in sent if i.get("type") == "function_call_output"]
    assert "OUTPUT-0" not in outputs[0] and "OUTPUT-7" in outputs[7]
    assert sent[0] == items[0]  # the task is never masked


def test_cost_baseline_counts_a_responses_transcript(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """The savings baseline estimates the client's whole Responses transcript (``input``
    and ``instructions``), not only its tools: a long loop compacted in state mode saves."""
    p = start(fake, start_proxy, "openai", "--mode", "state")
    items = tool_loop(repeat=80)
    fake.enqueue(Reply(text=envelope({"notes": "read"})))
    client(p).responses.create(
        model="gpt-4o", instructions="Be careful. " * 20, input=items, tools=TOOLS,
        extra_headers={SESSION_HEADER: "base"},
    )  # fmt: skip
    totals = p.get("/cost", params={"session": "base"}).json()["totals"]
    assert totals["baseline_input_tokens"] > 2 * totals["input_tokens"]
    assert totals["saved_input_tokens"] > 0


def test_cost_baseline_of_a_responses_transcript_leaves_out_earlier_envelopes(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """The baseline is the client's transcript without the envelopes the proxy caused: an
    earlier assistant item that still carries one (a client that kept the unstripped reply)
    counts as if it had not, as chat and Messages transcripts do."""
    p = start(fake, start_proxy, "openai", "--mode", "state")
    said = " ".join(["Looked at the files, nothing else to report."] * 4)
    baselines = []
    block = "\n```json\n" + json.dumps({"state_patch": {"notes": "x"}, "action": "a"}) + "\n```"
    for session, earlier in (("plain", said), ("enveloped", said + block)):
        items: list[Any] = [
            {"role": "user", "content": "Task: read the files."},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": earlier}]},
            {"role": "user", "content": "And now?"},
        ]  # fmt: skip
        fake.enqueue(Reply(text=envelope({"notes": "read"}), usage={"prompt_tokens": 500}))
        client(p).responses.create(
            model="gpt-4o", input=items, extra_headers={SESSION_HEADER: session}
        )
        totals = p.get("/cost", params={"session": session}).json()["totals"]
        baselines.append(totals["baseline_input_tokens"])
    assert baselines[0] == baselines[1] > 0
