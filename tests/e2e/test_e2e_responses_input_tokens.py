"""``POST /v1/responses/input_tokens`` through the real proxy, driven by the openai SDK's own
``client.responses.input_tokens.count``, against the fake provider as each upstream kind:
what the turn would send upstream now (passthrough: the request; state: the compact
context; window: the window turn's body), counted by an ``openai-responses`` upstream at its
own endpoint, by an Anthropic upstream at ``/v1/messages/count_tokens`` (translated as the
turn would be), or estimated by the proxy for a chat-completions upstream."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from skillstate.cost.tokens import request_tokens
from skillstate.engine.context import STATE_MARK
from tests.conftest import StartProxy
from tests.e2e.test_e2e_responses import TOOLS, start
from tests.e2e.test_e2e_window import TOOL, Client, Model, asks_checkpoint
from tests.e2e.test_e2e_window import start as start_window
from tests.fakeprovider import (
    INPUT_TOKENS_PATH,
    NO_COUNT_ROUTES,
    FakeProvider,
    RecordedRequest,
    Reply,
)
from tests.fakeprovider import prompt_tokens as fake_tokens
from tests.helpers import SESSION_HEADER, ant, envelope
from tests.helpers import oai as client

KINDS = ["openai-responses", "openai", "anthropic"]
# Where each upstream kind is asked to count: none for chat completions (the proxy estimates).
COUNTED_AT = {"openai-responses": INPUT_TOKENS_PATH, "anthropic": "/v1/messages/count_tokens"}


def counted_since(fake: FakeProvider, n: int, kind: str) -> list[RecordedRequest]:
    """The counting requests the fake got after its ``n``-th request."""
    return [r for r in fake.requests[n:] if r.path == COUNTED_AT.get(kind)]


def long_transcript() -> list[Any]:
    items: list[Any] = [{"role": "user", "content": "TASK: watch the logs."}]
    for i in range(12):
        items += [
            {"role": "assistant", "content": f"noted {i}"},
            {"role": "user", "content": f"Observation {i}: " + "log line " * 40},
        ]
    return items


@pytest.mark.parametrize("kind", KINDS)
def test_passthrough_counts_the_request(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    """In passthrough the request is what goes upstream: a Responses upstream counts it as it
    came (the fields its endpoint takes), an Anthropic upstream counts its translation, a
    chat-completions upstream has no counting endpoint: the proxy's estimate, said so."""
    p = start(fake, start_proxy, kind, "--mode", "passthrough")
    raw = client(p).responses.input_tokens.with_raw_response.count(
        model="m-1",
        instructions="Be brief.",
        input="What is the weather in Lyon?",
        tools=TOOLS,
        tool_choice="auto",
        extra_headers={SESSION_HEADER: "pt"},
        # what a client copies from its turn: taken, and not sent (the endpoint refuses it)
        extra_body={"max_output_tokens": 50, "store": False},
    )
    got = raw.parse()
    assert got.object == "response.input_tokens" and got.input_tokens > 0
    assert raw.headers[SESSION_HEADER] == "pt"
    if kind == "openai":
        assert fake.requests == []  # nothing to count with upstream
        assert raw.headers["x-skillstate-token-count"] == "estimate"
        sent = {"instructions": "Be brief.", "input": "What is the weather in Lyon?"}
        assert got.input_tokens == request_tokens({**sent, "tools": TOOLS})
        return
    (counted,) = fake.requests
    assert counted.path == COUNTED_AT[kind] and "x-skillstate-token-count" not in raw.headers
    assert raw.headers["x-skillstate-upstream"] == "up"
    if kind == "openai-responses":
        assert counted.json == {
            "model": "m-1",
            "instructions": "Be brief.",
            "input": "What is the weather in Lyon?",
            "tools": TOOLS,
            "tool_choice": "auto",
        }
        assert got.input_tokens == fake_tokens(counted.json, "responses")
    else:  # translated as the turn is: instructions as the system, function tools
        assert counted.json["system"] == "Be brief."
        assert counted.json["messages"] == [
            {"role": "user", "content": "What is the weather in Lyon?"}
        ]
        assert [t["name"] for t in counted.json["tools"]] == ["get_weather", "get_time"]
        assert "max_tokens" not in counted.json  # count_tokens refuses it
        assert got.input_tokens == fake_tokens(counted.json, "anthropic")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["passthrough", "state"])
