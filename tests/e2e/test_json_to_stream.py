"""An upstream (or a gateway in front of it) that answers a ``stream: true`` request with
the whole reply as JSON (application/json): the client still gets a stream in its own
dialect, read by its own SDK, with the reply's text, tool calls and usage; the turn is
metered from the JSON's usage and its state committed, on every route and every upstream
kind. The real proxy (in-process uvicorn) in front of the fake provider."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, ant, envelope, oai

CHAT_KINDS = ["openai", "anthropic"]  # a chat or Messages client has no Responses upstream
KINDS = [*CHAT_KINDS, "openai-responses"]
USAGE = {"prompt_tokens": 40, "completion_tokens": 12}


def start(fake: FakeProvider, start_proxy: StartProxy, kind: str) -> Proxy:
    url = fake.url if kind == "anthropic" else fake.url + "/v1"
    up = {"name": "up", "url": url, "kind": kind, "api_key": "sk-upstream"}
    fake.stream_as_json = True
    return start_proxy(None, "--schema", "notes", config={"upstreams": [up]})


def committed(proxy: Proxy, session: str) -> dict[str, Any]:
    r = proxy.http.get(proxy.url + "/state", params={"session": session})
    assert r.status_code == 200, r.text
    return dict(r.json())


def turn_rows(proxy: Proxy, session: str) -> dict[str, Any]:
    return dict(proxy.http.get(proxy.url + "/cost", params={"session": session}).json()["totals"])


def check_metered(proxy: Proxy, session: str) -> None:
    totals = turn_rows(proxy, session)
    assert totals["requests"] == 1 and totals["attempts"]["stream"] == 1, totals
    assert totals["output_tokens"] == 12 and totals["usage_unavailable_rows"] == 0


@pytest.mark.parametrize("kind", CHAT_KINDS)
def test_chat_completions_stream(fake: FakeProvider, start_proxy: StartProxy, kind: str) -> None:
    p = start(fake, start_proxy, kind)
    fake.enqueue(Reply(text=envelope({"notes": "kept"}, prefix="Hello there."), usage=USAGE))
    client = oai(p, "sk")
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={SESSION_HEADER: "c1"},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("Hello there.") and "state_patch" not in text
    assert [c.usage.completion_tokens for c in chunks if c.usage] == [12]
    assert fake.requests[0].json["stream"] is True
    assert committed(p, "c1")["state"] == {"notes": "kept"}
    check_metered(p, "c1")


@pytest.mark.parametrize("kind", CHAT_KINDS)
def test_chat_completions_stream_with_a_tool_call(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    p = start(fake, start_proxy, kind)
    fake.enqueue(Reply(tool_calls=[("get_weather", {"city": "Paris"})], usage=USAGE))
    client = oai(p, "sk")
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    with client.chat.completions.stream(
        model="m",
        messages=[{"role": "user", "content": "weather?"}],
        tools=[tool],  # type: ignore[list-item]
        extra_headers={SESSION_HEADER: "c2", "x-skillstate-mode": "passthrough"},
    ) as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert calls is not None and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert final.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("kind", CHAT_KINDS)
def test_messages_stream(fake: FakeProvider, start_proxy: StartProxy, kind: str) -> None:
    p = start(fake, start_proxy, kind)
    fake.enqueue(Reply(text=envelope({"notes": "kept"}, prefix="Hello there."), usage=USAGE))
    client = ant(p, "sk")
    with client.messages.stream(
        model="m",
        max_tokens=100,
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={SESSION_HEADER: "a1"},
    ) as stream:
        message = stream.get_final_message()
    text = "".join(b.text for b in message.content if b.type == "text")
    assert text.startswith("Hello there.") and "state_patch" not in text
    assert message.usage.output_tokens == 12 and message.stop_reason == "end_turn"
    assert committed(p, "a1")["state"] == {"notes": "kept"}
    check_metered(p, "a1")


@pytest.mark.parametrize("kind", KINDS)
def test_responses_stream(fake: FakeProvider, start_proxy: StartProxy, kind: str) -> None:
    p = start(fake, start_proxy, kind)
    fake.enqueue(Reply(text=envelope({"notes": "kept"}, prefix="Hello there."), usage=USAGE))
    client = oai(p, "sk")
    with client.responses.stream(
        model="m", input="hi", extra_headers={SESSION_HEADER: "r1"}
    ) as stream:
        response = stream.get_final_response()
    assert response.output_text.startswith("Hello there.")
    assert "state_patch" not in response.output_text
    assert response.usage is not None and response.usage.output_tokens == 12
    assert committed(p, "r1")["state"] == {"notes": "kept"}
    check_metered(p, "r1")


@pytest.mark.parametrize("kind", KINDS)
def test_responses_stream_with_a_function_call(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    p = start(fake, start_proxy, kind)
    fake.enqueue(Reply(tool_calls=[("get_weather", {"city": "Paris"})], usage=USAGE))
    client = oai(p, "sk")
    tool = {"type": "function", "name": "get_weather", "parameters": {}}
    with client.responses.stream(
        model="m",
        input="weather?",
        tools=[tool],  # type: ignore[list-item]
        extra_headers={SESSION_HEADER: "r2", "x-skillstate-mode": "passthrough"},
    ) as stream:
        response = stream.get_final_response()
    calls = [item for item in response.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]


def test_json_that_is_no_reply_is_an_error_in_the_clients_dialect(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "anthropic")
    gone = b'{"error": {"type": "overloaded_error", "message": "try later"}}'
    for _ in range(5):  # every attempt the proxy makes gets it
        fake.enqueue(Reply(raw_body=gone))
    client = ant(p, "sk")
    with (
        pytest.raises(anthropic.APIStatusError) as e,
        client.messages.stream(
            model="m", max_tokens=100, messages=[{"role": "user", "content": "hi"}]
        ) as stream,
    ):
        stream.get_final_message()
    assert e.value.status_code == 502
    assert "JSON that is no reply" in str(e.value) and "try later" in str(e.value)


def test_a_cut_off_responses_reply_ends_its_stream_as_the_api_would(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """A cut-off Responses reply in JSON (``status: incomplete``) streams with the terminal
    event its status names, ``response.incomplete``, as the API's own stream ends."""
    p = start(fake, start_proxy, "openai-responses")
    fake.enqueue(Reply(text="word " * 400, usage=USAGE))
    events = list(
        oai(p, "sk").responses.create(
            model="m", input="long", max_output_tokens=16, stream=True,
            extra_headers={SESSION_HEADER: "r3", "x-skillstate-mode": "passthrough"},
        )
    )  # fmt: skip
    kinds = [e.type for e in events]
    assert kinds[-1] == "response.incomplete" and "response.completed" not in kinds
    assert events[-1].response.status == "incomplete"  # type: ignore[union-attr]
