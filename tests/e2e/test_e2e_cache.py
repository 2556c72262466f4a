"""A context built for the provider's prompt cache (issue 14 §2), end to end: the real proxy
(in-process), the real openai SDK and native /v1/messages, the fake provider (which, with
``cache=...``, reports cache reads and writes the way the real APIs bill them)."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from skillstate.engine.context import CONTRACT_MARK, STATE_MARK
from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, ant, oai

PRICES = {
    "input_per_mtok": 2.0,
    "output_per_mtok": 10.0,
    "cache_read_per_mtok": 0.2,
    "cache_write_per_mtok": 2.5,
}
BIG_SYSTEM = "You are a meticulous release engineer. " * 150  # ~1,500 tokens
TOOLS_ANTHROPIC = [
    {
        "name": "run",
        "description": "Run a shell command",
        "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
]
TOOLS_OPENAI = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]


def envelope(step: int) -> str:
    body = {"state_patch": {"step": step}, "action": f"step {step}"}
    return f"Step {step}.\n```json\n{json.dumps(body)}\n```"


def start(start_proxy: StartProxy, fp: FakeProvider, *args: str, **upstream: Any) -> Proxy:
    config = {
        "schema": ["step"],
        "upstreams": [
            {"name": "a", "url": fp.url, "kind": "anthropic", "models": ["claude-*"], **upstream},
            {"name": "o", "url": fp.url + "/v1", "kind": "openai", **upstream},
        ],
        "prices": {"claude-mine": PRICES, "gpt-mine": PRICES},
    }
    return start_proxy(None, *args, config=config)


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    fp = FakeProvider().start()
    yield fp
    fp.stop()


def messages_call(
    p: Proxy, session: str, body: dict[str, Any], stream: bool = False
) -> httpx.Response:
    headers = {SESSION_HEADER: session, "anthropic-version": "2023-06-01"}
    r = httpx.post(
        p.url + "/v1/messages", json={**body, "stream": stream}, headers=headers, timeout=30
    )
    assert r.status_code == 200, r.text
    return r


def breakpoints(body: dict[str, Any]) -> list[str]:
    """Where a request's cache_control markers are: system[i], tools[i], messages[i][j]."""
    found = []
    for i, t in enumerate(body.get("tools") or []):
        if "cache_control" in t:
            found.append(f"tools[{i}]")
    system = body.get("system")
    for i, b in enumerate(system if isinstance(system, list) else []):
        if "cache_control" in b:
            found.append(f"system[{i}]")
    for i, m in enumerate(body["messages"]):
        for j, b in enumerate(m["content"] if isinstance(m["content"], list) else []):
            if "cache_control" in b:
                found.append(f"messages[{i}][{j}]")
    return found


