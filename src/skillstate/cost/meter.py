"""The ledger rows of one client turn, owned in one place.

``Pipeline`` decides what happens to a turn (retry, re-ask, commit); the ``TurnMeter`` counts
what it cost: one row per upstream attempt (see ``skillstate.cost.ledger`` for the kinds and the
baseline arithmetic). Keeping every row of a turn here means no path of the pipeline can
forget to meter an attempt it made, and the re-ask bookkeeping (the answered row relabelled
while a re-ask is out, restored if the re-ask fails) is one pair of methods rather than
tuples and rows patched by index.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

from ..errors import CLIENT_CLOSED
from ..store.records import Kind, LedgerRow
from .baseline import (
    Baseline,
    CacheRegime,
    CacheSplit,
    PrefixCache,
    PrefixPoint,
    baseline_output_tokens,
    openai_read,
    price_baseline,
    round_ratio,
)
from .ledger import Usage, make_row
from .pricing import PriceBook, Prices
from .worstcase import WorstCase


class _Attempt(Protocol):
    upstream: str
    status: int
    billed: bool  # the request may have reached the provider: charged an estimate


@dataclass(frozen=True)
class MeterContext:
    """What every row of one turn shares: who asked, in which mode, the size of the
    client's own transcript without the proxy's envelopes (None when there is nothing to
    compare, e.g. passthrough), the context shape sent and the baseline's cache model."""

    session: str
    mode: str
    model: str | None
    est_client: int | None
    context: str | None = None
    baseline: BaselineSource | None = None


@dataclass
class BaselineSource:
    """What the cache-aware baseline of one turn needs (see ``skillstate.cost.baseline``).

    ``points``: the prefix points (``baseline.prefix_points``) of the client's request with
    the proxy's envelopes removed; ``untouched``:
    the upstream got exactly the client's body and it had no envelope to remove, so the
    baseline IS the call (the cache model still learns the request for later turns).
    The session's cache is charged once per turn, by the first answer; a re-ask's answer
    reuses that split, scaled to its own input.
    """

    cache: PrefixCache
    points: Sequence[PrefixPoint]
    untouched: bool
    now: float
    _charged: tuple[int, CacheSplit] | None = field(default=None, init=False)

    def split(self, baseline_input: int, regime: CacheRegime) -> CacheSplit:
        if self._charged is None:
            split = self.cache.charge(self.points, baseline_input, self.now, regime)
            self._charged = (baseline_input, split)
            return split
        first_input, first = self._charged
        if first_input <= 0:
            return CacheSplit(baseline_input)

        def scaled(n: int) -> int:
            return round_ratio(n * baseline_input, first_input)

        read = scaled(first.cache_read_tokens)
        if regime.pricing == "openai":
            # still a read OpenAI could report: whole steps from its minimum on
            read = openai_read(read, regime)
        return CacheSplit(baseline_input, read, scaled(first.cache_write_tokens))

    def model(self, regime: CacheRegime, envelope_share: Fraction) -> Any:
        """The ``ledger.BaselineModel`` of one answered attempt."""

        def baseline(
            b_in: int, usage: Usage, prices: Prices | None, cost_usd: float | None
        ) -> Baseline:
            split = self.split(b_in, regime)
            if self.untouched:
                return Baseline(
                    usage.input_tokens,
                    usage.cache_read_tokens,
                    usage.cache_write_tokens,
                    usage.output_tokens,
                    cost_usd,
                )
            out = baseline_output_tokens(usage.output_tokens, envelope_share)
            return price_baseline(split, out, prices, usage)

        return baseline


