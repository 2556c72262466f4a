"""The embedded store: stdlib sqlite3 in WAL mode, used from one dedicated thread so that no
SQLite call ever blocks the event loop.

Durability: WAL with synchronous=NORMAL. A committed transaction is in the WAL file (in the
OS page cache at least) before commit() returns, so it survives kill -9 of the proxy; only a
power loss can lose the last transactions. Set `synchronous=FULL` to cover that too.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import orjson

from ..ledger import LedgerRow
from .base import SessionRecord, StepConflict, StoreError, TransitionRecord

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    state BLOB NOT NULL,
    schema TEXT NOT NULL,
    step INTEGER NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_updated ON sessions(updated);
CREATE TABLE IF NOT EXISTS transitions (
    session TEXT NOT NULL,
    step INTEGER NOT NULL,
    patch BLOB,
    action TEXT,
    status TEXT NOT NULL,
    errors TEXT NOT NULL,
    ts REAL NOT NULL,
    PRIMARY KEY (session, step)
);
CREATE TABLE IF NOT EXISTS ledger (
    ts REAL NOT NULL,
    session TEXT,
    upstream TEXT,
    model TEXT,
    kind TEXT NOT NULL,
    status INTEGER NOT NULL,
    input_tokens INTEGER,
    output_tokens INTEGER,
    cache_read_tokens INTEGER,
    cache_write_tokens INTEGER,
    pricing TEXT NOT NULL,
    cost_usd REAL,
    baseline_input_tokens INTEGER,
    baseline_cost_usd REAL,
    mode TEXT
);
CREATE INDEX IF NOT EXISTS ledger_ts ON ledger(ts);
CREATE INDEX IF NOT EXISTS ledger_session ON ledger(session, ts);
"""


