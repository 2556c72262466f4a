"""The runtime the routes share: settings, store, upstream pool and pipeline, created by
``create_app`` and opened/closed by its lifespan. Handlers find it on ``request.app.state``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request

from ..auth.gate import KeyBook
from ..auth.keys import KeyHasher, server_secret
from ..auth.quota import KeyQuotas
from ..compaction.pinned import PinnedStates
from ..config import Settings
from ..coordination.link import CoordinationLink
from ..cost.budgets import Budgets
from ..cost.pending import PendingCalls
from ..cost.pricing import PriceBook
from ..cost.worstcase import WorstCase
from ..observability.telemetry import Telemetry
from ..sessions.locks import TurnLocks
from ..sessions.operator import SessionOperator
from ..store import Store, StoreError
from ..store.factory import make_store
from ..turn.pipeline import Pipeline
from ..upstream.client import UpstreamPool

log = logging.getLogger("skillstate")


class Runtime:
    """Everything the routes share, created and closed by the app's lifespan."""

    def __init__(
        self,
        settings: Settings,
        store: Store | None = None,
        tracer_provider: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        # /metrics and, when configured, OpenTelemetry traces (``tracer_provider``: a test's).
        self.telemetry = Telemetry(settings, tracer_provider)
        self.store: Store = store or make_store(settings, exclusive=True)
        # Redis, shared by replicas (``coordination``); not configured: all in-process.
        self.coordination = CoordinationLink.from_settings(settings)
        self.pool = UpstreamPool(settings, telemetry=self.telemetry, link=self.coordination)
        prices = PriceBook.from_config(settings.prices, settings.upstreams)
        self.pipeline = Pipeline(settings, self.store, self.pool, prices, _turn_locks(self))
        # Each named session's last transcript: the request checks skip what it had
        # (skillstate.sessions.transcripts), and the planner's results reuse it.
        self.transcripts = self.pipeline.planner.transcripts
        # The states compaction tokens pin (skillstate.compaction.pinned).
        self.pinned_states = PinnedStates(self.store, settings.initial_state)
        # The operator's reads and changes (/state, the TTL purge), under the turns' locks.
        self.sessions = SessionOperator(settings, self.store, self.pipeline.locks)
        # A shared store keeps the secret itself (every replica hashes keys alike): until
        # the lifespan reads it, a random one that matches no stored key.
        local = self.store.home is not None
        secret = server_secret(settings.data_dir) if local else secrets.token_bytes(32)
        self.keys = KeyBook(self.store, KeyHasher(secret), settings)
        self.quotas = KeyQuotas(link=self.coordination)
        # ``clock``: the wall clock of the keys' daily budgets (a test's, to roll the day over).
        worst = WorstCase.of(prices, settings)
        # Each budgeted call's pending row, written before it is sent (``cost.pending``).
        self.pending = PendingCalls(shared_holds=self.coordination.configured)
        self.budgets = Budgets(
            self.store,
            worst,
            self.coordination,
            clock,
            ledger=self.pipeline.ledger,
            pending=self.pending,
        )

    async def settle_pending(self) -> None:
        """Mark the pending rows of dead processes interrupted (best effort: unmarked, a
        budget counts them all the same)."""
        exclusive = self.store.home is not None  # SQLite: one process's (a data-dir lock)
        try:
            settled = await self.store.settle_pending(
                self.pending.dead_before(time.time(), exclusive)
            )
        except StoreError as e:
            log.warning("pending ledger rows not settled: %s", e)
            return
        if settled:
            log.warning(
                "ledger: %d call(s) cut by a proxy that stopped with them out, charged their"
                " worst case (pricing: interrupted)",
                settled,
            )

    async def purge_forever(self) -> None:
        """Drop expired sessions, old ledger rows and replies kept past ``idempotency_ttl``,
        every ``purge_interval`` seconds."""
        s = self.settings
        while True:
            now = time.time()
            # A purge that fails for any reason is tried again next interval: one failure
            # (a store or Redis outage, a bug) must not end the purges until a restart.
            try:
                if s.session_ttl > 0:
                    await self.sessions.purge_expired(now - s.session_ttl)
                if s.ledger_retention > 0:
                    await self.store.purge_ledger(now - s.ledger_retention)
                await self.store.purge_kept_replies(now - s.idempotency_ttl)
                if self.store.home is None:  # a shared store: replicas that died since
                    await self.settle_pending()
            except StoreError as e:
                log.warning("purge skipped: %s", e)
            except Exception as e:
                log.error(
                    "purge failed (%s: %s); trying again in %gs",
                    type(e).__name__,
                    e,
                    s.purge_interval,
                )
            await asyncio.sleep(s.purge_interval)


def _turn_locks(rt: Runtime) -> TurnLocks | None:
    """Redis leases when coordination is configured; else the pipeline's own locks."""
    if not rt.coordination.configured:
        return None
    from ..coordination.leases import SessionLeases

    s = rt.settings
    return SessionLeases(
        rt.coordination, ttl=s.lease_ttl, wait=s.lease_wait, session_ttl=s.session_ttl
    )


INSECURE_WARNING = (
    "WARNING: --insecure-no-auth: listening on %s with NO client keys; anyone who reaches "
    "this port spends the upstream keys and reads every session's state"
)


def runtime(request: Request) -> Runtime:
    """The runtime of the app serving ``request``."""
    rt: Runtime = request.app.state.runtime
    return rt


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    """Open the store and the pool; on shutdown, let pending ledger writes land first."""
    rt: Runtime = app.state.runtime
    await rt.store.open()
    await rt.settle_pending()
    shared = await rt.store.shared_secret()
    if shared is not None:
        rt.keys.hasher = KeyHasher(shared)
    await rt.pool.open()
    if not await rt.keys.refresh_mode() and rt.settings.insecure_no_auth:
        log.warning(INSECURE_WARNING, rt.settings.host)
    purge = asyncio.ensure_future(rt.purge_forever())
    try:
        yield
    finally:
        purge.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await purge
        await rt.pool.close()
        await rt.pipeline.settle()
        await rt.budgets.unsettled.close()
        await rt.store.close()
        await rt.coordination.close()
        # The exporter's last batch may wait on a slow collector: not on the event loop.
        await asyncio.to_thread(rt.telemetry.close)