class TurnMeter:
    """Every ledger row of one turn, in attempt order.

    Exactly one row ends up as the turn's answer (kind ``generation`` or ``stream``); every
    other attempt is a retry row with a zero baseline. Rows reach the store either inside the
    turn's commit (``unwritten()``) or best effort on their own (``flush()``), never both.
    """

    def __init__(
        self, prices: PriceBook, ctx: MeterContext, worst: WorstCase | None = None
    ) -> None:
        self._prices = prices
        self._ctx = ctx
        self._worst = worst
        # The call out (or last sent): its estimated input, its body and the worst case its
        # budgets hold (None: under none), for the estimate of a row without usage.
        self._call: tuple[int, Mapping[str, Any], float | None] | None = None
        self._rows: list[LedgerRow] = []
        self._written = 0  # rows before this index were handed out to be written
        self._rewritten: list[int] = []  # rows before it changed since (``restore``)
        # The answer a re-ask replaced: its index and its row as the turn's answer.
        self._held: tuple[int, LedgerRow] | None = None
        # How the last answer's row was made, to make it again as a rollback-retry.
        self._last_answer: tuple[Usage | None, int, str, str | None, str | None] | None = None
        self._answered = False
        # Where a row of a budgeted call takes its id: the oldest pending row of the turn's
        # not yet taken (``TurnBudgets.claim``), which the row replaces when it is written.
        self._claim: Callable[[], str | None] | None = None

    @property
    def rows(self) -> list[LedgerRow]:
        """The rows so far (a copy: the meter alone changes them)."""
        return list(self._rows)

    def sending(
        self,
        est_tokens: int,
        body: Mapping[str, Any],
        held: float | None,
        claim: Callable[[], str | None] | None = None,
    ) -> None:
        """A call goes out: ``est_tokens`` its estimated input, ``held`` the worst case its
        budgets hold for it (None: no budget). A row of it without usage is charged that.
        ``claim``: the turn's pending rows' ids, for its rows (see ``_row_id``)."""
        self._call = (est_tokens, body, held)
        if claim is not None:
            self._claim = claim

    @property
    def answered_yet(self) -> bool:
        """True once some attempt's answer is recorded as the turn's answer."""
        return self._answered

    def failed(
        self, upstream: str, status: int, kind: Kind = "transport-retry", *, billed: bool = False
    ) -> None:
        """An attempt without usable usage: a transport failure, an error status, or (with
        ``kind="generation"``) an error answer that is what the client gets. ``billed``: the
        upstream may bill it (it answered 2xx with something unreadable, or it had the
        request when the transport failed), so its row is charged an estimate (a cut call,
        ``CLIENT_CLOSED``, always is)."""
        billed = billed or status == CLIENT_CLOSED
        row_id = self._row_id()
        row = self._make(None, kind, status, upstream, None, None, None, row_id, billed=billed)
        self._rows.append(row)
        if kind in ("generation", "stream"):
            self._answered = True

    def failed_attempts(self, attempts: Iterable[_Attempt]) -> None:
        """The upstream layer's failed attempts before the one that answered (those that
        failed after sending their request charged an estimate: ``AttemptRecord.billed``)."""
        for a in attempts:
            self.failed(a.upstream, a.status, billed=a.billed)

    def unanswered(self, attempts: Iterable[_Attempt]) -> None:
        """A call that no attempt answered (the client gets the proxy's own error): each
        attempt, the last as the turn's answer when it has none yet (the error is what the
        client got, so the turn keeps its one ``generation`` row and counts as a request),
        the ones before it as transport retries."""
        attempts = list(attempts)
        for i, a in enumerate(attempts):
            own = i == len(attempts) - 1 and not self._answered
            kind: Kind = "generation" if own else "transport-retry"
            self.failed(a.upstream, a.status, kind, billed=a.billed)

    def cancelled(self, attempts: Iterable[_Attempt]) -> None:
        """A call cut by its turn's cancellation: each attempt, and the one it cut
        (``CLIENT_CLOSED``: the upstream had the request and may bill it) as the turn's
        answer when it has none yet, else as a retry."""
        for a in attempts:
            cut = a.status == CLIENT_CLOSED and not self._answered
            kind: Kind = "generation" if cut else "transport-retry"
            self.failed(a.upstream, a.status, kind, billed=a.billed)

    def answered(
        self,
        *,
        upstream: str,
        provider_hint: str | None,
        usage: Usage | None,
        status: int,
        model: str | None,
        est_sent: int | None,
        kind: Kind = "generation",
        regime: CacheRegime | None = None,
        envelope_share: Fraction = Fraction(0),
    ) -> None:
        """The attempt whose answer goes to the client (unless ``discard_last`` follows).

        ``regime``: how the upstream bills its prompt cache (for the baseline's cache
        model); ``envelope_share``: the envelope's share of the reply
        (``baseline.envelope_output_share``), taken off the baseline's output."""
        source = self._ctx.baseline
        modelled = (
            source.model(regime, envelope_share)
            if source is not None and regime is not None
            else None
        )
        row = self._make(
            usage,
            kind,
            status,
            upstream,
            model,
            est_sent,
            provider_hint,
            self._row_id(),
            modelled,
            billed=True,
        )
        self._rows.append(row)
        self._last_answer = (usage, status, upstream, model, provider_hint)
        self._answered = True

    def discard_last(self) -> None:
        """The last answer is discarded for a re-ask: it becomes a rollback-retry row (zero
        baseline). ``restore`` puts it back if the re-ask brings no better answer."""
        assert self._last_answer is not None, "discard_last() before any answer"
        usage, status, upstream, model, hint = self._last_answer
        i = len(self._rows) - 1
        self._held = (i, self._rows[i])
        row_id = self._rows[i].row_id
        self._rows[i] = self._make(
            usage, "rollback-retry", status, upstream, model, None, hint, row_id, billed=True
        )

    def set_aside(self) -> None:
        """The last answer was a call of the proxy's own (a fold of the window), never the
        client's: a rollback-retry row (zero baseline), and the turn has no answer yet."""
        self.discard_last()
        self._held = None
        self._answered = False

    def take_over(self, earlier: TurnMeter) -> None:
        """The rows of ``earlier`` (the turn's meter before it was planned again) come
        first, written or not as they were."""
        self._rows = earlier._rows + self._rows
        self._written = earlier._written
        self._rewritten = list(earlier._rewritten)
        self._answered = earlier._answered or self._answered

    def restore(self) -> None:
        """The re-ask failed: the discarded answer is the turn's answer again. Its row,
        if written before the re-ask (``Committer.write_ahead``), is written again (it
        replaces itself: ``LedgerRow.row_id``)."""
        if self._held is not None:
            i, row = self._held
            self._rows[i] = row
            self._held = None
            if i < self._written:
                self._rewritten.append(i)

    def unwritten(self) -> list[LedgerRow]:
        """The rows not written yet, or changed since they were (the commit writes them in
        its own transaction)."""
        if self._rewritten:
            return [self._rows[i] for i in self._rewritten] + self._rows[self._written :]
        return self._rows[self._written :]

    def mark_written(self) -> None:
        """The rows so far were written (by the commit): ``flush`` leaves them alone."""
        self._written = len(self._rows)
        self._rewritten = []

    def headers(self) -> dict[str, str]:
        """The turn's ``x-skillstate-pricing/-cost-usd/-saved-tokens`` headers."""
        return ledger_headers(self._rows)

    # -- rows ---------------------------------------------------------------------------

    def _row_id(self) -> str:
        """A new row's id: a pending row's of the turn while one is not taken, so that
        writing the row replaces that pending row in the same statement (the ledger's
        upsert on ``row_id``): a process killed at any point leaves the call's pending row
        or its real row, never both (``cost.pending``); else a new id."""
        claimed = self._claim() if self._claim is not None else None
        return claimed if claimed is not None else _new_id()

    def _make(
        self,
        usage: Usage | None,
        kind: Kind,
        status: int,
        upstream: str,
        model: str | None,
        est_sent: int | None,
        provider_hint: str | None,
        row_id: str | None,
        baseline_model: Any = None,
        *,
        billed: bool = False,
    ) -> LedgerRow:
        ctx = self._ctx
        compare = ctx.est_client is not None and est_sent is not None
        model = model or ctx.model or None
        estimate = None
        if usage is None and billed:
            estimate = self._estimate(model, upstream, provider_hint)
        return make_row(
            book=self._prices,
            usage=usage,
            kind=kind,
            status=status,
            mode=ctx.mode,
            session=ctx.session,
            upstream=upstream,
            model=model,
            est_transcript=ctx.est_client if compare else None,
            est_sent=est_sent if compare else None,
            provider_hint=provider_hint,
            baseline_model=baseline_model,
            context=ctx.context,
            row_id=row_id,
            estimated_cost_usd=estimate,
        )

    def _estimate(
        self, model: str | None, upstream: str, provider_hint: str | None
    ) -> float | None:
        """What a call without usage is charged: the worst case its budgets held, else its
        worst case at this upstream's price (None: no call known, or no price)."""
        if self._call is None:
            return None
        est_tokens, body, held = self._call
        if held is not None:
            return held
        if self._worst is None:
            return None
        rates = self._worst.rates(model or "", [(upstream, provider_hint)], est_tokens, body)
        return None if rates is None else self._worst.cost(rates, est_tokens, body, [upstream])


