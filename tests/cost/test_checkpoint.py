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


def steady_interval(growth: float = 700.0) -> float:
    """T* of the module docstring for sizes(), under OPENAI at SONNET's prices: the steady
    checkpoint (envelope 130 at output, instruction 80 at input, the state and ``keep`` mean
    exchanges rewritten at input less read) against carrying at the read price."""
    steady = 130 * 15.0 + 80 * 3.0 + (300 + 3 * growth) * (3.0 - 0.3)
    return float((2 * steady / (0.3 * growth)) ** 0.5)


def timed(kept: tuple[int, ...], leaving: int):  # type: ignore[no-untyped-def]
    s = sizes(
        window=sum(kept) + leaving, kept=sum(kept), kept_exchanges=kept, exchanges=12, turns=30
    )
    return decide(s, OPENAI)


def test_with_exchanges_of_one_size_it_checkpoints_at_the_steady_interval() -> None:
    # leaving >= g T*: the rule without the kept exchanges' sizes
    edge = 700 * steady_interval()
    assert timed((700, 700, 700), int(edge) + 1).checkpoint
    assert not timed((700, 700, 700), int(edge) - 1).checkpoint
    # unmeasured kept exchanges are taken as equal
    s = sizes(window=2_100 + int(edge) + 1, kept=2_100, exchanges=12, turns=30)
    assert decide(s, OPENAI).checkpoint


def test_a_checkpoint_waits_while_a_large_kept_exchange_is_about_to_leave() -> None:
    # Past the steady interval either way, with the same kept total: a checkpoint now
    # rewrites the 1,500-token exchange (input less read: 2.7 a token), one a turn later
    # drops it instead, for one more turn of carrying what leaves (0.3 a token).
    leaving = int(700 * steady_interval()) + 240
    soon = timed((1_500, 300, 300), leaving)
    assert not soon.checkpoint and soon.reason == "wait"
    # the same exchange kept as the newest would be rewritten whenever the window
    # checkpoints within the next three turns: no later turn is cheaper
    late = timed((300, 300, 1_500), leaving)
    assert late.checkpoint and late.reason == "bill"
    assert soon.checkpoint_usd == late.checkpoint_usd  # the same checkpoint, timed apart
