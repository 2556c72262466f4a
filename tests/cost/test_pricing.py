from __future__ import annotations

import threading
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skillstate.cost import pricing
from skillstate.cost.ledger import Usage
from skillstate.cost.pricing import PriceBook, Priced, PriceOverride, Prices, cost_from_prices
from skillstate.dialects.anthropic import usage_from_anthropic
from skillstate.dialects.openai import usage_from_openai
from tests.helpers import listed_rates

# Our own numbers, so the arithmetic below is ours and not the price data's.
ACME = PriceOverride(
    input_per_mtok=2.0, output_per_mtok=10.0, cache_read_per_mtok=0.2, cache_write_per_mtok=2.5
)

# An Anthropic response's usage: input_tokens EXCLUDES the two cache counts.
ANTHROPIC_USAGE = {
    "input_tokens": 1_000,
    "cache_read_input_tokens": 40_000,
    "cache_creation_input_tokens": 5_000,
    "output_tokens": 800,
}


def test_worked_anthropic_example_with_override_prices() -> None:
    usage = usage_from_anthropic(ANTHROPIC_USAGE)
    assert usage == Usage(
        input_tokens=46_000, output_tokens=800, cache_read_tokens=40_000, cache_write_tokens=5_000
    )
    book = PriceBook(overrides_by_model={"acme-1": ACME})
    priced = book.price(usage, model="acme-1", upstream=None)
    # plain input   (46000 - 40000 - 5000) = 1000 * 2.00 =  2000
    # cache read                          40000 * 0.20 =  8000
    # cache write                          5000 * 2.50 = 12500
    # output                                800 * 10.0 =  8000
    #                                                    -----
    #                                                    30500 / 1e6 = $0.0305
    # (Counting cache tokens as input too would add 45000 * 2.00 = 90000 -> $0.1205.)
    assert priced.status == "override"
    assert priced.cost_usd == pytest.approx(0.0305, abs=1e-12)
    assert priced.prices == Prices(2.0, 10.0, 0.2, 2.5)


def _bundled_rates(model: str, provider: str) -> dict[str, Decimal]:
    from genai_prices.data import providers

    prov = next(p for p in providers if p.id == provider)
    info = prov.find_model(model)
    assert info is not None
    mp = info.prices
    assert not isinstance(mp, list)
    keys = ("input_mtok", "output_mtok", "cache_read_mtok", "cache_write_mtok")
    return {k: getattr(mp, k) for k in keys}


def test_real_model_claude_sonnet_4_against_bundled_data() -> None:
    rates = _bundled_rates("claude-sonnet-4", "anthropic")
    # Anthropic's published list prices, as bundled in genai-prices.
    assert rates == {
        "input_mtok": Decimal("3"),
        "output_mtok": Decimal("15"),
        "cache_read_mtok": Decimal("0.3"),
        "cache_write_mtok": Decimal("3.75"),
    }
    usage = usage_from_anthropic(ANTHROPIC_USAGE)
    priced = PriceBook().price(
        usage, model="claude-sonnet-4-20250514", upstream="anthropic", provider_hint="anthropic"
    )
    #  1000 * 3.00 =  3000
    # 40000 * 0.30 = 12000
    #  5000 * 3.75 = 18750
    #   800 * 15.0 = 12000
    #                -----
    #                45750 / 1e6 = $0.04575
    assert priced.status == "known"
    assert priced.cost_usd == pytest.approx(0.04575, abs=1e-12)
    assert priced.prices == Prices(3.0, 15.0, 0.3, 3.75, 6.0)
    assert priced.source == "genai-prices:anthropic/claude-sonnet-4-0"


