"""Rate windows (requests and tokens per minute) in Redis, shared by every replica: the
``RateLimits`` of ``skillstate.upstream.limits`` with exactly its semantics, for one upstream or one
client key.

Each window is a sorted set (member: a random entry id, score: the time it was recorded,
in microseconds); the token amounts and the running token total live in a hash beside it.
Two Lua scripts do the work, each atomic on the server:

- ``reserve`` drops the expired entries, checks both windows and, if the request fits,
  records it in both; otherwise it answers the exact wait (the entry whose expiry frees
  enough room), like ``RollingWindow.wait_for``. Never check-then-increment.
- ``settle`` replaces an entry's estimated tokens with the real ones, keeping its time (a
  no-op once it has expired).

The clock is Redis's own ``TIME`` (never older than the last recorded entry), so replicas
with skewed clocks agree. Every key expires one span after the last write: nothing is left
behind. Redis unreachable: ``coordination_down`` decides (``CoordinationLink.call``); under
``local`` this replica falls back to its own in-process windows until Redis answers again.
"""

from __future__ import annotations

import math
import secrets
from typing import Any

from ..upstream.limits import NEVER_FITS, Admission, Clock, Ticket, UpstreamLimits, admitted
from .link import LOCAL, CoordinationLink
from .scripts import lua_now_us, run_script

PREFIX = "skillstate:win:"
SPAN_US = 60_000_000  # the window, in microseconds (integers keep the arithmetic exact)
US = 1_000_000

# KEYS: 1 requests zset, 2 tokens zset, 3 hash (entry id -> tokens, "sum", "last").
# ARGV: 1 span (us), 2 now (us; "" = the server's TIME), then the script's own.
_PRELUDE = (
    "\nlocal span = tonumber(ARGV[1])"
    + lua_now_us(2)
    + """
local last = tonumber(redis.call('HGET', KEYS[3], 'last'))
if last and now < last then now = last end
-- Entries recorded at t count while now < t + span: drop those with t <= now - span.
local cutoff = n(now - span)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cutoff)
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', cutoff)
if #gone > 0 then
  local freed = 0
  for i = 1, #gone, 500 do
    local chunk = {unpack(gone, i, math.min(i + 499, #gone))}
    for _, a in ipairs(redis.call('HMGET', KEYS[3], unpack(chunk))) do
      freed = freed + (tonumber(a) or 0)
    end
    redis.call('HDEL', KEYS[3], unpack(chunk))
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', cutoff)
  redis.call('HINCRBY', KEYS[3], 'sum', n(-freed))
end
local count = redis.call('ZCARD', KEYS[1])
local sum = tonumber(redis.call('HGET', KEYS[3], 'sum')) or 0
"""
)

# ARGV: 3 entry id, 4 tokens, 5 rpm (0 = off), 6 tpm (0 = off).
# Returns {admitted (0/1), wait (us), requests in the window, tokens in the window}.
RESERVE = (
    _PRELUDE
    + """
local id, tokens, rpm, tpm = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local wait = 0
if rpm > 0 and count + 1 > rpm then
  -- the (count + 1 - rpm)-th oldest request frees the slot
  local e = redis.call('ZRANGE', KEYS[1], count - rpm, count - rpm, 'WITHSCORES')
  wait = tonumber(e[2]) + span - now
end
if tpm > 0 and sum + tokens > tpm then
  local excess = sum + tokens - tpm
  local start, frees = 0, nil
  while not frees do
    local page = redis.call('ZRANGE', KEYS[2], start, start + 199, 'WITHSCORES')
    if #page == 0 then return redis.error_reply('tpm window inconsistent') end
    local ids = {}
    for i = 1, #page, 2 do ids[#ids + 1] = page[i] end
    for i, a in ipairs(redis.call('HMGET', KEYS[3], unpack(ids))) do
      excess = excess - (tonumber(a) or 0)
      if excess <= 0 then frees = tonumber(page[2 * i]) break end
    end
    start = start + 200
  end
  local w = frees + span - now
  if w > wait then wait = w end
end
if wait > 0 then return {0, n(wait), count, n(sum)} end
if rpm > 0 then
  redis.call('ZADD', KEYS[1], n(now), id)
  count = count + 1
end
if tpm > 0 then
  redis.call('ZADD', KEYS[2], n(now), id)
  redis.call('HSET', KEYS[3], id, n(tokens))
  redis.call('HINCRBY', KEYS[3], 'sum', n(tokens))
  sum = sum + tokens
end
redis.call('HSET', KEYS[3], 'last', n(now))
local ttl = math.floor(span / 1000) + 1000
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ttl) end
return {1, 0, count, n(sum)}
"""
)

