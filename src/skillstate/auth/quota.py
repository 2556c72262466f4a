"""Per-key limits, checked before a turn reaches the upstream pool (and its own limits):
requests and tokens per minute (the exact rolling windows of ``skillstate.upstream.limits``, with
their Retry-After), and a daily USD budget.

The budget (UTC days) is read from the ledger: what the key's rows cost since midnight, plus
the estimates of its turns still in flight. A turn is refused (429) when that plus its own
estimate would exceed the budget; its real cost is in the ledger once it is committed, and
its estimate is released when it ends. The estimate is the client's input tokens at the
input price plus ``max_tokens`` at the output price (input only when the request sets no
``max_tokens``; nothing for a model without a known price).

With ``coordination`` configured, the windows and the holds are in Redis, shared by every
replica (``coordination.windows``, ``coordination.budgets``); the ledger is read as always.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..coordination.link import CoordinationLink
from ..cost.pricing import PriceBook
from ..cost.tokens import estimate_tokens
from ..errors import ProxyError
from ..store import Store, StoreError
from ..upstream.limits import RateLimits, UpstreamLimits
from .gate import Principal
from .tenancy import SEP

if TYPE_CHECKING:
    from ..coordination.budgets import SharedHolds

DAY = 86400.0
BUDGET_REMAINING = "x-skillstate-budget-remaining"
BUDGET_SPENT = "x-skillstate-budget-spent-usd"
_MAX_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


class BudgetExceeded(ProxyError):
    """A 429 that says how much of the day's budget is left."""

    def __init__(self, message: str, remaining: float, retry_after: float) -> None:
        super().__init__("rate_limit", message, code="budget_exceeded", retry_after=retry_after)
        self.remaining = remaining

    def headers(self) -> dict[str, str]:
        return {**super().headers(), BUDGET_REMAINING: f"{self.remaining:.8f}"}


@dataclass
class Grant:
    """A turn let through: its budget estimate, held until ``release``."""

    key: str
    estimate: float
    spent_before: float | None  # USD today before this turn; None without a budget
    budget: float | None
    _release: Callable[[], Awaitable[None]] | None = field(default=None, repr=False)

    async def release(self) -> None:
        """Give the estimate back (idempotent): the turn's real cost is in the ledger."""
        release, self._release = self._release, None
        if release is not None:
            # Shielded: a turn being cancelled still gives its hold back.
            await asyncio.shield(release())

    def headers(self, turn_cost: str | None) -> dict[str, str]:
        """What the key has spent today, this turn included, and what is left."""
        if self.budget is None or self.spent_before is None:
            return {}
        spent = self.spent_before + (float(turn_cost) if turn_cost else 0.0)
        return {
            BUDGET_SPENT: f"{spent:.8f}",
            BUDGET_REMAINING: f"{max(self.budget - spent, 0.0):.8f}",
        }


class LocalHolds:
    """The budget estimates of each key's turns in flight, in this process."""

    def __init__(self) -> None:
        self._reserved: dict[str, float] = {}

    def hold(self, key: str, estimate: float, spent: float, budget: float) -> float | None:
        """None (held) if ``spent`` + held + ``estimate`` fits ``budget``; else what is
        held by the key's other turns."""
        held = self._reserved.get(key, 0.0)
        if spent + held + estimate > budget:
            return held
        self._reserved[key] = held + estimate
        return None

    async def release(self, key: str, amount: float) -> None:
        left = self._reserved.get(key, 0.0) - amount
        if left <= 1e-12:
            self._reserved.pop(key, None)
        else:
            self._reserved[key] = left