def test_real_model_gpt_4o_openai_usage_cached_tokens_inside_prompt_tokens() -> None:
    rates = _bundled_rates("gpt-4o", "openai")
    assert rates["input_mtok"] == Decimal("2.5")
    assert rates["cache_read_mtok"] == Decimal("1.25")
    assert rates["output_mtok"] == Decimal("10")
    usage = usage_from_openai(
        {
            "prompt_tokens": 10_000,
            "completion_tokens": 500,
            "prompt_tokens_details": {"cached_tokens": 8_000},
        }
    )
    assert usage == Usage(10_000, 500, 8_000, 0)
    priced = PriceBook().price(usage, model="gpt-4o", upstream=None, provider_hint="openai")
    # (10000 - 8000) * 2.50 = 5000; 8000 * 1.25 = 10000; 500 * 10 = 5000 -> 20000 / 1e6
    assert priced.status == "known"
    assert priced.cost_usd == pytest.approx(0.02, abs=1e-12)
    # gpt-4o has no cache-write price: writes (none here) would be billed as plain input.
    assert priced.prices == Prices(2.5, 10.0, 1.25, 2.5)


def test_unknown_model_is_unknown_never_zero() -> None:
    book = PriceBook()
    u = Usage(1000, 100)
    for model in ("my-local-finetune-q4", None, ""):
        priced = book.price(u, model=model, upstream="local")
        assert priced.status == "unknown"
        assert priced.cost_usd is None


def test_usage_unavailable() -> None:
    book = PriceBook(overrides_by_model={"acme-1": ACME})
    assert book.price(None, model="claude-sonnet-4", upstream=None) == Priced(
        "usage-unavailable", None
    )
    assert book.price(None, model="acme-1", upstream=None).cost_usd is None
    # inconsistent counts (cache larger than the total input) are treated the same way
    bad = Usage(input_tokens=10, output_tokens=1, cache_read_tokens=20)
    assert book.price(bad, model="acme-1", upstream=None).status == "usage-unavailable"
    negative = Usage(input_tokens=-1, output_tokens=1)
    assert book.price(negative, model="acme-1", upstream=None).status == "usage-unavailable"


def test_local_zero_upstream_is_override_zero_even_for_a_known_model() -> None:
    book = PriceBook(overrides_by_upstream={"llama": PriceOverride(local_zero=True)})
    priced = book.price(Usage(5000, 500), model="gpt-4o", upstream="llama")
    assert priced.status == "override"
    assert priced.cost_usd == 0.0
    assert priced.prices == Prices(0.0, 0.0, 0.0, 0.0, 0.0)
    # another upstream still gets the bundled price
    assert book.price(Usage(5000, 500), model="gpt-4o", upstream="openai").status == "known"


def test_model_override_beats_upstream_override() -> None:
    book = PriceBook(
        overrides_by_upstream={"llama": PriceOverride(local_zero=True)},
        overrides_by_model={"acme-1": ACME},
    )
    priced = book.price(Usage(1_000_000, 0), model="ACME-1", upstream="llama")
    assert priced.status == "override"
    assert priced.cost_usd == pytest.approx(2.0)
    assert priced.source == "override:model=acme-1,upstream=llama"


def test_partial_overrides_layer_field_by_field() -> None:
    book = PriceBook(
        overrides_by_upstream={"gw": PriceOverride(output_per_mtok=20.0)},
        overrides_by_model={"claude-sonnet-4": PriceOverride(input_per_mtok=1.0)},
    )
    # input from the model override, output from the upstream override, cache from genai-prices
    priced = book.price(Usage(1_000_000, 1_000_000, 0, 0), model="claude-sonnet-4", upstream="gw")
    assert priced.status == "override"
    assert priced.prices == Prices(1.0, 20.0, 0.3, 3.75, 6.0)
    assert priced.cost_usd == pytest.approx(21.0)


def test_partial_override_of_unknown_model() -> None:
    only_input = PriceBook(overrides_by_model={"mystery": PriceOverride(input_per_mtok=1.0)})
    priced = only_input.price(Usage(100, 10), model="mystery", upstream=None)
    assert priced.status == "unknown"
    assert priced.cost_usd is None
    # input + output given, cache prices default to the input price
    io = PriceBook(
        overrides_by_model={"mystery": PriceOverride(input_per_mtok=1.0, output_per_mtok=3.0)}
    )
    priced = io.price(Usage(1_000_000, 0, 500_000, 0), model="mystery", upstream=None)
    assert priced.prices == Prices(1.0, 3.0, 1.0, 1.0)
    assert priced.cost_usd == pytest.approx(1.0)


