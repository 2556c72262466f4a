"""The real proxy, driven by the real openai SDK, against the fake provider."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pydantic
import pytest

from skillstate.engine.context import CONTRACT_MARK
from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER

SESSION = {SESSION_HEADER: "sess_1"}


def envelope(patch: dict, action: str = "next", prefix: str = "Thinking.") -> str:
    return f"{prefix}\n```json\n{json.dumps({'state_patch': patch, 'action': action})}\n```"


def client(proxy: Proxy, **kw: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.v1, api_key="sk-client", max_retries=0, **kw)


def test_non_streaming_turn_commits_state(fake: FakeProvider, proxy: Proxy) -> None:
    fake.enqueue(Reply(text=envelope({"facts": {"city": "Lyon"}}, "remember city")))
    raw = client(proxy).chat.completions.with_raw_response.create(
        model="gpt-test",
        messages=[{"role": "user", "content": "Plan a trip to Lyon"}],
        extra_headers=SESSION,
    )
    reply = raw.parse()
    assert reply.choices[0].message.content == "Thinking."  # the envelope is stripped
    assert raw.headers[SESSION_HEADER] == "sess_1"
    assert raw.headers["x-skillstate-transition"] == "valid"
    assert raw.headers["x-skillstate-step"] == "1"
    assert raw.headers["x-skillstate-upstream"] == "default"
    assert proxy.state("sess_1")["state"] == {"facts": {"city": "Lyon"}}
    sent = fake.last
    # The configured key replaces the client's; our own headers are never forwarded.
    assert sent.headers["authorization"] == "Bearer sk-upstream"
    assert not any(k.startswith("x-skillstate") for k in sent.headers)


def test_missing_session_header_creates_one(fake: FakeProvider, proxy: Proxy) -> None:
    raw = client(proxy).chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    sid = raw.headers[SESSION_HEADER]
    assert sid and proxy.state(sid)["step"] == 1


def test_streaming_is_incremental_and_commits_before_done(fake: FakeProvider, proxy: Proxy) -> None:
    text = envelope({"notes": "streamed"}, prefix="word " * 40)
    fake.enqueue(Reply(text=text, chunk_delay=0.01))
    seen_state_before_done = None
    pieces = []
    with httpx.stream(
        "POST",
        proxy.v1 + "/chat/completions",
        json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}]},
        headers={**SESSION, "authorization": "Bearer x"},
        timeout=10,
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith(": skillstate"):
                pieces.append(line)
            if line == "data: [DONE]":
                seen_state_before_done = proxy.state("sess_1")["state"]
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                # The client did not ask for usage: the usage-only chunk is dropped.
                assert chunk["choices"], "usage-only chunk leaked to a client that did not ask"
    assert seen_state_before_done == {"notes": "streamed"}
    assert len(pieces) == 1 and pieces[0].startswith(": skillstate transition=valid step=1 ")
    assert "pricing=" in pieces[0] and "saved-tokens=" in pieces[0]
    # Upstream was asked for usage so the stream can be metered.
    assert fake.last.json["stream_options"] == {"include_usage": True}


def test_streaming_with_sdk_and_usage(fake: FakeProvider, proxy: Proxy) -> None:
    fake.enqueue(Reply(text=envelope({"step": 1}), usage={"prompt_tokens": 123}))
    stream = client(proxy).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "go"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=SESSION,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Thinking."  # the envelope is stripped from the stream
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 123
    assert proxy.state("sess_1")["state"] == {"step": 1}


async def test_async_client_streaming_and_not(fake: FakeProvider, proxy: Proxy) -> None:
    c = openai.AsyncOpenAI(base_url=proxy.v1, api_key="k", max_retries=0)
    fake.enqueue(Reply(text=envelope({"step": 1})), Reply(text=envelope({"step": 2})))
    r = await c.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "a"}], extra_headers=SESSION
    )
    assert r.choices[0].message.content
    s = await c.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "b"}], stream=True, extra_headers=SESSION
    )
    assert [c async for c in s]
    assert proxy.state("sess_1")["state"] == {"step": 2}
    await c.close()


def test_tool_calls_pass_through_and_are_tool_noop(fake: FakeProvider, proxy: Proxy) -> None:
    fake.enqueue(Reply(tool_calls=[("read", {"path": "a"}), ("read", {"path": "b"})]))
    raw = client(proxy).chat.completions.with_raw_response.create(
        model="m",
        messages=[{"role": "user", "content": "read both"}],
        tools=[
            {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}
        ],
        extra_headers=SESSION,
    )
    msg = raw.parse().choices[0].message
    assert [json.loads(tc.function.arguments) for tc in msg.tool_calls or []] == [
        {"path": "a"},
        {"path": "b"},
    ]
    assert raw.headers["x-skillstate-transition"] == "tool-noop"
    assert fake.last.json["tools"][0]["function"]["name"] == "read"


class Person(pydantic.BaseModel):
    name: str
    age: int


def test_structured_output_is_answered_once_and_changes_no_state(
    fake: FakeProvider, proxy: Proxy
) -> None:
    c = client(proxy)
    fake.enqueue(Reply(text=envelope({"notes": "before"})))
    c.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "start"}], extra_headers=SESSION
    )
    # The client's own format: the reply is its object, with no room for an envelope.
    fake.enqueue(Reply(text='{"name": "Ann", "age": 31}'))
    before = len(fake.requests)
    msgs = [{"role": "user", "content": "start"}, {"role": "user", "content": "who is it?"}]
    raw = c.chat.completions.with_raw_response.parse(
        model="m", messages=msgs, response_format=Person, extra_headers=SESSION
    )
    assert raw.parse().choices[0].message.parsed == Person(name="Ann", age=31)
    assert len(fake.requests) == before + 1  # no re-ask for an envelope it could not write
    assert raw.headers["x-skillstate-transition"] == "format-noop"
    assert raw.headers["x-skillstate-step"] == "2"
    assert proxy.state("sess_1")["state"] == {"notes": "before"}
    sent = fake.last.json
    assert sent["response_format"]["json_schema"]["name"] == "Person"
    [contract] = [m["content"] for m in sent["messages"] if CONTRACT_MARK in m["content"]]
    assert "response format you were given" in contract and "```" not in contract
    assert '{"notes":"before"}' in contract  # the state is still the model's memory


def test_streamed_json_mode_turn_is_format_noop(fake: FakeProvider, proxy: Proxy) -> None:
    fake.enqueue(Reply(text='{"answer": 42}'))
    with client(proxy).chat.completions.with_streaming_response.create(
        model="m",
        messages=[{"role": "user", "content": "answer in JSON"}],
        response_format={"type": "json_object"},
        stream=True,
        extra_headers=SESSION,
    ) as r:
        body = b"".join(r.iter_bytes())
    assert b": skillstate transition=format-noop step=1" in body
    assert len(fake.requests) == 1


def test_models_passthrough(fake: FakeProvider, proxy: Proxy) -> None:
    models = client(proxy).models.list()
    assert models.data


def test_langchain_openai(fake: FakeProvider, proxy: Proxy) -> None:
    from langchain_openai import ChatOpenAI

    fake.enqueue(Reply(text=envelope({"notes": "lc"})))
    llm = ChatOpenAI(
        model="m",
        base_url=proxy.v1,
        api_key="k",  # type: ignore[arg-type]
        max_retries=0,
        default_headers=SESSION,
    )
    out = llm.invoke("hello")
    assert out.content == "Thinking."  # the envelope is stripped
    assert proxy.state("sess_1")["state"] == {"notes": "lc"}
    fake.enqueue(Reply(text=envelope({"notes": "lc2"})))
    assert "".join(str(c.content) for c in llm.stream("again"))
    assert proxy.state("sess_1")["state"] == {"notes": "lc2"}


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1,2]", 400, "JSON object"),
        (b'{"model": "m", "messages": []}', 400, "messages"),
        (b'{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}', 400, "role"),
        (b'{"model": "m", "messages": [{"role": {"a": 1}, "content": "x"}]}', 400, "role"),
        (b'{"model": "m", "messages": [{"role": ["user"], "content": "x"}]}', 400, "role"),
        (
            b'{"model": "m", "stream": true, "stream_options": "yes",'
            b' "messages": [{"role": "user", "content": "x"}]}',
            400,
            "stream_options",
        ),
    ],
)
def test_bad_requests_get_openai_errors(
    proxy: Proxy, body: bytes, status: int, needle: str
) -> None:
    r = proxy.http.post(
        proxy.v1 + "/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == status
    err = r.json()["error"]
    assert needle in err["message"] and err["type"] == "invalid_request_error"


def test_bad_session_id_is_400(proxy: Proxy) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client(proxy).chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "x"}],
            extra_headers={SESSION_HEADER: "bad id!"},
        )
    assert SESSION_HEADER in str(e.value)
    r = proxy.get("/state", params={"session": "bad id!"})
    assert r.status_code == 400


def test_oversize_body_is_413(fake: FakeProvider, start_proxy: StartProxy) -> None:
    p = start_proxy(fake.url, config={"max_body_bytes": 4096})
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 10000}]}
    r = p.http.post(p.v1 + "/chat/completions", json=big)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"
    assert fake.requests == []


def test_unknown_path_404(proxy: Proxy) -> None:
    r = proxy.get("/v1/nope")
    assert r.status_code == 404 and "error" in r.json()


def test_upstream_errors_pass_through(fake: FakeProvider, proxy: Proxy) -> None:
    fake.enqueue(Reply(status=400, error_body="model says no"))
    with pytest.raises(openai.BadRequestError) as e:
        client(proxy).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], extra_headers=SESSION
        )
    assert "model says no" in str(e.value)
    # Nothing was committed for a failed turn.
    assert proxy.get("/state", params={"session": "sess_1"}).status_code == 404


def test_unreachable_upstream_is_502(start_proxy: StartProxy) -> None:
    p = start_proxy("http://127.0.0.1:9/v1")
    with pytest.raises(openai.APIStatusError) as e:
        client(p).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 502


def test_health(proxy: Proxy) -> None:
    h = proxy.get("/health").json()
    assert h["ok"] is True and h["store"] == "ok"
    assert h["upstreams"][0]["name"] == "default" and h["upstreams"][0]["circuit"] == "closed"


def test_client_disconnect_cancels_upstream(fake: FakeProvider, proxy: Proxy) -> None:
    fake.enqueue(Reply(text="slow", delay=30))

    async def go() -> None:
        async with httpx.AsyncClient() as c:
            with pytest.raises(httpx.ReadTimeout):
                await c.post(
                    proxy.v1 + "/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                    timeout=0.5,
                )

    asyncio.run(go())
    fake.wait_for(lambda reqs: bool(reqs) and reqs[-1].disconnected, timeout=10)
