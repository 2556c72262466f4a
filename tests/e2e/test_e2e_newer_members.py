"""The newest SDKs' request members across translations (openai 3.57, anthropic 2.16), with
the real SDKs through the real proxy against the fake provider: what another format has
under the same meaning is translated; what it has not, and whose loss would change the
answer (a conversation's items, a stored prompt, MCP servers, a mid-conversation tool
change, web search, moderation), is a 400 in the client's format naming it, before
anything is sent; an upstream of the request's own format gets it as it came."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, ant, oai

MODES = ["passthrough", "state"]
# The betas of mid-conversation system messages' tool changes, output_config and clear_at.
SYSTEM_BETAS = [
    "mid-conversation-tool-changes-2026-07-01",
    "mid-conversation-output-config-2026-07-01",
    "mid-conversation-system-clear-at-2026-08-21",
]
LOOKUP = {"name": "lookup", "input_schema": {"type": "object"}}


def start(fake: FakeProvider, start_proxy: StartProxy, kind: str, mode: str) -> Proxy:
    url = fake.url if kind == "anthropic" else fake.url + "/v1"
    up = {"name": "up", "url": url, "kind": kind, "api_key": "sk-upstream"}
    return start_proxy(None, "--mode", mode, config={"upstreams": [up]})


def messages_create(p: Proxy, messages: list[Any], **kw: Any) -> Any:
    client = ant(p, default_headers={SESSION_HEADER: "newer"})
    return client.beta.messages.create(
        model="m", max_tokens=64, messages=messages, betas=SYSTEM_BETAS, **kw
    )


def system_texts(fake: FakeProvider, kind: str) -> list[str]:
    """The system text the upstream got, in order (a Responses upstream: instructions, then
    its system and developer items)."""
    body = fake.last.json
    if kind == "openai":
        return [m["content"] for m in body["messages"] if m["role"] == "system"]
    items = [i for i in body["input"] if i.get("role") in ("system", "developer")]
    texts = [text_of(i["content"]) for i in items]
    return ([body["instructions"]] if body.get("instructions") else []) + texts


def text_of(content: str | list[Any]) -> str:
    return content if isinstance(content, str) else "".join(part["text"] for part in content)


@pytest.mark.parametrize("kind", ["openai", "openai-responses"])
def test_mid_conversation_system_messages_reach_an_openai_format_upstream_as_the_model_sees_them(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    """A system message cleared at the next user message is no longer shown once one
    follows; one that carries only a per-turn output_config has no text to send."""
    p = start(fake, start_proxy, kind, "passthrough")
    fake.enqueue(Reply(text="ok"))
    messages = [
        {"role": "user", "content": "Look it up."},
        {"role": "system", "content": "Answer in French.", "clear_at": "next_user_message"},
        {"role": "assistant", "content": "D'accord."},
        {"role": "user", "content": "And now?"},
        {"role": "system", "output_config": {"effort": "low"}},
        {"role": "system", "content": [], "output_config": {"effort": "medium"}},  # Claude Code's
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
    ]
    reply = messages_create(p, messages, system="You help.")
    assert reply.content[0].text == "ok"
    assert system_texts(fake, kind) == ["You help.", "Be brief."]


@pytest.mark.parametrize("block", ["tool_addition", "tool_removal"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["openai", "openai-responses"])
def test_a_tool_change_in_a_system_message_is_a_400_for_an_openai_format_upstream(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, mode: str, block: str
) -> None:
    """Chat completions' tools are the request's: a tool offered from one point of the
    conversation on (or withdrawn) has no form there."""
    p = start(fake, start_proxy, kind, mode)
    change = {"type": block, "tool": {"type": "tool_reference", "name": "lookup"}}
    messages = [
        {"role": "user", "content": "Look it up."},
        {"role": "system", "content": [change]},
    ]
    with pytest.raises(anthropic.BadRequestError) as e:
        messages_create(p, messages, tools=[LOOKUP])
    assert f"messages[1].content[0]: {block} blocks cannot be sent" in e.value.message
    assert fake.requests == []


@pytest.mark.parametrize("mode", MODES)
def test_an_anthropic_upstream_gets_a_tool_change_as_it_came(
    fake: FakeProvider, start_proxy: StartProxy, mode: str
) -> None:
    p = start(fake, start_proxy, "anthropic", mode)
    fake.enqueue(Reply(text="ok"))
    change = {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "lookup"}}
    messages = [
        {"role": "user", "content": "Look it up."},
        {"role": "system", "content": [change]},
    ]
    messages_create(p, messages, tools=[LOOKUP])
    assert {"role": "system", "content": [change]} in fake.requests[0].json["messages"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["openai", "openai-responses"])
def test_mcp_servers_are_a_400_for_an_openai_format_upstream(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, mode: str
) -> None:
    """The Messages API connects to the servers and offers the model their tools: without
    them the model would answer without the tools."""
    p = start(fake, start_proxy, kind, mode)
    servers = [{"type": "url", "url": "https://mcp.example/sse", "name": "docs"}]
    with pytest.raises(anthropic.BadRequestError) as e:
        messages_create(p, [{"role": "user", "content": "Search."}], mcp_servers=servers)
    assert "mcp_servers cannot be sent to an OpenAI-format upstream" in e.value.message
    assert fake.requests == []


# A Responses request's members that only the Responses API holds, and what they name.
KEPT_UPSTREAM = {"conversation": "conv_123", "prompt": {"id": "pmpt_123", "version": "2"}}


@pytest.mark.parametrize("member", list(KEPT_UPSTREAM))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_conversation_or_a_stored_prompt_is_a_400_for_another_kind_of_upstream(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, mode: str, member: str
) -> None:
    """The model would answer without the conversation's items or the prompt's
    instructions."""
    p = start(fake, start_proxy, kind, mode)
    create = oai(p, default_headers={SESSION_HEADER: "newer"}).responses.create
    with pytest.raises(openai.BadRequestError) as e:
        create(model="m", input="Go on.", **{member: KEPT_UPSTREAM[member]})
    assert e.value.param == member
    assert fake.requests == []


def test_a_responses_upstream_gets_a_conversation_and_a_prompt_as_they_came(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai-responses", "passthrough")
    fake.enqueue(Reply(text="ok"))
    oai(p).responses.create(model="m", input="Go on.", **KEPT_UPSTREAM)  # type: ignore[arg-type]
    assert {k: fake.last.json[k] for k in KEPT_UPSTREAM} == KEPT_UPSTREAM


@pytest.mark.parametrize("mode", ["state", "window", "auto"])
def test_a_conversation_is_a_400_in_a_mode_that_sends_its_own_context(
    fake: FakeProvider, start_proxy: StartProxy, mode: str
) -> None:
    """The API would put the conversation's items (the earlier turns' contexts) before the
    proxy's context, and add this turn's to them. A stored prompt is sent as it came."""
    p = start(fake, start_proxy, "openai-responses", mode)
    create = oai(p, default_headers={SESSION_HEADER: "newer"}).responses.create
    with pytest.raises(openai.BadRequestError) as e:
        create(model="m", input="Go on.", conversation="conv_123")
    assert e.value.param == "conversation" and "passthrough" in e.value.message
    assert fake.requests == []
    fake.enqueue(Reply(text="ok"))
    create(model="m", input="Go on.", prompt=KEPT_UPSTREAM["prompt"])  # type: ignore[arg-type]
    assert fake.last.json["prompt"] == KEPT_UPSTREAM["prompt"]


def test_a_responses_request_keeps_on_a_chat_upstream_what_chat_has_by_the_same_meaning(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai", "passthrough")
    fake.enqueue(Reply(text="ok"))
    oai(p).responses.create(
        model="m",
        input="Go on.",
        text={"verbosity": "low"},
        safety_identifier="user-7",
        prompt_cache_retention="24h",
        service_tier="flex",
    )
    sent = fake.last.json
    assert sent["verbosity"] == "low" and sent["safety_identifier"] == "user-7"
    assert sent["prompt_cache_retention"] == "24h" and sent["service_tier"] == "flex"


MODERATION = {"model": "omni-moderation-latest", "policy": {"input": {"mode": "block"}}}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("route", "kind"),
    [
        ("chat", "anthropic"),
        ("chat", "openai-responses"),
        ("responses", "openai"),
        ("responses", "anthropic"),
    ],
)
def test_moderation_is_a_400_across_a_translation(
    fake: FakeProvider, start_proxy: StartProxy, route: str, kind: str, mode: str
) -> None:
    """The translated upstream would answer unmoderated, and the reply has no place for
    the results."""
    p = start(fake, start_proxy, kind, mode)
    client = oai(p, default_headers={SESSION_HEADER: "newer"})
    with pytest.raises(openai.BadRequestError) as e:
        if route == "chat":
            messages = [{"role": "user", "content": "Hi."}]
            client.chat.completions.create(model="m", messages=messages, moderation=MODERATION)  # type: ignore[arg-type]
        else:
            client.responses.create(model="m", input="Hi.", moderation=MODERATION)  # type: ignore[arg-type]
    assert e.value.param == "moderation"
    assert fake.requests == []


@pytest.mark.parametrize("mode", MODES)
def test_web_search_options_are_a_400_for_an_anthropic_upstream(
    fake: FakeProvider, start_proxy: StartProxy, mode: str
) -> None:
    """As for a Responses upstream: the answer would come from the model's memory."""
    p = start(fake, start_proxy, "anthropic", mode)
    messages = [{"role": "user", "content": "What happened today?"}]
    with pytest.raises(openai.BadRequestError) as e:
        oai(p).chat.completions.create(model="m", messages=messages, web_search_options={})  # type: ignore[list-item]
    assert e.value.param == "web_search_options"
    assert fake.requests == []
