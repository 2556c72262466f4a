"""The ledger rows written off a turn's critical path, a group at a time.

A turn that holds no budget (a passthrough turn, a failed one) has rows no commit took; they
are written after its reply. One store write per turn was the largest item of a passthrough
request's CPU: a hand-off to the store's thread and back, and a transaction. Here those rows
wait up to ``LINGER`` seconds (or until ``MAX_ROWS`` are waiting) and go to the store in one
write. What reads the ledger sees them all the same: ``/cost``, shutdown and a budget's
spend read ``settle`` first (the waiting rows written, and every write already started; a
spend read no longer races the previous turns' writes). A turn holding
budget reservations does not wait here: its rows are written before its holds end
(``turn.commit.Committer.close_ledger``). A process killed outright loses the rows of its
last ``LINGER`` seconds (as it loses, at any time, the writes its store had not finished).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from ..store import Store, StoreError
from ..store.records import LedgerRow

LINGER = 0.05  # seconds: a sequential client's 1-2 ms turns make groups of tens of rows
MAX_ROWS = 512  # written at once, without waiting for LINGER


class LedgerWrites:
    """Rows handed over (``add``) are written in groups, best effort: a turn never fails on
    its ledger, and a group the store could not write is lost (as one turn's rows were)."""

    def __init__(self, store: Store, linger: float = LINGER, max_rows: int = MAX_ROWS) -> None:
        self.store = store
        self.linger = linger
        self.max_rows = max_rows
        self._rows: list[LedgerRow] = []
        self._timer: asyncio.TimerHandle | None = None
        self._writes: set[asyncio.Task[Any]] = set()

    def add(self, rows: list[LedgerRow]) -> None:
        """Write ``rows`` within ``linger`` seconds (with the others waiting then)."""
        if not rows:
            return
        self._rows += rows
        if len(self._rows) >= self.max_rows:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.linger, self.flush)

    def flush(self) -> None:
        """Hand the waiting rows to the store now (not waiting for the write)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        task = asyncio.ensure_future(self._write(rows))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def settle(self) -> None:
        """Wait until every row handed over so far is written (or its write failed)."""
        self.flush()
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

    async def _write(self, rows: list[LedgerRow]) -> None:
        with contextlib.suppress(StoreError):
            await self.store.add_ledger_rows(rows)
