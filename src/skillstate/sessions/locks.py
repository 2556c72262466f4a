"""Per-session turn serialisation (session ids live in skillstate.sessions.ids).

``TurnLocks`` is what the pipeline holds a session with: ``SessionLocks`` (here, one
process) or ``skillstate.coordination.leases.SessionLeases`` (Redis leases shared by
replicas). Both yield a ``Hold`` the turn reports its commit to."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..store.records import SessionRecord


class Hold:
    """A turn's hold on its session, and what the turn tells it. In one process (this
    class) the hold cannot be lost and the store's cached copy is always current; a Redis
    lease (``skillstate.coordination.leases``) can be lost, and knows the step the last
    holder committed, whichever replica that was."""

    def current(self, record: SessionRecord) -> bool:
        """Whether ``record`` (as the store loaded it, maybe from its cache) is the
        session's latest committed state; when not, the caller reloads it from the store."""
        return True

    def check(self) -> None:
        """Raise the turn's 409 (``ProxyError`` conflict) when the hold was lost: checked
        right before commit. (The store's compare-and-set on the step stays the guard.)"""

    def committed(self, step: int) -> None:
        """The session is at ``step`` now (0: deleted), committed by this holder."""

    def unsure(self) -> None:
        """A commit failed in a way that leaves the session's step unknown here."""


LOCAL_HOLD = Hold()  # SessionLocks' holds: nothing to report


class TurnLocks(Protocol):
    """Per-session turn serialisation (see the module docstring)."""

    def hold(self, session: str) -> AbstractAsyncContextManager[Hold]:
        """Run the body alone for ``session`` (waiting for any turn of it in flight)."""
        ...

    def pause_new(self) -> AbstractAsyncContextManager[frozenset[str]]:
        """Hold back new holds while the body runs; yields the sessions held or waited for
        now, which the body must leave alone."""
        ...

    def __len__(self) -> int:
        """Sessions with a turn running or waiting here."""
        ...

    async def current(self, record: SessionRecord) -> bool:
        """Whether ``record``, loaded without holding its session (a ``GET /state``), is
        the session's latest committed state; when not, the caller reads the store again."""
        ...


class SessionLocks:
    """One lock per live session, so a whole logical turn (load, upstream call, validate,
    commit) runs alone for its session while different sessions run concurrently.
    Locks are dropped when nobody holds or waits for them, so memory stays bounded."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._paused: asyncio.Event | None = None  # set when a ``pause_new`` body ends

    @asynccontextmanager
    async def hold(self, session: str) -> AsyncIterator[Hold]:
        """Run the body alone for ``session`` (waiting for any turn of it in flight)."""
        while self._paused is not None:
            await self._paused.wait()
        lock, users = self._locks.get(session, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[session] = (lock, users + 1)
        try:
            async with lock:
                yield LOCAL_HOLD
        finally:
            lock, users = self._locks[session]
            if users <= 1:
                del self._locks[session]
            else:
                self._locks[session] = (lock, users - 1)

    @asynccontextmanager
    async def pause_new(self) -> AsyncIterator[frozenset[str]]:
        """Hold back every new ``hold`` while the body runs; yields the sessions held or
        waited for now, which the body must leave alone (e.g. the TTL purge: deleting a
        session under its running turn would make that turn's commit a conflict)."""
        while self._paused is not None:
            await self._paused.wait()
        gate = self._paused = asyncio.Event()
        try:
            yield frozenset(self._locks)
        finally:
            self._paused = None
            gate.set()

    def __len__(self) -> int:
        return len(self._locks)

    async def current(self, record: SessionRecord) -> bool:
        return True  # one process: the store's cache has every commit
