"""Budgets in isolation (``skillstate.cost.budgets``, ``skillstate.cost.worstcase``): worst cases
held by calls in flight, the UTC day of a key's budget, session budgets and their cap."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from skillstate.auth.record import KeyRecord
from skillstate.config import PriceOverride
from skillstate.cost.budgets import (
    KEY_REMAINING,
    BudgetExceeded,
    Budgets,
    TurnBudgets,
    parse_budget,
)
from skillstate.cost.pricing import PriceBook
from skillstate.cost.tokens import request_tokens
from skillstate.cost.worstcase import INPUT_MARGIN, WorstCase, most_expensive_known
from skillstate.errors import ProxyError
from tests.helpers import listed_rates

DAY = 86400.0


class StoreStub:
    during_read: Any = None

    """What Budgets reads of the store: spend by session id (prefix or whole), budgets."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float]] = []  # (session, ts, usd)
        self.budgets: dict[str, float] = {}

    async def ledger_spend(
        self,
        prefix: str,
        since: float,
        *,
        whole: bool = False,
        unpriced: Any = None,
        pending: Any = None,
        in_flight: Any = None,
    ) -> float:
        # Budgets here have no pending rows (cost.pending): nothing to write or leave out.
        assert pending is None and in_flight is None

        def match(s: str) -> bool:
            return s == prefix if whole else s.startswith(prefix)

        return sum(usd for s, ts, usd in self.rows if match(s) and ts >= since)

    async def session_budget(self, session: str) -> float | None:
        return self.budgets.get(session)

    async def set_session_budget(self, session: str, usd: float, *, replace: bool) -> float:
        if replace or session not in self.budgets:
            self.budgets[session] = usd
        return self.budgets[session]


# $0.01 per output token, input free: a call's worst case is max_tokens x $0.01.
PRICES = PriceBook.from_config({"m": PriceOverride(input_per_mtok=0, output_per_mtok=10_000)})


def book(store: StoreStub, now: list[float]) -> Budgets:
    return Budgets(store, WorstCase(PRICES, 1000), clock=lambda: now[0])  # type: ignore[arg-type]


def key(budget: float | None = None, **kw: Any) -> KeyRecord:
    return KeyRecord("k", "d", budget_usd_per_day=budget, **kw)


async def reserve(turn: TurnBudgets, max_tokens: int, model: str = "m") -> None:
    await turn.reserve(model, 1, {"max_tokens": max_tokens}, [])


def test_a_call_in_flight_holds_its_worst_case_until_released() -> None:
    async def run() -> None:
        store, now = StoreStub(), [100 * DAY + 10.0]
        b = book(store, now)
        first = await b.for_turn("k", key(1.0), "k:s1", None)
        await reserve(first, 60)  # holds $0.60
        second = await b.for_turn("k", key(1.0), "k:s2", None)
        with pytest.raises(BudgetExceeded) as e:
            await reserve(second, 50)  # 0.60 held + 0.50 > 1
        assert e.value.headers()[KEY_REMAINING] == "0.40000000"
        assert e.value.code == "budget_exceeded"
        await first.release()
        await first.release()  # idempotent: the worst case is given back once
        store.rows.append(("k:s1", now[0], 0.30))  # what the first call really cost
        await reserve(second, 50)  # 0.30 + 0.50 <= 1
        assert second.headers(0.2)["x-skillstate-budget-spent-usd"] == "0.50000000"
        await second.release()

    asyncio.run(run())


def test_a_key_budget_is_per_utc_day() -> None:
    async def run() -> None:
        store, now = StoreStub(), [100 * DAY + 100.0]
        b = book(store, now)
        store.rows.append(("k:s", now[0] - 50.0, 0.90))
        with pytest.raises(BudgetExceeded) as e:
            await reserve(await b.for_turn("k", key(1.0), "k:s", None), 20)
        assert e.value.retry_after == DAY - 100.0  # until 00:00 UTC
        store.rows.append(("other:s", now[0], 5.0))  # another key's spend does not count
        now[0] = 101 * DAY  # midnight
        turn = await b.for_turn("k", key(1.0), "k:s", None)
        await reserve(turn, 20)
        await turn.release()

    asyncio.run(run())


