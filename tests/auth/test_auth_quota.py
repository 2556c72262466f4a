"""KeyQuotas in isolation: budget reservations held by turns in flight, the day boundary."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from skillstate.auth.gate import Principal
from skillstate.auth.quota import BUDGET_REMAINING, BudgetExceeded, KeyQuotas
from skillstate.auth.record import KeyRecord
from skillstate.config import PriceOverride
from skillstate.cost.pricing import PriceBook

DAY = 86400.0


class LedgerStub:
    """What KeyQuotas reads of the store: the USD spent by a key since a time."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float]] = []  # (session, ts, usd)

    async def ledger_spend(self, prefix: str, since: float) -> float:
        return sum(usd for s, ts, usd in self.rows if s.startswith(prefix) and ts >= since)


def caller(budget: float | None = None, rpm: int | None = None) -> Principal:
    record = KeyRecord("k", "d", rpm=rpm, budget_usd_per_day=budget)
    return Principal("k", False, record)


def quotas(store: LedgerStub, now: list[float]) -> KeyQuotas:
    # $0.01 per output token, input free: an estimate is max_tokens x $0.01.
    prices = PriceBook.from_config({"m": PriceOverride(input_per_mtok=0, output_per_mtok=10_000)})
    return KeyQuotas(store, prices, clock=lambda: now[0], monotonic=lambda: now[0])  # type: ignore[arg-type]


def body(max_tokens: int) -> dict[str, Any]:
    return {"model": "m", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "x"}]}


def test_a_turn_in_flight_holds_its_estimate_until_released() -> None:
    async def run() -> None:
        store, now = LedgerStub(), [100 * DAY + 10.0]
        q = quotas(store, now)
        first = await q.admit(caller(budget=1.0), body(60), "m")  # holds $0.60
        with pytest.raises(BudgetExceeded) as e:
            await q.admit(caller(budget=1.0), body(50), "m")  # 0.60 held + 0.50 > 1
        assert e.value.headers()[BUDGET_REMAINING] == "0.40000000"
        await first.release()
        await first.release()  # idempotent: the estimate is given back once
        store.rows.append(("k:s", now[0], 0.30))  # what the first turn really cost
        second = await q.admit(caller(budget=1.0), body(50), "m")  # 0.30 + 0.50 <= 1
        assert second.headers("0.2")["x-skillstate-budget-spent-usd"] == "0.50000000"
        await second.release()

    asyncio.run(run())


def test_the_budget_is_per_utc_day() -> None:
    async def run() -> None:
        store, now = LedgerStub(), [100 * DAY + 100.0]
        q = quotas(store, now)
        store.rows.append(("k:s", now[0] - 50.0, 0.90))
        with pytest.raises(BudgetExceeded) as e:
            await q.admit(caller(budget=1.0), body(20), "m")
        assert e.value.retry_after == DAY - 100.0  # until 00:00 UTC
        store.rows.append(("other:s", now[0], 5.0))  # another key's spend does not count
        now[0] = 101 * DAY  # midnight
        await (await q.admit(caller(budget=1.0), body(20), "m")).release()

    asyncio.run(run())
