"""Per-session turn leases in Redis: one turn of a session at a time across replicas.

``SessionLeases`` is the pipeline's ``TurnLocks`` when ``coordination`` is set
(``skillstate.sessions.locks.SessionLocks`` without it). A turn's hold is a lease:

- **Acquire** (one script, one round trip): the lease key is set to a random token with
  ``PX lease_ttl`` when it is free and no earlier waiter is queued. The same script
  answers the step the session's last holder committed (kept in Redis by the release),
  so a replica can tell whether its cached copy of the session is current
  (``Hold.current``); a holder that never released (killed, partitioned) leaves that step
  unknown, and the store is read again.
- **Queue**: a turn that finds the lease taken takes a ticket in the session's queue (a
  sorted set ordered by a per-session counter) and tries again, first after 5 ms, then
  backing off to every 50 ms; a release on this replica wakes its own waiters at once. The
  lease goes to the lowest ticket whose waiter still polls: **first come, first served
  across replicas** (the order is the order the tickets were taken in Redis). A waiter
  that stops polling for ``STALE`` seconds (its replica died) loses its ticket. After
  ``lease_wait`` seconds the turn gives up with a 409 in its dialect (code
  ``session_busy``) and nothing was sent upstream.
- **Renewal**: while the turn runs, a task renews the lease every ``lease_ttl / 3`` (a
  script that extends it only if it still holds this turn's token). Turns shorter than
  that make no renewal: the happy path is two round trips (acquire, release).
- **Lost**: a lease whose renewal found another token, or that was not confirmed for
  ``lease_ttl`` (Redis unreachable, the process paused), is lost: ``Hold.check`` raises
  the turn's 409 (code ``lease_lost``) before it commits. The store's compare-and-set
  on the step remains the real guard (fencing): a commit over a newer step is a 409 too.
- **Release** (one script): deletes the lease if it still holds the token, and records
  the committed step (or forgets it when a commit failed halfway: ``Hold.unsure``).
- **Pause** (the TTL purge): a purge flag in Redis stops every replica from granting
  leases while the purge runs, and the purge leaves alone every session whose lease is
  live or queued (``pause_new`` yields them).

While Redis is unreachable the link's policy decides (``skillstate.coordination.link``):
``refuse`` gives the turn a 503, ``local`` falls back to this replica's ``SessionLocks``
(sessions are then serialised per replica only; the store's compare-and-set still refuses
a commit over a newer step).

Keys (prefix ``skillstate:``): per session ``{<session>}:lease``, ``:queue``, ``:seen``,
``:meta`` (the hash tag keeps one session's keys in one Redis Cluster slot); global
``leases`` (live and queued sessions, for the purge) and ``purging``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from ..cancelsafe import shielded, uncancellable
from ..errors import ProxyError
from ..sessions.locks import Hold, SessionLocks
from .link import LOCAL, CoordinationLink
from .scripts import run_script

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from ..store import SessionRecord

log = logging.getLogger("skillstate")

PREFIX = "skillstate:"
FIRST_POLL = 0.005  # seconds before a queued turn tries again, doubling up to POLL_MAX
POLL_MAX = 0.05
STALE = 2.0  # seconds without a poll after which a queued ticket is dropped
META_TTL = 86_400  # seconds a session's last committed step is kept in Redis after a release
UNKNOWN = -1  # "the step is not known": the store is read again

# KEYS: lease, queue, seen, meta, leases, purging
# ARGV: token, ttl ms, stale ms, session, meta ttl ms
# -> {1, step or -1} granted | {0, 0} queued (a ticket is taken on the first call)
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token, ttl, stale = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - stale)) do
  redis.call('ZREM', KEYS[2], w)
  redis.call('ZREM', KEYS[3], w)
end
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
if redis.call('EXISTS', KEYS[1]) == 0 and redis.call('EXISTS', KEYS[6]) == 0 then
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if head == nil or head == token then
    redis.call('SET', KEYS[1], token, 'PX', ttl)
    redis.call('ZREM', KEYS[2], token)
    redis.call('ZREM', KEYS[3], token)
    redis.call('ZADD', KEYS[5], now + ttl, ARGV[4])
    local meta = redis.call('HMGET', KEYS[4], 'step', 'held')
    redis.call('HSET', KEYS[4], 'held', token)
    redis.call('PEXPIRE', KEYS[4], ARGV[5])
    if meta[2] or not meta[1] then return {1, -1} end
    return {1, tonumber(meta[1])}
  end
end
if not redis.call('ZSCORE', KEYS[2], token) then
  local ticket = redis.call('HINCRBY', KEYS[4], 'tickets', 1)
  redis.call('PEXPIRE', KEYS[4], ARGV[5])
  redis.call('ZADD', KEYS[2], ticket, token)
end
redis.call('ZADD', KEYS[3], now, token)
redis.call('ZADD', KEYS[5], 'GT', now + stale, ARGV[4])
redis.call('PEXPIRE', KEYS[2], stale * 2)
redis.call('PEXPIRE', KEYS[3], stale * 2)
return {0, 0}
"""

