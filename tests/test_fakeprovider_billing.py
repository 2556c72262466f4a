"""The fake provider bills input the way the real APIs do: the tool definitions are input
(rendered into the prompt) and part of the cached prefix, OpenAI caches Responses requests
like chat completions, Anthropic caches at ``cache_control`` breakpoints in the order tools,
system, messages, with a minimum per model, and every route reports the counts in its
streamed events too. Driven with the official SDKs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.fakeprovider import (
    CACHE_LOOKBACK_BLOCKS,
    FakeProvider,
    estimate_tokens,
    ntokens,
    prompt_tokens,
)
from tests.helpers import HEAVY_ANTHROPIC_TOOLS, HEAVY_CHAT_TOOLS, HEAVY_RESPONSES_TOOLS

USER = [{"role": "user", "content": "Which tool fits?"}]
CHAT_TOOLS, RESPONSES_TOOLS, ANTHROPIC_TOOLS = (
    HEAVY_CHAT_TOOLS,
    HEAVY_RESPONSES_TOOLS,
    HEAVY_ANTHROPIC_TOOLS,
)
EPHEMERAL = {"type": "ephemeral"}


def marked_tools() -> list[Any]:
    """The Anthropic tools with a breakpoint on the last one (as Claude Code marks them)."""
    return [*ANTHROPIC_TOOLS[:-1], {**ANTHROPIC_TOOLS[-1], "cache_control": EPHEMERAL}]


@pytest.fixture
def openai_cache() -> Iterator[FakeProvider]:
    with FakeProvider(cache="openai") as fp:
        yield fp


@pytest.fixture
def anthropic_cache() -> Iterator[FakeProvider]:
    with FakeProvider(cache="anthropic") as fp:
        yield fp


def oai(fp: FakeProvider) -> openai.OpenAI:
    return openai.OpenAI(base_url=fp.url + "/v1", api_key="sk-test", max_retries=0)


def ant(fp: FakeProvider) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=fp.url, api_key="sk-ant-test", max_retries=0)


def sse(raw: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in raw.split("\n") if line.startswith("data: {")]


def test_the_fixture_is_tools_heavy() -> None:
    """The fixture is tools-heavy: the tools alone are over the caches' 1,024 tokens."""
    assert estimate_tokens(CHAT_TOOLS) > 1024 > estimate_tokens(USER) * 20
    assert estimate_tokens(ANTHROPIC_TOOLS) > 1024


def test_chat_completions_bill_the_tools_as_input() -> None:
    with FakeProvider() as fp:
        r = oai(fp).chat.completions.create(model="gpt-4o", messages=USER, tools=CHAT_TOOLS)  # type: ignore[arg-type]
        assert r.usage is not None
        assert r.usage.prompt_tokens == estimate_tokens(USER) + estimate_tokens(CHAT_TOOLS)
        assert r.usage.prompt_tokens == prompt_tokens(fp.last.json, "openai")
        plain = oai(fp).chat.completions.create(model="gpt-4o", messages=USER)  # type: ignore[arg-type]
        assert plain.usage is not None and plain.usage.prompt_tokens == estimate_tokens(USER)


def test_responses_bill_the_tools_and_the_instructions_as_input() -> None:
    with FakeProvider() as fp:
        r = oai(fp).responses.create(
            model="gpt-5", instructions="Be brief.", input="Which tool fits?", tools=RESPONSES_TOOLS
        )
        assert r.usage is not None
        expected = estimate_tokens(RESPONSES_TOOLS) + estimate_tokens(
            ["Be brief.", "Which tool fits?"]
        )
        assert r.usage.input_tokens == expected == prompt_tokens(fp.last.json, "responses")
        assert r.usage.input_tokens_details.cached_tokens == 0  # no cache configured


def test_messages_bill_the_tools_and_count_tokens_says_the_same() -> None:
    with FakeProvider() as fp:
        c = ant(fp)
        m = c.messages.create(
            model="claude-sonnet-4-5", max_tokens=50, system="Be brief.", messages=USER,
            tools=ANTHROPIC_TOOLS,
        )  # fmt: skip
        expected = (
            estimate_tokens(ANTHROPIC_TOOLS) + estimate_tokens("Be brief.") + estimate_tokens(USER)
        )
        assert m.usage.input_tokens == expected
        counted = c.messages.count_tokens(
            model="claude-sonnet-4-5", system="Be brief.", messages=USER, tools=ANTHROPIC_TOOLS
        )
        assert counted.input_tokens == m.usage.input_tokens


