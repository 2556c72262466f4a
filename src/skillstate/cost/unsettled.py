"""Budgeted calls whose ledger rows the store could not take when their turn ended.

A budgeted turn's rows replace its calls' pending rows when they are written, and its holds
end then (``cost.pending``, ``TurnBudgets.release``). With the store down at that moment
(locked, unreachable, full) the write failed and the rows were dropped, best effort, while
the holds ended all the same: the call was then counted nowhere by this process (its pending
row is its own, left out of a spend as a call in flight) until a restart charged it its
worst case. And a pending row of a hold no call used, whose delete failed, stayed to be
charged at the next start as a call that never went out.

Here such a turn's rows, the pending rows to delete and its holds wait, in this process, and
are written again: before each budget's spend is read (``Budgets.spent``: the reading turn
sees them), every ``RETRY`` seconds while any wait, and at shutdown. Their holds end once the
rows are written, so until then the budget counts each call at its worst case, as it did
while the call was out; once written, at its real cost, and once. A process that stops
before that leaves the pending rows, charged at their worst case at its next start
(``interrupted``), as a process killed with calls out does: never lost, never twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..store import Store, StoreError
from ..store.records import LedgerRow

log = logging.getLogger("skillstate")

RETRY = 1.0  # seconds between writes again while rows wait, doubled up to RETRY_MAX
RETRY_MAX = 30.0


@dataclass
class _Waiting:
    rows: list[LedgerRow]  # a turn's rows (those of its calls replace their pending rows)
    drop: list[str]  # the pending rows of its holds no call used
    releases: list[Callable[[], Awaitable[None]]]  # its holds, ended once all is written


class UnsettledCalls:
    """The turns whose ledger write failed at their end, written again until it succeeds."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._waiting: list[_Waiting] = []
        self._retry: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one writer at a time: each waiting turn written once

    def add(
        self,
        rows: list[LedgerRow],
        drop: list[str],
        releases: list[Callable[[], Awaitable[None]]],
    ) -> None:
        """Write ``rows`` and delete the pending rows ``drop`` later, then end ``releases``."""
        if not (rows or drop or releases):
            return
        self._waiting.append(_Waiting(rows, drop, releases))
        if self._retry is None or self._retry.done():
            self._retry = asyncio.ensure_future(self._retry_until_written())

    async def settle(self) -> None:
        """Write what waits, oldest first, as far as the store takes it."""
        if not self._waiting:
            return  # nearly always: one comparison on a budget's spend read
        async with self._lock:
            while self._waiting:
                first = self._waiting[0]
                try:
                    # The pending rows of holds no call used go first: a kill after the
                    # rows' write then leaves none of them to be charged as calls.
                    if first.drop:
                        await self.store.drop_ledger_rows(first.drop)
                        first.drop = []
                    if first.rows:
                        await self.store.add_ledger_rows(first.rows)
                        first.rows = []
                except StoreError:
                    return
                self._waiting.pop(0)
                for release in first.releases:
                    await asyncio.shield(release())

    async def close(self) -> None:
        """One last write (at shutdown); what still waits is settled at the next start."""
        if self._retry is not None:
            self._retry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retry
        await self.settle()
        if self._waiting:
            log.warning(
                "ledger: %d budgeted turn(s) not written (store down): their calls are charged"
                " their worst case at the next start",
                len(self._waiting),
            )

    async def _retry_until_written(self) -> None:
        delay = RETRY
        while self._waiting:
            await asyncio.sleep(delay)
            await self.settle()
            delay = min(delay * 2, RETRY_MAX)
