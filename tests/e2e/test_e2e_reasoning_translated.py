"""Reasoning across the translations, through the real proxy with the real SDKs: what each
side's reasoning becomes where the other side has no form for it, pinned.

* A Responses client's ``reasoning`` items (``encrypted_content`` only the Responses API
  that made it can read) are not sent to a chat-completions or Anthropic upstream, and the
  reply names them (``x-skillstate-dropped-items: reasoning``); never as an Anthropic
  thinking block, which needs Anthropic's signature.
* A Messages client's signed ``thinking`` / ``redacted_thinking`` blocks are not sent to a
  chat upstream (chat has no form for them); the turn's text and tool calls are.
* An Anthropic upstream's thinking reaches a chat or Responses client not at all (a
  thinking block without its signature is refused by the API when sent back; the client
  cannot hold the signature): its text and tool calls do, and the next request, echoing
  them, sends Anthropic no thinking block.
* Natively (Messages client, Anthropic upstream) signed blocks go back byte-exact in every
  mode, including the tool round a state-mode compact context keeps.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply, ToolCall
from tests.helpers import SESSION_HEADER, ant, envelope, oai

SIGNED = {"type": "thinking", "thinking": "Check the logs first.", "signature": "EqQBCkYsig=="}
REDACTED = {"type": "redacted_thinking", "data": "RU5DUllQVEVE"}
ENCRYPTED = "gAAAAABencrypted-by-the-responses-api=="
REASONING = {
    "type": "reasoning",
    "id": "rs_1",
    "summary": [{"type": "summary_text", "text": "Look at the logs."}],
    "encrypted_content": ENCRYPTED,
}
SHELL = {
    "type": "function",
    "name": "shell",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}
CHAT_SHELL = {
    "type": "function",
    "function": {"name": "shell", "parameters": SHELL["parameters"]},
}
ANT_SHELL = {"name": "shell", "input_schema": SHELL["parameters"]}
# A Messages transcript whose tool_use turn opens with signed and redacted thinking.
THOUGHT_TOOL_ROUND: list[Any] = [
    {"role": "user", "content": "Check the logs."},
    {
        "role": "assistant",
        "content": [
            SIGNED,
            REDACTED,
            {"type": "tool_use", "id": "toolu_1", "name": "shell", "input": {"cmd": "ls"}},
        ],
    },
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "app.log"}],
    },
]


def start(fake: FakeProvider, start_proxy: StartProxy, kind: str, mode: str) -> Proxy:
    url = fake.url if kind == "anthropic" else fake.url + "/v1"
    up = {"name": "up", "url": url, "kind": kind, "api_key": "sk-upstream"}
    return start_proxy(None, "--mode", mode, "--schema", "notes", config={"upstreams": [up]})


def said(text: str, mode: str) -> str:
    return envelope({"notes": "checked"}, prefix=text) if mode == "state" else text


def no_reasoning_in(sent: dict[str, Any]) -> None:
    raw = json.dumps(sent)
    assert ENCRYPTED not in raw and "Look at the logs." not in raw
    assert '"thinking"' not in raw and "redacted_thinking" not in raw


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("mode", ["passthrough", "state"])
def test_a_responses_clients_reasoning_items_are_left_out_and_named(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, mode: str
) -> None:
    p = start(fake, start_proxy, kind, mode)
    fake.enqueue(Reply(text=said("The logs are clean.", mode)))
    call = {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"cmd":"ls"}'}
    items = [
        {"role": "user", "content": "Check the logs."},
        REASONING,
        call,
        {"type": "function_call_output", "call_id": "c1", "output": "app.log"},
    ]
    c = oai(p, default_headers={SESSION_HEADER: f"rs-{kind}-{mode}"})
    raw = c.responses.with_raw_response.create(model="m", input=items, tools=[SHELL])  # type: ignore[arg-type, list-item]
    assert raw.parse().output_text == "The logs are clean."
    assert raw.headers["x-skillstate-dropped-items"] == "reasoning"
    sent = fake.last.json
    no_reasoning_in(sent)
    if kind == "openai":
        (asked,) = [m for m in sent["messages"] if m.get("tool_calls")]
        assert asked["tool_calls"][0]["id"] == "c1"
    else:  # the tool_use turn opens with the call: no unsigned thinking before it
        (turn,) = [m for m in sent["messages"] if m["role"] == "assistant"]
        assert [b["type"] for b in turn["content"]] == ["tool_use"]


@pytest.mark.parametrize("mode", ["passthrough", "state"])
def test_a_messages_clients_thinking_is_not_sent_to_a_chat_upstream(
    fake: FakeProvider, start_proxy: StartProxy, mode: str
) -> None:
    p = start(fake, start_proxy, "openai", mode)
    fake.enqueue(Reply(text=said("Clean.", mode)))
    c = ant(p, default_headers={SESSION_HEADER: f"think-chat-{mode}"})
    r = c.messages.create(model="m", max_tokens=256, messages=THOUGHT_TOOL_ROUND, tools=[ANT_SHELL])  # type: ignore[list-item]
    assert r.content[0].type == "text" and r.content[0].text == "Clean."
    sent = fake.last.json
    assert SIGNED["thinking"] not in json.dumps(sent) and REDACTED["data"] not in json.dumps(sent)
    (asked,) = [m for m in sent["messages"] if m.get("tool_calls")]
    assert asked["tool_calls"][0]["id"] == "toolu_1"


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
def test_an_anthropic_upstreams_thinking_reaches_a_chat_client_not_at_all(
    fake: FakeProvider, start_proxy: StartProxy, streamed: bool
) -> None:
    p = start(fake, start_proxy, "anthropic", "passthrough")
    fake.enqueue(Reply(thinking=[SIGNED, REDACTED], tool_calls=[ToolCall("shell", {"cmd": "ls"})]))
    c = oai(p)
    user = {"role": "user", "content": "Check the logs."}
    args: dict[str, Any] = {"model": "m", "messages": [user], "tools": [CHAT_SHELL]}
    if streamed:
        with c.chat.completions.stream(**args) as stream:
            chunks = [e.model_dump_json() for e in stream]
            r = stream.get_final_completion()
        assert not any(SIGNED["thinking"] in chunk for chunk in chunks)
    else:
        r = c.chat.completions.create(**args)
    msg = r.choices[0].message
    assert SIGNED["thinking"] not in msg.model_dump_json() and msg.tool_calls is not None
    fake.enqueue(Reply(text="Clean."))
    echoed = msg.model_dump(exclude_none=True)
    answer = {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "app.log"}
    c.chat.completions.create(model="m", messages=[user, echoed, answer], tools=[CHAT_SHELL])  # type: ignore[list-item]
    (turn,) = [m for m in fake.last.json["messages"] if m["role"] == "assistant"]
    assert [b["type"] for b in turn["content"]] == ["tool_use"]


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
def test_an_anthropic_upstreams_thinking_reaches_a_responses_client_not_at_all(
    fake: FakeProvider, start_proxy: StartProxy, streamed: bool
) -> None:
    p = start(fake, start_proxy, "anthropic", "passthrough")
    fake.enqueue(Reply(thinking=[SIGNED, REDACTED], tool_calls=[ToolCall("shell", {"cmd": "ls"})]))
    c = oai(p)
    args: dict[str, Any] = {"model": "m", "input": "Check the logs.", "tools": [SHELL]}
    if streamed:
        with c.responses.stream(**args) as stream:
            for _ in stream:
                pass
            r = stream.get_final_response()
    else:
        r = c.responses.create(**args)
    assert [o.type for o in r.output] == ["function_call"]
    assert SIGNED["thinking"] not in r.model_dump_json()
    fake.enqueue(Reply(text="Clean."))
    call = r.output[0].model_dump(exclude_none=True)
    out = {"type": "function_call_output", "call_id": call["call_id"], "output": "app.log"}
    c.responses.create(model="m", input=["Check the logs.", call, out][1:], tools=[SHELL])  # type: ignore[list-item]
    (turn,) = [m for m in fake.last.json["messages"] if m["role"] == "assistant"]
    assert [b["type"] for b in turn["content"]] == ["tool_use"]


@pytest.mark.parametrize("mode", ["passthrough", "state", "window"])
def test_signed_thinking_goes_back_to_anthropic_intact_in_every_mode(
    fake: FakeProvider, start_proxy: StartProxy, mode: str
) -> None:
    """The thinking of the turn being answered stays in its place with its signature (the
    API refuses a tool_use turn that lost it while thinking is on, and any block unsigned)."""
    p = start(fake, start_proxy, "anthropic", mode)
    fake.enqueue(Reply(text=said("Clean.", mode)))
    c = ant(p, default_headers={SESSION_HEADER: f"think-native-{mode}"})
    c.messages.create(
        model="m",
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=THOUGHT_TOOL_ROUND,
        tools=[ANT_SHELL],  # type: ignore[list-item]
    )
    sent = fake.last.json
    (turn,) = [m for m in sent["messages"] if m["role"] == "assistant"]
    assert turn["content"][:2] == [SIGNED, REDACTED]
    for m in sent["messages"]:
        for block in m["content"] if isinstance(m["content"], list) else ():
            if block["type"] == "thinking":
                assert block.get("signature"), block
