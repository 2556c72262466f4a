"""Per-key limits, checked before a turn reaches the upstream pool (and its own limits):
requests and tokens per minute (the exact rolling windows of ``skillstate.limits``, with
their Retry-After), and a daily USD budget.

The budget (UTC days) is read from the ledger: what the key's rows cost since midnight, plus
the estimates of its turns still in flight. A turn is refused (429) when that plus its own
estimate would exceed the budget; its real cost is in the ledger once it is committed, and
its estimate is released when it ends. The estimate is the client's input tokens at the
input price plus ``max_tokens`` at the output price (input only when the request sets no
``max_tokens``; nothing for a model without a known price).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ProxyError
from ..limits import UpstreamLimits
from ..pricing import PriceBook
from ..store import Store
from ..tokens import estimate_tokens
from .gate import Principal
from .tenancy import SEP

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
    _quotas: KeyQuotas | None = field(default=None, repr=False)

    def release(self) -> None:
        """Give the estimate back (idempotent): the turn's real cost is in the ledger."""
        if self._quotas is not None:
            self._quotas.unreserve(self.key, self.estimate)
            self._quotas = None

    def headers(self, turn_cost: str | None) -> dict[str, str]:
        """What the key has spent today, this turn included, and what is left."""
        if self.budget is None or self.spent_before is None:
            return {}
        spent = self.spent_before + (float(turn_cost) if turn_cost else 0.0)
        return {
            BUDGET_SPENT: f"{spent:.8f}",
            BUDGET_REMAINING: f"{max(self.budget - spent, 0.0):.8f}",
        }


class KeyQuotas:
    """The rpm/tpm windows and budget reservations of every key, in this process."""

    def __init__(
        self,
        store: Store,
        prices: PriceBook,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.prices = prices
        self.clock = clock
        self._monotonic = monotonic
        self._windows: dict[str, UpstreamLimits] = {}
        self._reserved: dict[str, float] = {}

    async def admit(self, caller: Principal, body: Mapping[str, Any], model: str) -> Grant:
        """Let one turn of ``caller`` through, or raise a 429 (rate or budget)."""
        record = caller.record
        if record.rpm is None and record.tpm is None and record.budget_usd_per_day is None:
            return Grant(caller.name, 0.0, None, None)
        tokens = estimate_tokens([body.get("system"), body.get("messages"), body.get("tools")])
        if record.budget_usd_per_day is None:
            self._admit_rate(caller, tokens)
            return Grant(caller.name, 0.0, None, None)
        now = self.clock()
        since = now - now % DAY  # this UTC day
        spent = await self.store.ledger_spend(caller.name + SEP, since)
        # No await from here on: the check and the reservation are one step.
        estimate = self._estimate(body, model, tokens)
        budget = record.budget_usd_per_day
        committed = spent + self._reserved.get(caller.name, 0.0)
        if committed + estimate > budget:
            remaining = max(budget - committed, 0.0)
            raise BudgetExceeded(
                f"key {caller.name!r}: daily budget ${budget:g} reached (spent ${spent:.6f} "
                f"today, this call is estimated at ${estimate:.6f}); it resets at 00:00 UTC",
                remaining,
                since + DAY - now,
            )
        self._admit_rate(caller, tokens)
        self._reserved[caller.name] = self._reserved.get(caller.name, 0.0) + estimate
        return Grant(caller.name, estimate, spent, budget, self)

    def unreserve(self, key: str, amount: float) -> None:
        left = self._reserved.get(key, 0.0) - amount
        if left <= 1e-12:
            self._reserved.pop(key, None)
        else:
            self._reserved[key] = left

    def _admit_rate(self, caller: Principal, tokens: int) -> None:
        record = caller.record
        if record.rpm is None and record.tpm is None:
            return
        window = self._windows.get(caller.name)
        if window is None or (window.rpm, window.tpm) != (record.rpm, record.tpm):
            window = UpstreamLimits(record.rpm, record.tpm, self._monotonic)
            self._windows[caller.name] = window
        admission = window.check(tokens)
        if admission.never_fits:
            raise ProxyError(
                "request_too_large",
                f"this request (~{tokens} tokens) is larger than key {caller.name!r}'s tpm",
                code="tpm_exceeded",
            )
        if not admission.ok or window.admit(tokens) is None:
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
