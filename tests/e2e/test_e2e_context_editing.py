"""Anthropic context editing through a real proxy, driven by the anthropic SDK: applied by
the proxy (placeholders, tool calls still paired, applied_edits reported, JSON and stream)
for a chat-completions upstream; passed through byte for byte to an Anthropic upstream."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import orjson
import pytest

from skillstate.engine.mask import MASK_MARK
from tests.conftest import InProcessProxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, ant

JSON = dict[str, Any]
EDITS = {
    "edits": [
        {
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "tool_uses", "value": 2},
            "keep": {"type": "tool_uses", "value": 1},
        }
    ]
}
TOOLS = [{"name": "Read", "input_schema": {"type": "object", "properties": {}}}]


def transcript(rounds: int = 4) -> list[JSON]:
    messages: list[JSON] = [{"role": "user", "content": "Summarise the files"}]
    for k in range(rounds):
        messages += [
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": f"toolu_{k}",
                        "name": "Read",
                        "input": {"path": f"f{k}"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": f"toolu_{k}",
                        "content": f"body of f{k} " * 30,
                    }
                ],
            },
        ]
    return messages


def start(fake: FakeProvider, start_proxy: StartProxy, kind: str) -> InProcessProxy:
    url = fake.url if kind == "anthropic" else fake.url + "/v1"
    up = {"name": "up", "url": url, "kind": kind, "api_key": "sk-upstream"}
    return start_proxy(None, "--mode", "passthrough", config={"upstreams": [up]})


@pytest.mark.parametrize("stream", [False, True])
def test_the_proxy_applies_the_edits_for_a_chat_upstream(
    fake: FakeProvider, start_proxy: StartProxy, stream: bool
) -> None:
    p = start(fake, start_proxy, "openai")
    fake.enqueue(Reply(text="Four files, all fine."))
    request: Any = {
        "model": "m-1",
        "max_tokens": 100,
        "messages": transcript(),
        "tools": TOOLS,
        "context_management": EDITS,
        "betas": ["context-management-2025-06-27"],
    }
    if stream:
        with ant(p).beta.messages.stream(**request) as s:
            msg = s.get_final_message()
    else:
        msg = ant(p).beta.messages.create(**request)
    assert msg.content[0].text == "Four files, all fine."
    assert msg.context_management is not None
    (applied,) = msg.context_management.applied_edits
    assert applied.type == "clear_tool_uses_20250919" and applied.cleared_tool_uses == 3
    assert applied.cleared_input_tokens > 0
    sent = fake.requests[-1].json
    assert "context_management" not in sent
    tools = [m for m in sent["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools] == ["toolu_0", "toolu_1", "toolu_2", "toolu_3"]
    assert [m["content"].startswith(MASK_MARK) for m in tools] == [True, True, True, False]
    calls = [c["id"] for m in sent["messages"] if m["role"] == "assistant" for c in m["tool_calls"]]
    assert calls == ["toolu_0", "toolu_1", "toolu_2", "toolu_3"]  # every call still paired


def test_below_the_trigger_nothing_is_cleared_and_none_is_reported(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai")
    fake.enqueue(Reply(text="ok"))
    msg = ant(p).beta.messages.create(
        model="m-1",
        max_tokens=100,
        messages=transcript(1),
        tools=TOOLS,  # type: ignore[arg-type]
        context_management=EDITS,  # type: ignore[arg-type]
    )
    assert msg.context_management is not None and msg.context_management.applied_edits == []
    assert "body of f0" in json.dumps(fake.requests[-1].json)


def test_an_anthropic_upstream_gets_the_request_byte_for_byte(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "anthropic")
    fake.enqueue(Reply(text="ok"))
    body = orjson.dumps(
        {
            "model": "m-1",
            "max_tokens": 100,
            "messages": transcript(),
            "tools": TOOLS,
            "context_management": EDITS,
        }
    )
    headers = {
        "x-api-key": "sk-client",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "context-management-2025-06-27",
        "content-type": "application/json",
    }
    r = p.http.post(p.url + "/v1/messages", content=body, headers=headers)
    assert r.status_code == 200, r.text
    assert fake.requests[-1].body == body
    assert "context_management" not in r.json()  # the fake applies nothing; the proxy adds nothing


def compact_edit(pause: bool) -> JSON:
    trigger = {"type": "input_tokens", "value": 400}  # transcript(): about 550 tokens
    return {
        "edits": [{"type": "compact_20260112", "trigger": trigger, "pause_after_compaction": pause}]
    }


def paused_compaction(c: anthropic.Anthropic, messages: list[Any], session: str) -> Any:
    """A Messages request (beta) in ``session`` whose compact edit pauses after compacting."""
    return c.beta.messages.create(
        model="m-1",
        max_tokens=100,
        messages=messages,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        context_management=compact_edit(pause=True),  # type: ignore[arg-type]
        extra_headers={SESSION_HEADER: session},
    )


def checkpoint_reply() -> Reply:
    env = {"state_patch": {"notes": "read f0..f3"}, "action": "continue"}
    return Reply(text=f"```json\n{json.dumps(env)}\n```")


def test_compaction_paused_then_carried_on(fake: FakeProvider, start_proxy: StartProxy) -> None:
    """``compact_20260112`` for a chat-completions upstream: the checkpoint folds the
    history into the state, the reply is the compaction block alone (``pause``), and the
    next request, carrying the block, reaches the upstream as the state and what follows."""
    from skillstate.compaction.items import CHECKPOINT_MARK, RESTORED_MARK

    p = start(fake, start_proxy, "openai")
    fake.enqueue(checkpoint_reply())
    c = ant(p)
    msg = paused_compaction(c, transcript(), "ant-1")
    assert msg.stop_reason == "compaction"
    (block,) = msg.content
    assert block.type == "compaction" and block.encrypted_content.startswith("ssc1_")
    assert CHECKPOINT_MARK in json.dumps(fake.requests[-1].json)
    assert p.state("ant-1")["state"] == {"notes": "read f0..f3"}
    fake.enqueue(Reply(text="Carrying on."))
    later = [
        *transcript(),
        {"role": "assistant", "content": [block.model_dump(exclude_none=True)]},
        {"role": "user", "content": "And now?"},
    ]
    r = paused_compaction(c, later, "ant-1")
    assert r.content[0].text == "Carrying on." and r.stop_reason == "end_turn"
    sent = json.dumps(fake.requests[-1].json)
    assert RESTORED_MARK in sent and "read f0..f3" in sent and "And now?" in sent
    assert "body of f0" not in sent and "ssc1_" not in sent


@pytest.mark.parametrize("kind", ["openai", "openai-responses"])
@pytest.mark.parametrize("stream", [False, True])
def test_compaction_then_the_answer(
    fake: FakeProvider, start_proxy: StartProxy, stream: bool, kind: str
) -> None:
    p = start(fake, start_proxy, kind)
    fake.enqueue(checkpoint_reply(), Reply(text="All four read."))
    request: Any = {
        "model": "m-1",
        "max_tokens": 100,
        "messages": transcript(),
        "tools": TOOLS,
        "context_management": compact_edit(pause=False),
    }
    if stream:
        with ant(p).beta.messages.stream(**request) as s:
            msg = s.get_final_message()
    else:
        msg = ant(p).beta.messages.create(**request)
    block, text = msg.content
    assert block.type == "compaction" and block.encrypted_content.startswith("ssc1_")
    assert text.type == "text" and text.text == "All four read."
    sent = json.dumps(fake.requests[-1].json)
    assert "read f0..f3" in sent and "body of f3" in sent and "body of f0" not in sent


def test_compaction_of_a_session_with_state_is_the_windows_checkpoint(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """A session that has state compacts with the window form's checkpoint turn (here with
    no window yet: the whole transcript, the contract, the state, the instruction); the
    patch merges into the state it had."""
    p = start(fake, start_proxy, "openai")
    c = ant(p)
    headers = {SESSION_HEADER: "ant-2", "x-skillstate-mode": "state"}
    env = {"state_patch": {"facts": ["f0 is short"]}, "action": "read"}
    fake.enqueue(Reply(text=f"```json\n{json.dumps(env)}\n```"))
    c.messages.create(model="m-1", max_tokens=100, messages=transcript(1), extra_headers=headers)
    fake.enqueue(checkpoint_reply())
    msg = paused_compaction(c, transcript(), "ant-2")
    assert msg.stop_reason == "compaction" and msg.content[0].type == "compaction"
    sent = json.dumps(fake.requests[-1].json)
    assert "f0 is short" in sent and "body of f0" in sent and "body of f3" in sent
    assert "leave your context after this reply" in sent and "is being compacted" not in sent
    state = p.state("ant-2")
    assert state["state"] == {"facts": ["f0 is short"], "notes": "read f0..f3"}
    assert state["step"] == 2


def test_a_bad_compaction_block_is_refused(fake: FakeProvider, start_proxy: StartProxy) -> None:
    p = start(fake, start_proxy, "openai")
    bad = {"type": "compaction", "content": "x", "encrypted_content": "forged"}
    messages = [
        *transcript(1),
        {"role": "assistant", "content": [bad]},
        {"role": "user", "content": "go"},
    ]
    with pytest.raises(anthropic.BadRequestError) as e:
        ant(p).beta.messages.create(model="m-1", max_tokens=10, messages=messages)  # type: ignore[arg-type]
    assert "compaction" in e.value.message and fake.requests == []


def test_count_tokens_counts_what_goes_upstream(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai")
    c = ant(p)
    edited = c.beta.messages.count_tokens(
        model="m-1",
        messages=transcript(),
        tools=TOOLS,  # type: ignore[arg-type]
        context_management=EDITS,  # type: ignore[arg-type]
    )
    whole = c.beta.messages.count_tokens(model="m-1", messages=transcript(), tools=TOOLS)  # type: ignore[arg-type]
    assert 0 < edited.input_tokens < whole.input_tokens
    # As the API answers: the count before the edits (BetaCountTokensContextManagementResponse).
    assert edited.context_management is not None
    assert edited.context_management.original_input_tokens == whole.input_tokens
    assert whole.context_management is None  # no context_management asked, none reported


def test_count_tokens_context_management_reaches_an_anthropic_upstream(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """An Anthropic upstream counts with the edits itself: the field reaches it, and its
    ``original_input_tokens`` reaches the client."""
    p = start(fake, start_proxy, "anthropic")
    counted = ant(p).beta.messages.count_tokens(
        model="m-1",
        messages=transcript(),
        tools=TOOLS,  # type: ignore[arg-type]
        context_management=EDITS,  # type: ignore[arg-type]
        betas=["context-management-2025-06-27"],
    )
    rec = fake.requests[-1]
    assert rec.path == "/v1/messages/count_tokens" and rec.json["context_management"] == EDITS
    assert counted.context_management is not None
    assert (
        counted.context_management.original_input_tokens
        == json.loads(rec.response_body)["context_management"]["original_input_tokens"]
    )


@pytest.mark.parametrize("compaction", ["native", "proxy"])
def test_an_anthropic_upstream_compacts_itself_unless_compaction_proxy(
    fake: FakeProvider, start_proxy: StartProxy, compaction: str
) -> None:
    from skillstate.compaction.items import CHECKPOINT_MARK

    up = {"name": "up", "url": fake.url, "kind": "anthropic", "api_key": "sk-upstream"}
    cfg = {"upstreams": [up], "compaction": compaction}
    p = start_proxy(None, "--mode", "passthrough", config=cfg)
    edits = [*EDITS["edits"], *compact_edit(pause=True)["edits"]]
    fake.enqueue(checkpoint_reply() if compaction == "proxy" else Reply(text="upstream's own"))
    msg = ant(p).beta.messages.create(
        model="m-1",
        max_tokens=100,
        messages=transcript(),
        tools=TOOLS,  # type: ignore[arg-type]
        context_management={"edits": edits},  # type: ignore[arg-type]
    )
    sent = fake.requests[-1].json
    if compaction == "native":
        assert sent["context_management"] == {"edits": edits}  # as sent: Anthropic applies it
        assert msg.content[0].type == "text"
    else:
        assert CHECKPOINT_MARK in json.dumps(sent)
        assert sent.get("context_management") in (None, {"edits": EDITS["edits"]})
        assert msg.stop_reason == "compaction" and msg.content[0].type == "compaction"