def test_glob_model_override() -> None:
    book = PriceBook(overrides_by_model={"qwen*": PriceOverride(local_zero=True)})
    assert book.price(Usage(1, 1), model="Qwen2.5-7B-Instruct", upstream=None).cost_usd == 0.0
    assert book.price(Usage(1, 1), model="llama-9", upstream=None).status == "unknown"


def test_overrides_accept_config_objects_and_dicts() -> None:
    from skillstate.config import PriceOverride as ConfigOverride
    from skillstate.config import Upstream

    up = Upstream(name="local", url="http://127.0.0.1:8080", prices=ConfigOverride(local_zero=True))
    book = PriceBook.from_config({"acme-1": {"input_per_mtok": 2, "output_per_mtok": 10}}, [up])
    assert book.price(Usage(1, 1), model="gpt-4o", upstream="local").cost_usd == 0.0
    assert book.price(Usage(10**6, 0), model="acme-1", upstream=None).cost_usd == pytest.approx(2)
    with pytest.raises(ValueError, match="input_per_mtok"):
        PriceOverride.coerce({"input_per_mtok": -1})


def test_provider_hint_unknown_falls_back_to_model_match_and_url_hint_works() -> None:
    book = PriceBook()
    u = Usage(1_000_000, 0)
    assert book.price(u, model="gpt-4o", upstream=None, provider_hint="llama-server").cost_usd == (
        pytest.approx(2.5)
    )
    by_url = book.price(u, model="gpt-4o", upstream=None, provider_hint="https://api.openai.com/v1")
    assert by_url.source == "genai-prices:openai/gpt-4o"


def test_tiered_price_uses_the_tier_of_this_call() -> None:
    book = PriceBook()
    small = book.price(Usage(1000, 10), model="claude-sonnet-4-5", upstream=None)
    big = book.price(
        Usage(250_000, 1000, 100_000, 20_000), model="claude-sonnet-4-5", upstream=None
    )
    assert small.prices is not None and big.prices is not None
    assert big.prices.input_per_mtok > small.prices.input_per_mtok
    assert big.cost_usd == pytest.approx(
        cost_from_prices(Usage(250_000, 1000, 100_000, 20_000), big.prices)
    )


usages = st.integers(0, 400_000).flatmap(
    lambda total: st.tuples(
        st.just(total),
        st.integers(0, 5_000),
        st.integers(0, total),
    ).flatmap(
        lambda t: st.tuples(
            st.just(t[0]), st.just(t[1]), st.just(t[2]), st.integers(0, t[0] - t[2])
        )
    )
)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(
        ["claude-sonnet-4", "claude-sonnet-4-5", "claude-3-5-haiku", "gpt-4o", "gpt-4o-mini"]
    ),
    usages,
)
def test_effective_rates_reproduce_genai_prices_cost(
    model: str, u: tuple[int, int, int, int]
) -> None:
    """The flat rates we report (used for baselines) agree with genai-prices' own total."""
    usage = Usage(*u)
    priced = PriceBook().price(usage, model=model, upstream=None)
    assert priced.status == "known"
    assert priced.prices is not None and priced.cost_usd is not None
    assert priced.cost_usd == pytest.approx(
        cost_from_prices(usage, priced.prices), rel=1e-9, abs=1e-12
    )


def test_lookups_are_cached() -> None:
    pricing._lookup_one.cache_clear()
    book = PriceBook()
    for i in range(5):
        book.price(Usage(100 + i, 1), model="gpt-4o", upstream=None, provider_hint="openai")
    info = pricing._lookup_one.cache_info()
    assert info.misses == 1
    assert info.hits == 4


