"""``auto``'s estimates of each form (skillstate.cost.auto)."""

from __future__ import annotations

import dataclasses

import pytest

from skillstate.choices import ContextShape
from skillstate.cost.auto import AutoEstimate, AutoPlanner, TurnSizes
from skillstate.cost.baseline import CacheRegime
from skillstate.cost.pricing import Prices

SONNET = Prices(3.0, 15.0, 0.3, 3.75)
OPENAI = CacheRegime("openai", 300, 1024)
ANTHROPIC = CacheRegime("anthropic", 300, 1024)
SIZES = TurnSizes(
    transcript=12_000, compact=3_500, state=0, contract=250,
    client_breakpoints=True, proxy_breakpoint=True,
)  # fmt: skip


def weighed(sizes: TurnSizes, regime: CacheRegime) -> AutoEstimate:
    """The estimate of the fifth turn of a session whose transcript grew 2,000 tokens a turn."""
    auto = AutoPlanner()
    for k in range(5):
        settled = auto.observe("s", 4_000 + 2_000 * k, has_state=False)
        assert settled is None  # in passthrough: every turn weighs
    return auto.decide("s", sizes, regime=regime, prices=SONNET)


@pytest.mark.parametrize("regime", [OPENAI, ANTHROPIC])
def test_the_switch_writes_the_clients_own_prefix_again_only_where_breakpoints_cache(
    regime: CacheRegime,
) -> None:
    # 2,000 more tokens of the client's own prefix (tools, system, task) in the window's head.
    # Under prefix caching (openai) passthrough's requests cached them: the switch reads
    # them. Under Anthropic's breakpoints nothing was written where the window's head ends,
    # so the switch writes them (at the write price, not the read one).
    small = weighed(SIZES, regime)
    large = weighed(dataclasses.replace(SIZES, compact=SIZES.compact + 2_000), regime)
    assert small.switch_usd is not None and large.switch_usd is not None
    extra = large.switch_usd - small.switch_usd
    expected = 0.0 if regime.pricing == "openai" else 2_000 * (3.75 - 0.3) / 1e6
    assert extra == pytest.approx(expected, abs=1e-12)


def test_a_switch_put_off_leaves_the_session_in_passthrough() -> None:
    auto = AutoPlanner()
    for k in range(12):
        auto.observe("s", 5_000 + 1_000 * k, has_state=False)
    sizes = dataclasses.replace(SIZES, transcript=16_000)
    switch = auto.decide("s", sizes, regime=OPENAI, prices=SONNET)
    assert switch.leaves_passthrough and switch.form == ContextShape.WINDOW
    assert auto.turns("s") == 12
    waited = auto.wait("s", switch)
    assert waited.form == ContextShape.PASSTHROUGH and not waited.leaves_passthrough
    assert waited.as_dict()["put_off"] is True and "put_off" not in switch.as_dict()
    assert waited.saving_usd == switch.saving_usd
    assert auto.form("s") == ContextShape.PASSTHROUGH
    assert auto.observe("s", 17_000, has_state=False) is None  # the next turn weighs again
    assert auto.turns("s") == 13 and auto.turns("other") == 0
