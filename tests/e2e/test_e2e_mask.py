"""mode: mask (issue 14 §5, issue 23) end to end: the real proxy (in-process), the real openai
SDK and native /v1/messages, the fake provider. What the upstream receives is checked: every
tool call stays paired with its result, and old observations are masked only when the re-mask
rule (skillstate.cost.remask) says it pays under the upstream's cache regime, so between
re-masks each request is a byte-prefix of the next."""

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx

from skillstate.cost.baseline import CacheRegime
from skillstate.cost.pricing import PriceBook
from skillstate.cost.remask import RemaskRule
from skillstate.engine.mask import MASK_MARK, mask_transcript
from tests.conftest import StartProxy
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, oai

BIG = "line of build output\n" * 40  # an observation worth masking


def masked(message: dict[str, Any]) -> bool:
    return MASK_MARK in json.dumps(message)


def test_openai_mask_keeps_pairing_and_masks_in_blocks(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start_proxy(fake.url + "/v1", "--mode", "mask", config={"mask_keep": 2})
    c = oai(p, "k")
    transcript: list[dict[str, Any]] = [{"role": "user", "content": "TASK: build it."}]
    contexts = []
    sent: list[list[dict[str, Any]]] = []  # what the client sent, turn by turn
    for turn in range(1, 13):
        fake.enqueue(Reply(text="", tool_calls=[("run", {"n": turn})]))
        sent.append(list(transcript))
        raw = c.chat.completions.with_raw_response.create(
            model="m", messages=transcript, extra_headers={SESSION_HEADER: "mask-o"}
        )
        contexts.append(raw.headers["x-skillstate-context"])
        assert "x-skillstate-transition" not in raw.headers  # mask keeps no state
        call = raw.parse().choices[0].message.tool_calls[0]  # type: ignore[index]
        transcript += [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": f"{turn}: {BIG}"},
        ]
    assert contexts == ["mask"] * 12
    counts = []
    for req in fake.requests:
        msgs = req.json["messages"]
        calls = {c["id"] for m in msgs if m.get("tool_calls") for c in m["tool_calls"]}
        results = [m["tool_call_id"] for m in msgs if m["role"] == "tool"]
        assert sorted(results) == sorted(calls)  # every call keeps its result
        assert not masked(msgs[0])  # the task never is
        counts.append(sum(masked(m) for m in msgs))
    # The upstream is OpenAI-kind with the model unpriced: the rule weighs the saving at the
    # relative cache-read rate against resending what follows the first newly masked message.
    rule = RemaskRule(CacheRegime("openai"), None, client_breakpoints=False)
    expected = [
        sum(
            masked(m)
            for m in mask_transcript("openai", {"messages": s}, 2, pays=rule.pays)["messages"]
        )
        for s in sent
    ]
    assert counts == expected
    assert counts[-1] > 0 and counts == sorted(counts)  # it does mask, and never unmasks
    # Between re-masks a request is a byte-prefix of the next (cache-friendly).
    for k in range(len(counts) - 1):
        if counts[k] == counts[k + 1]:
            a, b = fake.requests[k].json["messages"], fake.requests[k + 1].json["messages"]
            assert b[: len(a)] == a


def test_anthropic_mask_per_request_header(fake: FakeProvider, start_proxy: StartProxy) -> None:
    p = start_proxy(config={"upstreams": [{"name": "a", "url": fake.url, "kind": "anthropic"}]})
    headers = {
        SESSION_HEADER: "mask-a",
        "x-skillstate-mode": "mask",
        "anthropic-version": "2023-06-01",
    }
    transcript: list[dict[str, Any]] = [{"role": "user", "content": "TASK: build it."}]
    for turn in range(1, 9):
        fake.enqueue(Reply(text="", tool_calls=[("run", {"n": turn})]))
        body = {"model": "claude-x", "max_tokens": 100, "messages": transcript}
        r = httpx.post(p.url + "/v1/messages", json=body, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        assert r.headers["x-skillstate-context"] == "mask"
        use = r.json()["content"][0]
        transcript += [
            {"role": "assistant", "content": [use]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": BIG}],
            },
        ]
    last = fake.requests[-1].json["messages"]
    uses = [b["id"] for m in last if m["role"] == "assistant" for b in m["content"]]
    results = [b["tool_use_id"] for m in last[1:] if m["role"] == "user" for b in m["content"]]
    assert results == uses
    # The client marks no cache_control breakpoint, so Anthropic caches none of its
    # transcript and a re-mask costs nothing: every observation but the last 3 (the default
    # keep) is masked at once, the task excepted: 8 observations, 5 masked, less the task.
    assert sum(masked(m) for m in last) == 4


def test_mask_keeps_a_cached_anthropic_transcript_until_a_re_mask_pays(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """A client that marks its newest message for the cache (as Claude Code does), priced as
    claude-sonnet-4-5: re-masking rewrites the transcript at 1.25x input, so the proxy masks
    only when the reads it saves over the coming turns pay for that, and every other
    request extends the previous one byte for byte."""
    p = start_proxy(config={"upstreams": [{"name": "a", "url": fake.url, "kind": "anthropic"}]})
    headers = {"x-skillstate-session": "mask-cached", "x-skillstate-mode": "mask"}
    transcript: list[dict[str, Any]] = [{"role": "user", "content": "TASK: build it."}]
    sent: list[list[dict[str, Any]]] = []
    for turn in range(1, 25):
        fake.enqueue(Reply(text="", tool_calls=[("run", {"n": turn})]))
        marked = [*transcript[:-1], breakpoint_on(transcript[-1])]
        sent.append(marked)
        body = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": marked}
        r = httpx.post(p.url + "/v1/messages", json=body, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        use = r.json()["content"][0]
        transcript += [
            {"role": "assistant", "content": [use]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": BIG}],
            },
        ]
    got = [req.json["messages"] for req in fake.requests[-len(sent) :]]
    counts = [sum(masked(m) for m in msgs) for msgs in got]
    prices = PriceBook().rates(model="claude-sonnet-4-5", upstream="a")
    assert prices is not None and prices.cache_write_per_mtok > prices.input_per_mtok
    rule = RemaskRule(CacheRegime("anthropic"), prices, client_breakpoints=True)
    expected = [
        sum(
            masked(m)
            for m in mask_transcript("anthropic", {"messages": s}, pays=rule.pays)["messages"]
        )
        for s in sent
    ]
    assert counts == expected
    eager = [
        sum(
            masked(m)
            for m in mask_transcript("anthropic", {"messages": s}, pays=lambda *a: True)["messages"]
        )
        for s in sent
    ]
    # Fewer re-masks than masking whenever it can (each one a rewrite of the cache) ...
    remasks = sum(1 for a, b in itertools.pairwise(counts) if b != a)
    assert remasks < sum(1 for a, b in itertools.pairwise(eager) if b != a)
    # The masked part ends on a breakpoint of the proxy's, beside the client's on its newest
    # message, so that the next re-mask finds everything before it in Anthropic's cache.
    for msgs, count in zip(got, counts, strict=True):
        marks = [k for k, m in enumerate(msgs) if "cache_control" in json.dumps(m)]
        assert marks == ([len(msgs) - 1] if count == 0 else [marks[0], len(msgs) - 1])
        if count:
            assert masked(msgs[marks[0] - 1]) and not masked(msgs[marks[0] + 1])
    # ... and between re-masks each request extends the previous one (cache_control aside).
    for k in range(len(got) - 1):
        if counts[k] == counts[k + 1]:
            assert unmarked(got[k + 1][: len(got[k]) - 1]) == unmarked(got[k][:-1])


def breakpoint_on(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` with a cache_control breakpoint on its last block."""
    content = message["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    blocks[-1] = {**blocks[-1], "cache_control": {"type": "ephemeral"}}
    return {**message, "content": blocks}


def unmarked(messages: list[dict[str, Any]]) -> str:
    return json.dumps(messages).replace(', "cache_control": {"type": "ephemeral"}', "")
