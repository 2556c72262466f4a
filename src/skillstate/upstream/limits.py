"""Exact rolling-window rate limits (requests and tokens per minute) for one upstream or
one client key.

Expiry rule: an entry recorded at time ``t`` counts while ``now < t + span`` and is gone
at ``now == t + span``. So ``wait_for`` returns exactly ``t + span - now`` and a caller
that waits that long fits.

``RateLimits`` is what the upstream pool and the key quotas use: ``reserve`` (check both
windows and record, in one step), ``settle`` (replace a reservation's estimated tokens with
the real ones, keeping its time), ``refresh`` + ``snapshot`` (for /health and /metrics).
``UpstreamLimits`` here is the in-process implementation; ``coordination.windows`` holds
the same windows in Redis, shared by replicas.

``UpstreamLimits`` is not thread-safe: it is meant for one asyncio event loop, where
``reserve`` is atomic because it never awaits between the check and the record.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

Clock = Callable[[], float]


@dataclass(slots=True, eq=False)
class WindowEntry:
    """One recorded amount; the handle ``RollingWindow.adjust`` takes."""

    at: float
    amount: int
    live: bool = True  # False once pruned: adjusting it must not touch the total


class RollingWindow:
    """Sum of the amounts recorded in the last ``span`` seconds."""

    def __init__(self, span: float = 60.0, now: Clock = time.monotonic) -> None:
        if span <= 0:
            raise ValueError("span must be positive")
        self.span = span
        self._now = now
        self._entries: deque[WindowEntry] = deque()
        self._total = 0  # ints keep the sum exact, no float drift

    def _prune(self) -> float:
        now = self._now()
        entries = self._entries
        # Entries are appended with a monotonic clock, so the oldest is always first.
        while entries and entries[0].at + self.span <= now:
            gone = entries.popleft()
            gone.live = False
            self._total -= gone.amount
        return now

    def total(self) -> int:
        self._prune()
        return self._total

    def record(self, amount: int) -> WindowEntry:
        if amount < 0:
            raise ValueError("amount must be >= 0")
        entry = WindowEntry(self._prune(), amount)
        self._entries.append(entry)
        self._total += amount
        return entry

    def adjust(self, entry: WindowEntry, new_amount: int) -> None:
        """Replace an entry's amount, keeping its timestamp. No-op once it has expired."""
        if new_amount < 0:
            raise ValueError("amount must be >= 0")
        self._prune()
        if entry.live:
            self._total += new_amount - entry.amount
        entry.amount = new_amount

    def wait_for(self, amount: int, limit: int) -> float:
        """Seconds until ``total + amount <= limit``: 0.0 if it fits now, inf if never."""
        if amount > limit:
            return math.inf
        now = self._prune()
        excess = self._total + amount - limit
        if excess <= 0:
            return 0.0
        for entry in self._entries:
            excess -= entry.amount
            if excess <= 0:
                return _delay_until(now, entry.at + self.span)
        raise AssertionError("unreachable: amount <= limit, so emptying the window fits")


def _delay_until(now: float, deadline: float) -> float:
    # Smallest float d with now + d >= deadline, so a clock advanced by d really fits
    # (plain deadline - now can come out one ulp short after rounding).
    delay = max(deadline - now, 0.0)
    while now + delay < deadline:
        delay = math.nextafter(delay, math.inf)
    return delay


@dataclass(frozen=True, slots=True)
class Ticket:
    """What ``reserve`` recorded, for ``settle`` once the real usage is known."""

    estimated_tokens: int
    # The implementation's handle on the recorded token entry (a WindowEntry in process,
    # an entry id in Redis); None when tpm is off.
    token_entry: object | None


@dataclass(frozen=True, slots=True)
class Admission:
    """The limits' verdict on one request: admitted (with its ticket) or how long to wait."""

    ok: bool
    retry_after: float  # 0.0 when ok; math.inf when never_fits
    never_fits: bool  # the request alone is bigger than the whole tpm window
    ticket: Ticket | None = None  # what was recorded, when ``reserve`` admitted it


