"""The Anthropic Messages API (/v1/messages) through the real proxy with the real anthropic
SDK, against the fake provider in OpenAI mode (translated) and in Anthropic mode (native)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply, ToolCall
from tests.helpers import SESSION_HEADER, ant, oai

TOOLS = [
    {"name": "get_weather", "description": "w", "input_schema": {"type": "object"}},
    {"name": "get_time", "description": "t", "input_schema": {"type": "object"}},
]


def envelope(patch: dict[str, Any], action: str = "next") -> str:
    return f"Sure.\n```json\n{json.dumps({'state_patch': patch, 'action': action})}\n```"


@pytest.fixture(params=["openai", "anthropic"])
def upstream_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def aproxy(fake: FakeProvider, start_proxy: StartProxy, upstream_kind: str) -> Proxy:
    cfg = {
        "schema": ["facts", "notes"],
        "upstreams": [
            {"name": "up", "url": fake.url, "kind": upstream_kind, "api_key": "sk-configured"}
        ],
    }
    return start_proxy(None, config=cfg)


def client(p: Proxy) -> anthropic.Anthropic:
    return ant(p, "sk-client")


def comparable(msg: Any) -> dict[str, Any]:
    d = msg.model_dump()
    d.pop("id")
    return d


def test_stream_final_message_equals_non_streamed(
    fake: FakeProvider, aproxy: Proxy, upstream_kind: str
) -> None:
    reply = Reply(
        text="Checking both.",
        tool_calls=[
            ToolCall("get_weather", {"city": "Paris", "days": [1, 2]}, id="toolu_w1"),
            ToolCall("get_time", {"tz": "CET"}, id="toolu_t1"),
        ],
        usage={"prompt_tokens": 50, "completion_tokens": 20},
    )
    c = client(aproxy)
    kw: dict[str, Any] = {
        "model": "claude-test",
        "max_tokens": 256,
        "tools": TOOLS,
        "messages": [{"role": "user", "content": "weather and time?"}],
        "extra_headers": {SESSION_HEADER: "eq"},
    }
    fake.enqueue(reply)
    plain = c.messages.create(**kw)
    fake.enqueue(reply)
    with c.messages.stream(**kw) as s:
        streamed = s.get_final_message()
    assert comparable(streamed) == comparable(plain)
    assert plain.stop_reason == "tool_use"
    tool_uses = [b for b in plain.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in tool_uses] == [
        ("get_weather", {"city": "Paris", "days": [1, 2]}),
        ("get_time", {"tz": "CET"}),
    ]
    assert plain.usage.output_tokens == 20


def test_three_parallel_tool_calls_stream_and_pair_next_turn(
    fake: FakeProvider, aproxy: Proxy, upstream_kind: str
) -> None:
    c = client(aproxy)
    hdr = {SESSION_HEADER: "par"}
    fake.enqueue(Reply(tool_calls=[("get_weather", {"city": x}) for x in ("A", "B", "C")]))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "three cities"}]
    with c.messages.stream(
        model="m", max_tokens=100, tools=TOOLS, messages=messages, extra_headers=hdr
    ) as s:
        final = s.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert [b.input for b in uses] == [{"city": "A"}, {"city": "B"}, {"city": "C"}]
    assert len({b.id for b in uses}) == 3
    messages.append({"role": "assistant", "content": [b.model_dump() for b in final.content]})
    messages.append(
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": b.id, "content": f"sunny in {b.input}"}
                for b in uses
            ],
        }
    )
    fake.enqueue(Reply(text=envelope({"notes": "three done"})))
    done = c.messages.create(
        model="m", max_tokens=100, tools=TOOLS, messages=messages, extra_headers=hdr
    )
    assert done.stop_reason == "end_turn"
    sent = fake.last.json
    # The upstream saw the calls and their results paired, by id, in its own dialect.
    if upstream_kind == "openai":
        calls = next(m for m in sent["messages"] if m.get("tool_calls"))
        results = [m["tool_call_id"] for m in sent["messages"] if m["role"] == "tool"]
        assert [tc["id"] for tc in calls["tool_calls"]] == [b.id for b in uses] == results
    else:
        a = next(m for m in sent["messages"] if m["role"] == "assistant")
        ids = [b["id"] for b in a["content"] if b["type"] == "tool_use"]
        last = sent["messages"][-1]
        assert ids == [b.id for b in uses]
        assert [b["tool_use_id"] for b in last["content"] if b["type"] == "tool_result"] == ids
    assert aproxy.state("par")["state"] == {"notes": "three done"}


def test_state_updates_visible_like_chat_completions(fake: FakeProvider, aproxy: Proxy) -> None:
    fake.enqueue(Reply(text=envelope({"facts": {"x": 1}})))
    raw = client(aproxy).messages.with_raw_response.create(
        model="m",
        max_tokens=50,
        system=[{"type": "text", "text": "sys"}],
        messages=[{"role": "user", "content": "go"}],
        extra_headers={SESSION_HEADER: "vis"},
    )
    assert raw.headers["x-skillstate-transition"] == "valid"
    assert aproxy.state("vis")["state"] == {"facts": {"x": 1}}
    # A streamed turn commits too, before message_stop.
    fake.enqueue(Reply(text=envelope({"notes": "s"})))
    with client(aproxy).messages.stream(
        model="m", max_tokens=50, messages=[{"role": "user", "content": "again"}],
        extra_headers={SESSION_HEADER: "vis"},
    ) as s:  # fmt: skip
        s.get_final_message()
    assert aproxy.state("vis")["state"] == {"facts": {"x": 1}, "notes": "s"}


def test_client_key_never_forwarded(fake: FakeProvider, aproxy: Proxy, upstream_kind: str) -> None:
    client(aproxy).messages.create(
        model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    )
    h = fake.last.headers
    assert "sk-client" not in json.dumps(h)
    if upstream_kind == "anthropic":
        assert h["x-api-key"] == "sk-configured" and "anthropic-version" in h
    else:
        assert h["authorization"] == "Bearer sk-configured"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}, "role"),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [
                    {"role": "user", "content": [{"type": "tool_result", "content": "r"}]}
                ],
            },
            "tool_use_id",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "tools": [{"name": "t", "input_schema": "nope"}],
                "messages": [{"role": "user", "content": "x"}],
            },
            "input_schema",
        ),
    ],
)
def test_malformed_requests_get_anthropic_400(
    aproxy: Proxy, body: dict[str, Any], needle: str
) -> None:
    r = aproxy.http.post(aproxy.v1 + "/messages", json=body, headers={"x-api-key": "k"})
    assert r.status_code == 400
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert needle in err["error"]["message"]


def test_a_stray_stream_options_is_ignored_on_messages(fake: FakeProvider, aproxy: Proxy) -> None:
    fake.enqueue(Reply(text=envelope({"notes": "n"})))
    body = {"model": "m", "max_tokens": 9, "stream": True, "stream_options": "yes"}
    r = aproxy.http.post(
        aproxy.v1 + "/messages",
        json={**body, "messages": [{"role": "user", "content": "x"}]},
        headers={"x-api-key": "k"},
    )
    assert r.status_code == 200 and b"event: message_stop" in r.content


def test_errors_are_anthropic_shaped(fake: FakeProvider, aproxy: Proxy) -> None:
    fake.enqueue(Reply(status=429, error_body="slow down", retry_after="0"))
    fake.enqueue(Reply(status=429, error_body="slow down", retry_after="0"))
    fake.enqueue(Reply(status=429, error_body="slow down", retry_after="0"))
    with pytest.raises(anthropic.RateLimitError) as e:
        client(aproxy).messages.create(
            model="m", max_tokens=10, messages=[{"role": "user", "content": "x"}]
        )
    assert "slow down" in str(e.value)
    r = aproxy.http.post(
        aproxy.v1 + "/messages",
        content=b"{oops",
        headers={"x-api-key": "k", "content-type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_max_tokens_field_is_the_upstreams_choice(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    up = {"name": "o", "url": fake.url + "/v1", "max_tokens_field": "max_completion_tokens"}
    p = start_proxy(None, config={"upstreams": [up]})
    c = ant(p, "k")
    fake.enqueue(Reply(text=envelope({"notes": "n"})))
    c.messages.create(model="gpt-5", max_tokens=77, messages=[{"role": "user", "content": "go"}])
    assert fake.last.json["max_completion_tokens"] == 77 and "max_tokens" not in fake.last.json


PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_structured_outputs_cross_dialects(fake: FakeProvider, start_proxy: StartProxy) -> None:
    import pydantic

    class Person(pydantic.BaseModel):
        name: str
        age: int

    up = {"name": "a", "url": fake.url, "kind": "anthropic", "api_key": "k"}
    p = start_proxy(None, config={"upstreams": [up]})
    fake.enqueue(Reply(text='{"name": "Ann", "age": 31}'))
    c = oai(p, "x")
    r = c.chat.completions.parse(
        model="claude-x", messages=[{"role": "user", "content": "who?"}], response_format=Person
    )
    assert r.choices[0].message.parsed == Person(name="Ann", age=31)
    fmt = fake.last.json["output_config"]["format"]
    assert fmt["type"] == "json_schema" and fmt["schema"]["properties"].keys() == {"name", "age"}

    p.stop()  # one proxy per data dir
    up = {"name": "o", "url": fake.url + "/v1", "kind": "openai", "api_key": "k"}
    p = start_proxy(None, config={"upstreams": [up]})
    fake.enqueue(Reply(text='{"name": "Bo", "age": 2}'))
    a = ant(p, "k")
    m = a.messages.create(
        model="gpt-x", max_tokens=50, messages=[{"role": "user", "content": "who?"}],
        output_config={"format": {"type": "json_schema", "schema": PERSON_SCHEMA}},
    )  # fmt: skip
    assert json.loads(m.content[0].text) == {"name": "Bo", "age": 2}  # type: ignore[union-attr]
    # A closed schema with every member required: OpenAI can guarantee it too (strict).
    assert fake.last.json["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": PERSON_SCHEMA, "strict": True},
    }


def test_openai_client_against_anthropic_upstream(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start_proxy(
        None,
        config={"upstreams": [{"name": "a", "url": fake.url, "kind": "anthropic", "api_key": "k"}]},
    )
    c = oai(p, "x")
    fake.enqueue(Reply(text=envelope({"notes": "via anthropic"}), tool_calls=[("f", {"a": 1})]))
    r = c.chat.completions.create(
        model="claude-x",
        messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "go"}],
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        extra_headers={SESSION_HEADER: "x1"},
    )
    msg = r.choices[0].message
    assert msg.tool_calls and json.loads(msg.tool_calls[0].function.arguments) == {"a": 1}
    assert fake.last.path == "/v1/messages" and fake.last.json["system"] == "S"
    fake.enqueue(Reply(text=envelope({"notes": "streamed"})))
    chunks = list(
        c.chat.completions.create(
            model="claude-x", messages=[{"role": "user", "content": "go"}], stream=True,
            stream_options={"include_usage": True}, extra_headers={SESSION_HEADER: "x1"},
        )
    )  # fmt: skip
    assert chunks[-1].usage is not None
    assert p.state("x1")["state"] == {"notes": "streamed"}


def test_count_tokens_counts_what_would_be_sent(
    fake: FakeProvider, aproxy: Proxy, upstream_kind: str
) -> None:
    c = client(aproxy)
    hdr = {SESSION_HEADER: "count"}
    long_transcript: list[Any] = [{"role": "user", "content": "TASK: watch the logs."}]
    for i in range(12):
        long_transcript += [
            {"role": "assistant", "content": f"noted {i}"},
            {"role": "user", "content": f"Observation {i}: " + "log line " * 40},
        ]
    fake.enqueue(Reply(text=envelope({"notes": "n"})))
    c.messages.create(model="m", max_tokens=64, messages=long_transcript, extra_headers=hdr)
    n_before = len(fake.requests)

    raw = c.messages.with_raw_response.count_tokens(
        model="m", messages=long_transcript, extra_headers=hdr
    )
    compact = raw.parse().input_tokens
    full = c.messages.count_tokens(
        model="m",
        messages=long_transcript,
        extra_headers={**hdr, "x-skillstate-mode": "passthrough"},
    ).input_tokens
    assert 0 < compact < full / 3  # state mode counts the compact context, not the transcript
    assert raw.headers[SESSION_HEADER] == "count"
    if upstream_kind == "anthropic":
        # counted by the upstream's own endpoint, with only the fields it accepts
        counted = [r for r in fake.requests[n_before:] if r.path == "/v1/messages/count_tokens"]
        assert len(counted) == 2
        assert "[skillstate] STATE" in json.dumps(counted[0].json["messages"])
        assert raw.headers["x-skillstate-upstream"] == "up"
        assert "x-skillstate-token-count" not in raw.headers
    else:
        assert len(fake.requests) == n_before  # estimated locally; nothing sent
        assert raw.headers["x-skillstate-token-count"] == "estimate"
    assert aproxy.state("count")["step"] == 1  # counting commits nothing


def test_count_tokens_bad_requests_are_anthropic_errors(aproxy: Proxy) -> None:
    c = client(aproxy)
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.count_tokens(model="m", messages=[])
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    r = aproxy.http.post(
        aproxy.url + "/v1/messages/count_tokens",
        content=b"{nope",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_unknown_constrain_header_is_a_400(aproxy: Proxy) -> None:
    with pytest.raises(anthropic.BadRequestError, match="x-skillstate-constrain"):
        client(aproxy).messages.create(
            model="m",
            max_tokens=8,
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"x-skillstate-constrain": "bogus"},
        )


def test_a_cache_pre_warm_with_max_tokens_0_is_one_call_and_keeps_the_state(
    fake: FakeProvider, aproxy: Proxy
) -> None:
    """Anthropic documents ``max_tokens: 0`` as the way to populate the prompt cache. No
    envelope can come back from a zero-token reply: the turn is not re-asked (which billed
    three calls for one), goes out without an envelope grammar and keeps the state."""
    fake.enqueue(Reply(text=envelope({"notes": "before"})))
    client(aproxy).messages.create(
        model="m", max_tokens=50, messages=[{"role": "user", "content": "go"}],
        extra_headers={SESSION_HEADER: "warm"},
    )  # fmt: skip
    before = len(fake.requests)
    raw = client(aproxy).messages.with_raw_response.create(
        model="m", max_tokens=0, messages=[{"role": "user", "content": "warm it"}],
        extra_headers={SESSION_HEADER: "warm"},
    )  # fmt: skip
    assert len(fake.requests) == before + 1  # one upstream call, no re-ask
    assert raw.headers["x-skillstate-transition"] == "format-noop"
    sent = fake.requests[-1].json
    assert sent["max_tokens"] == 0
    assert "response_format" not in sent and "output_config" not in sent
    assert aproxy.state("warm")["state"] == {"notes": "before"}