# KEYS: lease, leases; ARGV: token, ttl ms, session -> 1 renewed | 0 not ours any more
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[3])
return 1
"""

# KEYS: lease, meta, leases; ARGV: token, step (-1 unknown, -2 unchanged), session, meta ttl
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[3], ARGV[3])
end
if redis.call('HGET', KEYS[2], 'held') == ARGV[1] then
  redis.call('HDEL', KEYS[2], 'held')
  local step = tonumber(ARGV[2])
  if step >= 0 then
    redis.call('HSET', KEYS[2], 'step', step)
  elseif step == -1 then
    redis.call('HDEL', KEYS[2], 'step')
  end
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
return 1
"""

# KEYS: purging, leases; ARGV: token, ttl ms -> {1, sessions live or queued} | {0}
_PAUSE = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {0} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
return {1, redis.call('ZRANGE', KEYS[2], 0, -1)}
"""

# KEYS: key; ARGV: token, ttl ms -> extends the key if it holds the token
_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

# KEYS: key; ARGV: token -> deletes the key if it holds the token
_DROP = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: lease, queue, seen, meta, leases; ARGV: token, session: a waiter that gives up
# leaves the queue at once, and gives back a lease granted by a reply it never read
_LEAVE = """
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[5], ARGV[2])
  if redis.call('HGET', KEYS[4], 'held') == ARGV[1] then redis.call('HDEL', KEYS[4], 'held') end
end
return 1
"""


def _keys(session: str) -> tuple[str, str, str, str]:
    tag = f"{PREFIX}{{{session}}}"
    return f"{tag}:lease", f"{tag}:queue", f"{tag}:seen", f"{tag}:meta"


LEASES = PREFIX + "leases"
PURGING = PREFIX + "purging"


class _Script:
    """One of the Lua scripts above, run like every coordination script
    (``scripts.run_script``: EVALSHA, EVAL when the server does not know it yet)."""

    def __init__(self, source: str) -> None:
        self.source = source

    async def __call__(self, *, keys: Sequence[str], args: Sequence[Any], client: Redis) -> Any:
        return await run_script(client, self.source, keys, args)


class _Scripts:
    """The lease scripts, by what they do."""

    def __init__(self) -> None:
        self.acquire = _Script(_ACQUIRE)
        self.renew = _Script(_RENEW)
        self.release = _Script(_RELEASE)
        self.pause = _Script(_PAUSE)
        self.drop = _Script(_DROP)
        self.extend = _Script(_EXTEND)
        self.leave = _Script(_LEAVE)


class Lease(Hold):
    """A turn's lease on its session (see the module docstring)."""

    def __init__(
        self,
        session: str,
        token: str,
        known_step: int,
        confirmed_until: float,
        session_ttl: float,
        clock: Callable[[], float],
    ) -> None:
        self.session = session
        self.token = token
        self.known_step = known_step  # what the last holder committed (UNKNOWN: not known)
        self.confirmed_until = confirmed_until  # monotonic: held at least until then
        self.lost = False  # a renewal found the lease taken by another token
        self.step_after: int | None = None  # the step to record on release (None: as before)
        self.renewals = 0
        self._session_ttl = session_ttl
        self._clock = clock

    def current(self, record: SessionRecord) -> bool:
        """Current when the last holder committed exactly this step, and the copy is not
        older than the session TTL (another replica's purge may have deleted it)."""
        return record.step == self.known_step and _fresh_enough(record, self._session_ttl)

    def check(self) -> None:
        if self.lost or self._clock() >= self.confirmed_until:
            raise ProxyError(
                "conflict",
                f"the turn's lease on session {self.session} was lost (not renewed within "
                "lease_ttl, e.g. the proxy was paused): the turn was not committed; retry it",
                code="lease_lost",
            )

    def committed(self, step: int) -> None:
        self.step_after = step

    def unsure(self) -> None:
        self.step_after = UNKNOWN


