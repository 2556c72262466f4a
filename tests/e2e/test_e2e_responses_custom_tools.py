"""Custom tools (Codex's freeform ``apply_patch`` for GPT-5 models) through the real proxy,
driven by the openai SDK: a Responses client against a chat-completions upstream gets the
custom tool call back (JSON and stream) and its next request's custom_tool_call_output reaches
the upstream as the tool message answering it; a chat client's custom tools pass through to a
chat upstream; an Anthropic upstream is sent neither, and the reply says so."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai.types.responses import ResponseCustomToolCall

from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply, ToolCall
from tests.helpers import (
    APPLY_PATCH,
    CHAT_PATCH_FORMAT,
    SESSION_HEADER,
    envelope,
    oai,
)

PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hello world\n*** End Patch\n"
SHELL: dict[str, Any] = {
    "type": "function",
    "name": "shell",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}


def start(fake: FakeProvider, start_proxy: StartProxy, kind: str, mode: str) -> Proxy:
    url = fake.url if kind == "anthropic" else fake.url + "/v1"
    up = {"name": "up", "url": url, "kind": kind, "api_key": "sk-upstream"}
    return start_proxy(None, "--mode", mode, "--schema", "notes", config={"upstreams": [up]})


def patch_call(mode: str, notes: str, plain: str | None) -> Reply:
    """The model's apply_patch call; its text: in state mode an envelope with ``notes``,
    else ``plain``."""
    text = envelope({"notes": notes}) if mode == "state" else plain
    return Reply(text=text, tool_calls=[ToolCall("apply_patch", PATCH, custom=True)])


def created(mode: str) -> Reply:
    """The model's answer once the patch applied (with an envelope in state mode)."""
    return Reply(
        text=envelope({"notes": "done"}, prefix="Created.") if mode == "state" else "Created."
    )


def ask_for_patch(c: openai.OpenAI, streamed: bool, items: list[Any]) -> Any:
    """One turn with the custom tool; (the response, the custom input's streamed deltas)."""
    args: dict[str, Any] = {"model": "gpt-5", "input": items, "tools": [APPLY_PATCH, SHELL]}
    if not streamed:
        return c.responses.create(**args), None
    deltas: list[str] = []
    with c.responses.stream(**args) as stream:
        for event in stream:
            if event.type == "response.custom_tool_call_input.delta":
                deltas.append(event.delta)
        return stream.get_final_response(), deltas