def test_a_session_budget_is_set_once_capped_by_its_key_and_never_resets() -> None:
    async def run() -> None:
        store, now = StoreStub(), [100 * DAY]
        b = book(store, now)
        turn = await b.for_turn("k", key(), "k:run", "0.5")
        await reserve(turn, 30)
        await turn.release()
        store.rows.append(("k:run", now[0], 0.30))
        store.rows.append(("k:run2", now[0], 9.0))  # another session with the same prefix
        later = await b.for_turn("k", key(), "k:run", "7")  # set already: the header is moot
        with pytest.raises(BudgetExceeded) as e:
            await reserve(later, 30)  # 0.30 + 0.30 > 0.5
        assert e.value.code == "session_budget_exceeded" and e.value.retry_after is None
        assert "session 'run': budget $0.5 reached" in e.value.message
        now[0] += 10 * DAY  # a session's budget is for its whole life
        with pytest.raises(BudgetExceeded):
            await reserve(await b.for_turn("k", key(), "k:run", None), 30)
        # A key's cap: the budget of sessions that set none, and the most one may set.
        capped = await b.for_turn("k", key(max_session_budget_usd=0.2), "k:new", None)
        with pytest.raises(BudgetExceeded):
            await reserve(capped, 30)
        with pytest.raises(ProxyError, match="max_session_budget_usd"):
            await b.for_turn("k", key(max_session_budget_usd=0.2), "k:new", "0.3")
        for bad in ("0", "-1", "nan", "inf", "five", ""):
            with pytest.raises(ProxyError, match="positive number of USD"):
                await b.for_turn("k", key(), "k:new", bad)

    asyncio.run(run())


def test_a_new_session_is_not_read_and_still_gets_its_budget_and_its_keys_cap() -> None:
    class Unread(StoreStub):
        async def session_budget(self, session: str) -> float | None:
            raise AssertionError(f"{session}: a new session's budget was read")

    async def run() -> None:
        store, now = Unread(), [100 * DAY]
        b = book(store, now)
        assert (await b.for_turn("k", key(), "k:new", None, stored=False)).budgets == []
        asked = await b.for_turn("k", key(), "k:new", "0.5", stored=False)
        assert [x.limit for x in asked.budgets] == [0.5] and store.budgets == {"k:new": 0.5}
        capped = await b.for_turn("k", key(max_session_budget_usd=0.2), "k:n2", None, stored=False)
        assert [x.limit for x in capped.budgets] == [0.2]
        with pytest.raises(ProxyError, match="max_session_budget_usd"):
            await b.for_turn("k", key(max_session_budget_usd=0.2), "k:n3", "0.3", stored=False)

    asyncio.run(run())


def test_the_worst_case_counts_what_is_sent_at_the_dearest_rates() -> None:
    def upstream(name: str, output: float) -> Any:
        return type("U", (), {"name": name, "prices": PriceOverride(output_per_mtok=output)})()

    book_ = PriceBook.from_config(
        {"m": PriceOverride(input_per_mtok=2, cache_write_per_mtok=2.5)},
        [upstream("a", 8), upstream("b", 20)],
    )
    worst = WorstCase(book_, default_max_tokens=500)
    # A Responses body: its instructions and input items are what the upstream reads.
    body = {
        "model": "m",
        "instructions": "be brief",
        "input": [{"role": "user", "content": "x" * 400}],
    }
    tokens = request_tokens(body)
    assert tokens > 100
    rates = worst.rates("m", [("a", None), ("b", None)], 0)
    assert rates is not None
    assert (rates.input_per_mtok, rates.output_per_mtok) == (2.5, 20)  # cache write; upstream b
    expected = (tokens * INPUT_MARGIN * 2.5 + 500 * 20) / 1e6  # no max_output_tokens: 500
    assert worst.cost(rates, tokens, body) == pytest.approx(expected)
    assert worst.cost(rates, tokens, {**body, "max_output_tokens": 10}) < expected
    assert worst.rates("unknown-model-x", [("a", None)], 0) is None


