"""Tests for skillstate.cost.baseline: the cache-aware, envelope-free baseline of a turn.

Expected costs are computed by hand in the comments, at list prices per million tokens:
gpt-4o input 2.50, cache read 1.25, output 10.00 (OpenAI bills no cache writes);
claude-sonnet-4-5 input 3.00, cache read 0.30, cache write 3.75, output 15.00.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from skillstate.cost.baseline import (
    MAX_WRITTEN,
    Baseline,
    CacheRegime,
    CacheSplit,
    PrefixCache,
    PrefixPoint,
    SessionPrefixCaches,
    baseline_output_tokens,
    baseline_turn,
    envelope_output_share,
    prefix_points,
    price_baseline,
    saving,
    tool_call_chars,
)
from skillstate.cost.ledger import Usage
from skillstate.cost.meter import BaselineSource
from skillstate.cost.pricing import Prices, cost_from_prices

GPT_4O = Prices(2.5, 10.0, 1.25, 2.5)
SONNET = Prices(3.0, 15.0, 0.3, 3.75)
OPENAI = CacheRegime("openai")
ANTHROPIC = CacheRegime("anthropic")


def points(*sizes: int, breakpoints: tuple[int, ...] = (), tag: str = "") -> list[PrefixPoint]:
    """Boundaries with these cumulative estimated sizes; digest i is shared by every
    request whose first i+1 pieces are the same (same ``tag`` for the first ones)."""
    return [
        PrefixPoint(f"{tag}{k}".encode().ljust(16, b"."), size, k in breakpoints)
        for k, size in enumerate(sizes)
    ]


# --- openai regime ---------------------------------------------------------------------------


def test_openai_reads_the_prefix_shared_with_the_previous_request() -> None:
    cache = PrefixCache()
    first = cache.charge(points(1000, 2000, 3000), 3000, now=0.0, regime=OPENAI)
    assert first == CacheSplit(3000, 0, 0)  # nothing cached yet
    second = cache.charge(points(1000, 2000, 3000, 4000), 4000, now=100.0, regime=OPENAI)
    assert second == CacheSplit(4000, 2944, 0)  # 3000 shared, served in steps of 128
    baseline = price_baseline(second, 200, GPT_4O)
    # plain input (4000 - 2944) * 2.50 = 2640; cache read 2944 * 1.25 = 3680;
    # output 200 * 10.00 = 2000; total 8320 / 1e6
    assert baseline == Baseline(4000, 2944, 0, 200, pytest.approx(0.00832))


def test_openai_reads_whole_steps_of_128_tokens_from_the_minimum_on() -> None:
    # OpenAI caches from 1,024 prompt tokens and reports the longest cached prefix in
    # increments of 128: a shared prefix of n tokens is read as n - n % 128.
    for shared, read in [(1023, 0), (1024, 1024), (1151, 1024), (1152, 1152), (1300, 1280)]:
        cache = PrefixCache()
        cache.charge(points(shared, 2000), 2000, now=0.0, regime=OPENAI)
        grown = [points(shared)[0], *points(2500, tag="new")]  # shares only the first piece
        split = cache.charge(grown, 2500, now=1.0, regime=OPENAI)
        assert split == CacheSplit(2500, read, 0), shared
    # the steps hold under a lowered minimum too (OpenAI's increments do not move with it)
    small = CacheRegime("openai", min_tokens=100)
    cache = PrefixCache()
    cache.charge(points(300, 400), 400, now=0.0, regime=small)
    grown = [points(300)[0], *points(500, tag="new")]
    assert cache.charge(grown, 500, 1.0, small).cache_read_tokens == 256
    # the anthropic regime reads exactly what was written: no steps
    cache = PrefixCache()
    cache.charge(points(1300, 2000, breakpoints=(0,)), 2000, now=0.0, regime=ANTHROPIC)
    split = cache.charge(points(1300, 2500, breakpoints=(0,)), 2500, 1.0, ANTHROPIC)
    assert split.cache_read_tokens == 1300


def test_a_re_asks_scaled_baseline_reads_whole_openai_steps() -> None:
    # A re-ask's answer reuses the turn's first split scaled to its own input; under openai
    # the scaled read is still one OpenAI could report (whole 128-token steps, none below
    # the minimum), while the anthropic regime scales reads and writes as they are.
    cache = PrefixCache()
    cache.charge(points(1300, 2000), 2000, now=0.0, regime=OPENAI)
    grown = [points(1300)[0], *points(2500, tag="new")]
    source = BaselineSource(cache, grown, untouched=False, now=1.0)
    assert source.split(2500, OPENAI) == CacheSplit(2500, 1280, 0)
    for re_ask, read in [(2600, 1280), (2750, 1408), (3000, 1536), (1900, 0), (2000, 1024)]:
        split = source.split(re_ask, OPENAI)
        # 1280 * re_ask / 2500, rounded down to a step: 1331 -> 1280, 1408, 1536; 972 -> 0
        assert split == CacheSplit(re_ask, read, 0), re_ask
    cache = PrefixCache()
    cache.charge(points(1300, 2000, breakpoints=(0,)), 2000, now=0.0, regime=ANTHROPIC)
    source = BaselineSource(cache, points(1300, 2500, breakpoints=(0,)), False, now=1.0)
    assert source.split(2500, ANTHROPIC).cache_read_tokens == 1300
    assert source.split(2750, ANTHROPIC).cache_read_tokens == 1430  # 1300 * 1.1, unrounded


def test_openai_cache_expires_after_the_ttl() -> None:
    cache = PrefixCache()
    cache.charge(points(1000, 2000), 2000, now=0.0, regime=OPENAI)
    assert (
        cache.charge(points(1000, 2000, 3000), 3000, now=301.0, regime=OPENAI).cache_read_tokens
        == 0
    )
    # ... measured from the previous request, which was just sent
    assert (
        cache.charge(points(1000, 2000, 3000, 4000), 4000, 400.0, OPENAI).cache_read_tokens == 2944
    )


def test_openai_prefix_below_the_minimum_is_not_cached() -> None:
    cache = PrefixCache()
    cache.charge(points(600, 1000), 1000, now=0.0, regime=OPENAI)
    assert cache.charge(points(600, 1000, 1500), 1500, 1.0, OPENAI).cache_read_tokens == 0
    small = CacheRegime("openai", min_tokens=512)
    cache = PrefixCache()
    cache.charge(points(600, 1000), 1000, now=0.0, regime=small)
    assert cache.charge(points(600, 1000, 1500), 1500, 1.0, small).cache_read_tokens == 896


def test_openai_a_changed_early_message_breaks_the_prefix() -> None:
    cache = PrefixCache()
    cache.charge(points(2000, 3000, 4000), 4000, now=0.0, regime=OPENAI)
    changed = [points(2000)[0], *points(3000, 4000, 5000, tag="x")]
    assert cache.charge(changed, 5000, 1.0, OPENAI).cache_read_tokens == 1920  # 2000, in 128s


def test_tokens_are_allocated_in_proportion_to_the_estimates() -> None:
    # the estimates say 3000 of 4000, the provider counted 2048 input: 3/4 of it is cached
    cache = PrefixCache()
    cache.charge(points(1500, 3000), 3000, now=0.0, regime=OPENAI)
    assert cache.charge(points(1500, 3000, 4000), 2048, 1.0, OPENAI) == CacheSplit(2048, 1536)


# --- anthropic regime ------------------------------------------------------------------------


def test_anthropic_reads_what_an_earlier_breakpoint_wrote_and_writes_the_new_part() -> None:
    cache = PrefixCache()
    # system (2000, breakpoint), m1, m2 (breakpoint): everything up to m2 is written
    first = cache.charge(points(2000, 2500, 3000, breakpoints=(0, 2)), 3000, 0.0, ANTHROPIC)
    assert first == CacheSplit(3000, 0, 3000)
    # cache write 3000 * 3.75 = 11250; output 100 * 15 = 1500 -> 12750 / 1e6
    assert price_baseline(first, 100, SONNET).cost_usd == pytest.approx(0.01275)
    # next turn: breakpoints at the system and the new last message
    split = cache.charge(
        points(2000, 2500, 3000, 3500, 4000, breakpoints=(0, 4)), 4000, 60.0, ANTHROPIC
    )
    assert split == CacheSplit(4000, 3000, 1000)
    # cache read 3000 * 0.30 = 900; cache write 1000 * 3.75 = 3750; output 200 * 15 = 3000
    assert price_baseline(split, 200, SONNET).cost_usd == pytest.approx(0.00765)


def test_the_baseline_writes_for_an_hour_in_the_share_the_call_did() -> None:
    """The client's markers set the writes' TTL, in its own request as in the one sent: the
    baseline's writes are one-hour writes (2 x 3.00 = 6.00) in the sent call's share."""
    split = CacheSplit(4000, 3000, 1000)
    sent = Usage(5000, 200, 3000, 2000, cache_write_1h_tokens=1500)  # 3/4 of its writes
    # read 3000 * 0.30 = 900; writes 250 * 3.75 + 750 * 6.00 = 5437.5; output 200 * 15 = 3000
    assert price_baseline(split, 200, SONNET, sent).cost_usd == pytest.approx(0.0093375)
    assert price_baseline(split, 200, SONNET).cost_usd == pytest.approx(0.00765)  # all 5m


def test_anthropic_without_breakpoints_pays_full_input() -> None:
    cache = PrefixCache()
    cache.charge(points(2000, 3000), 3000, 0.0, ANTHROPIC)
    split = cache.charge(points(2000, 3000, 4000), 4000, 1.0, ANTHROPIC)
    assert split == CacheSplit(4000, 0, 0)
    # 4000 * 3.00 = 12000 -> $0.012 (what the same prefix costs OpenAI-style is irrelevant)
    assert price_baseline(split, 0, SONNET).cost_usd == pytest.approx(0.012)


def test_anthropic_reads_only_what_was_written_not_what_was_sent() -> None:
    cache = PrefixCache()
    # the first request marks only the system; m1, m2 are sent but never written
    cache.charge(points(2000, 2500, 3000, breakpoints=(0,)), 3000, 0.0, ANTHROPIC)
    split = cache.charge(points(2000, 2500, 3000, 3500, breakpoints=(0, 3)), 3500, 1.0, ANTHROPIC)
    assert split == CacheSplit(3500, 2000, 1500)


def test_anthropic_reads_no_further_than_the_last_breakpoint() -> None:
    cache = PrefixCache()
    cache.charge(points(2000, 3000, breakpoints=(1,)), 3000, 0.0, ANTHROPIC)
    # written at 3000, but this request marks only the system: it reads nothing beyond it
    split = cache.charge(points(2000, 3000, 4000, breakpoints=(0,)), 4000, 1.0, ANTHROPIC)
    assert split == CacheSplit(4000, 0, 2000)


def test_anthropic_entries_expire_and_reads_refresh_them() -> None:
    cache = PrefixCache()
    cache.charge(points(2000, breakpoints=(0,)), 2000, 0.0, ANTHROPIC)
    assert (
        cache.charge(points(2000, breakpoints=(0,)), 2000, 250.0, ANTHROPIC).cache_read_tokens
        == 2000
    )
    # 500 s after the write, but 250 s after the read that refreshed it
    assert (
        cache.charge(points(2000, breakpoints=(0,)), 2000, 500.0, ANTHROPIC).cache_read_tokens
        == 2000
    )
    assert (
        cache.charge(points(2000, breakpoints=(0,)), 2000, 801.0, ANTHROPIC).cache_read_tokens == 0
    )


def test_anthropic_breakpoint_below_the_minimum_writes_nothing() -> None:
    cache = PrefixCache()
    assert cache.charge(points(500, 900, breakpoints=(1,)), 900, 0.0, ANTHROPIC) == CacheSplit(900)
    assert cache.charge(points(500, 900, breakpoints=(1,)), 900, 1.0, ANTHROPIC) == CacheSplit(900)


def test_anthropic_memory_is_bounded() -> None:
    cache = PrefixCache()
    for k in range(3 * MAX_WRITTEN):
        cache.charge(points(2000, breakpoints=(0,), tag=f"s{k}-"), 2000, float(k), ANTHROPIC)
    assert len(cache._written) == MAX_WRITTEN


def test_no_caching_regime() -> None:
    cache = PrefixCache()
    none = CacheRegime("none")
    cache.charge(points(2000, 3000), 3000, 0.0, none)
    assert cache.charge(points(2000, 3000, 4000), 4000, 1.0, none) == CacheSplit(4000)


def test_regime_is_checked() -> None:
    with pytest.raises(ValueError, match="cache pricing"):
        CacheRegime("gemini")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ttl"):
        CacheRegime("openai", ttl_s=-1)


# --- prefix hashing --------------------------------------------------------------------------


def _anthropic_body(marked: bool) -> dict[str, object]:
    mark = {"cache_control": {"type": "ephemeral"}} if marked else {}
    return {
        "model": "claude-sonnet-4-5",
        "tools": [{"name": "lookup", "input_schema": {"type": "object"}}],
        "system": [{"type": "text", "text": "You are an agent.", **mark}],
        "messages": [
            {"role": "user", "content": "Book a flight"},
            {"role": "assistant", "content": [{"type": "text", "text": "Which day?", **mark}]},
            {"role": "user", "content": "Monday"},
        ],
    }


def test_prefix_hashes_ignore_cache_control_markers() -> None:
    plain, marked = prefix_points(_anthropic_body(False)), prefix_points(_anthropic_body(True))
    assert [p.digest for p in plain] == [p.digest for p in marked]
    assert [p.est_tokens for p in plain] == [p.est_tokens for p in marked]
    assert [p.breakpoint for p in plain] == [False] * 5
    assert [p.breakpoint for p in marked] == [False, True, False, True, False]


def test_a_string_content_and_its_one_text_block_are_the_same_prefix() -> None:
    # How agents mark their last message: its string content becomes one text block carrying
    # cache_control; the next request sends that message as a plain string again. Same
    # tokens to the provider, so the same prefix: the next turn reads what this one wrote.
    text = "x" * 6000
    marked = {
        "system": [{"type": "text", "text": "s" * 400, "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}],
            }
        ],
    }
    later = {
        "system": "s" * 400,
        "messages": [
            {"role": "user", "content": text},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": "next", "cache_control": {}}]},
        ],
    }
    first, second = prefix_points(marked), prefix_points(later)
    assert [p.digest for p in first] == [p.digest for p in second[:2]]
    cache = PrefixCache()
    written = cache.charge(first, first[-1].est_tokens, 0.0, ANTHROPIC)
    assert written.cache_write_tokens == first[-1].est_tokens
    read = cache.charge(second, second[-1].est_tokens, 10.0, ANTHROPIC)
    assert read.cache_read_tokens == first[-1].est_tokens


def test_prefix_hashes_are_cumulative() -> None:
    body = _anthropic_body(False)
    longer = {**body, "messages": [*body["messages"], {"role": "assistant", "content": "Ok"}]}  # type: ignore[list-item]
    a, b = prefix_points(body), prefix_points(longer)
    assert [p.digest for p in b[:5]] == [p.digest for p in a]
    assert b[5].est_tokens > a[4].est_tokens
    changed = {**body, "system": "Another system prompt"}
    c = prefix_points(changed)
    assert c[0].digest == a[0].digest  # the tools are the same
    assert all(x.digest != y.digest for x, y in zip(a[1:], c[1:], strict=True))


def test_top_level_cache_control_is_a_breakpoint_at_the_end() -> None:
    body = {"cache_control": {"type": "ephemeral"}, "messages": [{"role": "user", "content": "hi"}]}
    assert [p.breakpoint for p in prefix_points(body)] == [True]


def test_openai_chat_body_and_no_mutation() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "sys"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
            },
        ]
    }
    before = repr(body)
    pts = prefix_points(body)
    assert repr(body) == before
    assert [p.breakpoint for p in pts] == [False, True]
    assert prefix_points({"messages": []}) == []


# --- output, cost and saving -----------------------------------------------------------------


OPENAI_TOOL_REPLY = {
    "choices": [
        {
            "message": {
                "role": "assistant",
                "content": "x" * 300,
                "tool_calls": [
                    {
                        "id": "c",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": "a" * 94},
                    }
                ],
            }
        }
    ]
}


def test_tool_call_chars_of_both_dialects() -> None:
    assert tool_call_chars("openai", OPENAI_TOOL_REPLY) == 100
    anthropic = {
        "content": [
            {"type": "text", "text": "hi"},
            {"type": "tool_use", "id": "t", "name": "lookup", "input": {"q": "paris"}},
        ]
    }
    assert tool_call_chars("anthropic", anthropic) == len("lookup") + len('{"q":"paris"}')
    assert tool_call_chars("openai", {"choices": []}) == 0
    assert tool_call_chars("openai", {"choices": [{"message": {"content": "x"}}]}) == 0


def test_envelope_share_counts_text_and_tool_calls() -> None:
    # reply of 300 characters, 100 of them the envelope, plus one tool call: "lookup" (6)
    # and arguments of 94 characters -> 100 / 400
    share = envelope_output_share("x" * 300, 100, tool_call_chars("openai", OPENAI_TOOL_REPLY))
    assert share == Fraction(1, 4)
    assert baseline_output_tokens(400, share) == 300
    assert envelope_output_share("", 0) == 0
    assert envelope_output_share("abc", 10) == 1


def test_negative_saving_is_reported_negative() -> None:
    # The proxy's turn (anthropic pricing): 2500 plain input (its compact prefix changed),
    # 400 output (the envelope doubled it): 2500 * 3 + 400 * 15 = 13500 -> $0.0135.
    actual = cost_from_prices(Usage(2500, 400), SONNET)
    assert actual == pytest.approx(0.0135)
    # The baseline: 4000 input of which 3000 read and 1000 written, 200 output:
    # 3000 * 0.30 + 1000 * 3.75 + 200 * 15 = 900 + 3750 + 3000 = 7650 -> $0.00765.
    baseline = price_baseline(CacheSplit(4000, 3000, 1000), 200, SONNET)
    saved, pct = saving(baseline.cost_usd, actual)
    assert saved == pytest.approx(-0.00585)
    assert pct == pytest.approx(-76.47)  # -0.00585 / 0.00765


def test_positive_saving_and_unknown_costs() -> None:
    assert saving(0.02, 0.005) == (pytest.approx(0.015), 75.0)
    assert saving(None, 0.01) == (None, None)
    assert saving(0.01, None) == (None, None)
    assert saving(0.0, 0.0) == (0.0, None)
    assert price_baseline(CacheSplit(10), 5, None).cost_usd is None


def test_end_to_end_openai_session_with_hand_computed_cost() -> None:
    """Two turns of a real chat body, priced like gpt-4o (min_tokens lowered so that a
    small body is cacheable)."""
    regime = CacheRegime("openai", min_tokens=10)
    cache = PrefixCache()
    turn1 = {
        "messages": [
            {"role": "user", "content": "s" * 400},
            {"role": "user", "content": "u" * 400},
        ]
    }
    p1 = prefix_points(turn1)
    cache.charge(p1, 1000, 0.0, regime)
    turn2 = {
        "messages": [
            *turn1["messages"],
            {"role": "user", "content": "a" * 400},
            {"role": "user", "content": "v" * 400},
        ]
    }
    p2 = prefix_points(turn2)
    assert [p.digest for p in p2[:2]] == [p.digest for p in p1]
    split = cache.charge(p2, 2000, 10.0, regime)
    # the four messages estimate the same (same size and keys): half the input is shared,
    # 1000 tokens, read in steps of 128: 896
    assert p2[1].est_tokens * 2 == p2[3].est_tokens
    assert split == CacheSplit(2000, 896, 0)
    # 1104 * 2.50 + 896 * 1.25 + 50 * 10.00 = 2760 + 1120 + 500 = 4380 -> $0.00438
    assert price_baseline(split, 50, GPT_4O).cost_usd == pytest.approx(0.00438)


def test_session_caches_are_per_session_and_bounded() -> None:
    caches = SessionPrefixCaches(max_sessions=2)
    a = caches.get("a")
    assert caches.get("a") is a
    caches.get("b")
    caches.get("a")  # a is now the most recently used
    caches.get("c")  # ... so b goes
    assert len(caches) == 2
    assert caches.get("a") is a
    with pytest.raises(ValueError):
        SessionPrefixCaches(0)


def test_baseline_turn_anthropic_session_with_a_negative_saving() -> None:
    """Two turns of an Anthropic client that marks its system and last message, priced
    like claude-sonnet-4-5, against a proxy turn that cost $0.0135."""
    regime = CacheRegime("anthropic", min_tokens=10)
    cache = PrefixCache()
    mark = {"cache_control": {"type": "ephemeral"}}

    def body(n: int) -> dict[str, object]:
        roles = ["user" if k % 2 == 0 else "assistant" for k in range(n)]
        messages = [  # every message the same size: "assistant" is 5 longer than "user"
            {
                "role": role,
                "content": [{"type": "text", "text": f"{k:03d}" + "m" * (401 - len(role))}],
            }
            for k, role in enumerate(roles)
        ]
        messages[-1] = {**messages[-1], "content": [{**messages[-1]["content"][0], **mark}]}  # type: ignore[dict-item]
        return {"messages": messages}

    first = baseline_turn(
        cache=cache, regime=regime, client_body=body(3), baseline_input=3000, output_tokens=100,
        envelope_share=Fraction(0), prices=SONNET, cost_usd=0.0135, now=0.0,
    )  # fmt: skip
    # all 3000 written: 3000 * 3.75 + 100 * 15 = 11250 + 1500 = 12750 -> $0.01275
    assert first.baseline == Baseline(3000, 0, 3000, 100, pytest.approx(0.01275))
    assert first.saved_cost_usd == pytest.approx(0.01275 - 0.0135)
    second = baseline_turn(
        cache=cache, regime=regime, client_body=body(5), baseline_input=5000, output_tokens=400,
        envelope_share=Fraction(1, 2), prices=SONNET, cost_usd=0.0135, now=30.0,
    )  # fmt: skip
    # the 5 messages estimate the same: 3/5 of 5000 = 3000 read, 2000 written; output 200:
    # 3000 * 0.30 + 2000 * 3.75 + 200 * 15 = 900 + 7500 + 3000 = 11400 -> $0.0114
    assert second.baseline == Baseline(5000, 3000, 2000, 200, pytest.approx(0.0114))
    assert second.saved_cost_usd == pytest.approx(-0.0021)
    assert second.saved_cost_pct == pytest.approx(-18.42)  # -0.0021 / 0.0114
