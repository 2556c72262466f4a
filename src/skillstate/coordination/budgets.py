"""The daily-budget holds of client keys in Redis, shared by every replica: the estimates
of each key's turns in flight (``auth.quota``), so that N replicas cannot each let through
a budget's worth.

One sorted set per key: member ``<hold id>:<estimate in USD>``, score the time it expires
(a replica that dies mid-turn cannot hold an estimate forever). ``HOLD`` drops the expired
holds, sums the rest and adds this one only if the spend read from the ledger, plus what is
held, plus this estimate stays within the budget: check and hold in one atomic script.
"""

from __future__ import annotations

import secrets
from typing import Any

from .link import HOLD_TTL, LOCAL, CoordinationLink
from .scripts import run_script

PREFIX = "skillstate:budget:"
RELEASED = "skillstate:budget-released:"

# A hold ends once its call's cost is in the ledger, and a reservation reads the ledger
# before its script runs: a hold released in between would be in neither, so the script
# also counts the holds released since the reservation began (ARGV 6: the server's TIME,
# read before the ledger). Released holds are remembered for 120 s (sorted set RELEASED,
# scored by release time): far longer than a reservation's ledger read (store_timeout).
# KEYS: 1 the holds, 2 the released. ARGV: 1 member, 2 spent, 3 estimate, 4 budget,
# 5 ttl (us), 6 since (us). Returns {held (0/1), USD held by other calls before this one,
# of which USD released since ARGV 6}.
HOLD = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now))
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', string.format('%.0f', now - 120000000))
local held, released = 0, 0
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  held = held + tonumber(string.match(m, ':(.*)$'))
end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[6], '+inf')) do
  released = released + tonumber(string.match(m, ':(.*)$'))
end
held = held + released
local spent, estimate, budget = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local shown = {string.format('%.17g', held), string.format('%.17g', released)}
if spent + held + estimate > budget then return {0, shown[1], shown[2]} end
local ttl = tonumber(ARGV[5])
redis.call('ZADD', KEYS[1], string.format('%.0f', now + ttl), ARGV[1])
redis.call('PEXPIRE', KEYS[1], string.format('%.0f', ttl / 1000))
return {1, shown[1], shown[2]}
"""

# KEYS: 1 the holds, 2 the released. ARGV: 1 member. A hold still there becomes a released
# one, scored by the server's time.
RELEASE = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  redis.call('ZADD', KEYS[2], string.format('%.0f', now), ARGV[1])
  redis.call('PEXPIRE', KEYS[2], 120000)
end
return 1
"""


class SharedHolds:
    """Budget holds in Redis (the ``BudgetHolds`` of ``cost.budgets``)."""

    def __init__(self, link: CoordinationLink, ttl: float = HOLD_TTL) -> None:
        self._link = link
        self._ttl_us = round(ttl * 1_000_000)

    async def mark(self) -> int | None:
        """The server's time (us), read before the ledger; None while Redis is down."""
        reply: Any = await self._link.call(lambda redis: redis.time())
        if reply is LOCAL:
            return None
        return int(reply[0]) * 1_000_000 + int(reply[1])

    async def hold(
        self, key: str, estimate: float, spent: float, budget: float, since: int
    ) -> tuple[str | None, float, float] | None:
        """(a hold id, held by others, of which released) if ``spent`` + held +
        ``estimate`` fits ``budget``, else (None, held by others, of which released); held
        counts the holds released since ``since`` (their cost may have reached the ledger
        after ``spent`` was read). None while Redis is down under ``local`` (hold in
        process instead)."""
        member = f"{secrets.token_hex(8)}:{estimate!r}"
        keys = [PREFIX + key, RELEASED + key]
        args: list[Any] = [member, repr(spent), repr(estimate), repr(budget), self._ttl_us, since]
        reply: Any = await self._link.call(lambda redis: run_script(redis, HOLD, keys, args))
        if reply is LOCAL:
            return None
        ok, held, released = int(reply[0]), float(reply[1]), float(reply[2])
        return (member if ok else None), held, released

    async def release(self, key: str, hold: str) -> None:
        """End the hold (idempotent). Redis unreachable: it expires on its own."""
        keys = [PREFIX + key, RELEASED + key]
        await self._link.attempt(lambda redis: run_script(redis, RELEASE, keys, [hold]))
