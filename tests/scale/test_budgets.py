"""Budget holds and key rate windows shared by replicas, in a real redis-server
(``skillstate.cost.budgets`` and ``coordination.budgets``; ``auth.quota``): N replicas never
let through N budgets' worth."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from skillstate.auth.gate import Principal
from skillstate.auth.quota import KeyQuotas
from skillstate.auth.record import KeyRecord
from skillstate.config import PriceOverride
from skillstate.coordination.link import CoordinationLink
from skillstate.cost.budgets import BudgetExceeded, Budgets, TurnBudgets
from skillstate.cost.pricing import PriceBook
from skillstate.cost.worstcase import WorstCase
from skillstate.errors import ProxyError

# These tests are about atomicity, not outages: a burst opens dozens of connections at once
# on a loaded 2-core machine, where the link's 1 s connect timeout can pass.
SLOW_MACHINE = 10.0


class StoreStub:
    def __init__(self) -> None:
        self.spent = 0.0

    async def ledger_spend(self, prefix: str, since: float, **kw: Any) -> float:
        return self.spent

    async def session_budget(self, session: str) -> float | None:
        return 0.35 if session == "k:capped" else None


@pytest.fixture
async def links(redis_url: str) -> AsyncIterator[list[CoordinationLink]]:
    links = [CoordinationLink(redis_url, timeout=SLOW_MACHINE) for _ in range(3)]
    try:
        yield links
    finally:
        for link in links:
            await link.close()


def replicas(links: list[CoordinationLink], store: StoreStub) -> list[Budgets]:
    # $0.01 per output token, input free: a worst case is max_tokens x $0.01.
    prices = PriceBook.from_config({"m": PriceOverride(input_per_mtok=0, output_per_mtok=10_000)})
    worst = WorstCase(prices, 1000)
    return [Budgets(store, worst, link) for link in links]  # type: ignore[arg-type]


RECORD = KeyRecord("k", "d", budget_usd_per_day=1.0)


async def outcome(b: Budgets, session: str, max_tokens: int) -> TurnBudgets | ProxyError:
    turn = await b.for_turn("k", RECORD, session, None)
    try:
        await turn.reserve("m", 1, {"max_tokens": max_tokens}, [])
        return turn
    except ProxyError as e:
        return e


async def test_holds_are_shared_so_replicas_admit_one_budget(
    links: list[CoordinationLink],
) -> None:
    store = StoreStub()
    store.spent = 0.25
    books = replicas(links, store)
    # 30 calls at once, each a worst case of $0.10, on three replicas: $0.75 is left.
    results = await asyncio.gather(*(outcome(books[i % 3], f"k:s{i}", 10) for i in range(30)))
    held = [r for r in results if isinstance(r, TurnBudgets)]
    refused = [r for r in results if isinstance(r, BudgetExceeded)]
    assert len(held) == 7 and len(refused) == 23
    for t in held:
        await t.release()
        await t.release()  # idempotent
    again = await asyncio.gather(*(outcome(books[i % 3], f"k:s{i}", 10) for i in range(10)))
    assert sum(isinstance(r, TurnBudgets) for r in again) == 7  # every hold was given back


async def test_a_call_refused_by_one_budget_holds_nothing_on_the_other(
    links: list[CoordinationLink],
) -> None:
    books = replicas(links, StoreStub())
    # The session's $0.35 refuses a $0.50 call that the key's $1 would take: the key's
    # hold is given back, so two more $0.50 calls fit the key.
    refused = await outcome(books[0], "k:capped", 50)
    assert isinstance(refused, BudgetExceeded) and refused.code == "session_budget_exceeded"
    fits = [await outcome(books[i], f"k:free{i}", 50) for i in (1, 2)]
    assert all(isinstance(f, TurnBudgets) for f in fits)


async def test_a_hold_released_during_a_read_that_saw_its_cost_counts_once(
    links: list[CoordinationLink],
) -> None:
    """One replica's call ends (row written, hold released in Redis) while another replica
    reads the ledger, and the read sees its row: the released hold counted too would refuse
    a call that fits; the ledger is read again."""

    class RacingStore(StoreStub):
        during_read: Any = None

        async def ledger_spend(self, prefix: str, since: float, **kw: Any) -> float:
            if self.during_read is not None:
                ends, self.during_read = self.during_read, None
                await ends()
            return self.spent

    store = RacingStore()
    books = replicas(links, store)
    first = await outcome(books[0], "k:s1", 60)  # $0.60 held
    assert isinstance(first, TurnBudgets)

    async def first_ends() -> None:
        store.spent = 0.60
        await first.release()

    store.during_read = first_ends
    second = await outcome(books[1], "k:s2", 40)  # $0.60 spent + $0.40 fits
    assert isinstance(second, TurnBudgets)
    assert isinstance(await outcome(books[2], "k:s3", 1), BudgetExceeded)


async def test_key_rpm_holds_across_replicas(links: list[CoordinationLink]) -> None:
    quotas = [KeyQuotas(link=link) for link in links]
    who = Principal("k", False, KeyRecord("k", "d", rpm=10))
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}

    async def admit(q: KeyQuotas) -> ProxyError | None:
        try:
            await q.admit(who, body)
            return None
        except ProxyError as e:
            return e

    results = await asyncio.gather(*(admit(quotas[i % 3]) for i in range(30)))
    refused = [r for r in results if isinstance(r, ProxyError)]
    assert len(refused) == 20
    assert all(r.code == "key_rate_limit" and r.retry_after for r in refused)