def test_a_count_without_a_model_is_answered(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, mode: str
) -> None:
    """``model`` is optional at ``/responses/input_tokens`` (the SDK's InputTokenCountParams,
    the API reference): an ``openai-responses`` upstream counts the request without one, as
    the API takes it; an Anthropic upstream's count_tokens needs a model, and a chat upstream
    has no endpoint: the proxy's estimate, said so."""
    p = start(fake, start_proxy, kind, "--mode", mode)
    raw = client(p).responses.input_tokens.with_raw_response.count(
        input="What is the weather in Lyon?", tools=TOOLS, extra_headers={SESSION_HEADER: "nm"}
    )
    got = raw.parse()
    assert got.object == "response.input_tokens" and got.input_tokens > 0
    if kind == "openai-responses":
        (counted,) = fake.requests
        assert counted.path == INPUT_TOKENS_PATH and "model" not in counted.json
        assert got.input_tokens == fake_tokens(counted.json, "responses")
        assert "x-skillstate-token-count" not in raw.headers
    else:
        assert fake.requests == []
        assert raw.headers["x-skillstate-token-count"] == "estimate"


@pytest.mark.parametrize("kind", KINDS)
def test_state_mode_counts_the_compact_context(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    """In state mode the count is of the compact context built from the session's state,
    which is what the next turn sends: a native count gets exactly the turn's input."""
    p = start(fake, start_proxy, kind)
    c = client(p)
    hdr = {SESSION_HEADER: "count"}
    items = long_transcript()
    fake.enqueue(Reply(text=envelope({"notes": "watching"})))
    c.responses.create(model="m", input=items, extra_headers=hdr)
    n = len(fake.requests)
    raw = c.responses.input_tokens.with_raw_response.count(
        model="m", input=items, extra_headers=hdr
    )
    compact = raw.parse().input_tokens
    full = c.responses.input_tokens.count(
        model="m", input=items, extra_headers={**hdr, "x-skillstate-mode": "passthrough"}
    ).input_tokens
    assert 0 < compact < full / 3  # the compact context, not the transcript
    assert p.state("count")["step"] == 1  # counting commits nothing
    counted = counted_since(fake, n, kind)
    if kind == "openai":
        assert len(fake.requests) == n
        assert raw.headers["x-skillstate-token-count"] == "estimate"
        return
    assert len(counted) == 2 and STATE_MARK in json.dumps(counted[0].json)
    if kind == "openai-responses":
        fake.enqueue(Reply(text=envelope({"facts": "more"})))
        c.responses.create(model="m", input=items, extra_headers=hdr)
        assert counted[0].json["input"] == fake.last.json["input"]  # what the turn sent
        assert compact == fake_tokens(counted[0].json, "responses")


def test_window_mode_counts_what_the_window_turn_sends(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """In window mode the count is of the window turn's own body, turn after turn: the
    window from the session's mark, and the checkpoint instruction on a checkpoint turn."""
    p = start_window(start_proxy, fake, "openai-responses")
    fake.responder = Model()
    loop = Client(p, "responses", "count-window")
    tools: Any = [{"type": "function", "name": TOOL["name"], "parameters": TOOL["schema"]}]
    checkpoints = 0
    for t in range(10):
        n = len(fake.requests)
        got = client(p).responses.input_tokens.count(
            model="m", input=loop.transcript, tools=tools, extra_headers=loop.headers
        )
        (counted,) = counted_since(fake, n, "openai-responses")
        assert got.input_tokens == fake_tokens(counted.json, "responses")
        loop.turn(stream=t % 2 == 1)
        sent = fake.last
        assert counted.json["input"] == sent.json["input"], t
        assert counted.json["tools"] == sent.json["tools"]
        checkpoints += asks_checkpoint(sent)
    assert checkpoints >= 2


@pytest.mark.parametrize("kind", ["openai-responses", "openai"])
def test_previous_response_id_counts_the_whole_chain(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    """A ``previous_response_id`` is resolved from the responses the proxy stores, as the
    turn route does: the count is of the chain and the new input, in that response's
    session; an unknown id is the API's 404."""
    p = start(fake, start_proxy, kind, "--mode", "passthrough")
    c = client(p)
    fake.enqueue(Reply(text="First answer, at some length."))
    first = c.responses.with_raw_response.create(
        model="m", input="one", extra_headers={SESSION_HEADER: "chain"}
    )
    n = len(fake.requests)
    raw = c.responses.input_tokens.with_raw_response.count(
        model="m", input="two", previous_response_id=first.parse().id
    )
    assert raw.headers[SESSION_HEADER] == "chain"
    alone = c.responses.input_tokens.count(model="m", input="two").input_tokens
    assert raw.parse().input_tokens > alone
    if kind == "openai-responses":
        counted, _alone = counted_since(fake, n, kind)
        assert "previous_response_id" not in counted.json
        roles = [i.get("role") for i in counted.json["input"]]
        assert roles == ["user", "assistant", "user"]
        assert counted.json["input"][1]["content"][0]["text"] == "First answer, at some length."
    else:
        chain = [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "one"}]}
        ]
        assert raw.parse().input_tokens > request_tokens({"input": chain})
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.input_tokens.count(model="m", input="x", previous_response_id="resp_nope")
    assert e.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert len(fake.requests) == n + 2 * (kind == "openai-responses")  # the two counts


