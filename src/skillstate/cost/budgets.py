"""The budgets a turn is held to, and the reservations that make them hold under concurrency.

A turn may be under two budgets: its key's daily budget (``budget_usd_per_day``, UTC days)
and its session's budget (``x-skillstate-budget-usd``, for the session's whole life; a key's
``max_session_budget_usd`` caps it, and is the budget of its sessions that set none).

Before each upstream call of the turn (the first, each re-ask, and each retry or failover
after an attempt the upstream may have billed: ``turn.complete.HoldPerBilledAttempt``) its
worst case (``cost.worstcase``) is reserved against every budget: the budget's spend read
from the ledger, plus what the calls in flight hold, plus this call's worst case, must fit,
or the call is refused (429) before anything is sent. Check and hold are one step: in process, no
await between them; across replicas, one Redis script (``coordination.budgets``). The holds
end once the turn's ledger rows are written (in state mode, in the commit; otherwise before
the reply's last bytes go out; before a re-ask, the rows so far: ``Committer.write_ahead``):
from then on the ledger has the real cost. At every moment
a budget is charged the real cost of each call done, the worst case of each call in
flight, and the worst case of each call that ended without usage (its ledger row's
``estimated_cost_usd``: a client leaving before the usage spends as if it stayed), so the
only way past it is a call whose real cost was above its worst case (the
estimator's error, see ``cost.worstcase``). The holds live in memory (or Redis): each call
also has a pending ledger row at its worst case, written before it is sent, so that a
process killed with calls out leaves them charged (``cost.pending``).

Unpriced models: a call under any budget to a model without a price is refused (400) unless
the key has ``allow_unpriced``; then it is reserved, and its ledger rows (which record no
cost) are counted, at the most expensive known model's rates.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..auth.record import KeyRecord
from ..errors import ProxyError
from ..sessions.ids import NAMESPACE_SEP, split_session
from ..store import Store, StoreError
from ..store.records import LedgerRow
from .unsettled import UnsettledCalls
from .worstcase import Rates, WorstCase, unpriced_rates

if TYPE_CHECKING:
    from ..coordination.budgets import SharedHolds
    from ..coordination.link import CoordinationLink
    from .ledgerwrites import LedgerWrites
    from .pending import PendingCalls

audit_log = logging.getLogger("skillstate.audit")

DAY = 86400.0
BUDGET_HEADER = "x-skillstate-budget-usd"
KEY_REMAINING = "x-skillstate-budget-remaining"
KEY_SPENT = "x-skillstate-budget-spent-usd"
SESSION_REMAINING = "x-skillstate-session-budget-remaining"
SESSION_SPENT = "x-skillstate-session-spent-usd"


class BudgetExceeded(ProxyError):
    """A 429 that says how much of the budget is left."""

    def __init__(
        self, message: str, remaining: float, retry_after: float | None, budget: Budget
    ) -> None:
        super().__init__("rate_limit", message, code=budget.code, retry_after=retry_after)
        self.remaining = remaining
        self._header = budget.remaining_header

    def headers(self) -> dict[str, str]:
        return {**super().headers(), self._header: f"{self.remaining:.8f}"}


@dataclass(frozen=True, slots=True)
class Budget:
    """One spending limit: ``limit`` USD of the ledger rows of ``sessions`` since ``since``."""

    holder: str  # the key of its holds ("<key name>" or "session:<store id>")
    limit: float
    since: float
    sessions: str  # a session id prefix (a key's namespace), or one session id (``whole``)
    whole: bool
    label: str  # what the refusal calls it
    code: str
    spent_header: str
    remaining_header: str
    resets: float | None  # when it resets (unix time), None: never

    def refusal(self, spent: float, held: float, call: float, now: float) -> BudgetExceeded:
        remaining = max(self.limit - spent - held, 0.0)
        if call > self.limit:
            why = f"this call alone (worst case ${call:.6f}) is more than the whole budget"
        else:
            why = (
                f"spent ${spent:.6f}, ${held:.6f} held by calls in flight, this call's worst"
                f" case is ${call:.6f}"
            )
        after = None if self.resets is None else max(self.resets - now, 0.0)
        hint = (
            "it resets at 00:00 UTC"
            if self.resets is not None
            else f"raise it with PATCH /state and {BUDGET_HEADER}"
        )
        return BudgetExceeded(
            f"{self.label} ${self.limit:g} reached ({why}); {hint}", remaining, after, self
        )


def key_budget(name: str, limit: float, now: float) -> Budget:
    since = now - now % DAY  # this UTC day
    return Budget(
        name,
        limit,
        since,
        name + NAMESPACE_SEP,
        False,
        f"key {name!r}: daily budget",
        "budget_exceeded",
        KEY_SPENT,
        KEY_REMAINING,
        since + DAY,
    )


def session_budget(session: str, limit: float) -> Budget:
    shown = split_session(session)[1]
    return Budget(
        "session:" + session,
        limit,
        0.0,
        session,
        True,
        f"session {shown!r}: budget",
        "session_budget_exceeded",
        SESSION_SPENT,
        SESSION_REMAINING,
        None,
    )


def audit_session_budget(session: str, usd: float | None, by: str) -> None:
    """The audit line of a session budget set or removed (``PATCH /state``, or the first
    turn that sends ``x-skillstate-budget-usd``). A budget is not a transition of the
    session (it moves no step, and a session with no state has one too): the audit log is
    its history, as for client keys."""
    shown = split_session(session)[1]
    if usd is None:
        audit_log.info("audit: session budget removed session=%s by=%s", shown, by)
    else:
        audit_log.info("audit: session budget set session=%s usd=%g by=%s", shown, usd, by)


# A decimal number of USD: ``5``, ``5.00``, ``.5``, ``1e2``. Python's float() also takes
# ``1_000``, non-ASCII digits and ``infinity``, which a money header should not.
_USD = re.compile(r"\+?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def usd_amount(text: str) -> float | None:
    """``text`` (blanks around it aside) as a positive, finite decimal number of USD; None
    when it is not one. The one grammar of a USD amount a person types: the budget header
    and the ``keys`` command's budgets."""
    text = text.strip()
    usd = float(text) if _USD.fullmatch(text) else math.nan
    return usd if math.isfinite(usd) and usd > 0 else None