def test_offline_bundled_data_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing fetches remote prices, and a custom snapshot installed by genai-prices'
    updater (by anyone else in the process) is ignored in favour of the bundled data."""
    import httpx2
    from genai_prices import data_snapshot, update_prices

    def no_network(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("genai-prices tried to fetch prices over the network")

    monkeypatch.setattr(httpx2, "get", no_network)
    threads_before = {t.name for t in threading.enumerate()}
    empty = data_snapshot.DataSnapshot(providers=[], from_auto_update=True)
    data_snapshot.set_custom_snapshot(empty)
    try:
        pricing._lookup_one.cache_clear()
        priced = PriceBook().price(Usage(1_000_000, 0), model="gpt-4o", upstream=None)
    finally:
        data_snapshot.set_custom_snapshot(None)
    assert priced.status == "known"
    assert priced.cost_usd == pytest.approx(2.5)
    assert update_prices._shared_updater.thread is None
    assert "genai_prices:update" not in {t.name for t in threading.enumerate()} - threads_before
    assert pricing._snapshot().from_auto_update is False


@pytest.mark.parametrize(
    ("model", "hint", "expected"),
    [
        # list prices per million tokens: input, output, cache read, cache write (5m, 1h)
        ("gpt-4o", "openai", Prices(2.5, 10.0, 1.25, 2.5)),  # no write price: plain input
        ("claude-sonnet-4-5", "anthropic", Prices(3.0, 15.0, 0.3, 3.75, 6.0)),
    ],
)
def test_rates_carry_genai_prices_cache_read_and_write_prices(
    model: str, hint: str, expected: Prices
) -> None:
    assert PriceBook().rates(model=model, upstream=None, provider_hint=hint) == expected


def test_rates_honour_overrides_and_say_unknown() -> None:
    book = PriceBook(overrides_by_model={"claude-sonnet-4-5": {"cache_read_per_mtok": 0.1}})
    rates = book.rates(model="claude-sonnet-4-5", upstream=None, provider_hint="anthropic")
    assert rates == Prices(3.0, 15.0, 0.1, 3.75, 6.0)
    assert PriceBook().rates(model="no-such-model-xyz", upstream=None) is None
    local = PriceBook(overrides_by_upstream={"local": {"local_zero": True}})
    assert local.rates(model="anything", upstream="local") == Prices(0.0, 0.0, 0.0, 0.0, 0.0)


def test_context_window_is_genai_prices_bundled_one_and_none_when_unknown() -> None:
    from genai_prices.data import providers

    def bundled(provider_id: str, model_id: str) -> int | None:
        provider = next(p for p in providers if p.id == provider_id)
        return next(m.context_window for m in provider.models if m.id == model_id)

    book = PriceBook()
    # Anthropic publishes 200,000 tokens for Sonnet 4.5, OpenAI 128,000 for gpt-4o-mini.
    assert book.context_window("claude-sonnet-4-5", "anthropic") == 200_000
    assert bundled("anthropic", "claude-sonnet-4-5") == 200_000
    assert book.context_window("gpt-4o-mini", "https://api.openai.com/v1") == 128_000
    assert book.context_window("gpt-4o-mini") == bundled("openai", "gpt-4o-mini")
    assert book.context_window("my-local-llama") is None
    assert book.context_window(None) is None
    assert book.context_window("") is None


# The same call with 3,000 of its 5,000 cache writes written for one hour ("ttl": "1h").
ANTHROPIC_USAGE_1H = {
    **ANTHROPIC_USAGE,
    "cache_creation": {"ephemeral_5m_input_tokens": 2_000, "ephemeral_1h_input_tokens": 3_000},
}


def test_anthropic_one_hour_writes_are_read_from_the_usage_split() -> None:
    usage = usage_from_anthropic(ANTHROPIC_USAGE_1H)
    assert usage == Usage(46_000, 800, 40_000, 5_000, cache_write_1h_tokens=3_000)
    # No split (older API, a translated or OpenAI upstream): every write is a 5m write.
    assert usage_from_anthropic(ANTHROPIC_USAGE) == Usage(46_000, 800, 40_000, 5_000)
    # A malformed split is not a reason to lose the call's usage: the writes count as 5m.
    for bad in ("3000", {"ephemeral_1h_input_tokens": -1}, {"ephemeral_1h_input_tokens": "x"}):
        broken = usage_from_anthropic({**ANTHROPIC_USAGE, "cache_creation": bad})
        assert broken == Usage(46_000, 800, 40_000, 5_000)
    # More one-hour writes than writes: capped at the writes.
    over = {**ANTHROPIC_USAGE, "cache_creation": {"ephemeral_1h_input_tokens": 9_000}}
    assert usage_from_anthropic(over) == Usage(46_000, 800, 40_000, 5_000, 5_000)


@pytest.mark.parametrize(
    ("book", "model", "expected"),
    [
        # ACME declares no 1h price: twice its input price, 4.00.
        #  1000 * 2.00 + 40000 * 0.20 + 2000 * 2.50 + 3000 * 4.00 + 800 * 10.0 = 35000
        (PriceBook(overrides_by_model={"acme-1": ACME}), "acme-1", 0.035),
        # ... or the one it declares: 3000 * 5.00 instead.
        (
            PriceBook(
                overrides_by_model={
                    "acme-1": ACME.model_copy(update={"cache_write_1h_per_mtok": 5.0})
                }
            ),
            "acme-1",
            0.038,
        ),
        # genai-prices' claude-sonnet-4: 1h writes at its cache_write_1h_mtok, 6.00.
        #  1000 * 3.00 + 40000 * 0.30 + 2000 * 3.75 + 3000 * 6.00 + 800 * 15.0 = 52500
        (PriceBook(), "claude-sonnet-4-20250514", 0.0525),
    ],
)
def test_one_hour_cache_writes_are_priced_at_the_one_hour_write_price(
    book: PriceBook, model: str, expected: float
) -> None:
    usage = usage_from_anthropic(ANTHROPIC_USAGE_1H)
    priced = book.price(usage, model=model, upstream=None, provider_hint="anthropic")
    assert priced.cost_usd == pytest.approx(expected, abs=1e-12)
    assert priced.prices is not None
    assert cost_from_prices(usage, priced.prices) == pytest.approx(expected, abs=1e-12)


def test_a_tiered_anthropic_model_prices_one_hour_writes_at_the_tier() -> None:
    """claude-sonnet-4-5's prices rise past 200k input tokens (1h writes: 6 -> 12); above
    the tier genai-prices' own calculation prices the split too."""
    usage = Usage(300_000, 0, 0, 300_000, cache_write_1h_tokens=300_000)
    priced = PriceBook().price(
        usage, model="claude-sonnet-4-5", upstream=None, provider_hint="anthropic"
    )
    assert priced.cost_usd == pytest.approx(300_000 * 12.0 / 1e6, abs=1e-9)


