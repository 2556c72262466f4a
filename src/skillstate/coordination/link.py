"""The process's one link to Redis, and what happens while Redis is unreachable.

Interface (everything that coordinates through Redis goes through a ``CoordinationLink``):

- ``CoordinationLink.from_settings(settings)``: one per process (the runtime's). Without the
  ``coordination`` setting the link is not ``configured`` and nothing talks to Redis.
- ``await link.call(op)``: runs ``op(client)`` (a coroutine function taking the
  ``redis.asyncio.Redis`` client) and returns its result, or ``LOCAL`` when the caller must
  do the in-process equivalent instead. While Redis is unreachable (a connection error or
  a timeout, found out within ``coordination_timeout`` seconds), ``coordination_down`` decides:
  ``refuse`` raises the turn's 503 (``ProxyError``, code ``coordination_unavailable``,
  with Retry-After); ``local`` returns ``LOCAL`` and the replica runs degraded on its
  own locks, windows and breakers (``/health`` says so, and each change is logged once).
- While down, no call waits on the dead server: one call per ``RETRY_EVERY`` seconds
  tries it again (and ``/health``'s ``check`` tries it every time), so Redis coming back
  is picked up without a restart.
- ``await link.attempt(op)``: ``op(client)``'s result, or None when Redis is unreachable
  (or not configured); never refused. For what comes after a turn's upstream call or must
  not fail it: settling a window, a breaker's verdict, renewing or releasing a lease.
- ``link.errors``: the exception types that mean "Redis is unreachable" (for a caller
  that talks to the client outside ``call``/``attempt``: it reports them with
  ``link.failed(e)`` and a success with ``link.succeeded()``).
- ``await link.check(timeout)``: the ``coordination`` section of ``/health``.

Errors Redis itself answers with (a bad script, a wrong type) are bugs, not outages: they
propagate from ``call`` unchanged.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

from ..choices import CoordinationDown
from ..errors import ProxyError
from ..urltext import redacted

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from ..config import Settings

log = logging.getLogger("skillstate")
T = TypeVar("T")

TIMEOUT = 1.0  # default seconds a connect or a command may take before Redis counts as down
MAX_CONNECTIONS = 64  # per process; a call holds one for a round trip
RETRY_EVERY = 1.0  # seconds between tries while down (and the refusals' Retry-After)
# Seconds a budget hold in Redis outlives a replica that died holding it (``budgets``); here,
# without Redis's client, for what reads it in every process (``cost.pending``).
HOLD_TTL = 900.0


class _Local(enum.Enum):
    LOCAL = "LOCAL"


LOCAL: Final = _Local.LOCAL  # ``call``'s answer when the caller must run on in-process state


class CoordinationLink:
    """One Redis client for the process, whether Redis is reachable now, and the failure
    policy (see the module docstring)."""

    def __init__(
        self,
        url: str | None,
        policy: CoordinationDown = CoordinationDown.REFUSE,
        *,
        timeout: float = TIMEOUT,
        retry_every: float = RETRY_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.policy = policy
        self.retry_every = retry_every
        self._clock = clock
        self._client: Redis | None = None
        self.errors: tuple[type[BaseException], ...] = ()
        self._down: str | None = None  # why Redis is unreachable now, None while it answers
        self._retry_at = 0.0  # while down: when the next call may try Redis again
        self.outages = 0  # times Redis went from reachable to unreachable (for /metrics)
        if url is not None:
            self._client, self.errors = _client(url, timeout)

    @classmethod
    def from_settings(cls, settings: Settings) -> CoordinationLink:
        return cls(
            settings.coordination,
            settings.coordination_down,
            timeout=settings.coordination_timeout,
        )

    @property
    def configured(self) -> bool:
        """Whether a Redis URL is configured (else everything runs in-process)."""
        return self._client is not None

    @property
    def client(self) -> Redis:
        """The Redis client (only when ``configured``)."""
        if self._client is None:
            raise RuntimeError("no coordination configured")
        return self._client

    @property
    def up(self) -> bool:
        """Configured and, as far as the last call knows, reachable."""
        return self._client is not None and self._down is None

    @property
    def degraded(self) -> bool:
        """Whether this replica runs on local locks and limits now (Redis down, policy
        ``local``)."""
        return self._client is not None and self._down is not None and not self.refuses

    @property
    def refuses(self) -> bool:
        return self.policy == CoordinationDown.REFUSE

    def ready(self) -> bool:
        """Whether a call should try Redis now: while it is down, one call per
        ``retry_every`` does (the others go straight to the failure policy)."""
        if self._client is None:
            return False
        if self._down is None:
            return True
        now = self._clock()
        if now < self._retry_at:
            return False
        self._retry_at = now + self.retry_every
        return True

    async def call(self, op: Callable[[Redis], Awaitable[T]]) -> T | Literal[_Local.LOCAL]:
        """``op(client)``'s result, or ``LOCAL`` (no coordination configured, or Redis
        unreachable under ``local``); under ``refuse`` an unreachable Redis raises the
        503 ``ProxyError``."""
        if self._client is None:
            return LOCAL
        if self.ready():
            try:
                result = await op(self._client)
            except self.errors as e:
                self.failed(e)
            else:
                self.succeeded()
                return result
        return self.fallback()

    async def attempt(self, op: Callable[[Redis], Awaitable[T]]) -> T | None:
        """``op(client)``'s result, or None when Redis is not reachable now (or not
        configured): never refused, for what comes after a turn's call (settling a window,
        a breaker's verdict, releasing a hold) or only reads (snapshots)."""
        if self._client is None or not self.ready():
            return None
        try:
            result = await op(self._client)
        except self.errors as e:
            self.failed(e)
            return None
        self.succeeded()
        return result

    def fallback(self) -> Literal[_Local.LOCAL]:
        """``LOCAL`` under ``local``; under ``refuse``, raise the client's 503."""
        if self.refuses:
            raise self.unavailable()
        return LOCAL

    def unavailable(self) -> ProxyError:
        """The error a refused turn gets (503 in the client's dialect, with Retry-After)."""
        why = self._down or "unreachable"
        return ProxyError(
            "overloaded",
            f"the coordination service (Redis) is unreachable ({why}); the turn was not "
            "sent. Retry later",
            status=503,
            code="coordination_unavailable",
            retry_after=self.retry_every,
        )

    def failed(self, error: BaseException) -> None:
        """Redis did not answer (one of ``errors``): down until a later call succeeds."""
        why = f"{type(error).__name__}: {error}"[:200] or type(error).__name__
        was_up = self._down is None
        self._down = why
        self._retry_at = self._clock() + self.retry_every
        if was_up:
            self.outages += 1
            then = (
                "turns are refused with 503 (coordination_down=refuse)"
                if self.refuses
                else "this replica runs DEGRADED on its own locks, windows and breakers "
                "(coordination_down=local): limits hold per replica only"
            )
            log.warning("coordination: Redis at %s is unreachable (%s); %s", self.where, why, then)

    def succeeded(self) -> None:
        """Redis answered: back to normal if it was down."""
        if self._down is not None:
            self._down = None
            log.warning("coordination: Redis at %s answers again; coordination resumed", self.where)

    @property
    def where(self) -> str:
        return redacted(self.url) if self.url else "(none)"

    async def check(self, timeout: float) -> dict[str, Any]:
        """The ``coordination`` section of /health: ``redis`` is ``ok``, ``down: why`` or
        ``not configured``; ``degraded`` is whether this replica runs on local limits."""
        if self._client is None:
            return {"redis": "not configured", "degraded": False}
        client = self._client
        try:
            await asyncio.wait_for(client.ping(), timeout)
        except self.errors as e:
            self.failed(e)
        else:
            self.succeeded()
        return {
            "redis": "ok" if self._down is None else f"down: {self._down}",
            "degraded": self.degraded,
            "when_down": str(self.policy),
        }

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()


