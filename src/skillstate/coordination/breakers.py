"""One upstream's circuit breaker in Redis, shared by every replica: the ``Breaker`` of
``skillstate.upstream.breaker`` with the same semantics, where the failures of all
replicas count together, an open breaker is open for all, and in half_open exactly one
replica (one call) probes.

State: a hash (``failures``, ``open``, ``next``: when a probe may go out, in Redis's
microseconds, ``probed``: a probe went out since it opened) and the probe claim, a key set
with ``SET NX PX`` holding its owner's token (it expires after ``probe_ttl`` should its
replica die mid-probe). Each operation is one Lua script, atomic on the server, on Redis's
own clock (``TIME``); each answers the state, which this replica keeps for ``state`` and
``snapshot`` (``refresh`` reads it afresh, for /health and /metrics).

Round trips. With ``sync`` = 0 every ``acquire`` and every verdict is one script on Redis:
exactly the in-process semantics, at two round trips per call. With ``sync`` > 0 (the
``breaker_sync`` setting), a breaker this replica read as closed with no failures within
the last ``sync`` seconds lets calls through, and their successes are not written, without
asking Redis: zero round trips per call on the happy path. The price, bounded by ``sync``:
a replica may still send calls for up to ``sync`` seconds after another one opened the
breaker (like calls already in flight; their failures change nothing, a success closes it,
as in process), and a success of this replica does not reset a failure it has not seen yet.
``sync`` is capped at half the cooldown, so a closed state read before the breaker opened
has expired before its probe may go out: the single probe is never bypassed.

A state change is told to ``on_change`` by the replica that caused it (so metrics count
each change once). Redis unreachable: ``coordination_down`` decides whether a call is
refused (503) or runs on this replica's in-process breaker, which is told every verdict so
that it knows this replica's recent view. A verdict never raises: the call is over.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

from ..upstream.breaker import CircuitBreaker, CircuitState, Permit
from .link import LOCAL, CoordinationLink
from .scripts import lua_now_us, run_script

PREFIX = "skillstate:breaker:"
US = 1_000_000
KEEP_MS = 7 * 86400 * 1000  # an idle breaker's hash is dropped after a week

# KEYS: 1 state hash, 2 probe claim. ARGV: 1 now (us; "" = the server's TIME), then own.
# Every script ends with {its own answer, open (0/1), next probe in (us), failures}.
_PRELUDE = (
    lua_now_us(1)
    + """
local h = redis.call('HMGET', KEYS[1], 'open', 'next', 'probed', 'failures')
local open, nxt = h[1] == '1', tonumber(h[2]) or 0
local probed, failures = h[3] == '1', tonumber(h[4]) or 0
local function state()
  if not open then return 'closed' end
  if now >= nxt then return 'half_open' end
  return 'open'
end
local function reply(answer)
  local wait = 0
  if open then wait = math.max(nxt - now, 0) end
  return {answer, open and 1 or 0, n(wait), failures}
end
"""
)

# ARGV: 2 probe ttl (ms), 3 this claim's token. Answer: 0 refused, 1 call, 2 the probe,
# 3 the first probe since the breaker opened (the change to half_open).
ACQUIRE = (
    _PRELUDE
    + """
local s = state()
if s == 'closed' then return reply(1) end
if s == 'open' then return reply(0) end
if not redis.call('SET', KEYS[2], ARGV[3], 'NX', 'PX', ARGV[2]) then return reply(0) end
if probed then return reply(2) end
redis.call('HSET', KEYS[1], 'probed', '1')
return reply(3)
"""
)

# ARGV: 2 the claim's token. Frees the probe slot if this claim still holds it.
RELEASE = (
    _PRELUDE
    + """
if redis.call('GET', KEYS[2]) == ARGV[2] then redis.call('DEL', KEYS[2]) end
return reply(0)
"""
)

# Answer: 1 if it closed an open breaker.
SUCCESS = (
    _PRELUDE
    + """
local was_open = open
redis.call('DEL', KEYS[1], KEYS[2])
open, failures = false, 0
return reply(was_open and 1 or 0)
"""
)

# ARGV: 2 failure threshold, 3 cooldown (us). Answer: 1 if it (re)opened the breaker.
FAILURE = (
    _PRELUDE
    + """
