"""Key quotas shared by replicas (auth.quota with coordination): budget holds and per-key
rate windows in a real redis-server, so N replicas never let through N budgets' worth."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from skillstate.auth.gate import Principal
from skillstate.auth.quota import BudgetExceeded, Grant, KeyQuotas
from skillstate.auth.record import KeyRecord
from skillstate.config import PriceOverride
from skillstate.coordination.link import CoordinationLink
from skillstate.cost.pricing import PriceBook
from skillstate.errors import ProxyError

DAY = 86400.0

# These tests are about atomicity, not outages: a burst opens dozens of connections at once
# on a loaded 2-core machine, where the link's 1 s connect timeout can pass.
SLOW_MACHINE = 10.0


class LedgerStub:
    def __init__(self) -> None:
        self.spent = 0.0

    async def ledger_spend(self, prefix: str, since: float) -> float:
        return self.spent


@pytest.fixture
async def links(redis_url: str) -> AsyncIterator[list[CoordinationLink]]:
    links = [CoordinationLink(redis_url, timeout=SLOW_MACHINE) for _ in range(3)]
    try:
        yield links
    finally:
        for link in links:
            await link.close()


def replicas(links: list[CoordinationLink], store: LedgerStub) -> list[KeyQuotas]:
    # $0.01 per output token, input free: an estimate is max_tokens x $0.01.
    prices = PriceBook.from_config({"m": PriceOverride(input_per_mtok=0, output_per_mtok=10_000)})
    return [KeyQuotas(store, prices, link=link) for link in links]  # type: ignore[arg-type]


def caller(budget: float | None = None, rpm: int | None = None) -> Principal:
    return Principal("k", False, KeyRecord("k", "d", rpm=rpm, budget_usd_per_day=budget))


def body(max_tokens: int) -> dict[str, Any]:
    return {"model": "m", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "x"}]}


async def outcome(q: KeyQuotas, who: Principal, max_tokens: int) -> Grant | ProxyError:
    try:
        return await q.admit(who, body(max_tokens), "m")
    except ProxyError as e:
        return e


async def test_holds_are_shared_so_replicas_admit_one_budget(
    links: list[CoordinationLink],
) -> None:
    store = LedgerStub()
    store.spent = 0.25
    quotas = replicas(links, store)
    who = caller(budget=1.0)
    # 30 turns at once, each estimated at $0.10, on three replicas: $0.75 is left.
    results = await asyncio.gather(*(outcome(quotas[i % 3], who, 10) for i in range(30)))
    grants = [r for r in results if isinstance(r, Grant)]
    refused = [r for r in results if isinstance(r, BudgetExceeded)]
    assert len(grants) == 7 and len(refused) == 23
    for g in grants:
        await g.release()
        await g.release()  # idempotent
    again = await asyncio.gather(*(outcome(quotas[i % 3], who, 10) for i in range(10)))
    assert sum(isinstance(r, Grant) for r in again) == 7  # every hold was given back


async def test_key_rpm_holds_across_replicas(links: list[CoordinationLink]) -> None:
    quotas = replicas(links, LedgerStub())
    who = caller(rpm=10)
    results = await asyncio.gather(*(outcome(quotas[i % 3], who, 10) for i in range(30)))
    refused = [r for r in results if isinstance(r, ProxyError)]
    assert len(refused) == 20
    assert all(r.code == "key_rate_limit" and r.retry_after for r in refused)


async def test_a_rate_refusal_gives_the_budget_hold_back(links: list[CoordinationLink]) -> None:
    quotas = replicas(links, LedgerStub())
    who = caller(budget=1.0, rpm=1)
    first = await outcome(quotas[0], who, 50)
    assert isinstance(first, Grant)
    second = await outcome(quotas[1], who, 10)
    assert isinstance(second, ProxyError) and second.code == "key_rate_limit"
    # Only the first turn's $0.50 is held: $0.50 more fits the budget (were the refused
    # turn's $0.10 still held, it would not).
    third = await outcome(quotas[2], caller(budget=1.0), 50)
    assert isinstance(third, Grant)