def test_bad_requests_are_openai_400s_and_send_nothing(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai-responses")
    c = client(p)
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.input_tokens.count(model="m", input=[{"role": "robot", "content": "x"}])  # type: ignore[list-item]
    assert e.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    assert e.value.body["param"] == "input[0].role"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as e:  # optional, but a string when given
        c.responses.input_tokens.count(model="", input="empty model")
    assert e.value.body["param"] == "model"  # type: ignore[index]
    bad = [{"type": "function_call_output", "call_id": "", "output": "sunny"}]
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.input_tokens.count(model="m", input=bad)  # type: ignore[arg-type]
    assert e.value.body["param"] == "input[0].call_id"  # type: ignore[index]
    r = p.http.post(
        p.v1 + "/responses/input_tokens",
        content=b"{nope",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert fake.requests == []


def test_hosted_tools_under_unsupported_tools_reject_are_refused_as_the_turn_is(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    up = {"name": "up", "url": fake.url + "/v1", "kind": "openai", "api_key": "k"}
    cfg = {"upstreams": [up], "unsupported_tools": "reject"}
    p = start_proxy(None, "--mode", "passthrough", config=cfg)
    hosted: Any = [TOOLS[0], {"type": "web_search"}]
    with pytest.raises(openai.BadRequestError) as e:
        client(p).responses.input_tokens.count(model="m", input="hi", tools=hosted)
    assert e.value.code == "unsupported_tools" and "web_search" in e.value.message
    assert client(p).responses.input_tokens.count(model="m", input="hi", tools=TOOLS).input_tokens


def test_the_route_with_and_without_v1_and_other_methods(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """``/responses/input_tokens`` is served with and without ``/v1``; it is no response id:
    a GET or DELETE there is a 405 naming POST, and a stored response is still found."""
    p = start(fake, start_proxy, "openai", "--mode", "passthrough")
    r = p.http.post(p.url + "/responses/input_tokens", json={"model": "m", "input": "hi"})
    assert r.status_code == 200 and r.json()["object"] == "response.input_tokens"
    for method in ("GET", "DELETE"):
        r = p.http.request(method, p.v1 + "/responses/input_tokens")
        assert r.status_code == 405 and r.headers["allow"] == "POST", method
        assert r.json()["error"]["type"] == "invalid_request_error"
    fake.enqueue(Reply(text="Stored."))
    stored = client(p).responses.create(model="m", input="keep")
    assert client(p).responses.retrieve(stored.id).output_text == "Stored."
    assert httpx.codes.is_success(p.http.get(f"{p.v1}/responses/{stored.id}").status_code)


@pytest.mark.parametrize("kind", ["openai-responses", "anthropic"])
def test_an_upstream_without_the_counting_route_is_estimated(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    """A compatible server that serves the turns but not the counting route (vLLM answers
    ``/v1/responses/input_tokens`` with a 405, a FastAPI app a missing route with its bare
    404): the client gets the proxy's estimate, said so, not the server's routing error."""
    fake.count_answers = NO_COUNT_ROUTES
    p = start(fake, start_proxy, kind, "--mode", "passthrough")
    sent = {"instructions": "Be brief.", "input": "What is the weather in Lyon?"}
    raw = client(p).responses.input_tokens.with_raw_response.count(
        model="m-1", tools=TOOLS, extra_headers={SESSION_HEADER: "no-route"}, **sent
    )
    assert [r.status for r in fake.requests] == [405 if kind == "openai-responses" else 404]
    assert raw.headers["x-skillstate-token-count"] == "estimate"
    assert raw.parse().input_tokens == request_tokens({**sent, "tools": TOOLS})


def test_a_messages_count_at_an_upstream_without_the_route_is_estimated(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    fake.count_answers = NO_COUNT_ROUTES
    p = start(fake, start_proxy, "anthropic", "--mode", "passthrough")
    messages = [{"role": "user", "content": "What is the weather in Lyon?"}]
    raw = ant(p).messages.with_raw_response.count_tokens(
        model="m-1", messages=messages, system="Be brief."
    )
    assert [r.status for r in fake.requests] == [404]
    assert raw.headers["x-skillstate-token-count"] == "estimate"
    assert raw.parse().input_tokens == request_tokens({"system": "Be brief.", "messages": messages})


def test_a_providers_own_404_is_relayed_not_estimated(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """An unknown model is the provider's answer, not a missing route: the client sees it."""
    p = start(fake, start_proxy, "anthropic", "--mode", "passthrough")
    fake_error = {"type": "error", "error": {"type": "not_found_error", "message": "model: m-9"}}
    fake.count_answers = {COUNTED_AT["anthropic"]: (404, fake_error)}
    with pytest.raises(openai.NotFoundError, match="model: m-9"):
        client(p).responses.input_tokens.count(model="m-9", input="hi")