def test_openai_caches_the_tools_prefix_on_chat_completions(openai_cache: FakeProvider) -> None:
    c = oai(openai_cache)
    first = c.chat.completions.create(model="gpt-4o", messages=USER, tools=CHAT_TOOLS)  # type: ignore[arg-type]
    other = [{"role": "user", "content": "Something else entirely."}]
    second = c.chat.completions.create(model="gpt-4o", messages=other, tools=CHAT_TOOLS)  # type: ignore[arg-type]
    assert first.usage is not None and second.usage is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]
    cached = second.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    # The shared prefix is the tools and the user message's head (the texts differ from
    # their first character): counted in 128-token steps from 1,024 on, within the prompt.
    shared = len(json.dumps(CHAT_TOOLS, separators=(",", ":")) + '{"role":"user","content":"')
    assert cached == shared // 4 // 128 * 128 and cached >= 1024
    assert cached <= second.usage.prompt_tokens


def test_openai_caches_responses_requests_like_chat_completions(
    openai_cache: FakeProvider,
) -> None:
    c = oai(openai_cache)
    items: list[Any] = [{"role": "user", "content": "Which tool fits?"}]
    first = c.responses.create(
        model="gpt-5", instructions="Be brief.", input=items, tools=RESPONSES_TOOLS
    )
    items += [{"role": "assistant", "content": "lookup_3."}, {"role": "user", "content": "Why?"}]
    second = c.responses.create(
        model="gpt-5", instructions="Be brief.", input=items, tools=RESPONSES_TOOLS
    )
    assert first.usage is not None and second.usage is not None
    assert first.usage.input_tokens_details.cached_tokens == 0
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached % 128 == 0 and cached >= estimate_tokens(RESPONSES_TOOLS) // 128 * 128 >= 1024
    assert cached <= second.usage.input_tokens
    # Streamed: the counts are in response.completed (and nowhere before it).
    raw = httpx.post(
        openai_cache.url + "/v1/responses",
        json={"model": "gpt-5", "instructions": "Be brief.", "input": items,
              "tools": RESPONSES_TOOLS, "stream": True},
        headers={"authorization": "Bearer sk-test"},
    ).text  # fmt: skip
    events = sse(raw)
    assert [e["response"]["usage"] for e in events[:2]] == [None, None]
    done = events[-1]
    assert done["type"] == "response.completed"
    assert done["response"]["usage"]["input_tokens_details"]["cached_tokens"] >= cached


def test_openai_caches_nothing_below_1024_tokens(openai_cache: FakeProvider) -> None:
    c = oai(openai_cache)
    small = CHAT_TOOLS[:2]
    assert estimate_tokens(small) + estimate_tokens(USER) < 1024
    for _ in range(2):
        r = c.chat.completions.create(model="gpt-4o", messages=USER, tools=small)  # type: ignore[arg-type]
        assert r.usage is not None and r.usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]