def prepare_path(path: Path) -> None:
    """A private directory (0700, when we create it) and a private file (0600). State may
    be sensitive; SQLite's WAL and SHM files inherit the database file's mode."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.close(fd)
    os.chmod(path, 0o600)


# Data-dir locks this process holds: lock file -> [descriptor, holds]. Re-entrant, so the
# CLI's pre-flight check can keep its hold until exit while the store takes its own.
_held: dict[str, list[int]] = {}


def lock_data_dir(path: Path) -> None:
    """Take an exclusive lock on ``<db>.lock`` (released by :func:`unlock_data_dir` or when
    the process dies). The proxy's session cache assumes it is the only writer, so a second
    proxy on the same data dir must not start; readers (``skillstate cost``) need no lock.
    """
    name = os.path.realpath(f"{path}.lock")
    if name in _held:
        _held[name][1] += 1
        return
    fd = os.open(name, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise StoreError(
            f"{path.parent} is in use by another skillstate proxy (pid {holder});"
            " give each proxy its own data_dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _held[name] = [fd, 1]


def unlock_data_dir(path: Path) -> None:
    name = os.path.realpath(f"{path}.lock")
    hold = _held.get(name)
    if hold is None:
        return
    hold[1] -= 1
    if hold[1] == 0:
        del _held[name]
        os.close(hold[0])


_LEDGER_COLUMNS = [f.name for f in fields(LedgerRow)]


def _ledger_tuple(row: LedgerRow) -> tuple[Any, ...]:
    # Much cheaper than dataclasses.astuple (no deep copy); this runs on every turn.
    return tuple(getattr(row, name) for name in _LEDGER_COLUMNS)


_LEDGER_INSERT = (
    f"INSERT INTO ledger ({', '.join(_LEDGER_COLUMNS)})"
    f" VALUES ({', '.join('?' * len(_LEDGER_COLUMNS))})"
)


class SQLiteStore:
    def __init__(
        self,
        path: Path,
        *,
        synchronous: str = "NORMAL",
        cache_sessions: int = 4096,
        exclusive: bool = False,
    ) -> None:
        self.path = path
        self._exclusive = exclusive  # hold the data dir's lock while open (see lock_data_dir)
        self._locked = False
        self._synchronous = synchronous
        # Write-through cache of hot sessions: a turn's load needs no thread hop. The store
        # assumes it is the only writer of its database (one proxy per data dir).
        self._cache: OrderedDict[str, SessionRecord] = OrderedDict()
        self._cache_max = cache_sessions
        self._exec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="skillstate-sqlite")
        self._db: sqlite3.Connection | None = None
        # Group commit: writes that arrive while a batch is being written go together in
        # the next transaction (one thread hop for all of them). Each still gets its own
        # savepoint, so one failed write does not undo the others.
        self._queue: list[tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any]]] = []
        self._writing = False

    # -- plumbing -------------------------------------------------------------------------

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            if self._db is None:
                raise StoreError("store is closed")
            try:
                return fn(self._db)
            except sqlite3.Error as e:
                raise StoreError(f"sqlite: {e}") from e

        return await asyncio.get_running_loop().run_in_executor(self._exec, call)

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` inside a write transaction; returns once that transaction committed."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._queue.append((fn, fut))
        if not self._writing:
            self._flush(loop)
        return await fut

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        batch, self._queue = self._queue, []
        self._writing = True
        self._exec.submit(self._write_batch, batch, loop)

    def _write_batch(
        self,
        batch: list[tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any]]],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        results: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        db = self._db
        try:
            if db is None:
                raise StoreError("store is closed")
            db.execute("BEGIN IMMEDIATE")
            for fn, fut in batch:
                db.execute("SAVEPOINT w")
                try:
                    results.append((fut, fn(db), None))
                    db.execute("RELEASE w")
                except (StoreError, sqlite3.Error) as e:
                    db.execute("ROLLBACK TO w")
                    db.execute("RELEASE w")
                    err = e if isinstance(e, StoreError) else StoreError(f"sqlite: {e}")
                    results.append((fut, None, err))
            db.execute("COMMIT")
        except (StoreError, sqlite3.Error) as e:
            if db is not None and db.in_transaction:
                db.execute("ROLLBACK")
            err = e if isinstance(e, StoreError) else StoreError(f"sqlite: {e}")
            results = [(fut, None, err) for _, fut in batch]
        loop.call_soon_threadsafe(self._settle, results, loop)

    def _settle(
        self,
        results: list[tuple[asyncio.Future[Any], Any, BaseException | None]],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        for fut, value, err in results:
            if fut.done():
                continue  # the waiter was cancelled; the write happened all the same
            if err is not None:
                fut.set_exception(err)
            else:
                fut.set_result(value)
        self._writing = False
        if self._queue:
            self._flush(loop)

    def _open_sync(self) -> None:
        prepare_path(self.path)
        if self._exclusive and not self._locked:
            lock_data_dir(self.path)
            self._locked = True
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={self._synchronous}")
        db.execute("PRAGMA busy_timeout=5000")
        db.executescript(_SCHEMA)
        self._db = db

    async def open(self) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(self._exec, self._open_sync)
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"cannot open store {self.path}: {e}") from e

    async def close(self) -> None:
        def close(db: sqlite3.Connection) -> None:
            db.close()
            self._db = None

        while self._writing or self._queue:  # let queued writes land first
            await asyncio.sleep(0.005)
        if self._db is not None:
            await self._run(close)
        self._exec.shutdown(wait=True)
        if self._locked:
            unlock_data_dir(self.path)
            self._locked = False

    async def ping(self) -> bool:
        try:
            return await self._run(lambda db: db.execute("SELECT 1").fetchone() == (1,))
        except StoreError:
            return False

    # -- sessions -------------------------------------------------------------------------

    def _remember(self, rec: SessionRecord) -> None:
        self._cache[rec.session] = rec
        self._cache.move_to_end(rec.session)
        if len(self._cache) > self._cache_max:
            self._cache.popitem(last=False)

    async def load(self, session: str) -> SessionRecord | None:
        cached = self._cache.get(session)
        if cached is not None:
            self._cache.move_to_end(session)
            return cached
        rec = await self._run(self._load_sync(session))
        if rec is not None:
            self._remember(rec)
        return rec

    @staticmethod
    def _load_sync(session: str) -> Callable[[sqlite3.Connection], SessionRecord | None]:
        def load(db: sqlite3.Connection) -> SessionRecord | None:
            row = db.execute(
                "SELECT state, schema, step, created, updated FROM sessions WHERE id = ?",
                (session,),
            ).fetchone()
            if row is None:
                return None
            state, schema, step, created, updated = row
            return SessionRecord(
                session, orjson.loads(state), orjson.loads(schema), step, created, updated,
                len(state),
            )  # fmt: skip

        return load

    async def commit(
        self,
        session: str,
        *,
        expected_step: int,
        state: dict[str, Any] | None,
        schema: list[str],
        transition: TransitionRecord,
        now: float,
        ledger: list[LedgerRow] | None = None,
    ) -> int:
        ledger_values = [_ledger_tuple(r) for r in ledger or []]
        state_blob = orjson.dumps(state) if state is not None else None
        patch_blob = orjson.dumps(transition.patch) if transition.patch is not None else None
        errors = orjson.dumps(transition.errors).decode()

        def commit(db: sqlite3.Connection) -> int:
            # Runs inside the group-commit transaction (see _write).
            row = db.execute("SELECT step FROM sessions WHERE id = ?", (session,)).fetchone()
            current = row[0] if row else 0
            if current != expected_step:
                moved = f"session {session} moved from step {expected_step} to {current}"
                raise StepConflict(moved)
            step = current + 1
            if row is None:
                db.execute(
                    "INSERT INTO sessions (id, state, schema, step, created, updated)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (session, state_blob or b"{}", orjson.dumps(schema), step, now, now),
                )
            elif state_blob is not None:
                db.execute(
                    "UPDATE sessions SET state = ?, step = ?, updated = ? WHERE id = ?",
                    (state_blob, step, now, session),
                )
            else:
                db.execute(
                    "UPDATE sessions SET step = ?, updated = ? WHERE id = ?",
                    (step, now, session),
                )
            db.execute(
                "INSERT INTO transitions (session, step, patch, action, status, errors, ts)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (session, step, patch_blob, transition.action, transition.status, errors, now),
            )
            if ledger_values:
                db.executemany(_LEDGER_INSERT, ledger_values)
            return step

        try:
            step = await self._write(commit)
        except StoreError:
            # The cached copy may be what is stale (the database moved on): reload next time.
            self._cache.pop(session, None)
            raise
        prev = self._cache.get(session)
        if prev is not None:
            self._remember(
                SessionRecord(
                    session,
                    state if state is not None else prev.state,
                    schema,
                    step,
                    prev.created,
                    now,
                    len(state_blob) if state_blob is not None else prev.state_bytes,
                )
            )
        elif state is not None and state_blob is not None:
            self._remember(SessionRecord(session, state, schema, step, now, now, len(state_blob)))
        return step

    async def list_sessions(self) -> list[dict[str, Any]]:
        def list_(db: sqlite3.Connection) -> list[dict[str, Any]]:
            rows = db.execute(
                "SELECT id, step, updated, length(state) FROM sessions ORDER BY updated DESC"
            ).fetchall()
            return [
                {"session": r[0], "step": r[1], "updated": r[2], "state_bytes": r[3]} for r in rows
            ]

        return await self._run(list_)

    async def history(self, session: str) -> list[TransitionRecord]:
        def history(db: sqlite3.Connection) -> list[TransitionRecord]:
            rows = db.execute(
                "SELECT step, status, patch, action, errors, ts FROM transitions"
                " WHERE session = ? ORDER BY step",
                (session,),
            ).fetchall()
            return [
                TransitionRecord(
                    step=r[0],
                    status=r[1],
                    patch=orjson.loads(r[2]) if r[2] else None,
                    action=r[3],
                    errors=orjson.loads(r[4]),
                    ts=r[5],
                )
                for r in rows
            ]

        return await self._run(history)

    async def delete(self, session: str) -> bool:
        def delete(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                cur = db.execute("DELETE FROM sessions WHERE id = ?", (session,))
                db.execute("DELETE FROM transitions WHERE session = ?", (session,))
            return cur.rowcount > 0

        self._cache.pop(session, None)
        return await self._run(delete)

    async def purge_sessions(self, older_than: float) -> int:
        def purge(db: sqlite3.Connection) -> list[str]:
            with _transaction(db):
                ids = [
                    r[0]
                    for r in db.execute("SELECT id FROM sessions WHERE updated < ?", (older_than,))
                ]
                db.executemany("DELETE FROM transitions WHERE session = ?", [(i,) for i in ids])
                db.executemany("DELETE FROM sessions WHERE id = ?", [(i,) for i in ids])
            return ids

        ids = await self._run(purge)
        for i in ids:
            self._cache.pop(i, None)
        return len(ids)

    # -- ledger ---------------------------------------------------------------------------

    async def add_ledger_rows(self, rows: list[LedgerRow]) -> None:
        if not rows:
            return
        values = [_ledger_tuple(r) for r in rows]

        def add(db: sqlite3.Connection) -> None:
            db.executemany(_LEDGER_INSERT, values)

        await self._write(add)

    async def ledger_rows(
        self, since: float, until: float, session: str | None = None
    ) -> list[LedgerRow]:
        sql = f"SELECT {', '.join(_LEDGER_COLUMNS)} FROM ledger WHERE ts >= ? AND ts < ?"
        args: tuple[Any, ...] = (since, until)
        if session is not None:
            sql += " AND session = ?"
            args += (session,)
        sql += " ORDER BY ts"

        def rows(db: sqlite3.Connection) -> list[LedgerRow]:
            return [LedgerRow(*r) for r in db.execute(sql, args)]

        return await self._run(rows)

    async def purge_ledger(self, older_than: float) -> int:
        def purge(db: sqlite3.Connection) -> int:
            with _transaction(db):
                return db.execute("DELETE FROM ledger WHERE ts < ?", (older_than,)).rowcount

        return await self._run(purge)


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT (the connection is in autocommit mode otherwise)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