def parse_budget(value: str, cap: float | None, name: str = BUDGET_HEADER) -> float:
    """A budget header's USD (``5.00``), or a 400 that says what is wrong with it."""
    usd = usd_amount(value)
    if usd is None:
        raise ProxyError(
            "invalid_request",
            f"{name} must be a positive number of USD, like 5.00 (got {value[:40]!r})",
            param=name,
        )
    if cap is not None and usd > cap:
        raise ProxyError(
            "invalid_request",
            f"{name} ${usd:g} is more than this key allows a session (max_session_budget_usd"
            f" ${cap:g})",
            param=name,
        )
    return usd


class LocalHolds:
    """The worst cases of the calls in flight, per budget holder, in this process; and the
    holds released lately (see ``mark``)."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._reserved: dict[str, float] = {}
        self._released: dict[str, list[tuple[int, float, float]]] = {}  # (seq, USD, when)
        self._seq = 0
        self._monotonic = monotonic

    def mark(self) -> int:
        """Taken before a reservation reads the ledger: the holds released after it count
        as held (their cost may have reached the ledger after the read)."""
        return self._seq

    def hold(
        self, key: str, amount: float, spent: float, limit: float, since: int
    ) -> tuple[float, float] | None:
        """None (held) if ``spent`` + held + ``amount`` fits ``limit``; else what is held
        by the other calls (those released since ``since`` included), and of that what
        was released since ``since``."""
        released = self._released_since(key, since)
        held = self._reserved.get(key, 0.0) + released
        if spent + held + amount > limit:
            return held, released
        self._reserved[key] = self._reserved.get(key, 0.0) + amount
        return None

    async def release(self, key: str, amount: float) -> None:
        left = self._reserved.get(key, 0.0) - amount
        if left <= 1e-12:
            self._reserved.pop(key, None)
        else:
            self._reserved[key] = left
        self._seq += 1
        self._released.setdefault(key, []).append((self._seq, amount, self._monotonic()))

    def _released_since(self, key: str, since: int) -> float:
        recent = [r for r in self._released.get(key, ()) if r[2] > self._monotonic() - RECENT]
        if recent:
            self._released[key] = recent
        else:
            self._released.pop(key, None)
        return sum(usd for seq, usd, _ in recent if seq > since)


Release = Callable[[], Awaitable[None]]
RECENT = 120.0  # seconds a released hold is remembered: far past a ledger read's bound
READS = 4  # ledger reads of one reservation, at most (``TurnBudgets._hold``)


class BudgetHolds:
    """Holds in Redis when coordination is configured (shared by every replica), else, and
    while Redis is down under ``coordination_down: local``, in this process."""

    def __init__(self, link: CoordinationLink | None = None) -> None:
        self.local = LocalHolds()
        self._shared: SharedHolds | None = None
        if link is not None and link.configured:
            from ..coordination.budgets import SharedHolds

            self._shared = SharedHolds(link)

    async def mark(self) -> tuple[int | None, int]:
        """Taken before a reservation reads the ledger (see ``LocalHolds.mark``): Redis's
        time (None while it is down), and this process's."""
        shared = await self._shared.mark() if self._shared is not None else None
        return shared, self.local.mark()

    async def hold(
        self, budget: Budget, amount: float, spent: float, since: tuple[int | None, int]
    ) -> tuple[Release | None, float, float]:
        """(its release, held by others, of which released since ``since``) when
        ``amount`` fits, else (None, held by others, of which released since ``since``)."""
        key = budget.holder
        if self._shared is not None and since[0] is not None:
            answer = await self._shared.hold(key, amount, spent, budget.limit, since[0])
            if answer is not None:  # None: Redis is down, hold in process
                hold, held, released = answer
                if hold is None:
                    return None, held, released
                return functools.partial(self._shared.release, key, hold), held, released
        refused = self.local.hold(key, amount, spent, budget.limit, since[1])
        if refused is not None:
            return None, *refused
        return functools.partial(self.local.release, key, amount), 0.0, 0.0


