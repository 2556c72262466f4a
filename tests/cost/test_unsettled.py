"""Budgeted turns whose rows the store could not take, written again later
(``skillstate.cost.unsettled``), against a real SQLite store."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from skillstate.cost.pending import PendingCalls
from skillstate.cost.unsettled import UnsettledCalls
from skillstate.store.records import LedgerRow
from skillstate.store.sqlite import SQLiteStore


class Killed(BaseException):
    """The process dies here (nothing after it runs)."""


class DyingStore(SQLiteStore):
    """A real store whose process is killed right after its first ledger write: that
    write is done, and nothing is written after it."""

    dead = False

    async def add_ledger_rows(self, rows: list[LedgerRow]) -> None:
        self._alive()
        await super().add_ledger_rows(rows)
        self._die()

    async def drop_ledger_rows(self, row_ids: list[str]) -> None:
        self._alive()
        await super().drop_ledger_rows(row_ids)
        self._die()

    def _alive(self) -> None:
        if self.dead:
            raise Killed

    def _die(self) -> None:
        self.dead = True
        raise Killed


async def test_a_kill_between_the_writes_again_leaves_no_unused_holds_row(
    tmp_path: Path,
) -> None:
    """A turn's call (its pending row ``used``) and a hold no call used (``unused``) wait
    for the store; it is back, and the process is killed after the first of the two
    writes. The unused hold's pending row must be gone by then: the next start charges
    every pending row left as a call cut by a kill. Before, the call's row went first, and
    the unused hold's pending row stayed to be charged ($0.10 for a call never sent)."""
    db = tmp_path / "skillstate.db"
    store = DyingStore(db)
    await store.open()
    pending = PendingCalls(shared_holds=False)
    used, unused = (pending.row("s", "m", "passthrough", 0.10) for _ in range(2))
    await SQLiteStore.add_ledger_rows(store, [used, unused])
    real = dataclasses.replace(used, pricing="known", cost_usd=0.006, estimated_cost_usd=None)
    unsettled = UnsettledCalls(store)
    unsettled.add([real], [unused.row_id or ""], [])
    with pytest.raises(Killed):
        await unsettled.settle()
    with pytest.raises(Killed):
        await unsettled.close()  # its retry task ends; a dead process writes nothing more

    restarted = SQLiteStore(db)
    await restarted.open()
    try:
        await restarted.settle_pending(time.time() + 1)  # as the next start does
        left = {r.row_id for r in await restarted.ledger_rows(0.0, 1e12)}
        assert left == {used.row_id}  # the call's own row, pending or real: never the hold's
    finally:
        await restarted.close()
        await store.close()
