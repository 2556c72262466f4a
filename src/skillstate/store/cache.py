"""The session cache both store backends keep: sessions as their stored bytes, least
recently used evicted, bounded by count and by bytes.

A cached copy is only as good as the store's knowledge that nobody else committed: SQLite
is the only writer of its file; a PostgreSQL store shared by replicas keeps one only when
the turn's lease verifies each copy's step (``skillstate.sessions.locks.Hold.current``)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import orjson

from .records import SessionRecord


@dataclass(frozen=True, slots=True)
class CachedSession:
    """A cached session as its stored bytes: what it costs in memory is exactly known
    (a parsed state can take 20x its JSON size), and each load gets its own copy."""

    state: bytes
    schema: list[str]
    step: int
    created: float
    updated: float

    @property
    def cost(self) -> int:
        return len(self.state) + sum(len(k) for k in self.schema) + 200  # + entry overhead

    def record(self, session: str) -> SessionRecord:
        return SessionRecord(
            session, orjson.loads(self.state), self.schema, self.step, self.created,
            self.updated, len(self.state),
        )  # fmt: skip


class SessionCache:
    """Write-through cache of hot sessions: at most ``max_sessions`` of them and
    ``max_bytes`` of their stored size (0: nothing is cached)."""

    def __init__(self, max_sessions: int, max_bytes: int) -> None:
        self._entries: OrderedDict[str, CachedSession] = OrderedDict()
        self._max_sessions = max_sessions
        self._max_bytes = max_bytes
        self.bytes = 0  # what it holds now

    def get(self, session: str) -> CachedSession | None:
        entry = self._entries.get(session)
        if entry is not None:
            self._entries.move_to_end(session)
        return entry

    def remember(self, session: str, entry: CachedSession) -> None:
        self.forget(session)
        if entry.cost > self._max_bytes:
            return  # bigger than the whole cache: loads read it from the database
        self._entries[session] = entry
        self.bytes += entry.cost
        while len(self._entries) > self._max_sessions or self.bytes > self._max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= evicted.cost

    def forget(self, session: str) -> None:
        old = self._entries.pop(session, None)
        if old is not None:
            self.bytes -= old.cost

    def committed(
        self, session: str, state: bytes | None, schema: list[str], step: int, now: float
    ) -> None:
        """A commit of ``session`` at ``step`` landed (``state`` None: unchanged)."""
        prev = self._entries.get(session)
        if prev is not None:
            blob = state if state is not None else prev.state
            self.remember(session, CachedSession(blob, schema, step, prev.created, now))
        elif state is not None:
            self.remember(session, CachedSession(state, schema, step, now, now))