@dataclass
class TurnBudgets:
    """The budgets of one turn, its holds, and what each budget had spent before it."""

    budgets: list[Budget]
    book: Budgets
    allow_unpriced: bool
    keyed: bool = False  # the turn's caller has a client key (which allow_unpriced is of)
    session: str = ""  # the turn's session (store id), mode and streaming: its pending rows'
    mode: str = ""
    stream: bool = False
    _spent: dict[str, float] = field(default_factory=dict)
    _releases: list[Release] = field(default_factory=list, repr=False)
    _pending: list[str] = field(default_factory=list, repr=False)  # its pending rows' ids
    _claimed: int = 0  # of which the first are taken by the turn's rows (``claim``)

    async def reserve(
        self,
        model: str,
        input_tokens: int,
        body: Mapping[str, Any],
        upstreams: Iterable[tuple[str, str | None]],
        *,
        unlimited: bool = False,
    ) -> float | None:
        """Hold one call's worst case against every budget of the turn, or raise (429 over
        a budget, 400 for a model without a price); nothing is held when it raises. The
        worst case held (None: the turn is under no budget): what the call is charged if it
        ends without usage (``TurnMeter.sending``). ``unlimited``: the call goes with no
        output limit (``WorstCase.cost``)."""
        if not self.budgets:
            return None
        upstreams = list(upstreams)
        rates = self.book.worst.rates(model, upstreams, input_tokens, body)
        if rates is None:
            rates = self._unpriced(model)
        names = [name for name, _ in upstreams]
        call = self.book.worst.cost(rates, input_tokens, body, names, unlimited=unlimited)
        held: list[Release] = []
        spent_before: dict[str, float] = {}
        pending = self.book.pending_row(self.session, model, self.mode, call, self.stream)
        written = pending  # written with the first spend read
        # The turns the store could not take before, written first: their holds end, and
        # the spend read below counts their calls once, at their real cost.
        await self.book.unsettled.settle()
        try:
            for budget in self.budgets:
                release, spent = await self._hold(budget, call, written)
                written = None
                spent_before[budget.holder] = spent
                held.append(release)
        except BaseException:
            for release in held:
                await asyncio.shield(release())
            if pending is not None and pending.row_id is not None:  # the call is not sent
                await asyncio.shield(self.book.drop_pending([pending.row_id]))
            raise
        self._releases += held
        if pending is not None and pending.row_id is not None:
            self._pending.append(pending.row_id)
        for holder, spent in spent_before.items():  # a re-ask's: the turn's own first call
            self._spent.setdefault(holder, spent)
        return call

    async def _hold(
        self, budget: Budget, call: float, pending: LedgerRow | None
    ) -> tuple[Release, float]:
        """Hold ``call`` against ``budget`` (its release, and the budget's spend read), or
        raise its refusal. A hold released while the ledger was read counts as held, as its
        cost may or may not be in the read; when only such holds stand in the way, the
        ledger is read again (their costs are in it then) rather than the call refused:
        up to ``READS`` reads, for calls that end as fast as the ledger is read."""
        for read in range(READS):
            since = await self.book.holds.mark()  # before the ledger is read
            spent = await self.book.spent(budget, pending if read == 0 else None)
            release, others, released = await self.book.holds.hold(budget, call, spent, since)
            if release is not None:
                return release, spent
            if released <= 0 or spent + others - released + call > budget.limit:
                break  # refused without the holds released meanwhile too
        raise budget.refusal(spent, others, call, self.book.clock())

    def _unpriced(self, model: str) -> Rates:
        if self.allow_unpriced:
            return unpriced_rates()
        under = " and ".join(b.label.rsplit(":", 1)[0] for b in self.budgets)
        name = model or "(none)"
        # Without client keys there is no key to allow it: the price is the one way.
        key = " or give the key allow_unpriced" if self.keyed else ""
        raise ProxyError(
            "invalid_request",
            f"model {name!r} has no known price, and this call is under a budget ({under}):"
            f' add its price to the config, e.g. "prices": {{"{name}": {{"input_per_mtok":'
            ' 3, "output_per_mtok": 15}} (or {"local_zero": true} for a free local model)' + key,
            param="model",
            code="model_unpriced",
        )

    @property
    def holding(self) -> bool:
        """Whether a call of the turn holds a reservation."""
        return bool(self._releases)

    def claim(self) -> str | None:
        """The id of the oldest pending row no row of the turn has taken yet (None: none
        left), for a row of the turn (``TurnMeter``): written, that row replaces the pending
        row in the same statement, so a kill never leaves both (``cost.pending``)."""
        if self._claimed >= len(self._pending):
            return None
        self._claimed += 1
        return self._pending[self._claimed - 1]

    async def drop_unused(self) -> None:
        """Delete the pending rows no row of the turn took (holds whose call never went
        out), before the turn's rows are written: a process killed after that write then
        leaves no pending row of a call that was never sent, which its next start would
        charge at its worst case (``cost.pending``). Killed between the two writes, it
        leaves the pending rows of the calls that went out, as a kill before any write
        does. With the store down, the delete waits in ``cost.unsettled``, ahead of the
        rows."""
        unclaimed = self._pending[self._claimed :]
        if unclaimed:
            del self._pending[self._claimed :]
            await asyncio.shield(self.book.drop_pending(unclaimed))

    async def release(self) -> None:
        """End every hold (idempotent): the turn's cost is in the ledger now. Its pending
        rows were replaced by the rows that took their ids; any other (a hold no attempt
        used), if ``drop_unused`` has not taken it yet, goes now, before the reply's last
        bytes, like the rows: a reader of the ledger after the reply sees the call once."""
        releases, self._releases = self._releases, []
        for release in releases:
            # Shielded: a turn being cancelled still gives its holds back.
            await asyncio.shield(release())
        await self.drop_unused()
        self._pending, self._claimed = [], 0

    def release_once_written(self, rows: list[LedgerRow]) -> None:
        """The turn's rows could not be written (the store is down): its holds stay, and
        its pending rows, until a later write of ``rows`` replaces them
        (``cost.unsettled``); the turn itself is over."""
        releases, self._releases = self._releases, []
        unclaimed = self._pending[self._claimed :]
        self._pending, self._claimed = [], 0
        self.book.unsettled.add(rows, unclaimed, releases)

    def headers(self, turn_cost: float) -> dict[str, str]:
        """What each budget has spent, this turn's cost (measured and estimated) included,
        and what is left."""
        cost = turn_cost
        out: dict[str, str] = {}
        for b in self.budgets:
            before = self._spent.get(b.holder)
            if before is not None:
                spent = before + cost
                out[b.spent_header] = f"{spent:.8f}"
                out[b.remaining_header] = f"{max(b.limit - spent, 0.0):.8f}"
        return out


