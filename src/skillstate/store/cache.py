"""The session cache both store backends keep: sessions as their stored bytes, least
recently used evicted, bounded by count and by bytes.

A cached copy is only as good as the store's knowledge that nobody else committed: SQLite
is the only writer of its file; a PostgreSQL store shared by replicas keeps one only when
the turn's lease verifies each copy's step (``skillstate.sessions.locks.Hold.current``)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

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
    cost: int = field(init=False, compare=False)  # worked out once: a commit reads it 3 times

    def __post_init__(self) -> None:
        cost = len(self.state) + sum(len(k) for k in self.schema) + 200  # + entry overhead
        object.__setattr__(self, "cost", cost)

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


_UNKNOWN = object()


class BudgetCache:
    """The session budgets a store read lately (None too: no budget), least recently used
    evicted past ``max_sessions``, so that a turn's budget costs no database read.

    Only for a store that is the only writer of its database (SQLite): a budget written
    elsewhere would never be seen. A read that a budget write overlapped may carry the old
    value, so ``remember`` keeps a read only when no write started since it did (``epoch``)."""

    def __init__(self, max_sessions: int) -> None:
        self._entries: OrderedDict[str, float | None] = OrderedDict()
        self._max_sessions = max(max_sessions, 1)
        self.epoch = 0  # changes with every budget write (see ``changed``)

    def get(self, session: str) -> tuple[bool, float | None]:
        """(known, budget): known False means read it from the database."""
        usd = self._entries.get(session, _UNKNOWN)
        if usd is _UNKNOWN:
            return False, None
        self._entries.move_to_end(session)
        return True, usd  # type: ignore[return-value]

    def remember(self, session: str, usd: float | None, epoch: int) -> None:
        """Keep what a read that started at ``epoch`` found, unless a write came since."""
        if epoch != self.epoch:
            return
        self._entries[session] = usd
        self._entries.move_to_end(session)
        while len(self._entries) > self._max_sessions:
            self._entries.popitem(last=False)

    def changed(self, session: str | None = None) -> None:
        """A write of ``session``'s budget (None: of any number of them) starts or ended:
        its cached value goes, and the reads in flight are not kept."""
        self.epoch += 1
        if session is None:
            self._entries.clear()
        else:
            self._entries.pop(session, None)