# ARGV: 3 entry id, 4 the real tokens. Returns {requests, tokens} in the window.
SETTLE = (
    _PRELUDE
    + """
local old = tonumber(redis.call('HGET', KEYS[3], ARGV[3]))
if old then
  local actual = tonumber(ARGV[4])
  redis.call('HSET', KEYS[3], ARGV[3], n(actual))
  redis.call('HINCRBY', KEYS[3], 'sum', n(actual - old))
  sum = sum + actual - old
end
return {count, n(sum)}
"""
)

# Returns {requests, tokens} in the window (after dropping the expired entries).
USAGE = _PRELUDE + "\nreturn {count, n(sum)}\n"


class SharedWindows:
    """``RateLimits`` kept in Redis under ``scope`` (e.g. ``upstream:NAME``), shared by
    every replica that uses the same scope. ``now`` replaces Redis's clock (tests only)."""

    def __init__(
        self,
        link: CoordinationLink,
        scope: str,
        rpm: int | None,
        tpm: int | None,
        *,
        now: Clock | None = None,
        local: UpstreamLimits | None = None,
    ) -> None:
        self.local = local or UpstreamLimits(rpm, tpm)  # while Redis is down (policy local)
        self.rpm = self.local.rpm
        self.tpm = self.local.tpm
        self._link = link
        # One hash tag: the three keys live on the same Redis Cluster slot.
        base = f"{PREFIX}{{{scope}}}"
        self._keys = [base + ":r", base + ":t", base + ":a"]
        self._now = now
        self._used: tuple[int, int] = (0, 0)  # requests, tokens: as last read from Redis
        self._on_local = False  # the last answer came from the in-process fallback

    def _args(self, *more: object) -> list[object]:
        now = "" if self._now is None else str(round(self._now() * US))
        return [SPAN_US, now, *more]

    async def _run(self, script: str, args: list[object]) -> Any:
        """The script's reply, or ``LOCAL`` (Redis down under ``local``; under ``refuse``
        the link raises the turn's 503)."""
        return await self._link.call(lambda redis: run_script(redis, script, self._keys, args))

    async def reserve(self, tokens: int) -> Admission:
        """``RateLimits.reserve``, in one atomic script on Redis (one round trip)."""
        if tokens < 0:
            raise ValueError("tokens must be >= 0")
        if self.tpm is not None and tokens > self.tpm:
            return NEVER_FITS
        if self.rpm is None and self.tpm is None:
            return admitted(Ticket(tokens, None))
        entry = secrets.token_hex(8)
        reply = await self._run(RESERVE, self._args(entry, tokens, self.rpm or 0, self.tpm or 0))
        if reply is LOCAL:
            self._on_local = True
            return await self.local.reserve(tokens)
        self._on_local = False
        ok, wait_us, requests, used = (int(x) for x in reply)
        self._used = (requests, used)
        if not ok:
            return Admission(ok=False, retry_after=_seconds(wait_us), never_fits=False)
        return admitted(Ticket(tokens, entry if self.tpm is not None else None))

    async def settle(self, ticket: Ticket, actual_tokens: int) -> None:
        """``RateLimits.settle``: an in-process ticket (taken while Redis was down) settles
        locally; a shared one in Redis, unless nothing changes. Redis unreachable: the
        estimate stays (the turn is over; refusing it now would help nobody)."""
        if actual_tokens < 0:
            raise ValueError("amount must be >= 0")
        entry = ticket.token_entry
        if not isinstance(entry, str):
            await self.local.settle(ticket, actual_tokens)
            return
        if actual_tokens == ticket.estimated_tokens:
            return
        reply = await self._best_effort(SETTLE, self._args(entry, actual_tokens))
        if reply is not None:
            self._used = (int(reply[0]), int(reply[1]))

    async def refresh(self) -> None:
        """Read the windows' usage from Redis (for /health and /metrics)."""
        if self.rpm is None and self.tpm is None:
            return
        reply = await self._best_effort(USAGE, self._args())
        if reply is not None:
            self._on_local = False
            self._used = (int(reply[0]), int(reply[1]))

    async def _best_effort(self, script: str, args: list[object]) -> Any:
        """The script's reply, or None while Redis is unreachable (never a refusal: used
        after a turn, or for a snapshot)."""
        return await self._link.attempt(lambda redis: run_script(redis, script, self._keys, args))

    def snapshot(self) -> dict[str, Any]:
        """The usage last read from Redis (``refresh`` first for a current one); while
        running on the in-process fallback, that one's."""
        if self._on_local:
            return self.local.snapshot()
        requests, tokens = self._used
        return {
            "rpm": None if self.rpm is None else {"limit": self.rpm, "used": requests},
            "tpm": None if self.tpm is None else {"limit": self.tpm, "used": tokens},
        }


def _seconds(wait_us: int) -> float:
    # Smallest float of seconds that, scaled back, is not short of the wait in microseconds.
    seconds = wait_us / US
    while seconds * US < wait_us:
        seconds = math.nextafter(seconds, math.inf)
    return seconds