@pytest.mark.parametrize(
    ("declared", "hour_rate"), [({}, 4.0), ({"cache_write_1h_per_mtok": 5}, 5.0)]
)
def test_a_body_marking_one_hour_cache_writes_is_held_at_the_one_hour_write_price(
    declared: dict[str, float], hour_rate: float
) -> None:
    """Anthropic bills a one-hour cache write at twice the input price (unset: 2 x 2.0), the
    dearest way to read a token then; a body without such a marker keeps the 5m write's."""
    book_ = PriceBook.from_config(
        {"m": PriceOverride(input_per_mtok=2, output_per_mtok=10, cache_write_per_mtok=2.5,
                            **declared)}
    )  # fmt: skip
    worst = WorstCase(book_, default_max_tokens=500)
    rates = worst.rates("m", [], 0)
    assert rates is not None
    hour = {"type": "ephemeral", "ttl": "1h"}
    block = {"type": "text", "text": "x" * 400}
    body = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": [block]}]}
    marked = {**body, "system": [{"type": "text", "text": "sys", "cache_control": hour}]}
    five_minutes = {**body, "cache_control": {"type": "ephemeral", "ttl": "5m"}}
    tokens = 1_000
    at = {rate: (tokens * INPUT_MARGIN * rate + 100 * 10) / 1e6 for rate in (2.5, hour_rate)}
    assert worst.cost(rates, tokens, body) == pytest.approx(at[2.5])
    assert worst.cost(rates, tokens, five_minutes) == pytest.approx(at[2.5])
    assert worst.cost(rates, tokens, marked) == pytest.approx(at[hour_rate])
    top_level = {**body, "cache_control": hour}  # automatic caching, for an hour
    assert worst.cost(rates, tokens, top_level) == pytest.approx(at[hour_rate])


def test_an_unpriced_model_under_a_budget_is_refused_unless_allowed() -> None:
    async def run() -> None:
        store, now = StoreStub(), [100 * DAY]
        b = book(store, now)
        strict = await b.for_turn("k", key(100.0), "k:s", None)
        with pytest.raises(ProxyError) as e:
            await reserve(strict, 10, model="unknown-model-x")
        assert e.value.status == 400 and e.value.code == "model_unpriced"
        assert "'unknown-model-x' has no known price" in e.value.message
        loose = await b.for_turn("k", key(100.0, allow_unpriced=True), "k:s", None)
        await reserve(loose, 10, model="unknown-model-x")
        await loose.release()
        unbudgeted = await b.for_turn("k", key(), "k:s", None)  # no budget: nothing to hold
        await reserve(unbudgeted, 10, model="unknown-model-x")

    asyncio.run(run())


def test_the_most_expensive_known_model_is_the_documented_one() -> None:
    name, prices = most_expensive_known("2026-12-01")
    assert name.endswith("o1-pro")
    assert (prices.input_per_mtok, prices.output_per_mtok) == (150.0, 600.0)


class RacingStore(StoreStub):
    """A store in whose ledger read another call ends (its row written, its hold gone):
    after the read took the spend (``seen=False``), or before (``seen=True``)."""

    def __init__(self, seen: bool) -> None:
        super().__init__()
        self.seen = seen

    async def ledger_spend(self, prefix: str, since: float, **kw: Any) -> float:
        ends, self.during_read = self.during_read, None
        if ends is not None and self.seen:
            await ends()
        spent = await super().ledger_spend(prefix, since, **kw)
        if ends is not None and not self.seen:
            await ends()
        return spent


async def first_call_ends_in_a_read(store: RacingStore, now: list[float]) -> Budgets:
    """A $0.60 call held under the key's $1 budget, set to end in the next ledger read."""
    b = book(store, now)
    first = await b.for_turn("k", key(1.0), "k:s1", None)
    await reserve(first, 60)  # $0.60 held

    async def first_ends() -> None:
        store.rows.append(("k:s1", now[0], 0.60))
        await first.release()

    store.during_read = first_ends
    return b