class SessionLeases:
    """``TurnLocks`` across replicas, on Redis leases (see the module docstring)."""

    def __init__(
        self,
        link: CoordinationLink,
        *,
        ttl: float,
        wait: float,
        session_ttl: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.link = link
        self.ttl = ttl
        self.wait = wait
        self.session_ttl = session_ttl
        self._clock = clock
        self._scripts = _Scripts()
        self._local = SessionLocks()  # while Redis is down under coordination_down=local
        self._here: dict[str, int] = {}  # session -> turns running or waiting here
        self._wake: dict[str, asyncio.Event] = {}  # session -> set when released here
        self._paused: asyncio.Event | None = None  # this replica's own purge is running

    def __len__(self) -> int:
        return len(self._here)

    async def current(self, record: SessionRecord) -> bool:
        """Whether ``record`` is at the step the session's last holder committed (one
        round trip). Unknown, or Redis unreachable: not current (read the store again)."""
        meta = _keys(record.session)[3]

        async def last(client: Redis) -> Any:
            return await client.hget(meta, "step")

        try:
            step = await self.link.call(last)
        except ProxyError:  # refused: Redis is down; the store's database still answers
            return False
        if step is LOCAL or step is None:
            return False
        return int(step) == record.step and _fresh_enough(record, self.session_ttl)

    @asynccontextmanager
    async def hold(self, session: str) -> AsyncIterator[Hold]:
        """Run the body alone for ``session`` across replicas (or, while Redis is down
        under ``local``, in this replica)."""
        while self._paused is not None:
            await self._paused.wait()
        self._here[session] = self._here.get(session, 0) + 1
        try:
            lease = await self._acquire(session)
            if lease is None:
                async with self._local.hold(session) as local:
                    yield local
                return
            renewal = asyncio.ensure_future(self._renew_forever(lease))
            try:
                yield lease
            finally:
                renewal.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await renewal  # a renewal that failed left the lease to expire: lost
                await shielded(self._release(lease))
        finally:
            users = self._here[session]
            if users <= 1:
                del self._here[session]
                self._wake.pop(session, None)  # nobody here waits for it any more
            else:
                self._here[session] = users - 1

    async def _acquire(self, session: str) -> Lease | None:
        """The lease, after waiting in the queue; None when running locally (Redis down
        under ``local``). Raises the 409 after ``lease_wait``, the 503 under ``refuse``;
        a turn that gives up (or is cancelled: its client went away) leaves the queue at
        once, so the turns behind it do not wait for its ticket to go stale."""
        token = secrets.token_hex(12)
        try:
            return await self._queue_for(session, token)
        except BaseException:
            await shielded(self._leave(session, token))
            raise

    async def _queue_for(self, session: str, token: str) -> Lease | None:
        keys = [*_keys(session), LEASES, PURGING]
        ttl_ms = max(int(self.ttl * 1000), 1)
        deadline = self._clock() + self.wait
        delay = FIRST_POLL
        args: list[str | int] = [token, ttl_ms, int(STALE * 1000), session, META_TTL * 1000]
        while True:
            sent = self._clock()

            async def acquire(client: Redis) -> Any:
                return await self._scripts.acquire(keys=keys, args=args, client=client)

            # Cancelled meanwhile (its client went away), the script may still run after
            # the leave sent on another connection, queueing the ticket (or taking the
            # lease) again: its answer is awaited first, and the leave follows it.
            answer = await uncancellable(self.link.call(acquire))
            if answer is LOCAL:
                return None
            granted, step = int(answer[0]), int(answer[1])
            if granted:
                return Lease(session, token, step, sent + self.ttl, self.session_ttl, self._clock)
            left = deadline - self._clock()
            if left <= 0:
                raise ProxyError(
                    "conflict",
                    f"session {session} is busy: another turn of it ran for the whole "
                    f"lease_wait ({self.wait:g} s); retry it later",
                    code="session_busy",
                    retry_after=1.0,
                )
            await self._nap(session, min(delay, left))
            delay = min(delay * 2, POLL_MAX)

    async def _nap(self, session: str, seconds: float) -> None:
        """Wait ``seconds``, or less when a turn of ``session`` is released here."""
        wake = self._wake.get(session)
        if wake is None:
            wake = self._wake[session] = asyncio.Event()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(wake.wait(), seconds)

    def _woken(self, session: str) -> None:
        wake = self._wake.pop(session, None)
        if wake is not None:
            wake.set()

    async def _leave(self, session: str, token: str) -> None:
        keys = [*_keys(session), LEASES]
        try:
            await self._scripts.leave(keys=keys, args=[token, session], client=self.link.client)
        except Exception:  # best effort: the ticket goes stale, a lease expires, on their own
            log.debug("session %s: leaving the lease queue failed", session, exc_info=True)

    async def _renew_forever(self, lease: Lease) -> None:
        """Renew every ttl/3 until cancelled or the lease is lost. Redis errors are
        reported to the link; the lease then expires on its own after ``confirmed_until``."""
        lease_key = _keys(lease.session)[0]
        ttl_ms = max(int(self.ttl * 1000), 1)
        while not lease.lost:
            await asyncio.sleep(self.ttl / 3)
            sent = self._clock()

            async def renew(client: Redis) -> Any:
                args: list[str | int] = [lease.token, ttl_ms, lease.session]
                return await self._scripts.renew(keys=[lease_key, LEASES], args=args, client=client)

            try:
                renewed = await self.link.attempt(renew)
            except Exception:
                log.exception("session %s: renewing the turn's lease", lease.session)
                lease.lost = True
                return
            if renewed is None:
                continue  # Redis unreachable: try again; the lease may expire meanwhile
            lease.renewals += 1
            if int(renewed):
                lease.confirmed_until = sent + self.ttl
            else:
                lease.lost = True
                log.warning(
                    "session %s: the turn's lease was lost (another holder has it)",
                    lease.session,
                )

    async def _release(self, lease: Lease) -> None:
        lease_key, _, _, meta = _keys(lease.session)
        step = -2 if lease.step_after is None else lease.step_after

        async def release(client: Redis) -> Any:
            args: list[str | int] = [lease.token, step, lease.session, META_TTL * 1000]
            return await self._scripts.release(
                keys=[lease_key, meta, LEASES], args=args, client=client
            )

        try:
            # Redis unreachable: nothing released, the lease expires on its own.
            await self.link.attempt(release)
        except Exception:
            log.exception("session %s: releasing the turn's lease", lease.session)
        self._woken(lease.session)

    @asynccontextmanager
    async def pause_new(self) -> AsyncIterator[frozenset[str]]:
        """Stop every replica from granting leases while the body runs (a purge flag in
        Redis, kept alive like a lease); yields the sessions whose lease is live or queued
        anywhere, and those running here on local locks."""
        while self._paused is not None:
            await self._paused.wait()
        gate = self._paused = asyncio.Event()
        try:
            async with self._local.pause_new() as local_busy:
                flag = await self._raise_flag()
                if flag is None:  # Redis down under ``local``: this replica only
                    yield local_busy | frozenset(self._here)
                    return
                token, busy = flag
                keeper = asyncio.ensure_future(self._keep_flag(token))
                try:
                    yield busy | local_busy | frozenset(self._here)
                finally:
                    keeper.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await keeper
                    await shielded(self._drop_flag(token))
        finally:
            self._paused = None
            gate.set()

    async def _raise_flag(self) -> tuple[str, frozenset[str]] | None:
        """The purge flag's token and the busy sessions, once no other replica purges
        (None when running locally)."""
        token = secrets.token_hex(12)
        ttl_ms = max(int(self.ttl * 1000), 1)
        while True:

            async def pause(client: Redis) -> Any:
                return await self._scripts.pause(
                    keys=[PURGING, LEASES], args=[token, ttl_ms], client=client
                )

            answer = await self.link.call(pause)
            if answer is LOCAL:
                return None
            if int(answer[0]):
                names = answer[1]
                return token, frozenset(n.decode() if isinstance(n, bytes) else n for n in names)
            await asyncio.sleep(POLL_MAX)  # another replica's purge: wait for its end

    async def _keep_flag(self, token: str) -> None:
        ttl_ms = max(int(self.ttl * 1000), 1)
        while True:
            await asyncio.sleep(self.ttl / 3)

            async def extend(client: Redis) -> Any:
                return await self._scripts.extend(
                    keys=[PURGING], args=[token, ttl_ms], client=client
                )

            await self.link.attempt(extend)

    async def _drop_flag(self, token: str) -> None:
        async def drop(client: Redis) -> Any:
            return await self._scripts.drop(keys=[PURGING], args=[token], client=client)

        await self.link.attempt(drop)  # unreachable: the flag expires within lease_ttl
        for session in list(self._wake):
            self._woken(session)


def _fresh_enough(record: SessionRecord, session_ttl: float) -> bool:
    """A copy older than the session TTL may have been purged by another replica."""
    return not (session_ttl > 0 and record.updated < time.time() - session_ttl)