def test_anthropic_prefix_is_byte_identical_over_50_turns_with_streams_and_tools(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(start_proxy, fake)
    system = [{"type": "text", "text": BIG_SYSTEM}]
    transcript: list[dict[str, Any]] = [{"role": "user", "content": "TASK: ship release 7."}]
    for turn in range(1, 51):
        if turn % 3 == 0:  # a tool call, answered on the next turn
            fake.enqueue(Reply(text=envelope(turn), tool_calls=[("run", {"cmd": f"make {turn}"})]))
        else:
            fake.enqueue(Reply(text=envelope(turn)))
        body = {"model": "claude-mine", "max_tokens": 300, "system": system,
                "tools": TOOLS_ANTHROPIC, "messages": transcript}  # fmt: skip
        r = messages_call(p, "fifty", body, stream=turn % 2 == 0)
        if turn % 2 == 0:  # the stream: the assistant turn as the client would rebuild it
            sent = fake.requests[-1].json
            reply = fake.requests[-1].reply
            assert reply is not None
            content: list[dict[str, Any]] = [{"type": "text", "text": f"Step {turn}."}]
            content += [
                {"type": "tool_use", "id": f"t{turn}", "name": c.name, "input": c.arguments}
                for c in reply.tool_calls
            ]
            assert b"event: message_stop" in r.content
        else:
            content = r.json()["content"]
        transcript = [*transcript, {"role": "assistant", "content": content}]
        uses = [b for b in content if b["type"] == "tool_use"]
        if uses:
            results = [
                {"type": "tool_result", "tool_use_id": u["id"], "content": "ok"} for u in uses
            ]
            transcript.append({"role": "user", "content": results})
        else:
            transcript.append({"role": "user", "content": f"Observation {turn}."})
    assert len(fake.requests) == 50
    prefixes = set()
    for req in fake.requests:
        sent = req.json
        first = sent["messages"][0]["content"]
        end = next(k for k, b in enumerate(first) if b.get("text", "").startswith(CONTRACT_MARK))
        assert first[end + 1]["text"].startswith(STATE_MARK)  # then the state
        prefix = [sent["tools"], sent["system"], first[: end + 1]]
        prefixes.add(json.dumps(prefix, separators=(",", ":")))
        # One proxy-added breakpoint, at the end of the stable prefix.
        assert breakpoints(sent) == [f"messages[0][{end}]"]
    assert len(prefixes) == 1


def test_openai_prefix_is_byte_identical_and_the_session_has_one_cache_key(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(start_proxy, fake)
    c = oai(p, "k")
    transcript: list[dict[str, Any]] = [
        {"role": "system", "content": BIG_SYSTEM},
        {"role": "user", "content": "TASK: ship release 7."},
    ]
    hdr = {SESSION_HEADER: "oai-fifty"}
    for turn in range(1, 51):
        fake.enqueue(Reply(text=envelope(turn)))
        if turn % 2:
            got = c.chat.completions.create(
                model="gpt-mine",
                messages=transcript,
                tools=TOOLS_OPENAI,
                extra_headers=hdr,  # type: ignore[arg-type]
            )
            text = got.choices[0].message.content or ""
        else:
            stream = c.chat.completions.create(
                model="gpt-mine", messages=transcript, tools=TOOLS_OPENAI, stream=True,  # type: ignore[arg-type]
                extra_headers=hdr,
            )  # fmt: skip
            text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
        assert text == f"Step {turn}."
        transcript += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": f"Observation {turn}."},
        ]
    key = "skillstate-" + hashlib.sha256(b"oai-fifty").hexdigest()[:32]
    prefixes = set()
    for req in fake.requests:
        sent = req.json
        assert sent["prompt_cache_key"] == key
        m = sent["messages"]
        assert m[0]["content"] == BIG_SYSTEM and m[1]["content"].startswith("TASK")
        prefix = [sent["tools"], m[:2], m[2]["content"].split(STATE_MARK)[0]]
        prefixes.add(json.dumps(prefix, separators=(",", ":")))
    assert len(prefixes) == 1


def test_openai_client_cache_key_is_kept(fake: FakeProvider, start_proxy: StartProxy) -> None:
    p = start(start_proxy, fake)
    c = oai(p, "k")
    fake.enqueue(Reply(text=envelope(1)))
    c.chat.completions.create(
        model="gpt-mine",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={SESSION_HEADER: "own"},
        extra_body={"prompt_cache_key": "client-key"},
    )
    assert fake.last.json["prompt_cache_key"] == "client-key"


def test_anthropic_client_breakpoints_are_kept_and_limited_to_four(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(start_proxy, fake)
    marked = {"type": "ephemeral"}
    system = [{"type": "text", "text": BIG_SYSTEM, "cache_control": marked}]
    task = {
        "role": "user",
        "content": [{"type": "text", "text": "TASK: go", "cache_control": marked}],
    }
    body = {"model": "claude-mine", "max_tokens": 100, "system": system, "messages": [task]}
    fake.enqueue(Reply(text=envelope(1)))
    messages_call(p, "own-bp", body)
    # The client's two breakpoints are kept (system, task); the proxy adds one after the
    # contract, which follows the task: three in all.
    assert breakpoints(fake.last.json) == ["system[0]", "messages[0][0]", "messages[0][1]"]

    # A client that already uses the 4 allowed gets none added.
    four = [
        {"type": "text", "text": BIG_SYSTEM[:100] + str(i), "cache_control": marked}
        for i in range(3)
    ]
    body = {"model": "claude-mine", "max_tokens": 100, "system": four, "messages": [task]}
    fake.enqueue(Reply(text=envelope(1)))
    messages_call(p, "four-bp", body)
    assert breakpoints(fake.last.json) == ["system[0]", "system[1]", "system[2]", "messages[0][0]"]


@pytest.mark.parametrize("mode", ["state", "window"])
def test_a_client_marking_its_newest_message_one_hour_gets_a_one_hour_proxy_breakpoint(
    fake: FakeProvider, start_proxy: StartProxy, mode: str
) -> None:
    """Claude Code can mark its newest message ``"ttl": "1h"``; the API refuses a one-hour
    breakpoint after a five-minute one (the fake, in the API's words). The proxy's
    breakpoint after the contract or the state comes before it, so it is one-hour too:
    before, every such turn was a 400 from the upstream."""
    p = start(start_proxy, fake, "--mode", mode)
    hour = {"type": "ephemeral", "ttl": "1h"}
    body = {
        "model": "claude-mine",
        "max_tokens": 100,
        "system": [{"type": "text", "text": BIG_SYSTEM, "cache_control": hour}],
        "messages": [
            {"role": "user", "content": "TASK: go"},
            {"role": "assistant", "content": "On it."},
            {"role": "user", "content": [{"type": "text", "text": "go on", "cache_control": hour}]},
        ],
    }
    for turn in (1, 2):
        fake.enqueue(Reply(text=envelope(turn)))
        messages_call(p, f"hour-{mode}", body)
        sent = fake.last.json
        markers = [
            b["cache_control"]
            for m in sent["messages"]
            for b in (m["content"] if isinstance(m["content"], list) else [])
            if "cache_control" in b
        ]
        assert markers and all(m == hour for m in markers), markers
    assert len(breakpoints(sent)) >= 3, breakpoints(sent)  # system, the proxy's, newest


def test_no_breakpoint_below_the_minimum_or_when_off(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    p = start(start_proxy, fake)
    small = {"model": "claude-mine", "max_tokens": 100, "system": "Be brief.",
             "messages": [{"role": "user", "content": "TASK: go"}]}  # fmt: skip
    fake.enqueue(Reply(text=envelope(1)))
    messages_call(p, "small", small)
    assert breakpoints(fake.last.json) == []  # ~300 tokens of prefix, below 1,024
    off = start(start_proxy, fake, "--data-dir", str(tmp_path / "off"), cache_breakpoints="off")
    big = {**small, "system": BIG_SYSTEM}
    fake.enqueue(Reply(text=envelope(1)))
    messages_call(off, "off", big)
    assert breakpoints(fake.last.json) == []


def test_sent_side_cache_reads_and_writes_are_recorded_and_priced(
    start_proxy: StartProxy, tmp_path: Path
) -> None:
    fp = FakeProvider(cache="anthropic").start()
    try:
        p = start(start_proxy, fp)
        system = [{"type": "text", "text": BIG_SYSTEM}]
        transcript: list[dict[str, Any]] = [{"role": "user", "content": "TASK: ship it."}]
        for turn in (1, 2):
            fp.enqueue(Reply(text=envelope(turn)))
            body = {
                "model": "claude-mine",
                "max_tokens": 300,
                "system": system,
                "messages": transcript,
            }
            r = messages_call(p, "billed", body)
            transcript += [
                {"role": "assistant", "content": r.json()["content"]},
                {"role": "user", "content": f"Observation {turn}."},
            ]
        usages = [json.loads(req.response_body)["usage"] for req in fp.requests]
        # The fake billed the proxy's breakpoint: a write on turn 1, a read on turn 2.
        assert usages[0]["cache_creation_input_tokens"] > 0 == usages[0]["cache_read_input_tokens"]
        assert usages[1]["cache_read_input_tokens"] == usages[0]["cache_creation_input_tokens"]
        db = sqlite3.connect(tmp_path / "data" / "skillstate.db")
        rows = db.execute(
            "SELECT input_tokens, cache_read_tokens, cache_write_tokens, output_tokens, cost_usd"
            " FROM ledger WHERE session = 'billed' ORDER BY ts"
        ).fetchall()
        db.close()
        for u, (inp, read, write, out, cost) in zip(usages, rows, strict=True):
            plain = u["input_tokens"]
            assert (read, write) == (u["cache_read_input_tokens"], u["cache_creation_input_tokens"])
            assert inp == plain + read + write
            expected = (plain * 2.0 + read * 0.2 + write * 2.5 + out * 10.0) / 1e6
            assert cost == pytest.approx(expected, abs=1e-12)
    finally:
        fp.stop()


@pytest.mark.parametrize("mode", ["state", "window"])
@pytest.mark.parametrize("route", ["chat", "responses"])
def test_a_translated_client_on_an_anthropic_upstream_gets_the_breakpoint(
    start_proxy: StartProxy, route: str, mode: str
) -> None:
    """A chat-completions or Responses client (the openai SDK) on an Anthropic upstream:
    its contract and state are one message, one text block once translated. The proxy
    marks where the stable prefix ends there too (state: the task's block before it, as
    the state changes every turn; window: that block, as the state changes only at
    checkpoints), so the second turn reads what the first wrote. Before, the breakpoint was
    looked for in the client's own format only: none was set, and nothing was ever read."""
    fp = FakeProvider(cache="anthropic").start()
    try:
        p = start(start_proxy, fp, "--mode", mode)
        sdk = oai(p, "sk-client")
        headers = {SESSION_HEADER: f"translated-{route}-{mode}"}
        kind = {"type": "message"} if route == "responses" else {}
        system = "developer" if route == "responses" else "system"
        transcript: list[Any] = [
            {**kind, "role": system, "content": BIG_SYSTEM},
            {**kind, "role": "user", "content": "TASK: ship it."},
        ]
        for turn in (1, 2):
            fp.enqueue(Reply(text=envelope(turn)))
            if route == "chat":
                said = (
                    sdk.chat.completions.create(
                        model="claude-mine", messages=transcript, extra_headers=headers
                    )
                    .choices[0]
                    .message.content
                )
            else:
                said = sdk.responses.create(
                    model="claude-mine", input=transcript, extra_headers=headers
                ).output_text
            transcript += [
                {**kind, "role": "assistant", "content": said},
                {**kind, "role": "user", "content": f"Observation {turn}."},
            ]
        marked = [breakpoints(req.json) for req in fp.requests]
        prefix_end = 0 if mode == "state" else 1  # the task's block, or the state's
        assert marked == [[f"messages[0][{prefix_end}]"]] * 2
        usages = [json.loads(req.response_body)["usage"] for req in fp.requests]
        assert usages[0]["cache_creation_input_tokens"] > 1_000  # the system text and more
        assert usages[1]["cache_read_input_tokens"] > 1_000  # (the fake caps turn 1's at its
        # prompt, which the prefix is nearly all of in the window form: not compared)
    finally:
        fp.stop()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("model", "one_hour_price"),
    [("claude-mine", 4.0), ("claude-hour", 5.0)],  # unset: twice the input price
)
def test_one_hour_cache_writes_are_billed_at_the_one_hour_write_price(
    start_proxy: StartProxy, tmp_path: Path, stream: bool, model: str, one_hour_price: float
) -> None:
    """The anthropic SDK marks its system prompt ``"ttl": "1h"`` (as Claude Code can); the
    proxy adds its own 5-minute breakpoint after the contract. Anthropic bills the one-hour
    writes at twice the input price (the five-minute ones at 1.25x) and says how many there
    were in ``usage.cache_creation``: the ledger row and /cost price them at the model's
    one-hour write price (a ``prices`` entry's ``cache_write_1h_per_mtok``, else twice its
    input price). Before, every write was priced at ``cache_write_per_mtok``."""
    fp = FakeProvider(cache="anthropic").start()
    try:
        config = {
            "schema": ["step"],
            "upstreams": [{"name": "a", "url": fp.url, "kind": "anthropic"}],
            "prices": {
                "claude-mine": PRICES,
                **({"claude-hour": {**PRICES, "cache_write_1h_per_mtok": one_hour_price}}
                   if model == "claude-hour" else {}),
            },
        }  # fmt: skip
        p = start_proxy(None, config=config)
        hour = {"type": "ephemeral", "ttl": "1h"}
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": 300,
            "system": [{"type": "text", "text": BIG_SYSTEM, "cache_control": hour}],
            "messages": [{"role": "user", "content": "TASK: ship it."}],
            "extra_headers": {SESSION_HEADER: "hour"},
        }
        fp.enqueue(Reply(text=envelope(1)))
        if stream:
            with ant(p).messages.stream(**body) as s:
                got = s.get_final_message()
        else:
            got = ant(p).messages.create(**body)
        split = got.usage.cache_creation
        assert split is not None and split.ephemeral_1h_input_tokens > 1_000  # BIG_SYSTEM
        assert split.ephemeral_5m_input_tokens > 0  # the contract, to the proxy's breakpoint
        u = got.usage
        assert u.cache_creation_input_tokens == (
            split.ephemeral_1h_input_tokens + split.ephemeral_5m_input_tokens
        )
        db = sqlite3.connect(tmp_path / "data" / "skillstate.db")
        ((write, cost),) = db.execute(
            "SELECT cache_write_tokens, cost_usd FROM ledger WHERE session = 'hour'"
        ).fetchall()
        db.close()
        assert write == u.cache_creation_input_tokens
        expected = (
            u.input_tokens * 2.0
            + split.ephemeral_5m_input_tokens * 2.5
            + split.ephemeral_1h_input_tokens * one_hour_price
            + u.output_tokens * 10.0
        ) / 1e6
        assert cost == pytest.approx(expected, abs=1e-12)
        r = p.get("/cost", params={"session": "hour"})
        assert r.status_code == 200, r.text
        assert r.json()["totals"]["cost_usd"] == pytest.approx(expected, abs=1e-9)
    finally:
        fp.stop()
