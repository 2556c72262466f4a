"""Ledger rows written off the critical path, in groups (``skillstate.cost.ledgerwrites``),
against a real SQLite store."""

from __future__ import annotations

import asyncio
from pathlib import Path

from skillstate.cost.budgets import Budgets, session_budget
from skillstate.cost.ledgerwrites import LedgerWrites
from skillstate.cost.pricing import PriceBook
from skillstate.cost.worstcase import WorstCase
from skillstate.store import StoreError
from skillstate.store.records import LedgerRow
from skillstate.store.sqlite import SQLiteStore

# Long enough that nothing is written by the timer while a test looks, unless it waits.
LONG = 60.0


def row(session: str, ts: float = 1.0) -> LedgerRow:
    return LedgerRow(
        ts, session, "u", "m", "passthrough", 200, 10, 5, None, None, "known", 0.5, 10, 0.5,
        "passthrough",
    )  # fmt: skip


class CountingStore(SQLiteStore):
    """A real store that counts its ledger writes (and can be told to refuse them)."""

    writes: list[int]
    refuse = False

    async def add_ledger_rows(self, rows: list[LedgerRow]) -> None:
        self.writes.append(len(rows))
        if self.refuse:
            raise StoreError("refused")
        await super().add_ledger_rows(rows)


async def opened(tmp_path: Path) -> CountingStore:
    store = CountingStore(tmp_path / "skillstate.db")
    store.writes = []
    await store.open()
    return store


async def sessions(store: SQLiteStore) -> list[str]:
    return sorted(r.session for r in await store.ledger_rows(0.0, 1e12))


async def test_rows_handed_over_together_are_one_write_once_settled(tmp_path: Path) -> None:
    store = await opened(tmp_path)
    try:
        writes = LedgerWrites(store, linger=LONG)
        for s in ("a", "b", "c"):
            writes.add([row(s)])
        writes.add([])  # a turn whose commit took every row: nothing to wait for
        await asyncio.sleep(0.01)
        assert store.writes == [] and await sessions(store) == []  # still waiting
        await writes.settle()
        assert store.writes == [3] and await sessions(store) == ["a", "b", "c"]
        await writes.settle()  # nothing waiting: no write
        assert store.writes == [3]
    finally:
        await store.close()


async def test_the_linger_ends_with_a_write_without_anyone_asking(tmp_path: Path) -> None:
    store = await opened(tmp_path)
    try:
        writes = LedgerWrites(store, linger=0.01)
        writes.add([row("a"), row("b")])
        for _ in range(3000):  # a guard against a hang, not a timing threshold
            if await sessions(store) == ["a", "b"]:
                break
            await asyncio.sleep(0.01)
        assert await sessions(store) == ["a", "b"] and store.writes == [2]
    finally:
        await store.close()


async def test_max_rows_waiting_are_written_at_once(tmp_path: Path) -> None:
    store = await opened(tmp_path)
    try:
        writes = LedgerWrites(store, linger=LONG, max_rows=3)
        writes.add([row("a"), row("b")])
        writes.add([row("c"), row("d")])  # 4 >= 3: handed to the store now
        writes.add([row("e")])
        await asyncio.gather(*writes._writes)
        assert store.writes == [4] and await sessions(store) == ["a", "b", "c", "d"]
        await writes.settle()
        assert store.writes == [4, 1]
    finally:
        await store.close()


async def test_a_refused_group_is_lost_and_the_next_one_is_written(tmp_path: Path) -> None:
    store = await opened(tmp_path)
    try:
        writes = LedgerWrites(store, linger=LONG)
        store.refuse = True
        writes.add([row("lost")])
        await writes.settle()  # best effort: no exception reaches the turns
        store.refuse = False
        writes.add([row("kept")])
        await writes.settle()
        assert store.writes == [1, 1] and await sessions(store) == ["kept"]
    finally:
        await store.close()


async def test_a_budget_reads_its_spend_after_the_waiting_rows_are_written(tmp_path: Path) -> None:
    store = await opened(tmp_path)
    try:
        writes = LedgerWrites(store, linger=LONG)
        budgets = Budgets(store, WorstCase(PriceBook.from_config({}), 1000), ledger=writes)
        writes.add([row("k:s"), row("k:s")])
        assert await budgets.spent(session_budget("k:s", 5.0)) == 1.0
    finally:
        await store.close()
