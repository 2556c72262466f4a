"""Tool and output-format shapes are checked by the client's dialect before anything is sent
or saved (issue 13 item 12: OpenAI ``tools: "abc"`` used to be forwarded and the turn saved).
Through the real proxy process, with raw HTTP so the SDKs' own typing cannot stop the body."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider
from tests.helpers import SESSION_HEADER

MSGS = [{"role": "user", "content": "x"}]
FN = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"tools": "abc"}, "tools"),
        ({"tools": {"type": "function"}}, "tools"),
        ({"tools": ["f"]}, "tools[0]"),
        ({"tools": [{"type": "function"}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "param"),
        ({"tools": [FN], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [FN], "tool_choice": 3}, "tool_choice"),
        ({"tools": [FN], "tool_choice": {"type": "function"}}, "tool_choice"),
        ({"response_format": "json"}, "response_format"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": []}}}, "schema"),
    ],
)
def test_openai_shapes_are_a_400_and_nothing_is_sent_or_saved(
    fake: FakeProvider, proxy: Proxy, extra: dict[str, Any], needle: str
) -> None:
    r = proxy.http.post(
        proxy.v1 + "/chat/completions",
        json={"model": "m", "messages": MSGS, **extra},
        headers={SESSION_HEADER: "shapes"},
        timeout=10,
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and needle in err["message"], err
    assert fake.requests == []
    assert proxy.get("/state", params={"session": "shapes"}).status_code == 404


def test_openai_valid_shapes_still_pass(fake: FakeProvider, proxy: Proxy) -> None:
    body = {
        "model": "m",
        "messages": MSGS,
        "tools": [FN, {"type": "custom", "custom": {"name": "c"}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "response_format": {"type": "json_object"},
    }
    r = proxy.http.post(proxy.v1 + "/chat/completions", json=body, timeout=10)
    assert r.status_code == 200, r.text
    assert len(fake.requests) == 1


@pytest.fixture
def anthropic_proxy(fake: FakeProvider, start_proxy: StartProxy) -> Proxy:
    up = {"name": "a", "url": fake.url, "kind": "anthropic", "api_key": "sk-configured"}
    return start_proxy(None, config={"schema": ["notes"], "upstreams": [up]})


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"tools": "abc"}, "tools"),
        ({"tools": [{"name": "t", "input_schema": "nope"}]}, "input_schema"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tool_choice": {"type": "tool"}}, "name"),
        ({"output_config": "json"}, "output_config"),
        ({"output_config": {"format": {"type": "yaml"}}}, "output_config.format"),
        ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format.schema"),
        ({"output_format": {"type": "json_schema", "schema": 1}}, "output_format.schema"),
    ],
)
def test_anthropic_shapes_are_a_400_and_nothing_is_sent_or_saved(
    fake: FakeProvider, anthropic_proxy: Proxy, extra: dict[str, Any], needle: str
) -> None:
    r = anthropic_proxy.http.post(
        anthropic_proxy.v1 + "/messages",
        json={"model": "m", "max_tokens": 5, "messages": MSGS, **extra},
        headers={"x-api-key": "k", SESSION_HEADER: "shapes"},
        timeout=10,
    )
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert needle in err["error"]["message"], err
    assert fake.requests == []
    assert anthropic_proxy.get("/state", params={"session": "shapes"}).status_code == 404
