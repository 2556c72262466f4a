"""``tool_choice: allowed_tools`` across the translations, through the real proxy with the
openai SDK: Responses' ``{"type": "allowed_tools", "mode", "tools": [{"type", "name"}]}``
reaches a chat-completions upstream as chat's ``{"type": "allowed_tools", "allowed_tools":
{"mode", "tools": [{"type": "function", "function": {"name"}}]}}`` (it went as "auto"), and
an Anthropic upstream, which has no such choice, as the allowed tools only under ``auto`` /
``any``, from a Responses and from a chat client (a chat client got a 400)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply, ToolCall
from tests.helpers import SESSION_HEADER, oai


def function(name: str) -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}


def chat_function(name: str) -> dict[str, Any]:
    params = {"type": "object", "properties": {}}
    return {"type": "function", "function": {"name": name, "parameters": params}}


PATCH_TOOL = {"type": "custom", "name": "apply_patch", "description": "Edit files."}
TOOLS = [function("shell"), function("read"), function("write"), PATCH_TOOL]


def start(fake: FakeProvider, start_proxy: StartProxy, kind: str) -> Proxy:
    url = fake.url if kind == "anthropic" else fake.url + "/v1"
    up = {"name": "up", "url": url, "kind": kind, "api_key": "sk-upstream"}
    return start_proxy(None, "--mode", "passthrough", config={"upstreams": [up]})


def allowed(mode: str, *entries: dict[str, Any]) -> dict[str, Any]:
    return {"type": "allowed_tools", "mode": mode, "tools": list(entries)}


def respond(p: Proxy, choice: Any, tools: list[Any] = TOOLS) -> Any:
    c = oai(p, default_headers={SESSION_HEADER: "allowed"})
    return c.responses.create(
        model="gpt-5",
        input="List the files.",
        tools=tools,  # type: ignore[arg-type]
        tool_choice=choice,
    )


def test_allowed_tools_reach_a_chat_upstream_as_chats_allowed_tools(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai")
    fake.enqueue(Reply(tool_calls=[ToolCall("shell", {"cmd": "ls"})]))
    choice = allowed(
        "required",
        {"type": "function", "name": "shell"},
        {"type": "custom", "name": "apply_patch"},
        {"type": "web_search"},  # a hosted tool: not sent to chat, nor its entry
    )
    r = respond(p, choice, [*TOOLS, {"type": "web_search"}])
    assert r.output[0].type == "function_call"
    sent = fake.last.json
    assert sent["tool_choice"] == {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": "required",
            "tools": [
                {"type": "function", "function": {"name": "shell"}},
                {"type": "custom", "custom": {"name": "apply_patch"}},
            ],
        },
    }
    assert len(sent["tools"]) == 4  # every tool still sent: the choice narrows, not the list


@pytest.mark.parametrize(
    ("mode", "names", "anthropic_choice"),
    [("auto", ["read"], {"type": "auto"}), ("required", ["read", "write"], {"type": "any"})],
)
def test_allowed_tools_reach_an_anthropic_upstream_as_the_allowed_tools_only(
    fake: FakeProvider,
    start_proxy: StartProxy,
    mode: str,
    names: list[str],
    anthropic_choice: dict[str, Any],
) -> None:
    p = start(fake, start_proxy, "anthropic")
    fake.enqueue(Reply(tool_calls=[ToolCall("read", {})]))
    choice = allowed(mode, *({"type": "function", "name": n} for n in names))
    r = respond(p, choice, TOOLS[:3])
    assert r.output[0].type == "function_call"
    sent = fake.last.json
    assert [t["name"] for t in sent["tools"]] == names
    assert sent["tool_choice"] == anthropic_choice


def test_a_chat_clients_allowed_tools_reach_an_anthropic_upstream(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "anthropic")
    fake.enqueue(Reply(tool_calls=[ToolCall("write", {})]))
    choice = {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": "required",
            "tools": [{"type": "function", "function": {"name": "write"}}],
        },
    }
    r = oai(p).chat.completions.create(
        model="claude-sonnet-4-5",
        messages=[{"role": "user", "content": "Save it."}],
        tools=[chat_function("read"), chat_function("write")],  # type: ignore[list-item]
        tool_choice=choice,  # type: ignore[arg-type]
    )
    assert r.choices[0].message.tool_calls is not None
    sent = fake.last.json
    assert [t["name"] for t in sent["tools"]] == ["write"]
    assert sent["tool_choice"] == {"type": "any"}


def test_allowing_only_tools_a_chat_upstream_lacks(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """Only a hosted tool allowed: under auto the model may call none of the tools sent
    ("none"); under required it could satisfy nothing: a 400, nothing sent."""
    p = start(fake, start_proxy, "openai")
    tools = [*TOOLS, {"type": "web_search"}]
    fake.enqueue(Reply(text="No tool for that."))
    respond(p, allowed("auto", {"type": "web_search"}), tools)
    assert fake.last.json["tool_choice"] == "none"
    fake.requests.clear()
    with pytest.raises(openai.BadRequestError) as e:
        respond(p, allowed("required", {"type": "web_search"}), tools)
    assert isinstance(e.value.body, dict) and e.value.body.get("param") == "tool_choice.tools"
    assert fake.requests == []


@pytest.mark.parametrize(
    ("choice", "param"),
    [
        ({"type": "allowed_tools", "tools": []}, "tool_choice.mode"),
        ({"type": "allowed_tools", "mode": "any", "tools": []}, "tool_choice.mode"),
        ({"type": "allowed_tools", "mode": "auto"}, "tool_choice.tools"),
        ({"type": "allowed_tools", "mode": "auto", "tools": ["shell"]}, "tool_choice.tools"),
    ],
)
def test_a_malformed_allowed_tools_choice_is_a_400(
    fake: FakeProvider, start_proxy: StartProxy, choice: dict[str, Any], param: str
) -> None:
    p = start(fake, start_proxy, "openai")
    with pytest.raises(openai.BadRequestError) as e:
        respond(p, choice)
    assert isinstance(e.value.body, dict) and e.value.body.get("param") == param
    assert fake.requests == []
