"""A per-upstream circuit breaker: closed -> open -> half_open -> closed.

Only two states are stored (closed, open); half_open is an open breaker whose cooldown
has elapsed, computed from the clock, so no timer is needed. In half_open exactly one
probe may be in flight; its verdict (``record_success``/``record_failure``) or a
``release`` frees the slot.

Any verdict counts, not just the probe's: a success from a call that was already in
flight closes the breaker (the upstream evidently works) and a failure re-opens it.

``Breaker`` is what the upstream pool uses; ``CircuitBreaker`` here keeps the state in this
process (not thread-safe: meant for one asyncio event loop, where its methods never await),
``coordination.breakers`` keeps it in Redis, shared by replicas, with the same semantics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal, Protocol

CircuitState = Literal["closed", "open", "half_open"]
# What ``acquire`` grants: a call through a closed breaker, or half_open's single probe
# (which must be given back with ``release`` if it ends without a verdict).
Permit = Literal["call", "probe"]


class Breaker(Protocol):
    """One upstream's circuit breaker (in process or shared)."""

    # Told the state entered on each change this process caused (metrics).
    on_change: Callable[[CircuitState], None] | None

    @property
    def state(self) -> CircuitState:
        """The state as last known here (``refresh`` first for a shared one's current)."""
        ...

    async def acquire(self) -> Permit | None:
        """Whether a call may go out now (None: open, or half_open with its probe taken)."""
        ...

    async def release(self) -> None:
        """The probe ended without a verdict (cancelled): free the slot, stay half_open."""
        ...

    async def record_success(self) -> None: ...

    async def record_failure(self) -> None: ...

    async def refresh(self) -> None:
        """Bring ``state`` and ``snapshot`` up to date."""
        ...

    def snapshot(self, wall_now: float | None = None) -> dict[str, Any]: ...


class CircuitBreaker:
    def __init__(
        self,
        failure_threshold: int = 5,
        open_cooldown: float = 30.0,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        if failure_threshold < 1:
            raise ValueError("failure_threshold must be >= 1")
        if open_cooldown < 0:
            raise ValueError("open_cooldown must be >= 0")
        self.failure_threshold = failure_threshold
        self.open_cooldown = open_cooldown
        self._now = now
        self._open = False
        self._next_probe_at: float | None = None  # monotonic; set only while open
        self._probe_in_flight = False
        self._failures = 0
        self._probed = False  # a probe went out since the breaker opened
        # Told the state entered on each change (metrics); half_open when its probe goes out.
        self.on_change: Callable[[CircuitState], None] | None = None

    @property
    def state(self) -> CircuitState:
        if not self._open:
            return "closed"
        assert self._next_probe_at is not None
        return "half_open" if self._now() >= self._next_probe_at else "open"

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    @property
    def next_probe_at(self) -> float | None:
        """Monotonic time from which a probe may go out; None while closed."""
        return self._next_probe_at

    async def acquire(self) -> Permit | None:
        """``call`` if closed; in half_open, ``probe`` claims the single probe slot."""
        state = self.state
        if state == "closed":
            return "call"
        if state == "open" or self._probe_in_flight:
            return None
        self._probe_in_flight = True
        if not self._probed:
            self._probed = True
            self._changed("half_open")
        return "probe"

    async def release(self) -> None:
        """The probe was cancelled without a verdict: free the slot, stay half_open."""
        self._probe_in_flight = False

    async def refresh(self) -> None:
        """Nothing to fetch: the state is in this process."""

    async def record_success(self) -> None:
        if self._open:
            self._changed("closed")
        self._open = False
        self._next_probe_at = None
        self._probe_in_flight = False
        self._failures = 0

    async def record_failure(self) -> None:
        self._failures += 1
        state = self.state
        if state == "half_open" or (state == "closed" and self._failures >= self.failure_threshold):
            self._trip()
        # While open (cooldown running), a late failure from an older call changes
        # nothing: extending the cooldown would punish the upstream twice.

    def _trip(self) -> None:
        self._open = True
        self._next_probe_at = self._now() + self.open_cooldown
        self._probe_in_flight = False
        self._probed = False
        self._changed("open")

    def _changed(self, state: CircuitState) -> None:
        if self.on_change is not None:
            self.on_change(state)

    def snapshot(self, wall_now: float | None = None) -> dict[str, Any]:
        """For /health. With ``wall_now`` (time.time()), also the next probe as wall time."""
        state = self.state
        next_probe_in_s: float | None = None
        if self._next_probe_at is not None:
            next_probe_in_s = max(0.0, self._next_probe_at - self._now())
        snap: dict[str, Any] = {
            "circuit": state,
            "consecutive_failures": self._failures,
            "next_probe_in_s": next_probe_in_s,
        }
        if wall_now is not None:
            snap["next_probe_at"] = None if next_probe_in_s is None else wall_now + next_probe_in_s
        return snap