def test_a_call_that_ends_while_another_reads_the_ledger_is_still_counted() -> None:
    """The reservation read the ledger before the first call's row was written, and the
    first call's hold ended before the reservation's check: its cost is in neither, unless
    the holds released meanwhile count."""

    async def run() -> None:
        store, now = RacingStore(seen=False), [100 * DAY]
        b = await first_call_ends_in_a_read(store, now)
        second = await b.for_turn("k", key(1.0), "k:s2", None)
        with pytest.raises(BudgetExceeded):
            await reserve(second, 50)  # read $0 spent, but $0.60 ended meanwhile: 1.10 > 1
        await reserve(second, 40)  # read again: $0.60 spent + $0.40 fits

    asyncio.run(run())


def test_a_call_that_ends_during_a_read_that_sees_its_cost_is_counted_once() -> None:
    """The first call's row was written and its hold ended while the reservation read the
    ledger, and the read saw the row: counted as spent and as held, the call would be
    refused (the CI's flaky burst of twenty, 4 admitted of 5); the ledger is read again."""

    async def run() -> None:
        store, now = RacingStore(seen=True), [100 * DAY]
        b = await first_call_ends_in_a_read(store, now)
        second = await b.for_turn("k", key(1.0), "k:s2", None)
        await reserve(second, 40)  # $0.60 spent + $0.40 fits: the $0.60 counted once
        assert second.headers(0.0)["x-skillstate-budget-spent-usd"] == "0.60000000"
        third = await b.for_turn("k", key(1.0), "k:s3", None)
        with pytest.raises(BudgetExceeded):  # and nothing more fits
            await reserve(third, 1)

    asyncio.run(run())


def test_a_budget_header_is_a_plain_positive_decimal_number_of_usd() -> None:
    for text, usd in [
        ("5", 5.0),
        ("5.00", 5.0),
        (" 2.5 ", 2.5),
        (".5", 0.5),
        ("2.", 2.0),
        ("+2", 2.0),
        ("1e2", 100.0),
        ("1E-2", 0.01),
    ]:
        assert parse_budget(text, None) == usd, text
    # float() takes the first three; a money header does not (1_000 was $1,000)
    for text in [
        "1_000",
        "\uff11",
        "\u0661",
        "infinity",
        "nan",
        "1e999",
        "0",
        "-1",
        "0x10",
        "1,5",
        "",
        "5 USD",
        "$5",
    ]:
        with pytest.raises(ProxyError, match="must be a positive number of USD"):
            parse_budget(text, None)
    with pytest.raises(ProxyError, match="more than this key allows"):
        parse_budget("10", 5.0)


def test_a_request_for_the_priority_tier_is_held_at_its_rates() -> None:
    """OpenAI bills priority at about twice its standard rates (gpt-5, bundled genai-prices);
    a request that asks for it is held at them, one that asks for flex at flex's."""
    worst = WorstCase(PriceBook(), default_max_tokens=500)
    hint = [("o", "https://api.openai.com/v1")]
    standard = worst.rates("gpt-5", hint, 1000, {"service_tier": "auto"})
    priority = worst.rates("gpt-5", hint, 1000, {"service_tier": "priority"})
    flex = worst.rates("gpt-5", hint, 1000, {"service_tier": "flex"})
    assert standard is not None and priority is not None and flex is not None
    assert worst.rates("gpt-5", hint, 1000) == standard
    assert (priority.input_per_mtok, priority.output_per_mtok) == (2.5, 20.0)
    assert (standard.input_per_mtok, standard.output_per_mtok) == (1.25, 10.0)
    assert (flex.input_per_mtok, flex.output_per_mtok) == (0.625, 5.0)


def test_a_request_for_anthropic_fast_mode_is_held_at_its_rates() -> None:
    """At genai-prices' ``speed: fast`` rates (the standard ones where the installed list has
    no such variant: an older genai-prices)."""
    worst = WorstCase(PriceBook(), default_max_tokens=500)
    fast = worst.rates("claude-opus-5-5", [], 1000, {"speed": "fast"})
    standard = worst.rates("claude-opus-5-5", [], 1000, {"speed": "standard"})
    assert fast is not None and standard is not None
    fast_out = listed_rates("anthropic", "claude-opus-5-5", {"speed": "fast"})[1]
    standard_out = listed_rates("anthropic", "claude-opus-5-5", None)[1]
    assert (fast.output_per_mtok, standard.output_per_mtok) == (fast_out, standard_out)