class KeyQuotas:
    """The rpm/tpm windows and budget holds of every key: in this process, or shared by
    replicas through ``link`` when coordination is configured."""

    def __init__(
        self,
        store: Store,
        prices: PriceBook,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        link: CoordinationLink | None = None,
    ) -> None:
        self.store = store
        self.prices = prices
        self.clock = clock
        self._monotonic = monotonic
        self._windows: dict[str, RateLimits] = {}
        self.local_holds = LocalHolds()  # also the fallback while Redis is down
        self._link = link if link is not None and link.configured else None
        self._shared_holds: SharedHolds | None = None
        if self._link is not None:
            from ..coordination.budgets import SharedHolds

            self._shared_holds = SharedHolds(self._link)

    async def admit(self, caller: Principal, body: Mapping[str, Any], model: str) -> Grant:
        """Let one turn of ``caller`` through, or raise a 429 (rate or budget)."""
        record = caller.record
        if record.rpm is None and record.tpm is None and record.budget_usd_per_day is None:
            return Grant(caller.name, 0.0, None, None)
        tokens = estimate_tokens([body.get("system"), body.get("messages"), body.get("tools")])
        if record.budget_usd_per_day is None:
            await self._admit_rate(caller, tokens)
            return Grant(caller.name, 0.0, None, None)
        now = self.clock()
        since = now - now % DAY  # this UTC day
        try:
            spent = await self.store.ledger_spend(caller.name + SEP, since)
        except StoreError as e:
            raise e.for_client("could not read the key's spend today") from e
        estimate = self._estimate(body, model, tokens)
        budget = record.budget_usd_per_day
        # The check and the hold are one step (in process: no await between them; shared:
        # one script). The budget is held first: a refused rate check gives it back, while
        # a recorded request could not be taken back.
        grant = Grant(caller.name, estimate, spent, budget)
        refused_at = await self._hold(grant, spent, budget)
        if refused_at is not None:
            committed = spent + refused_at
            remaining = max(budget - committed, 0.0)
            raise BudgetExceeded(
                f"key {caller.name!r}: daily budget ${budget:g} reached (spent ${spent:.6f} "
                f"today, this call is estimated at ${estimate:.6f}); it resets at 00:00 UTC",
                remaining,
                since + DAY - now,
            )
        try:
            await self._admit_rate(caller, tokens)
        except BaseException:
            await grant.release()
            raise
        return grant

    async def _hold(self, grant: Grant, spent: float, budget: float) -> float | None:
        """Hold the grant's estimate (and arm its release), or return what the key's other
        turns hold when it does not fit."""
        key, estimate = grant.key, grant.estimate
        if self._shared_holds is not None:
            shared = self._shared_holds
            answer = await shared.hold(key, estimate, spent, budget)
            if answer is not None:  # None: Redis is down, hold in process
                hold, held = answer
                if hold is None:
                    return held
                grant._release = functools.partial(shared.release, key, hold)
                return None
        held_by_others = self.local_holds.hold(key, estimate, spent, budget)
        if held_by_others is not None:
            return held_by_others
        grant._release = functools.partial(self.local_holds.release, key, estimate)
        return None

    def _window(self, caller: Principal) -> RateLimits:
        record = caller.record
        window = self._windows.get(caller.name)
        if window is None or (window.rpm, window.tpm) != (record.rpm or None, record.tpm or None):
            local = UpstreamLimits(record.rpm, record.tpm, self._monotonic)
            if self._link is not None:
                from ..coordination.windows import SharedWindows

                window = SharedWindows(
                    self._link, "key:" + caller.name, record.rpm, record.tpm, local=local
                )
            else:
                window = local
            self._windows[caller.name] = window
        return window

    async def _admit_rate(self, caller: Principal, tokens: int) -> None:
        record = caller.record
        if record.rpm is None and record.tpm is None:
            return
        admission = await self._window(caller).reserve(tokens)
        if admission.never_fits:
            raise ProxyError(
                "request_too_large",
                f"this request (~{tokens} tokens) is larger than key {caller.name!r}'s tpm",
                code="tpm_exceeded",
            )
        if not admission.ok:
            raise ProxyError(
                "rate_limit",
                f"key {caller.name!r}: rate limit reached; retry after the given time",
                retry_after=admission.retry_after,
                code="key_rate_limit",
            )

    def _estimate(self, body: Mapping[str, Any], model: str, tokens: int) -> float:
        rates = self.prices.rates(model=model or None, upstream=None)
        if rates is None:
            return 0.0
        out = next((v for f in _MAX_TOKEN_FIELDS if isinstance(v := body.get(f), int)), 0)
        return (tokens * rates.input_per_mtok + max(out, 0) * rates.output_per_mtok) / 1e6