@pytest.mark.parametrize("mode", ["passthrough", "state"])
@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
def test_a_custom_tool_call_round_trips_through_a_chat_upstream(
    fake: FakeProvider, start_proxy: StartProxy, mode: str, streamed: bool
) -> None:
    p = start(fake, start_proxy, "openai", mode)
    c = oai(p, default_headers={SESSION_HEADER: f"patch-{mode}-{streamed}"})
    user = {"role": "user", "content": "Create hello.txt saying hello world."}
    fake.enqueue(patch_call(mode, "patching hello.txt", ""))
    r, deltas = ask_for_patch(c, streamed, [user])
    call = next(o for o in r.output if o.type == "custom_tool_call")
    assert isinstance(call, ResponseCustomToolCall)
    assert (call.name, call.input) == ("apply_patch", PATCH) and call.call_id.startswith("call_")
    if streamed:
        assert "".join(deltas) == PATCH
    sent = fake.last.json
    assert sent["tools"][0] == {
        "type": "custom",
        "custom": {
            "name": "apply_patch",
            "description": APPLY_PATCH["description"],
            "format": CHAT_PATCH_FORMAT,
        },
    }
    # Turn 2: Codex sends the call back with its output.
    output = {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Success."}
    echoed = call.model_dump(exclude_none=True)
    fake.enqueue(created(mode))
    raw = c.responses.with_raw_response.create(
        model="gpt-5",
        input=[user, echoed, output],  # type: ignore[list-item]
        tools=[APPLY_PATCH, SHELL],  # type: ignore[list-item]
    )
    assert "Created." in raw.parse().output_text
    assert "x-skillstate-dropped-items" not in raw.headers
    assert "x-skillstate-dropped-tools" not in raw.headers
    msgs = fake.last.json["messages"]
    asked = next(m for m in msgs if m.get("tool_calls"))
    assert asked["tool_calls"] == [
        {"id": call.call_id, "type": "custom", "custom": {"name": "apply_patch", "input": PATCH}}
    ]
    answer = msgs[msgs.index(asked) + 1]
    assert answer == {"role": "tool", "tool_call_id": call.call_id, "content": "Success."}


def test_a_forced_custom_tool_choice_reaches_the_chat_upstream(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai", "passthrough")
    fake.enqueue(Reply(tool_calls=[ToolCall("apply_patch", PATCH, custom=True)]))
    r = oai(p, default_headers={SESSION_HEADER: "forced"}).responses.create(
        model="gpt-5",
        input="patch it",
        tools=[APPLY_PATCH],  # type: ignore[list-item]
        tool_choice={"type": "custom", "name": "apply_patch"},
    )
    assert r.output[0].type == "custom_tool_call"
    assert fake.last.json["tool_choice"] == {"type": "custom", "custom": {"name": "apply_patch"}}


CHAT_TOOL: dict[str, Any] = {
    "type": "custom",
    "custom": {
        "name": "apply_patch",
        "format": CHAT_PATCH_FORMAT,
    },
}


@pytest.mark.parametrize("mode", ["passthrough", "state"])
def test_a_chat_clients_custom_tools_pass_through_to_a_chat_upstream(
    fake: FakeProvider, start_proxy: StartProxy, mode: str
) -> None:
    p = start(fake, start_proxy, "openai", mode)
    c = oai(p, default_headers={SESSION_HEADER: f"chat-{mode}"})
    user = {"role": "user", "content": "Create hello.txt."}
    fake.enqueue(patch_call(mode, "patching", None))
    choice = {"type": "custom", "custom": {"name": "apply_patch"}}
    r = c.chat.completions.create(
        model="gpt-5",
        messages=[user],  # type: ignore[list-item]
        tools=[CHAT_TOOL],  # type: ignore[list-item]
        tool_choice=choice,  # type: ignore[arg-type]
    )
    (tc,) = r.choices[0].message.tool_calls or []
    assert tc.type == "custom" and tc.custom.input == PATCH
    assert fake.last.json["tools"] == [CHAT_TOOL] and fake.last.json["tool_choice"] == choice
    # Streamed: the custom pieces reach the client as the upstream sent them.
    fake.enqueue(patch_call(mode, "patching", None))
    body = {"model": "gpt-5", "messages": [user], "tools": [CHAT_TOOL], "stream": True}
    with p.http.stream(
        "POST", p.v1 + "/chat/completions", json=body, headers={SESSION_HEADER: f"chat-{mode}"}
    ) as s:
        lines = [ln[6:] for ln in s.iter_lines() if ln.startswith("data: {")]
    pieces = [
        tc for ch in map(json.loads, lines) for c0 in ch["choices"][:1]
        for tc in c0["delta"].get("tool_calls") or ()
    ]  # fmt: skip
    assert pieces[0]["type"] == "custom" and pieces[0]["custom"]["name"] == "apply_patch"
    assert "".join(tc["custom"]["input"] for tc in pieces) == PATCH
    # The next request answers the call: the upstream gets the pair.
    asked = {"role": "assistant", "content": None, "tool_calls": [tc.model_dump()]}
    answer = {"role": "tool", "tool_call_id": tc.id, "content": "Success."}
    fake.enqueue(created(mode))
    r2 = c.chat.completions.create(
        model="gpt-5",
        messages=[user, asked, answer],  # type: ignore[list-item]
        tools=[CHAT_TOOL],  # type: ignore[list-item]
    )
    assert "Created." in (r2.choices[0].message.content or "")
    msgs = fake.last.json["messages"]
    assert msgs[-2]["tool_calls"][0]["custom"] == {"name": "apply_patch", "input": PATCH}
    assert msgs[-1] == answer
    # A custom call without its input is the proxy's own 400, in the client's dialect.
    before = len(fake.requests)
    bare = {**asked, "tool_calls": [{"id": tc.id, "type": "custom", "custom": {"name": "x"}}]}
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="gpt-5", messages=[user, bare, answer])  # type: ignore[list-item]
    assert "custom.input" in e.value.message and len(fake.requests) == before


def test_an_anthropic_upstream_is_sent_no_custom_tool_and_the_reply_says_so(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """Messages has no tool whose input is free text: the custom tool, its call and output
    are left out (named in the headers), the function tool and its pair are sent."""
    p = start(fake, start_proxy, "anthropic", "passthrough")
    items: list[Any] = [
        {"role": "user", "content": "Create hello.txt."},
        {"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Success."},
        {"type": "function_call", "call_id": "call_s", "name": "shell", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_s", "output": "hello.txt"},
    ]
    fake.enqueue(Reply(text="Done."))
    raw = oai(p, default_headers={SESSION_HEADER: "anthropic"}).responses.with_raw_response.create(
        model="claude-sonnet-4-5",
        input=items,
        tools=[APPLY_PATCH, SHELL],  # type: ignore[list-item]
    )
    assert raw.parse().output_text == "Done."
    assert raw.headers["x-skillstate-dropped-tools"] == "apply_patch"
    assert raw.headers["x-skillstate-dropped-items"] == "custom_tool_call,custom_tool_call_output"
    sent = fake.last.json
    assert [t["name"] for t in sent["tools"]] == ["shell"]
    assert "apply_patch" not in json.dumps(sent["messages"])
