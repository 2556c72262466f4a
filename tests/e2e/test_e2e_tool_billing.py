"""A tools-heavy request is billed with its tools, and its tools are read from the provider's
prompt cache on the next call, on all three routes, end to end: the real proxy
(in-process), the official SDKs, the fake provider billing as each API bills
(``cache="openai"`` for chat completions and Responses, ``"anthropic"`` for Messages). In
passthrough the proxy relays the client's request; in state mode it sends its own context,
whose stable prefix (the tools first) must be what the cache reads. The proxy's ledger
records what the provider billed."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, RecordedRequest, estimate_tokens, prompt_tokens
from tests.helpers import (
    HEAVY_ANTHROPIC_TOOLS,
    HEAVY_CHAT_TOOLS,
    HEAVY_RESPONSES_TOOLS,
    SESSION_HEADER,
    ant,
    envelope,
    oai,
)

ROUTES = ["openai", "anthropic", "openai-responses"]  # the upstream kind, as the client's
FAKE_DIALECT = {"openai": "openai", "anthropic": "anthropic", "openai-responses": "responses"}
MODEL = {"openai": "gpt-4o", "anthropic": "claude-sonnet-4-5", "openai-responses": "gpt-5"}
TOOLS = {
    "openai": HEAVY_CHAT_TOOLS,
    "anthropic": [
        *HEAVY_ANTHROPIC_TOOLS[:-1],
        {**HEAVY_ANTHROPIC_TOOLS[-1], "cache_control": {"type": "ephemeral"}},
    ],  # Claude Code marks its last tool
    "openai-responses": HEAVY_RESPONSES_TOOLS,
}
TASK = "Find the record of part 42 and report its stock."
OBSERVATIONS = ["Looked it up: part 42 has 17 in stock.", "Checked again: still 17."]


@pytest.fixture(params=ROUTES)
def route(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def fake(route: str) -> Iterator[FakeProvider]:
    fp = FakeProvider(cache="anthropic" if route == "anthropic" else "openai").start()
    fp.responder = lambda rec: envelope({"step": len(fp.requests)}, prefix="Stock is 17.")
    yield fp
    fp.stop()


def start(start_proxy: StartProxy, fake: FakeProvider, route: str) -> Proxy:
    url = fake.url if route == "anthropic" else fake.url + "/v1"
    up = {"name": "up", "url": url, "kind": route, "api_key": "sk-upstream"}
    return start_proxy(None, "--schema", "step", config={"upstreams": [up]})


def call(p: Proxy, route: str, mode: str, turns: list[str]) -> None:
    """One client call: the task, then the earlier turns' exchanges, through the proxy."""
    headers = {SESSION_HEADER: f"billing-{mode}", "x-skillstate-mode": mode}
    model, tools = MODEL[route], TOOLS[route]
    history: list[Any] = [{"role": "user", "content": TASK}]
    for obs in turns:
        history += [{"role": "assistant", "content": "Looking."}, {"role": "user", "content": obs}]
    if route == "openai":
        oai(p).chat.completions.create(
            model=model, messages=history, tools=tools, extra_headers=headers
        )
    elif route == "anthropic":
        ant(p).messages.create(
            model=model, max_tokens=200, messages=history, tools=tools, extra_headers=headers
        )
    else:
        oai(p).responses.create(model=model, input=history, tools=tools, extra_headers=headers)


def billed(rec: RecordedRequest) -> tuple[int, int, int]:
    """(input tokens with the cache's, cache read, cache write) the fake billed a request."""
    u = json.loads(rec.response_body)["usage"]
    if "cache_read_input_tokens" in u:  # Anthropic: input_tokens excludes the cache's
        read, write = u["cache_read_input_tokens"], u["cache_creation_input_tokens"]
        return u["input_tokens"] + read + write, read, write
    details = u.get("prompt_tokens_details") or u["input_tokens_details"]
    return u.get("prompt_tokens", u.get("input_tokens")), details["cached_tokens"], 0


def ledger(tmp_path: Path, session: str) -> list[tuple[int, int, int]]:
    db = sqlite3.connect(tmp_path / "data" / "skillstate.db")
    try:
        return db.execute(
            "SELECT input_tokens, cache_read_tokens, cache_write_tokens FROM ledger"
            " WHERE session = ? ORDER BY ts",
            (session,),
        ).fetchall()
    finally:
        db.close()


@pytest.mark.parametrize("mode", ["passthrough", "state"])
def test_a_tools_heavy_request_is_billed_with_its_tools_and_cached_on_the_second_call(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path, route: str, mode: str
) -> None:
    p = start(start_proxy, fake, route)
    call(p, route, mode, [])
    call(p, route, mode, OBSERVATIONS[:1])
    assert len(fake.requests) == 2  # one upstream call per client call (no re-ask)
    first, second = fake.requests
    for rec in (first, second):
        sent_tools = rec.json["tools"]
        assert [t.get("name") or t["function"]["name"] for t in sent_tools] == [
            f"lookup_{i}" for i in range(8)
        ]
        # Billed: everything the model reads, the tools included (they are most of it).
        whole, _, _ = billed(rec)
        assert whole == prompt_tokens(rec.json, FAKE_DIALECT[route])
        assert whole > estimate_tokens(HEAVY_ANTHROPIC_TOOLS) > 1024
    _, read_1, write_1 = billed(first)
    _, read_2, write_2 = billed(second)
    assert read_1 == 0
    # The second call reads at least the tools from the cache (OpenAI: in 128-token steps).
    tools_tokens = estimate_tokens(HEAVY_ANTHROPIC_TOOLS)
    assert read_2 >= tools_tokens - 128
    if route == "anthropic":  # written at a breakpoint by the first call, then read
        assert write_1 >= read_2 > 0
    else:
        assert read_2 % 128 == 0 and write_1 == write_2 == 0
    # The proxy's ledger holds what the provider billed, cache reads and writes apart. (A
    # passthrough row is written after the reply; /cost waits for the writes in flight.)
    assert p.get("/cost", params={"session": f"billing-{mode}"}).status_code == 200
    rows = ledger(tmp_path, f"billing-{mode}")
    assert rows == [billed(first), billed(second)]