failures = redis.call('HINCRBY', KEYS[1], 'failures', 1)
local s = state()
local tripped = 0
if s == 'half_open' or (s == 'closed' and failures >= tonumber(ARGV[2])) then
  -- While open (cooldown running) a late failure changes nothing, as in process.
  open, nxt, tripped = true, now + tonumber(ARGV[3]), 1
  redis.call('HSET', KEYS[1], 'open', '1', 'next', n(nxt), 'probed', '0')
  redis.call('DEL', KEYS[2])
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return reply(tripped)
"""
)

READ = _PRELUDE + "\nreturn reply(0)\n"


class SharedBreaker:
    """A ``Breaker`` kept in Redis under ``name``. ``probe_ttl``: how long a probe claim
    outlives a replica that died holding it (the longest a call may take); ``sync``: see
    the module docstring. ``now``
    replaces Redis's clock (tests only); ``monotonic`` is this process's clock, for the
    state kept between reads."""

    def __init__(
        self,
        link: CoordinationLink,
        name: str,
        failure_threshold: int = 5,
        open_cooldown: float = 30.0,
        *,
        probe_ttl: float = 600.0,
        sync: float = 0.0,
        now: Callable[[], float] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.local = CircuitBreaker(failure_threshold, open_cooldown, monotonic)
        # Its changes reach metrics only while this replica runs on it (Redis down).
        self.local.on_change = self._local_changed
        self.failure_threshold = failure_threshold
        self.open_cooldown = open_cooldown
        self.on_change: Callable[[CircuitState], None] | None = None
        self._link = link
        base = f"{PREFIX}{{{name}}}"
        self._keys = [base, base + ":probe"]
        self._probe_ttl_ms = max(int(probe_ttl * 1000), 1)
        self._sync = min(max(sync, 0.0), open_cooldown / 2)
        self._read_at: float | None = None  # monotonic time of the last read from Redis
        self._now = now
        self._monotonic = monotonic
        # As last read from Redis: open, when a probe may go out (monotonic), failures.
        self._open = False
        self._next_probe_at: float | None = None
        self._failures = 0
        self._token: str | None = None  # this replica's probe claim, while it holds one
        self._on_local = False  # the last call ran on the in-process breaker

    @property
    def state(self) -> CircuitState:
        if self._on_local:
            return self.local.state
        if not self._open:
            return "closed"
        assert self._next_probe_at is not None
        return "half_open" if self._monotonic() >= self._next_probe_at else "open"

    @property
    def consecutive_failures(self) -> int:
        return self.local.consecutive_failures if self._on_local else self._failures

    def _clock(self) -> str:
        return "" if self._now is None else str(round(self._now() * US))

    def _seen(self, reply: Any) -> int:
        """Keep the state a script answered; returns its own answer."""
        answer, is_open, wait_us, failures = (int(x) for x in reply)
        self._open = bool(is_open)
        self._next_probe_at = self._monotonic() + wait_us / US if is_open else None
        self._failures = failures
        self._on_local = False
        self._read_at = self._monotonic()
        return answer

    def _fresh_and_clean(self) -> bool:
        """Read as closed with no failures within the last ``sync`` seconds."""
        read_at = self._read_at
        return (
            read_at is not None
            and not self._open
            and self._failures == 0
            and not self._on_local
            and self._monotonic() - read_at < self._sync
        )

    async def acquire(self) -> Permit | None:
        """``Breaker.acquire``: one round trip; the probe slot is claimed in Redis, so one
        replica probes (none while a closed state read within ``sync`` is fresh)."""
        if self._fresh_and_clean():
            return "call"
        token = secrets.token_hex(8)
        keys, args = self._keys, [self._clock(), self._probe_ttl_ms, token]
        reply = await self._link.call(lambda redis: run_script(redis, ACQUIRE, keys, args))
        if reply is LOCAL:
            self._on_local = True
            return await self.local.acquire()
        answer = self._seen(reply)
        if answer == 0:
            return None
        if answer == 1:
            return "call"
        self._token = token
        if answer == 3:
            self._changed("half_open")
        return "probe"

    async def release(self) -> None:
        token, self._token = self._token, None
        if token is None:  # the probe was the in-process breaker's
            await self.local.release()
            return
        await self._best_effort(RELEASE, [self._clock(), token])

    async def record_success(self) -> None:
        await self.local.record_success()
        if self._token is None and self._fresh_and_clean():
            return  # nothing to reset or close, as far as a fresh read knows
        self._token = None
        if await self._best_effort(SUCCESS, [self._clock()]) == 1:
            self._changed("closed")

    async def record_failure(self) -> None:
        await self.local.record_failure()
        self._token = None
        cooldown_us = round(self.open_cooldown * US)
        args = [self._clock(), self.failure_threshold, cooldown_us, KEEP_MS]
        if await self._best_effort(FAILURE, args) == 1:
            self._changed("open")

    async def refresh(self) -> None:
        await self._best_effort(READ, [self._clock()])

    async def _best_effort(self, script: str, args: list[object]) -> int | None:
        """The script's own answer (the state kept), or None while Redis is unreachable:
        a verdict or a read is never refused."""
        keys = self._keys
        reply = await self._link.attempt(lambda redis: run_script(redis, script, keys, args))
        return None if reply is None else self._seen(reply)

    def _local_changed(self, state: CircuitState) -> None:
        if self._on_local:
            self._changed(state)

    def _changed(self, state: CircuitState) -> None:
        if self.on_change is not None:
            self.on_change(state)

    def snapshot(self, wall_now: float | None = None) -> dict[str, Any]:
        """As ``CircuitBreaker.snapshot``, from the state last read (``refresh`` first)."""
        if self._on_local:
            return self.local.snapshot(wall_now)
        next_probe_in_s: float | None = None
        if self._next_probe_at is not None:
            next_probe_in_s = max(0.0, self._next_probe_at - self._monotonic())
        snap: dict[str, Any] = {
            "circuit": self.state,
            "consecutive_failures": self._failures,
            "next_probe_in_s": next_probe_in_s,
        }
        if wall_now is not None:
            snap["next_probe_at"] = None if next_probe_in_s is None else wall_now + next_probe_in_s
        return snap
