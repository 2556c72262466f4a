"""Pending ledger rows: each budgeted upstream call is in the ledger before it is sent, so a
budget holds across a proxy killed with calls out.

A budget's holds (``cost.budgets``) live in memory (or Redis) and end once the call's real
rows are written: a process killed with a call out (waiting for the answer, mid-stream, or
before its commit) lost both, and the call, which the upstream had and may bill, was counted
nowhere. So each reservation also writes a **pending** row (``pricing`` ``pending``,
``estimated_cost_usd`` the worst case it holds), in the same store call as the spend read
that precedes it (no extra round trip: SQLite runs both in one group-commit transaction,
PostgreSQL in one statement), durable before the call goes out. Once the call's real rows
are written, the pending row is gone: the call's first row takes the pending row's id
(``TurnBudgets.claim``), and the ledger's upsert on ``row_id`` writes it over the pending
row, in the same statement, so a reader of the ledger sees the call once, and a process
killed at any point leaves either the pending row or the real one, never both. A hold that
no attempt used (its call never went out) has its pending row deleted before the turn's
rows are written (``TurnBudgets.drop_unused``), so that a process killed after that write
leaves none of them to be charged as a call. Nothing of this runs for a turn under no
budget; a budgeted call costs a row inserted with the spend read, and a delete only for a
hold no row took.
A turn whose rows the store could not take at its end (store down) keeps its holds and its
pending rows until a later write of its rows replaces them (``cost.unsettled``).

A budget's spend counts every row but the pending rows of calls still in flight, which
their holds already count: this process's own (their ids start with ``PendingCalls.prefix``),
and, when the holds are shared in Redis (coordination), other processes' rows younger than
``HOLD_TTL`` (their holds are still there). Any other pending row is a call whose process
died: it counts at its worst case, the most the call could have cost. At start-up (and at
each purge) those rows are marked ``interrupted`` (``Store.settle_pending``): the SQLite
store is one process's (a data-dir lock), so all of its pending rows are; in a shared store,
those older than ``HOLD_TTL``. ``/cost`` lists interrupted rows with their estimate
(``estimated_cost_usd``) and leaves the pending ones of calls in flight out.
"""

from __future__ import annotations

import math
import os
import time

from ..coordination.link import HOLD_TTL
from ..store.records import PENDING, LedgerRow

__all__ = ["PendingCalls"]


class PendingCalls:
    """The pending rows of this process's calls, and which pending rows a spend counts."""

    def __init__(self, shared_holds: bool) -> None:
        self.prefix = f"pending-{os.urandom(8).hex()}-"  # this process's rows' ids
        # Whether other processes' calls in flight are held in Redis (coordination): their
        # pending rows then count only once their holds could have expired.
        self._shared_holds = shared_holds

    def row(
        self, session: str, model: str | None, mode: str, usd: float, *, stream: bool = False
    ) -> LedgerRow:
        """The pending row of a call about to be sent, holding ``usd``; of the kind the
        call's own row will be (``stream``: the turn streams), which a kill leaves it."""
        return LedgerRow(
            ts=time.time(),
            session=session,
            upstream=None,
            model=model or None,
            kind="stream" if stream else "generation",
            status=0,
            input_tokens=None,
            output_tokens=None,
            cache_read_tokens=None,
            cache_write_tokens=None,
            pricing=PENDING,
            cost_usd=None,
            baseline_input_tokens=None,
            baseline_cost_usd=None,
            mode=mode,
            row_id=self.prefix + os.urandom(8).hex(),
            estimated_cost_usd=usd,
        )

    def in_flight(self, now: float) -> tuple[str, float]:
        """Which pending rows a spend leaves out, as (a LIKE pattern of this process's row
        ids, the time from which another process's are still in flight)."""
        since = now - HOLD_TTL if self._shared_holds else now
        return self.prefix + "%", since

    def dead_before(self, now: float, exclusive: bool) -> float:
        """The time before which a pending row is a dead process's: any (``exclusive``: the
        store is this process's alone, as SQLite's is), else one older than any hold."""
        return math.inf if exclusive else now - HOLD_TTL