def _new_id() -> str:
    """A ledger row's id (``LedgerRow.row_id``): 32 hex digits, the milliseconds since the
    epoch (12) then 10 random bytes, unique across replicas as 16 random bytes were. Ids
    that grow with time are inserted at the end of the ledger's unique index instead of at
    random pages of it: the store's thread spent 5-7 µs less per row (30,000 rows written in
    groups of 100, as ``LedgerWrites`` does). The 80 random bits are the ``random`` module's
    (seeded from the OS, and again in a forked child): ``os.urandom`` is a system call a row,
    0.9 % of a state turn's CPU at 64 connections, and an id needs to be unique, not secret."""
    return f"{time.time_ns() // 1_000_000:012x}{random.getrandbits(80):020x}"


def ledger_headers(rows: list[LedgerRow]) -> dict[str, str]:
    """Pricing status, cost and saved tokens of a turn's rows, as response headers."""
    if not rows:
        return {}
    h: dict[str, str] = {}
    statuses = {r.pricing for r in rows if r.pricing != "usage-unavailable" or r is rows[-1]}
    if rows[-1].pricing == "usage-unavailable":
        h["x-skillstate-pricing"] = "usage-unavailable"
    elif "unknown" in statuses:
        h["x-skillstate-pricing"] = "unknown"
    else:
        h["x-skillstate-pricing"] = rows[-1].pricing
    costs = [r.cost_usd for r in rows if r.cost_usd is not None]
    if costs and h["x-skillstate-pricing"] in ("known", "override"):
        h["x-skillstate-cost-usd"] = f"{sum(costs):.8f}"
    estimates = [r.estimated_cost_usd for r in rows if r.estimated_cost_usd is not None]
    if estimates:  # calls without usage: charged their worst case, not measured
        h["x-skillstate-estimated-cost-usd"] = f"{sum(estimates):.8f}"
    # Over all the turn's attempts (retries have a zero baseline), so the headers of a
    # session's turns add up to its /cost saved_input_tokens.
    saved = [
        r.baseline_input_tokens - r.input_tokens
        for r in rows
        if r.baseline_input_tokens is not None and r.input_tokens is not None
    ]
    if saved:
        h["x-skillstate-saved-tokens"] = str(sum(saved))
    return h
