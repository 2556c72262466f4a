"""The newer tool fields (the openai SDK 3.57's FunctionToolParam / CustomToolParam:
``defer_loading``, ``allowed_callers``, ``output_schema``; the anthropic SDK's ToolParam:
``defer_loading``, ``allowed_callers``, ``input_examples``) through the real proxy: where the
upstream's format has the field it goes on (natively), where it has not the tool goes as its
format takes it, and a tool the model may not call itself (``allowed_callers`` without
``"direct"``) is not offered to a chat or Anthropic upstream, whose model could only call it
directly: it is named in ``x-skillstate-dropped-tools`` (a 400 under ``unsupported_tools:
reject``)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, oai

PARAMS = {"type": "object", "properties": {"q": {"type": "string"}}}
SHELL = {"type": "function", "name": "shell", "parameters": PARAMS}
DEFERRED = {
    "type": "function",
    "name": "lookup",
    "parameters": PARAMS,
    "defer_loading": True,
    "allowed_callers": ["direct", "programmatic"],
    "output_schema": {"type": "object"},
}
PROGRAM_ONLY = {
    "type": "function",
    "name": "run_sql",
    "parameters": PARAMS,
    "allowed_callers": ["programmatic"],
}
TOOLS = [SHELL, DEFERRED, PROGRAM_ONLY]


def start(fake: FakeProvider, start_proxy: StartProxy, kind: str, **config: Any) -> Proxy:
    url = fake.url if kind == "anthropic" else fake.url + "/v1"
    up = {"name": "up", "url": url, "kind": kind, "api_key": "sk-upstream"}
    return start_proxy(None, "--mode", "passthrough", config={"upstreams": [up], **config})


def create(p: Proxy) -> Any:
    c = oai(p, default_headers={SESSION_HEADER: "fields"})
    return c.responses.with_raw_response.create(model="m", input="Find it.", tools=TOOLS)  # type: ignore[arg-type]


def sent_names(fake: FakeProvider, kind: str) -> list[str]:
    tools = fake.last.json["tools"]
    if kind == "anthropic":
        return [t["name"] for t in tools]
    return [t["function"]["name"] if "function" in t else t["name"] for t in tools]


def test_a_responses_upstream_gets_every_field_as_it_came(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai-responses")
    fake.enqueue(Reply(text="ok"))
    raw = create(p)
    assert fake.last.json["tools"] == TOOLS
    assert "x-skillstate-dropped-tools" not in raw.headers


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_tool_only_a_program_may_call_is_not_offered_to_a_translated_upstream(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    p = start(fake, start_proxy, kind)
    fake.enqueue(Reply(text="ok"))
    raw = create(p)
    assert sent_names(fake, kind) == ["shell", "lookup"]  # the deferred one, loaded up front
    assert raw.headers["x-skillstate-dropped-tools"] == "run_sql"
    if kind == "openai":
        assert fake.last.json["tools"][1] == {
            "type": "function",
            "function": {"name": "lookup", "parameters": PARAMS},
        }
    else:
        assert "defer_loading" not in fake.last.json["tools"][1]  # no tool search to load it


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_under_reject_a_tool_only_a_program_may_call_is_a_400(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    p = start(fake, start_proxy, kind, unsupported_tools="reject")
    with pytest.raises(openai.BadRequestError) as e:
        create(p)
    assert "run_sql" in e.value.message and e.value.code == "unsupported_tools"
    assert fake.requests == []


def test_an_allowed_tools_choice_names_only_the_tools_a_chat_upstream_is_sent(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai")
    fake.enqueue(Reply(text="ok"))
    names = ("shell", "run_sql")
    choice = {"type": "allowed_tools", "mode": "required", "tools": []}
    choice["tools"] = [{"type": "function", "name": n} for n in names]
    oai(p).responses.create(model="m", input="Find it.", tools=TOOLS, tool_choice=choice)  # type: ignore[arg-type]
    assert fake.last.json["tool_choice"]["allowed_tools"]["tools"] == [
        {"type": "function", "function": {"name": "shell"}}
    ]