class Budgets:
    """The budgets of every turn: builds each turn's ``TurnBudgets``."""

    def __init__(
        self,
        store: Store,
        worst: WorstCase,
        link: CoordinationLink | None = None,
        clock: Callable[[], float] = time.time,
        ledger: LedgerWrites | None = None,
        pending: PendingCalls | None = None,
    ) -> None:
        self.store = store
        self.worst = worst
        self.holds = BudgetHolds(link)
        self.clock = clock
        # The rows written off the critical path: all written before a spend is read.
        self.ledger = ledger
        # Each call's pending row, written before it is sent (None: no such rows).
        self.pending = pending
        # The turns whose rows the store could not take at their end, written again.
        self.unsettled = UnsettledCalls(store)

    def pending_row(
        self, session: str, model: str, mode: str, usd: float, stream: bool = False
    ) -> LedgerRow | None:
        """The pending row of a call about to be sent (None without pending rows)."""
        if self.pending is None:
            return None
        return self.pending.row(session, model, mode, usd, stream=stream)

    async def drop_pending(self, row_ids: list[str]) -> None:
        """Delete the pending rows of holds no call used; with the store down, later
        (``cost.unsettled``), not left to be charged as calls at the next start."""
        try:
            await self.store.drop_ledger_rows(row_ids)
        except StoreError:
            self.unsettled.add([], row_ids, [])

    async def for_turn(
        self,
        key: str | None,
        record: KeyRecord | None,
        session: str,
        asked: str | None,
        *,
        stored: bool = True,
        mode: str = "",
        stream: bool = False,
    ) -> TurnBudgets:
        """The budgets of a turn of ``session`` by the key ``key`` (None with auth off);
        ``asked``: the turn's budget header, which sets the session's budget when it has
        none yet (a 400 when it is not a positive number or above the key's cap).
        ``stored=False``: the session is new (an id the proxy just made up), it has no
        budget in the store, and it is not read (one store round trip per such turn)."""
        budgets: list[Budget] = []
        if key is not None and record is not None and record.budget_usd_per_day is not None:
            budgets.append(key_budget(key, record.budget_usd_per_day, self.clock()))
        cap = record.max_session_budget_usd if record is not None else None
        usd = parse_budget(asked, cap) if asked is not None else None
        try:
            limit = await self.store.session_budget(session) if stored else None
            if limit is None and usd is not None:
                limit = await self.store.set_session_budget(session, usd, replace=False)
                audit_session_budget(session, limit, f"turn of key:{key}" if key else "turn")
        except StoreError as e:
            raise e.for_client("could not read the session's budget") from e
        if cap is not None:  # a budget set before the key's cap was lowered is held to it
            limit = cap if limit is None else min(limit, cap)
        if limit is not None:
            budgets.append(session_budget(session, limit))
        allow = bool(record is not None and record.allow_unpriced)
        keyed = record is not None
        return TurnBudgets(
            budgets, self, allow, keyed=keyed, session=session, mode=mode, stream=stream
        )

    async def spent(self, budget: Budget, pending: LedgerRow | None = None) -> float:
        """What the budget's ledger rows cost (a row without a price at the most
        expensive known model's rates), the pending rows of calls in flight left out (their
        holds count them); ``pending``: a call's pending row, written in the same store call."""
        fallback = unpriced_rates()
        if self.ledger is not None:
            await self.ledger.settle()
        in_flight = None if self.pending is None else self.pending.in_flight(time.time())
        try:
            return await self.store.ledger_spend(
                budget.sessions,
                budget.since,
                whole=budget.whole,
                unpriced=(fallback.input_per_mtok, fallback.output_per_mtok),
                pending=pending,
                in_flight=in_flight,
            )
        except StoreError as e:
            raise e.for_client(f"could not read the spend of the {budget.label}") from e