def _client(url: str, timeout: float) -> tuple[Redis, tuple[type[BaseException], ...]]:
    """A client with short timeouts and no retries of its own (a retry would multiply the
    time a dead server costs a turn), and the exceptions that mean "unreachable"."""
    try:
        import redis.asyncio as aioredis
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import InvalidResponse, ReadOnlyError
        from redis.exceptions import TimeoutError as RedisTimeoutError
    except ImportError as e:  # pragma: no cover - the scale extra is missing
        raise RuntimeError(
            "the coordination setting needs the redis package: "
            "pip install 'skillstate-proxy[scale]'"
        ) from e
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    # A blocking pool: a burst of concurrent turns waits (up to ``timeout``) for one of
    # MAX_CONNECTIONS connections, instead of the default pool's MaxConnectionsError past
    # 100, which would count as Redis being down.
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=MAX_CONNECTIONS,
        timeout=timeout,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
        health_check_interval=30,
    )
    client = aioredis.Redis.from_pool(pool)
    # InvalidResponse: something that is not Redis answers there; ReadOnlyError: a replica
    # (e.g. the old primary after a failover) that cannot take the writes.
    errors = (
        RedisConnectionError,
        RedisTimeoutError,
        InvalidResponse,
        ReadOnlyError,
        OSError,
        asyncio.TimeoutError,
    )
    return client, errors