def test_a_price_override_validates_the_one_hour_write_price() -> None:
    with pytest.raises(ValueError, match="cache_write_1h_per_mtok"):
        PriceOverride.coerce({"cache_write_1h_per_mtok": -1})


def _tiered_models(when: datetime) -> list[tuple[str, str, list[int]]]:
    """(provider, model, tier starts) of every model whose bundled prices have tiers."""
    found = []
    for provider in pricing._snapshot().providers:
        for info in provider.models:
            try:
                model_price = info.get_prices(when)
            except (LookupError, ValueError):
                continue
            starts = sorted(
                {
                    int(tier.start)
                    for key in ("input_mtok", "output_mtok", "cache_read_mtok", "cache_write_mtok")
                    for tier in getattr(getattr(model_price, key, None), "tiers", None) or ()
                }
            )
            if starts:
                found.append((provider.id, info.id, starts))
    return found


def test_the_cached_tiers_price_every_tiered_model_as_genai_prices_does() -> None:
    """The hot path keeps each hour's rates per span of input sizes between tier starts
    (pricing._HourPrices); genai-prices' own calculation, on either side of every start of
    every tiered model in the bundled data, is the definition."""
    from genai_prices import Usage as GenaiUsage

    when = datetime(2026, 12, 3, 8, 30, tzinfo=timezone.utc)
    tiered = _tiered_models(when)
    assert len(tiered) >= 10  # the data has them (claude-sonnet-4-5 at 200k, gemini at 128k)
    book = PriceBook()
    for provider_id, model, starts in tiered:
        provider, info = pricing._lookup(model, provider_id) or (None, None)
        if info is None or info.id != model:
            continue  # a name another provider's model answers first
        for total in sorted({0, 1, *(s + d for s in starts for d in (-1, 0, 1) if s + d >= 0)}):
            usage = Usage(total, 1_000, total // 2, total // 4)
            theirs = info.calc_price(
                GenaiUsage(
                    input_tokens=usage.input_tokens,
                    output_tokens=usage.output_tokens,
                    cache_read_tokens=usage.cache_read_tokens,
                    cache_write_tokens=usage.cache_write_tokens,
                ),
                provider,
                genai_request_timestamp=when,
            )
            ours = book.price(usage, model=model, upstream=None, provider_hint=provider_id, at=when)
            assert ours.cost_usd == pytest.approx(float(theirs.total_price), rel=1e-9, abs=1e-12), (
                model,
                total,
            )


def _variant(model: str, tier: str) -> dict[str, Decimal]:
    """genai-prices' bundled rates of ``model`` (OpenAI's) at a service tier."""
    from genai_prices.data import providers

    info = next(p for p in providers if p.id == "openai").find_model(model)
    assert info is not None
    variant = next(v for v in info.price_variants or () if v.when == {"service_tier": tier})
    keys = ("input_mtok", "output_mtok", "cache_read_mtok")
    return {k: getattr(variant.prices, k) for k in keys}


@pytest.mark.parametrize("tier", ["flex", "priority"])
def test_a_call_served_at_a_service_tier_is_priced_at_its_rates(tier: str) -> None:
    rates = _variant("gpt-5", tier)
    usage = usage_from_openai(
        {"prompt_tokens": 10_000, "completion_tokens": 500,
         "prompt_tokens_details": {"cached_tokens": 8_000}},
        tier,
    )  # fmt: skip
    assert usage == Usage(10_000, 500, 8_000, 0, service_tier=tier)
    priced = PriceBook().price(usage, model="gpt-5", upstream=None, provider_hint="openai")
    expected = (
        2_000 * rates["input_mtok"] + 8_000 * rates["cache_read_mtok"] + 500 * rates["output_mtok"]
    ) / 1_000_000
    assert priced.status == "known" and priced.cost_usd == pytest.approx(float(expected))
    standard = PriceBook().price(
        Usage(10_000, 500, 8_000, 0), model="gpt-5", upstream=None, provider_hint="openai"
    )
    assert standard.cost_usd is not None and priced.cost_usd is not None
    assert (priced.cost_usd < standard.cost_usd) == (tier == "flex")


@pytest.mark.parametrize("named", ["default", "auto", "scale", "", None, 3, ["priority"]])
def test_a_tier_without_rates_of_its_own_is_the_standard_rates(named: Any) -> None:
    usage = usage_from_openai({"prompt_tokens": 100, "completion_tokens": 5}, named)
    assert usage == Usage(100, 5, 0, 0) and usage.service_tier is None


def test_an_anthropic_fast_mode_call_is_priced_at_its_rates() -> None:
    """The rates of genai-prices' ``speed: fast`` variant (the standard ones where the
    installed list has none: an older genai-prices)."""
    inp, out = listed_rates("anthropic", "claude-opus-5-5", {"speed": "fast"})
    raw = {"input_tokens": 1_000, "output_tokens": 100, "cache_read_input_tokens": 0,
           "cache_creation_input_tokens": 0}  # fmt: skip
    usage = usage_from_anthropic({**raw, "speed": "fast"})
    assert usage is not None and usage.speed == "fast"
    assert usage_from_anthropic({**raw, "speed": "standard"}) == usage_from_anthropic(raw)
    priced = PriceBook().price(usage, model="claude-opus-5-5", upstream=None)
    assert priced.cost_usd == pytest.approx((1_000 * inp + 100 * out) / 1_000_000)