def test_openai_chat_stream_reports_the_cache_in_the_usage_chunk(
    openai_cache: FakeProvider,
) -> None:
    body = {"model": "gpt-4o", "messages": USER, "tools": CHAT_TOOLS, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    headers = {"authorization": "Bearer sk-test"}
    httpx.post(openai_cache.url + "/v1/chat/completions", json=body, headers=headers)
    chunks = sse(
        httpx.post(openai_cache.url + "/v1/chat/completions", json=body, headers=headers).text
    )
    assert all(c["usage"] is None for c in chunks[:-1])
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["prompt_tokens"] == prompt_tokens(body, "openai")
    assert usage["prompt_tokens_details"]["cached_tokens"] >= 1024


def test_anthropic_writes_then_reads_a_breakpoint_on_the_tools(
    anthropic_cache: FakeProvider,
) -> None:
    c = ant(anthropic_cache)
    first = c.messages.create(
        model="claude-sonnet-4-5", max_tokens=50, messages=USER, tools=marked_tools()
    )
    other = [{"role": "user", "content": "Something else entirely."}]
    second = c.messages.create(
        model="claude-sonnet-4-5", max_tokens=50, messages=other, tools=marked_tools()
    )
    tools = sum(ntokens(json.dumps(t, separators=(",", ":"))) for t in ANTHROPIC_TOOLS)
    assert (first.usage.cache_creation_input_tokens, first.usage.cache_read_input_tokens) == (
        pytest.approx(tools, abs=8), 0,
    )  # fmt: skip
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert second.usage.cache_creation_input_tokens == 0
    # input_tokens excludes the cache: the three add up to the whole prompt.
    whole = prompt_tokens({"messages": other, "tools": ANTHROPIC_TOOLS}, "anthropic")
    u = second.usage
    assert u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens == whole


def test_anthropic_cache_order_is_tools_then_system_then_messages(
    anthropic_cache: FakeProvider,
) -> None:
    """A breakpoint on the system caches the tools with it; a new system prompt misses that
    entry but still reads the tools' own breakpoint."""
    c = ant(anthropic_cache)

    def call(system: str) -> Any:
        blocks = [{"type": "text", "text": system, "cache_control": EPHEMERAL}]
        return c.messages.create(
            model="claude-sonnet-4-5", max_tokens=50, system=blocks, messages=USER,  # type: ignore[arg-type]
            tools=marked_tools(),
        ).usage  # fmt: skip

    first = call("You are the inventory agent.")
    again = call("You are the inventory agent.")
    changed = call("You are the invoicing agent.")  # as long: as many tokens
    assert first.cache_read_input_tokens == 0 and first.cache_creation_input_tokens > 1024
    assert again.cache_read_input_tokens == first.cache_creation_input_tokens
    tools = changed.cache_read_input_tokens  # the tools' entry, written by the first call
    assert 1024 < tools < first.cache_creation_input_tokens
    assert changed.cache_creation_input_tokens == first.cache_creation_input_tokens - tools


def test_anthropic_top_level_cache_control_marks_the_last_block(
    anthropic_cache: FakeProvider,
) -> None:
    c = ant(anthropic_cache)
    usages = [
        c.messages.create(
            model="claude-sonnet-4-5", max_tokens=50, messages=USER, tools=ANTHROPIC_TOOLS,
            extra_body={"cache_control": EPHEMERAL},
        ).usage
        for _ in range(2)
    ]  # fmt: skip
    assert usages[0].cache_creation_input_tokens > 1024 and usages[0].cache_read_input_tokens == 0
    assert usages[1].cache_read_input_tokens == usages[0].cache_creation_input_tokens


@pytest.mark.parametrize(
    ("model", "minimum"),
    [("claude-sonnet-4-5", 1024), ("claude-haiku-4-5", 4096), ("claude-3-5-haiku-latest", 2048)],
)
def test_anthropic_minimum_cacheable_prefix_is_the_models(
    anthropic_cache: FakeProvider, model: str, minimum: int
) -> None:
    assert anthropic_cache.cache_minimum(model) == minimum
    c = ant(anthropic_cache)
    usages = [
        c.messages.create(model=model, max_tokens=50, messages=USER, tools=marked_tools()).usage
        for _ in range(2)
    ]
    tools = usages[0].input_tokens + usages[0].cache_creation_input_tokens - estimate_tokens(USER)
    assert 1024 < tools < 2048  # the same ~1,500-token prefix for every model
    cached = minimum <= tools
    assert (usages[0].cache_creation_input_tokens > 0) is cached
    assert (usages[1].cache_read_input_tokens > 0) is cached


def test_anthropic_looks_back_at_most_20_blocks_from_a_breakpoint(
    anthropic_cache: FakeProvider,
) -> None:
    """A request whose only breakpoint (on its last message) is 21 blocks after the system
    prompt an earlier request wrote does not read it; 19 blocks after it, it does."""
    c = ant(anthropic_cache)
    text = "Inventory agent. " * 400

    def usage(n: int, marked: str) -> Any:
        """A call with n exchanges after the system, the breakpoint on ``marked``."""
        system: list[Any] = [{"type": "text", "text": text}]
        last: dict[str, Any] = {"type": "text", "text": "last"}
        (system[0] if marked == "system" else last)["cache_control"] = EPHEMERAL
        messages: list[Any] = []
        for i in range(n):
            messages += [{"role": "user", "content": f"q{i}"}]
            messages += [{"role": "assistant", "content": f"a{i}"}]
        messages.append({"role": "user", "content": [last]})
        return c.messages.create(
            model="claude-sonnet-4-5", max_tokens=50, system=system, messages=messages
        ).usage

    written = usage(0, "system").cache_creation_input_tokens
    assert written > 1024
    far = usage(CACHE_LOOKBACK_BLOCKS // 2, "last")  # 2n+1 = 21 blocks after the system
    assert far.cache_read_input_tokens == 0 and far.cache_creation_input_tokens > written
    anthropic_cache.reset()
    assert usage(0, "system").cache_creation_input_tokens == written
    near = usage(CACHE_LOOKBACK_BLOCKS // 2 - 1, "last")  # 19 blocks after it
    assert near.cache_read_input_tokens == written and near.cache_creation_input_tokens > 0


def test_anthropic_stream_reports_the_cache_in_message_start_and_message_delta(
    anthropic_cache: FakeProvider,
) -> None:
    c = ant(anthropic_cache)
    c.messages.create(model="claude-sonnet-4-5", max_tokens=50, messages=USER, tools=marked_tools())
    body = {"model": "claude-sonnet-4-5", "max_tokens": 50, "messages": USER,
            "tools": marked_tools(), "stream": True}  # fmt: skip
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    events = sse(httpx.post(anthropic_cache.url + "/v1/messages", json=body, headers=headers).text)
    start = events[0]["message"]["usage"]
    delta = next(e for e in events if e["type"] == "message_delta")["usage"]
    assert start["cache_read_input_tokens"] > 1024 and start["input_tokens"] > 0
    for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
        assert delta[key] == start[key]
