"""Hostile upstream bytes: whatever an upstream answers, the client gets the reply or a clear
error in its own dialect (a 502 naming the upstream), never a 500, and nothing is committed
from a reply the client could not be given."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply, ToolCall

DEEP = 300  # past orjson's 255 levels, under its parser's 1,024


def _nested(depth: int) -> str:
    return '{"a":' + "[" * depth + "]" * depth + "}"


def _proxy(start_proxy: StartProxy, fake: FakeProvider, kind: str, mode: str) -> Proxy:
    up = {"name": "up", "url": fake.url, "kind": kind, "api_key": "k"}
    return start_proxy(None, "--mode", mode, config={"upstreams": [up]})


def _turn(p: Proxy, client: str, session: str = "s1") -> Any:
    if client == "anthropic":
        body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
        headers = {"x-skillstate-session": session, "anthropic-version": "2023-06-01"}
        return p.http.post(p.url + "/v1/messages", json=body, headers=headers)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return p.http.post(
        p.url + "/v1/chat/completions", json=body, headers={"x-skillstate-session": session}
    )


def _assert_502_in_dialect(r: Any, client: str) -> str:
    assert r.status_code == 502, r.text
    body = r.json()
    if client == "anthropic":
        assert body["type"] == "error"
    message = body["error"]["message"]
    assert "upstream up" in message
    return str(message)


@pytest.mark.parametrize("mode", ["state", "passthrough"])
@pytest.mark.parametrize("depth", [DEEP, 2000])
def test_deep_tool_arguments_translated_for_anthropic_are_a_502(
    fake: FakeProvider, start_proxy: StartProxy, mode: str, depth: int
) -> None:
    """OpenAI arguments are JSON text; an Anthropic client gets them parsed as ``input``,
    which past 255 levels orjson cannot write (and past ~1,000 Python cannot parse)."""
    p = _proxy(start_proxy, fake, "openai", mode)
    fake.enqueue(Reply(tool_calls=[ToolCall("f", _nested(depth))]))
    message = _assert_502_in_dialect(_turn(p, "anthropic"), "anthropic")
    assert "128 levels" in message
    # Nothing was committed, and the session's next turn is ordinary.
    fake.enqueue(Reply(text="fine"))
    r = _turn(p, "anthropic")
    assert r.status_code == 200, r.text
    if mode == "state":
        assert p.state("s1")["step"] == 1


@pytest.mark.parametrize("client", ["openai", "anthropic"])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_reply_nested_past_the_depth_limit_is_a_502(
    fake: FakeProvider, start_proxy: StartProxy, client: str, kind: str
) -> None:
    """One depth limit for JSON from outside: an upstream's reply is held to it too."""
    p = _proxy(start_proxy, fake, kind, "state")
    reply = {"openai": {"choices": [], "junk": json.loads(_nested(DEEP))}}
    reply["anthropic"] = {"type": "message", "content": [], "junk": json.loads(_nested(DEEP))}
    fake.enqueue(Reply(raw_body=json.dumps(reply[kind]).encode()))
    _assert_502_in_dialect(_turn(p, client), client)
    assert p.get("/state", params={"session": "s1"}).status_code == 404


def test_huge_integer_arguments_translate_for_anthropic(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """An integer past 64 bits in OpenAI arguments reaches an Anthropic client (as orjson
    would read it: a float) instead of failing to serialise."""
    p = _proxy(start_proxy, fake, "openai", "passthrough")
    fake.enqueue(Reply(tool_calls=[ToolCall("f", '{"n": 123456789012345678901234567890}')]))
    r = _turn(p, "anthropic")
    assert r.status_code == 200, r.text
    (block,) = [b for b in r.json()["content"] if b["type"] == "tool_use"]
    assert block["input"] == {"n": 1.2345678901234568e29}


@pytest.mark.parametrize("client", ["openai", "anthropic"])
def test_reply_text_that_is_not_a_string_is_no_text(
    fake: FakeProvider, start_proxy: StartProxy, client: str
) -> None:
    """A same-dialect reply whose text is not a string is judged as no text, not a 500."""
    p = _proxy(start_proxy, fake, client, "state")
    bodies = {
        "anthropic": {"type": "message", "content": [{"type": "text", "text": [1]}]},
        "openai": {"choices": [{"index": 0, "message": {"content": [{"text": {"a": 1}}]}}]},
    }
    fake.enqueue(Reply(raw_body=json.dumps(bodies[client]).encode()))
    r = _turn(p, client)
    assert r.status_code == 200, r.text
    assert r.headers["x-skillstate-step"] == "1"
    assert p.state("s1")["step"] == 1


def test_deep_tool_arguments_from_an_openai_client_to_anthropic_are_a_400(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """The same arguments text in a client's transcript: its own fault, a 400 in its dialect,
    and nothing sent upstream."""
    p = _proxy(start_proxy, fake, "anthropic", "passthrough")
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": _nested(DEEP)}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    r = p.http.post(p.url + "/v1/chat/completions", json={"model": "m", "messages": messages})
    assert r.status_code == 400, r.text
    assert "arguments" in r.json()["error"]["message"]
    assert not fake.requests