NEVER_FITS = Admission(ok=False, retry_after=math.inf, never_fits=True)


def admitted(ticket: Ticket) -> Admission:
    return Admission(ok=True, retry_after=0.0, never_fits=False, ticket=ticket)


class RateLimits(Protocol):
    """Requests and tokens per minute of one upstream or key (in process or shared)."""

    rpm: int | None
    tpm: int | None

    async def reserve(self, tokens: int) -> Admission:
        """Check both windows and, if ``tokens`` fits, record one request and the tokens,
        atomically. Not admitted: how long until it fits (``never_fits`` when it is bigger
        than the whole tpm window)."""
        ...

    async def settle(self, ticket: Ticket, actual_tokens: int) -> None:
        """Replace the ticket's estimated tokens with the real usage, keeping its time (a
        no-op once the entry has left the window)."""
        ...

    async def refresh(self) -> None:
        """Bring ``snapshot`` up to date (shared windows: read them from where they live)."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """For /health and /metrics: ``{"rpm": {"limit", "used"} | None, "tpm": ...}``."""
        ...


class UpstreamLimits:
    """Requests-per-minute and tokens-per-minute for one upstream. None or 0 disables one."""

    def __init__(self, rpm: int | None, tpm: int | None, now: Clock = time.monotonic) -> None:
        if (rpm or 0) < 0 or (tpm or 0) < 0:
            raise ValueError("rpm and tpm must be >= 0 (0 or None disables)")
        self.rpm = rpm or None
        self.tpm = tpm or None
        # A disabled counter has no window at all, so it keeps no history.
        self._requests = RollingWindow(60.0, now) if self.rpm else None
        self._tokens = RollingWindow(60.0, now) if self.tpm else None

    def check(self, tokens: int) -> Admission:
        """Whether a request of ``tokens`` estimated tokens fits now, else how long until it
        does (``never_fits`` when it is bigger than the whole tpm window)."""
        if tokens < 0:
            raise ValueError("tokens must be >= 0")
        if self.tpm is not None and tokens > self.tpm:
            return NEVER_FITS
        wait = 0.0
        if self._requests is not None and self.rpm is not None:
            wait = self._requests.wait_for(1, self.rpm)
        if self._tokens is not None and self.tpm is not None:
            # Both windows only drain as time passes, so the later of the two waits fits both.
            wait = max(wait, self._tokens.wait_for(tokens, self.tpm))
        return Admission(ok=wait == 0.0, retry_after=wait, never_fits=False)

    async def reserve(self, tokens: int) -> Admission:
        """``check`` and, if it fits, record one request and ``tokens`` estimated tokens.
        Never awaits, so nothing runs between the check and the record."""
        verdict = self.check(tokens)
        if not verdict.ok:
            return verdict
        if self._requests is not None:
            self._requests.record(1)
        token_entry = self._tokens.record(tokens) if self._tokens is not None else None
        return admitted(Ticket(tokens, token_entry))

    async def settle(self, ticket: Ticket, actual_tokens: int) -> None:
        """Replace the ticket's estimate with the usage the upstream reported."""
        entry = ticket.token_entry
        if self._tokens is not None and isinstance(entry, WindowEntry):
            self._tokens.adjust(entry, actual_tokens)

    async def refresh(self) -> None:
        """Nothing to fetch: the windows are in this process."""

    def snapshot(self) -> dict[str, Any]:
        """For /health; a disabled counter is null."""
        return {
            "rpm": _usage(self.rpm, self._requests),
            "tpm": _usage(self.tpm, self._tokens),
        }


def _usage(limit: int | None, window: RollingWindow | None) -> dict[str, int] | None:
    if limit is None or window is None:
        return None
    return {"limit": limit, "used": window.total()}
