"""The checkpoint policy of the window form (skillstate.cost.checkpoint)."""

from __future__ import annotations

import dataclasses

from skillstate.cost.baseline import CacheRegime
from skillstate.cost.checkpoint import CONTEXT_SHARE, CheckpointPolicy, WindowSizes
from skillstate.cost.pricing import Prices

SONNET = Prices(3.0, 15.0, 0.3, 3.75)
ANTHROPIC = CacheRegime("anthropic", 300, 1024)
OPENAI = CacheRegime("openai", 300, 1024)
NONE = CacheRegime("none", 300, 1024)


def sizes(**kw: object) -> WindowSizes:
    base = WindowSizes(
        prefix=3000, state=300, window=6000, kept=1500, exchanges=8, growth=700.0,
        turns=10, instruction=80, window_caches=True,
    )  # fmt: skip
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def decide(s: WindowSizes, regime: CacheRegime = ANTHROPIC, **kw: object):  # type: ignore[no-untyped-def]
    policy = CheckpointPolicy(keep=3, max_tokens=32_000)
    return policy.decide(s, regime=regime, prices=SONNET, envelope_tokens=130, **kw)  # type: ignore[arg-type]


def test_never_with_no_more_than_keep_exchanges() -> None:
    d = decide(sizes(exchanges=3, window=40_000))
    assert not d.checkpoint and d.reason == "keep"


def test_always_past_window_max_tokens_or_the_context_limit() -> None:
    assert decide(sizes(window=31_500)).reason == "max_tokens"
    d = decide(sizes(window=5_000), context_limit=8_000)
    assert d.checkpoint and d.reason == "context_limit"


def test_the_context_limit_binds_at_its_safe_share_of_the_whole_request() -> None:
    # prefix 3,000 + state 300 + window + one turn's growth (700) against the share
    limit = 40_000
    room = int(limit * CONTEXT_SHARE) - 3_000 - 300 - 700
    assert 0 < room < 32_000 - 700  # below window_max_tokens: only the limit can bind
    below = decide(sizes(window=room - 1, kept=room - 1_000), context_limit=limit)
    assert below.reason != "context_limit"
    above = decide(sizes(window=room + 1, kept=room - 1_000), context_limit=limit)
    assert above.checkpoint and above.reason == "context_limit"
    # the same window with no known limit (or a large one) waits for the bill
    assert decide(sizes(window=room + 1, kept=room - 1_000)).reason != "context_limit"
    assert decide(sizes(window=room + 1, kept=room - 1_000), context_limit=10**6).reason != (
        "context_limit"
    )


def test_window_max_tokens_binds_below_a_large_context_limit() -> None:
    d = decide(sizes(window=31_500), context_limit=1_000_000)
    assert d.checkpoint and d.reason == "max_tokens"


def test_the_context_limit_binds_before_window_keep_while_an_exchange_can_leave() -> None:
    # three kept exchanges past the model's context: a checkpoint that keeps fewer of them
    # (the kept room, see engine.window.kept_start) rather than a request the model refuses
    d = decide(sizes(exchanges=3, window=9_000, kept=9_000), context_limit=8_000)
    assert d.checkpoint and d.reason == "context_limit"
    # one exchange: nothing could leave it, so no checkpoint either
    d = decide(sizes(exchanges=1, window=9_000, kept=9_000), context_limit=8_000)
    assert not d.checkpoint and d.reason == "keep"
    # below the limit, window_keep holds as before
    d = decide(sizes(exchanges=3, window=4_000, kept=4_000), context_limit=80_000)
    assert not d.checkpoint and d.reason == "keep"


def test_by_bill_a_large_window_pays_a_small_one_waits() -> None:
    small = decide(sizes(window=1_800, kept=1_500))
    assert not small.checkpoint and small.reason == "wait"
    large = decide(sizes(window=20_000, kept=1_500))
    assert large.checkpoint and large.reason == "bill"
    assert large.carry_usd is not None and large.checkpoint_usd is not None
    assert large.carry_usd > large.checkpoint_usd


def test_uncached_windows_checkpoint_sooner() -> None:
    s = sizes(window=4_000, kept=1_500)
    cached = decide(s)
    uncached = decide(dataclasses.replace(s, window_caches=False))
    assert uncached.checkpoint and not cached.checkpoint
    assert decide(s, NONE).checkpoint


def test_openai_and_anthropic_rewrite_costs_differ() -> None:
    s = sizes(window=9_000)
    a, o = decide(s), decide(s, OPENAI)
    assert a.checkpoint_usd is not None and o.checkpoint_usd is not None
    # anthropic rewrites state + kept at write (1.25x) less read; openai at input less read
    assert a.checkpoint_usd > o.checkpoint_usd
