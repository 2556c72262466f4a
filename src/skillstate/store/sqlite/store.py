"""The embedded store: stdlib sqlite3 in WAL mode, used from one dedicated thread so that no
SQLite call that can wait (for a lock, an fsync, a checkpoint) ever blocks the event loop.

The exception, for speed: while the store thread is idle, writes run on the event loop's
thread. A lone turn's commit (no other turn in flight) and a group of ledger rows
(``add_ledger_rows``) at once (``commit_at_once``), which saves two thread hand-offs and a
loop iteration; other writes as one batch at the loop's next pass (``_write_here``), which
saves the store thread's taking the GIL back after each statement against a busy loop
(docs/benchmarks.md). None of it can wait for anything: the connection's lock wait
(``busy_timeout``) is 0 outside the thread's own calls, so a database locked by another
process sends the write to the thread instead; checkpoints are never part of a commit
(``wal_autocheckpoint`` off) but calls of their own on the thread; and it is not taken
under ``store_synchronous: "full"``, whose commits fsync.

Durability: WAL with synchronous=NORMAL. A committed transaction is in the WAL file (in the
OS page cache at least) before commit() returns, so it survives kill -9 of the proxy; only a
power loss or an OS crash can lose the last transactions. The ``store_synchronous: "full"``
setting covers that too (an fsync of the WAL on every commit). A
WAL damaged so that SQLite would drop committed transactions is refused before the store
opens it (``refuse_wal_damage``, see ``wal``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import orjson

from ...auth.record import KeyRecord
from ...config import ConfigError
from ..base import (
    COUNTED,
    KeptAlready,
    KeptReply,
    SessionRecord,
    StepConflict,
    StoredResponse,
    StoreError,
    StoreFull,
    StoreUnavailable,
    TransitionRecord,
)
from ..cache import BudgetCache, CachedSession, SessionCache
from ..datadir import lock_data_dir, prepare_path, sqlite_tables, unlock_data_dir
from ..ledgersql import (
    GROUP_BY,
    SEPARATOR,
    GroupKeys,
    ledger_where,
    spend_select,
    sums_of,
    sums_select,
)
from ..records import INTERRUPTED, PENDING, LedgerRow, LedgerSums, SessionCommit
from ..rows import (
    COUNTED_TABLES,
    EXPORTED_SESSION_COLUMNS,
    KEPT_COLUMNS,
    KEY_COLUMNS,
    LEDGER_COLUMNS,
    LEDGER_CONFLICT,
    RESPONSE_COLUMNS,
    TRANSITION_COLUMNS,
    clamp_time,
    exported_session,
    full_message,
    kept_reply,
    kept_values,
    key_record,
    key_values,
    ledger_tuple,
    namespace_where,
    prefix_range,
    response_chain_sql,
    response_values,
    stored_response,
    transition_record,
)
from .migrations import SQLITE_MIGRATIONS, migrate_sqlite
from .thread import StoreThread
from .wal import wal_damage

T = TypeVar("T")

GROUP_KEYS = GroupKeys(
    day="CAST(ts / 86400 AS INTEGER)",
    key=f"CASE WHEN instr(session, {SEPARATOR}) > 0"
    f" THEN substr(session, 1, instr(session, {SEPARATOR}) - 1) END",
)
log = logging.getLogger("skillstate")

_LEDGER_INSERT = (
    f"INSERT INTO ledger ({', '.join(LEDGER_COLUMNS)})"
    f" VALUES ({', '.join('?' * len(LEDGER_COLUMNS))}){LEDGER_CONFLICT}"
)
_KEPT_INSERT = (
    f"INSERT INTO idempotency_keys ({KEPT_COLUMNS})"
    f" VALUES ({', '.join('?' * len(KEPT_COLUMNS.split(',')))})"
)


_RESPONSE_PUT = f"INSERT OR REPLACE INTO responses ({RESPONSE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)"

_TRANSITION_INSERT = (
    "INSERT INTO transitions"
    " (session, step, patch, action, status, errors, ts, context, estimate)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


# The minute of a session's last update, which its row keeps as ``touched`` (indexed by
# sessions_touched: migration 6), of the time in the parameter ``?N``: one expression for
# every statement that writes or reads it, so that touched = MINUTE(updated) in every row.
def _minute(param: str) -> str:
    return f"CAST({param} / 60 AS INTEGER)"


def _advance_sql(state: bool, touch: bool) -> str:
    """A session's next step (parameters: state, step, updated, id, the step it was at),
    only from the step the turn started from (else nothing changes); ``state``: its new
    state too. Not ``touch``: only within the minute of its last update, and then
    sessions_touched is not written; ``touch``: in any minute, which moves its entry."""
    sets = f"{'state = ?1, ' if state else ''}step = ?2, updated = ?3"
    if touch:
        return f"UPDATE sessions SET {sets}, touched = {_minute('?3')} WHERE id = ?4 AND step = ?5"
    return f"UPDATE sessions SET {sets} WHERE id = ?4 AND step = ?5 AND touched = {_minute('?3')}"


# _advance_sql's four statements, by (state, touch).
_ADVANCE = {
    (state, touch): _advance_sql(state, touch) for state in (True, False) for touch in (False, True)
}
_SESSION_INSERT = (
    "INSERT INTO sessions (id, state, schema, step, created, updated, touched)"
    f" VALUES (?1, ?2, ?3, ?4, ?5, ?6, {_minute('?6')})"
)


def _transition_values(t: TransitionRecord, ts: float) -> tuple[Any, ...]:
    """A transition's columns after its session and step (its JSON as bytes), at ``ts``."""
    return (
        None if t.patch is None else orjson.dumps(t.patch),
        t.action,
        t.status,
        orjson.dumps(t.errors).decode(),
        ts,
        t.context,
        None if t.estimate is None else orjson.dumps(t.estimate),
    )


def _insert_kept(db: sqlite3.Connection, values: tuple[Any, ...]) -> None:
    """Keep a reply (inside the caller's transaction); KeptAlready when its key is kept."""
    try:
        db.execute(_KEPT_INSERT, values)
    except sqlite3.IntegrityError:
        raise KeptAlready(f"Idempotency-Key {values[1]!r} was kept by another turn") from None


Batch = list[tuple[Callable[[sqlite3.Connection], Any], "asyncio.Future[Any]"]]

# Written WAL pages (a guess made per write) after which the store thread checkpoints. Four
# times SQLite's own wal_autocheckpoint default (which the store turns off, see the
# docstring): a checkpoint copies each page once however often it was written since, and
# fsyncs; at 64 connections of state turns the proxy spent 5-9 % less CPU a request than at
# 1,000 (`scripts/overhead-ab --mode state`, three runs: x0.948, x0.949, x0.912). The
# cost: a WAL of ~16 MiB on disk while the proxy runs, and after a crash about 0.5 s more
# of ``wal.wal_damage``'s scan at start.
CHECKPOINT_PAGES = 4000
Results = list[tuple["asyncio.Future[Any]", Any, BaseException | None]]

# SQLite primary result codes (sqlite.org/rescode.html) for "cannot write now, nothing
# written": a retry later may work.
_BUSY, _LOCKED = 5, 6
_UNAVAILABLE_CODES = {_BUSY, _LOCKED, 8, 10, 13, 14}  # + READONLY, IOERR, FULL, CANTOPEN
# sqlite3's messages for those codes (sqlite3_errstr), for Pythons without sqlite_errorcode.
_CODE_BY_MESSAGE = {
    "database is locked": _BUSY,
    "database table is locked": _LOCKED,
    "attempt to write a readonly database": 8,
    "disk I/O error": 10,
    "database or disk is full": 13,
    "unable to open database file": 14,
}


def as_store_error(e: BaseException) -> StoreError:
    """Any exception from the store thread as the StoreError the caller gets."""
    if isinstance(e, StoreError):
        return e
    if isinstance(e, sqlite3.Error):
        code = _primary_code(e)
        if code in _UNAVAILABLE_CODES:
            if code in (_BUSY, _LOCKED):
                return StoreUnavailable(f"the database is locked by another process ({e})")
            return StoreUnavailable(f"the database cannot be written ({e})")
        return StoreError(f"sqlite: {e}")
    # A bug or a value SQLite refuses (e.g. OverflowError): the write fails, the store lives.
    log.error("store: unexpected %s in a write", type(e).__name__, exc_info=e)
    return StoreError(f"unexpected {type(e).__name__} while writing: {e}")


def refuse_wal_damage(path: Path) -> None:
    """StoreError when SQLite, opening ``path``, would drop committed transactions of its
    damaged WAL (``wal_damage``): once opened, the next checkpoint overwrites them."""
    damage = wal_damage(path)
    if damage is not None:
        raise StoreError(
            f"{damage}; not opening it, which would lose them for good: keep a copy of "
            f"{path.parent}, and move {path.name}-wal out of it to start without what it holds"
        )


def connect(
    path: Path, *, synchronous: str = "NORMAL", busy_timeout: float = 1.0, migrate: bool = True
) -> sqlite3.Connection:
    """A connection in WAL mode, after checking that the file is a usable database (a
    corrupt one raises sqlite3.DatabaseError here, not on the first turn). ``migrate``:
    bring its schema to this code's version (SchemaTooNew for a newer one)."""
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    try:
        db.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        db.execute("PRAGMA schema_version").fetchone()  # reads the header: "not a database"
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={synchronous}")
        if migrate:
            for line in migrate_sqlite(db, f"sqlite://{path}"):
                log.info("store: %s", line)
            for table in ("sessions", "transitions", "ledger"):
                db.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchall()  # reads its root page
    except BaseException:
        db.close()
        raise
    return db


class SQLiteStore:
    """Sessions, transitions and the ledger in one SQLite file, on one thread.

    ``cache_bytes`` bounds the write-through session cache; ``max_sessions`` (0 = no
    limit) is how many sessions the store keeps before refusing new ones (StoreFull);
    ``busy_timeout`` is how long a write waits for another process's lock before it fails
    with StoreUnavailable; ``close_timeout`` bounds how long close() waits for writes."""

    def __init__(
        self,
        path: Path,
        *,
        synchronous: str = "NORMAL",
        cache_sessions: int = 4096,
        cache_bytes: int = 64 * 1024 * 1024,
        max_sessions: int = 0,
        busy_timeout: float = 1.0,
        close_timeout: float = 10.0,
        exclusive: bool = False,
    ) -> None:
        self.path = path
        self._exclusive = exclusive  # hold the data dir's lock while open (see lock_data_dir)
        self._locked = False
        self._synchronous = synchronous
        self._busy_timeout = busy_timeout
        self._close_timeout = close_timeout
        # Write-through cache of hot sessions: a turn's load needs no thread hop. The store
        # assumes it is the only writer of its database (one proxy per data dir).
        self._cache = SessionCache(cache_sessions, cache_bytes)
        # Every turn reads its session's budget (cost.budgets): from here, not the database.
        self._budgets = BudgetCache(cache_sessions)
        self._max_sessions = max_sessions
        # Sessions in the database: written by the store thread, or by commit_at_once
        # while that thread is idle.
        self._sessions = 0
        self._batch_new = 0  # sessions the running batch created
        self._exec = StoreThread("skillstate-sqlite")  # its post() is the cheap hand-off
        # Long reads (/cost's sums over the ledger) have their own connection and thread: in
        # WAL mode they read a snapshot while the store thread writes, so summing a big
        # ledger never holds up a turn's commit.
        self._read_exec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="skillstate-read")
        self._reader: sqlite3.Connection | None = None
        self._db: sqlite3.Connection | None = None
        # Group commit: writes that arrive while a batch is being written go together in
        # the next transaction (one thread hop for all of them). Each still fails alone: a
        # batch of several in which one fails runs again with a savepoint for each, a lone
        # write is its own transaction.
        self._queue: Batch = []
        self._writing = False
        self._batch_started = 0.0  # monotonic time the running batch was handed over
        self._write_failure: StoreError | None = None  # why the last batch failed, if it did
        self._probe: asyncio.Future[None] | None = None
        # Lone commits on the loop's thread (module docstring): not when commits fsync.
        self._at_once = synchronous.upper() == "NORMAL"
        self._wal_pages = 0  # written since the last checkpoint (a guess; the loop's thread)

    # -- before the proxy runs (Store: home, exists, preflight, migrate) -----------------

    @property
    def home(self) -> Path:
        """The file's directory: the client keys' secret lives beside a SQLite store."""
        return self.path.parent

    def exists(self) -> bool:
        """A file with tables, or with a WAL that may hold them. A file with no tables (an
        empty one, or a database nothing was written to) is no store: a command that only
        reads would write a new store into it."""
        path = self.path
        if not path.is_file():
            return False
        return Path(f"{path}-wal").exists() or sqlite_tables(path) != set()

    def preflight(self) -> None:
        """The data dir is safe, no other proxy holds it (the hold taken here lasts until
        this process exits, so none slips in before the store takes its own), and the file
        is a database this code can use (migrated to this release's schema)."""
        path = self.path
        try:
            prepare_path(path)
            lock_data_dir(path)
            refuse_wal_damage(path)
            connect(path, busy_timeout=self._busy_timeout).close()
        except StoreError as e:
            raise ConfigError(f"data_dir: {e}") from None
        except sqlite3.Error as e:
            err = as_store_error(e)
            if isinstance(err, StoreUnavailable):  # locked, read-only, disk full
                raise ConfigError(f"data_dir: cannot use {path}: {err}") from None
            raise ConfigError(f"data_dir: {path} is not a usable SQLite database ({e})") from None
        except OSError as e:
            raise ConfigError(f"data_dir: cannot open the store at {path}: {e}") from None

    def migrate(self) -> list[str]:
        try:
            prepare_path(self.path)
            refuse_wal_damage(self.path)
            db = connect(self.path, busy_timeout=self._busy_timeout, migrate=False)
            try:
                lines = migrate_sqlite(db, f"sqlite://{self.path}")
            finally:
                db.close()
        except StoreError as e:
            raise ConfigError(f"store: {e}") from None
        except sqlite3.Error as e:
            raise ConfigError(f"store: {self.path} is not a usable SQLite database ({e})") from None
        latest = SQLITE_MIGRATIONS[-1].version
        return lines or [f"{self.path}: at schema {latest}, this release's: nothing to do"]

    # -- plumbing -------------------------------------------------------------------------

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            db = self._db
            if db is None:
                raise StoreUnavailable("store is closed")
            try:
                with self._waiting(db):
                    return fn(db)
            except Exception as e:
                raise as_store_error(e) from e

        self._written(4)  # most calls read; a purge or a delete writes more: a guess
        return await asyncio.get_running_loop().run_in_executor(self._exec, call)

    @contextmanager
    def _waiting(self, db: sqlite3.Connection) -> Iterator[None]:
        """On the store thread: the connection waits ``busy_timeout`` for another process's
        lock while the body runs, and not at all otherwise (``commit_at_once``)."""
        if not self._at_once:
            yield
            return
        db.execute(f"PRAGMA busy_timeout={int(self._busy_timeout * 1000)}")
        try:
            yield
        finally:
            if self._db is db:  # (not closed by the body)
                db.execute("PRAGMA busy_timeout=0")

    def _written(self, pages: int) -> None:
        """Count a write's WAL pages (a guess); past ``CHECKPOINT_PAGES``, the store
        thread checkpoints (never a commit on the loop's thread: see the docstring)."""
        self._wal_pages += pages
        if self._wal_pages >= CHECKPOINT_PAGES and self._at_once:
            self._wal_pages = 0
            with contextlib.suppress(RuntimeError):  # shut down: close() checkpoints
                self._exec.post(self._checkpoint)

    def _checkpoint(self) -> tuple[int, int, int] | None:
        """On the store thread: copy the WAL into the database as far as no reader needs
        it, so that the next writes start the WAL over (SQLite's automatic checkpoint).
        SQLite's answer: (1 if it could not run, the WAL's frames, the frames copied)."""
        if self._db is None:
            return None
        busy, frames, copied = self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return busy, frames, copied

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run the read-only ``fn`` on the reader connection (see ``_read_exec``)."""

        def call() -> T:
            if self._db is None:
                raise StoreUnavailable("store is closed")
            if self._reader is None:
                self._reader = sqlite3.connect(
                    self.path, check_same_thread=False, isolation_level=None
                )
                self._reader.execute(f"PRAGMA busy_timeout={int(self._busy_timeout * 1000)}")
                self._reader.execute("PRAGMA query_only=1")
            try:
                return fn(self._reader)
            except Exception as e:
                raise as_store_error(e) from e

        return await asyncio.get_running_loop().run_in_executor(self._read_exec, call)

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    async def _write(
        self, fn: Callable[[sqlite3.Connection], T], pages: int = 4, shared: int = 0
    ) -> T:
        """Run `fn` inside a write transaction; returns once that transaction committed.
        ``pages``: about how many WAL pages it writes alone (see ``_written``), ``shared``
        of them pages that the other writes of its batch write too (the newest pages of the
        ledger's and the transitions' b-trees): a batch writes those once, so they count
        for the first write of a batch only. Counted in full, 64 turns a batch counted
        ~6x the frames they wrote, and the store thread checkpointed ~6x as often."""
        self._written(pages - shared if self._queue else pages)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._queue.append((fn, fut))
        if not self._writing:
            self._flush(loop)
        return await fut

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the next batch: with the store thread idle, on the loop's thread at the
        next pass of the loop (the writes queued until then together, ``_write_here``);
        else on the store thread."""
        self._writing = True
        self._batch_started = time.monotonic()
        if self._at_once and self._exec.idle:
            loop.call_soon(self._write_here, loop)
        else:
            self._post_batch(loop)

    def _write_here(self, loop: asyncio.AbstractEventLoop) -> None:
        """The queued writes as one batch on the loop's thread, as the store thread writes
        them (``_write_batch``), when that cannot wait (module docstring); the store thread
        writes them instead when it got work meanwhile or the file is locked."""
        db = self._db
        if db is None or not self._exec.idle:
            self._post_batch(loop)
            return
        batch, self._queue = self._queue, []
        try:
            results = self._commit_batch(db, batch)
            self._write_failure = None
        except Exception as e:
            if isinstance(e, sqlite3.Error) and _busy(e):  # nothing written
                self._queue = batch + self._queue
                self._post_batch(loop)
                return
            err = self._write_failure = as_store_error(e)
            results = [(fut, None, err) for _, fut in batch]
        self._settle(results, loop)

    def _post_batch(self, loop: asyncio.AbstractEventLoop) -> None:
        batch, self._queue = self._queue, []
        try:
            self._exec.post(self._write_batch, batch, loop)
        except RuntimeError as e:  # the executor is shut down (close() gave up waiting)
            self._settle(
                [(fut, None, StoreUnavailable(f"store is closed ({e})")) for _, fut in batch], loop
            )

    def _write_batch(self, batch: Batch, loop: asyncio.AbstractEventLoop) -> None:
        """On the store thread. Whatever happens, every waiter of the batch is answered
        and the next batch can start: an exception fails writes, never the store."""
        results: Results | None = None
        try:
            db = self._db
            if db is None:
                raise StoreUnavailable("store is closed")
            with self._waiting(db):
                results = self._commit_batch(db, batch)
            self._write_failure = None
        except Exception as e:
            err = as_store_error(e)
            self._write_failure = err
            results = [(fut, None, err) for _, fut in batch]
        finally:
            if results is None:  # only a BaseException gets here
                results = [(fut, None, StoreError("store thread interrupted")) for _, fut in batch]
            # RuntimeError: the event loop is closed, so nobody waits any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._settle, results, loop)

    def _commit_batch(self, db: sqlite3.Connection, batch: Batch) -> Results:
        results: Results = []
        self._batch_new = 0
        db.execute("BEGIN IMMEDIATE")
        try:
            if len(batch) == 1:
                # One write (every turn of a lone client): the transaction is its savepoint,
                # two statements fewer; a failed write is rolled back, nothing else was in it.
                fn, fut = batch[0]
                try:
                    results.append((fut, fn(db), None))
                except Exception as e:
                    _roll_back(db)
                    return [(fut, None, as_store_error(e))]
            else:
                results = self._all_of(db, batch) or self._each_of(db, batch)
            db.execute("COMMIT")
        except BaseException:
            _roll_back(db)
            raise
        self._sessions += self._batch_new
        return results

    def _all_of(self, db: sqlite3.Connection, batch: Batch) -> Results | None:
        """Every write of the batch, with no savepoints (two statements fewer a write);
        None when one failed, the transaction then rolled back and begun again, empty."""
        results: Results = []
        try:
            for fn, fut in batch:
                results.append((fut, fn(db), None))
        except Exception:
            _roll_back(db)
            self._batch_new = 0
            db.execute("BEGIN IMMEDIATE")
            return None
        return results

    def _each_of(self, db: sqlite3.Connection, batch: Batch) -> Results:
        """Every write of the batch in a savepoint of its own: a failed one leaves nothing,
        the others commit (after ``_all_of`` found one that fails)."""
        results: Results = []
        for fn, fut in batch:
            db.execute("SAVEPOINT w")
            try:
                value = fn(db)
            except Exception as e:
                db.execute("ROLLBACK TO w")
                db.execute("RELEASE w")
                results.append((fut, None, as_store_error(e)))
            else:
                db.execute("RELEASE w")
                results.append((fut, value, None))
        return results

    def _settle(self, results: Results, loop: asyncio.AbstractEventLoop) -> None:
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
        # Every opener, not only a starting proxy: a reader (`skillstate cost`) opening a
        # crashed data dir is its last connection, whose close checkpoints and deletes the WAL.
        refuse_wal_damage(self.path)
        db = connect(self.path, synchronous=self._synchronous, busy_timeout=self._busy_timeout)
        self._sessions = db.execute("SELECT count(*) FROM sessions").fetchone()[0]
        if self._at_once:  # see the module docstring and _waiting
            db.execute("PRAGMA wal_autocheckpoint=0")
            db.execute("PRAGMA busy_timeout=0")
        self._db = db

    async def open(self) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(self._exec, self._open_sync)
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"cannot open store {self.path}: {e}") from e

    async def close(self) -> None:
        """Close after the queued writes landed, or after ``close_timeout`` at most: a
        store that cannot write never holds up shutdown (the waiting writes fail)."""

        def close(db: sqlite3.Connection) -> None:
            db.close()
            self._db = None

        deadline = time.monotonic() + self._close_timeout
        while (self._writing or self._queue) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        for _, fut in self._queue:
            if not fut.done():
                fut.set_exception(StoreUnavailable("the store closed before this write"))
        self._queue = []
        if self._db is not None:
            with contextlib.suppress(StoreError, asyncio.TimeoutError):
                await asyncio.wait_for(self._run(close), max(deadline - time.monotonic(), 0.1))
        self._exec.shutdown(wait=False)
        closing = asyncio.get_running_loop().run_in_executor(self._read_exec, self._close_reader)
        with contextlib.suppress(sqlite3.Error, asyncio.TimeoutError):
            await asyncio.wait_for(closing, max(deadline - time.monotonic(), 0.1))
        self._read_exec.shutdown(wait=False)
        if self._locked:
            unlock_data_dir(self.path)
            self._locked = False

    async def check(self, timeout: float) -> str | None:
        """None when the store can write now, else why not. Waits at most ``timeout``: the
        probe takes and releases the write lock without waiting for another process."""
        if self._db is None:
            return "closed"
        if self._writing and time.monotonic() - self._batch_started > timeout:
            waited = time.monotonic() - self._batch_started
            return f"a write has been waiting {waited:.1f}s (database locked?)"
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self._run(self._probe_write))
        try:
            await asyncio.wait_for(asyncio.shield(self._probe), timeout)
        except asyncio.TimeoutError:  # not the builtin on Python 3.10
            return f"the store did not answer within {timeout:g}s"
        except StoreError as e:
            return str(e)
        return None

    async def ensure_writable(self, timeout: float) -> None:
        if self._db is None:
            raise StoreUnavailable("store is closed")
        if self._write_failure is None:
            return
        problem = await self.check(timeout)
        if problem is not None:
            raise StoreUnavailable(problem)
        self._write_failure = None  # the probe wrote: whatever failed before has passed

    def _probe_write(self, db: sqlite3.Connection) -> None:
        db.execute("PRAGMA busy_timeout=0")
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute("ROLLBACK")
        finally:
            db.execute(f"PRAGMA busy_timeout={int(self._busy_timeout * 1000)}")

    def ensure_room_for_session(self) -> None:
        if self._max_sessions and self._sessions >= self._max_sessions:
            raise StoreFull(full_message(self._max_sessions))

    # -- sessions -------------------------------------------------------------------------

    @property
    def cache_bytes(self) -> int:
        """What the session cache holds now (bounded by ``cache_bytes``)."""
        return self._cache.bytes

    async def load(self, session: str, *, fresh: bool = False) -> SessionRecord | None:
        cached = None if fresh else self._cache.get(session)
        if cached is not None:
            return cached.record(session)
        entry = await self._run(self._load_sync(session))
        if entry is None:
            self._cache.forget(session)  # a fresh read of a session deleted by another writer
            return None
        self._cache.remember(session, entry)
        return entry.record(session)

    @staticmethod
    def _load_sync(session: str) -> Callable[[sqlite3.Connection], CachedSession | None]:
        def load(db: sqlite3.Connection) -> CachedSession | None:
            row = db.execute(
                "SELECT state, schema, step, created, updated FROM sessions WHERE id = ?",
                (session,),
            ).fetchone()
            if row is None:
                return None
            state, schema, step, created, updated = row
            return CachedSession(state, orjson.loads(schema), step, created, updated)

        return load

    async def commit(self, c: SessionCommit) -> int:
        write, state_blob, now = self._commit_write(c)
        try:
            step = await self._write(write, _pages(state_blob), _SHARED_PAGES)
        except StoreError:
            # The cached copy may be what is stale (the database moved on): reload next time.
            self._cache.forget(c.session)
            raise
        self._cache.committed(c.session, state_blob, c.schema, step, now)
        return step

    def commit_at_once(self, c: SessionCommit) -> int | None:
        """``commit`` on the caller's thread (the event loop's), for a turn with no other
        in flight, when that cannot wait for anything (module docstring): the store thread
        idle, no write queued, the database's write lock free. None when not, with nothing
        written: the caller awaits ``commit``."""
        db = self._db_now()
        if db is None:
            return None  # (closed: commit() says so)
        write, state_blob, now = self._commit_write(c)
        try:
            step = self._write_now(db, write)
        except StoreError:
            self._cache.forget(c.session)
            raise
        if step is None:
            return None
        self._written(_pages(state_blob))
        self._cache.committed(c.session, state_blob, c.schema, step, now)
        return step

    def _db_now(self) -> sqlite3.Connection | None:
        """The connection, when a write on the caller's thread cannot wait for anything
        (module docstring): the store thread idle and no write queued; else None."""
        if not self._at_once or self._writing or self._queue or not self._exec.idle:
            return None
        return self._db

    def _write_now(
        self, db: sqlite3.Connection, fn: Callable[[sqlite3.Connection], int]
    ) -> int | None:
        """``fn`` in a transaction of its own on this thread, as a batch of one on the
        store thread would run it; None when another process holds the write lock (the
        connection does not wait here), with nothing written."""
        self._batch_new = 0
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            if _busy(e):
                return None
            self._write_failure = as_store_error(e)
            raise self._write_failure from e
        try:
            value = fn(db)
        except Exception as e:
            _roll_back(db)
            raise as_store_error(e) from e
        try:
            db.execute("COMMIT")
        except sqlite3.Error as e:
            _roll_back(db)  # a failed COMMIT leaves it open: nothing was written
            if _busy(e):
                return None
            self._write_failure = as_store_error(e)
            raise self._write_failure from e
        self._write_failure = None
        self._sessions += self._batch_new
        return value

    def _commit_write(
        self, c: SessionCommit
    ) -> tuple[Callable[[sqlite3.Connection], int], bytes | None, float]:
        """The write of ``c`` (run in a transaction: the new step, or StepConflict,
        StoreFull, KeptAlready), its state as stored, and its time as stored."""
        session, expected_step, transition = c.session, c.expected_step, c.transition
        now = clamp_time(c.now)
        try:
            ledger_values = [ledger_tuple(r) for r in c.ledger or []]
            kept_row = None if c.kept is None else kept_values(c.kept)
            response_row = None if c.response is None else response_values(c.response)
            state_blob = c.state_blob()
            transition_row = _transition_values(transition, now)
            schema_blob = orjson.dumps(c.schema)
        except (TypeError, ValueError) as e:  # orjson.JSONEncodeError is a TypeError
            raise StoreError(f"cannot store the turn: {e}") from e

        def commit(db: sqlite3.Connection) -> int:
            # Runs inside the group-commit transaction (see _write), or its own (_write_now).
            created = False
            if expected_step and advance(db):  # the usual turn: one statement, no read
                step = expected_step + 1
            else:
                step, created = create_or_update(db)
            db.execute(_TRANSITION_INSERT, (session, step, *transition_row))
            if ledger_values:
                db.executemany(_LEDGER_INSERT, ledger_values)
            if kept_row is not None:  # under this commit's session and step
                _insert_kept(db, (*kept_row[:3], session, *kept_row[4:9], step))
            if response_row is not None:
                db.execute(_RESPONSE_PUT, response_row)
            if created:
                self._batch_new += 1  # last: a write that failed above created nothing
            return step

        values = (state_blob, expected_step + 1, now, session, expected_step)
        has_state = state_blob is not None

        def advance(db: sqlite3.Connection) -> bool:
            """The session moved from ``expected_step`` to the next, if it was there: in
            the minute of its last update (most turns) without a write of its index."""
            if db.execute(_ADVANCE[has_state, False], values).rowcount == 1:
                return True
            return db.execute(_ADVANCE[has_state, True], values).rowcount == 1

        def create_or_update(db: sqlite3.Connection) -> tuple[int, bool]:
            """A new session's row, or the step conflict where ``advance`` found none at
            ``expected_step``: the session's new step, and whether its row is new."""
            row = db.execute("SELECT step FROM sessions WHERE id = ?", (session,)).fetchone()
            current = row[0] if row else 0
            if current != expected_step:
                moved = f"session {session} moved from step {expected_step} to {current}"
                raise StepConflict(moved)
            step = current + 1
            if row is None:
                if self._max_sessions and self._sessions + self._batch_new >= self._max_sessions:
                    raise StoreFull(full_message(self._max_sessions))
                db.execute(
                    _SESSION_INSERT, (session, state_blob or b"{}", schema_blob, step, now, now)
                )
            else:  # (at ``expected_step``, as just read)
                db.execute(_ADVANCE[has_state, True], values)
            return step, row is None

        return commit, state_blob, now

    # -- pages (GET /state and ?history=1) ----------------------------------------------

    async def sessions_page(
        self, limit: int, after: tuple[float, str] | None = None, prefix: str | None = None
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` sessions, most recently updated first (ties by id), starting
        after the ``(updated, id)`` of the last one of the previous page; only ids in
        ``prefix``'s namespace when it is given (``UNKEYED``: in none)."""
        sql = "SELECT id, step, updated, length(state) FROM sessions WHERE 1"
        args: tuple[Any, ...] = ()
        if after is not None:
            sql += f" AND touched <= {_minute('?')} AND (updated < ? OR (updated = ? AND id > ?))"
            args = (after[0], after[0], after[0], after[1])
        if prefix:
            where, range_args = namespace_where("id", prefix, "?", "?")
            sql += where
            args += range_args
        # The same order as by updated alone (touched is its minute), read by sessions_touched
        # minute by minute, each minute's sessions sorted.
        sql += " ORDER BY touched DESC, updated DESC, id LIMIT ?"

        def page(db: sqlite3.Connection) -> list[dict[str, Any]]:
            rows = db.execute(sql, (*args, limit)).fetchall()
            return [
                {"session": r[0], "step": r[1], "updated": r[2], "state_bytes": r[3]} for r in rows
            ]

        return await self._run(page)

    async def history_page(
        self, session: str, limit: int, after_step: int = 0
    ) -> list[TransitionRecord]:
        """Up to ``limit`` transitions of ``session`` after step ``after_step``, in order."""

        def page(db: sqlite3.Connection) -> list[TransitionRecord]:
            rows = db.execute(
                f"SELECT {TRANSITION_COLUMNS} FROM transitions"
                " WHERE session = ? AND step > ? ORDER BY step LIMIT ?",
                (session, after_step, limit),
            ).fetchall()
            return [transition_record(r) for r in rows]

        return await self._run(page)

    async def delete(self, session: str) -> bool:
        def delete(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                cur = db.execute("DELETE FROM sessions WHERE id = ?", (session,))
                db.execute("DELETE FROM transitions WHERE session = ?", (session,))
                db.execute("DELETE FROM responses WHERE session = ?", (session,))
                db.execute("DELETE FROM session_budgets WHERE session = ?", (session,))
                db.execute("DELETE FROM idempotency_keys WHERE session = ?", (session,))
            self._sessions -= cur.rowcount
            return cur.rowcount > 0

        self._cache.forget(session)
        self._budgets.changed(session)
        try:
            return await self._run(delete)
        finally:
            self._budgets.changed(session)

    async def purge_sessions(self, older_than: float, keep: Collection[str] = ()) -> int:
        kept = frozenset(keep)

        def purge(db: sqlite3.Connection) -> list[str]:
            with _transaction(db):
                expired = db.execute(
                    f"SELECT id FROM sessions WHERE touched <= {_minute('?1')} AND updated < ?1",
                    (older_than,),
                )
                ids = [r[0] for r in expired if r[0] not in kept]
                db.executemany("DELETE FROM transitions WHERE session = ?", [(i,) for i in ids])
                db.executemany("DELETE FROM sessions WHERE id = ?", [(i,) for i in ids])
                # Stored Responses API responses expire with the same TTL (passthrough turns
                # store them under sessions that have no state row).
                db.execute("DELETE FROM responses WHERE created < ?", (older_than,))
                # Budgets go with their sessions; a budget of a session with no state row
                # (passthrough) with the same TTL, counted from when it was set.
                db.executemany("DELETE FROM session_budgets WHERE session = ?", [(i,) for i in ids])
                orphans = db.execute(
                    "SELECT session FROM session_budgets WHERE updated < ? AND session NOT IN"
                    " (SELECT id FROM sessions)",
                    (older_than,),
                ).fetchall()
                db.executemany(
                    "DELETE FROM session_budgets WHERE session = ?",
                    [(o[0],) for o in orphans if o[0] not in kept],
                )
            self._sessions -= len(ids)
            return ids

        self._budgets.changed()
        try:
            ids = await self._run(purge)
        finally:
            self._budgets.changed()  # its orphan budgets too: they are not listed
        for i in ids:
            self._cache.forget(i)
        return len(ids)

    # -- replies kept under an Idempotency-Key ---------------------------------------------

    async def kept_reply(self, scope: str, key: str) -> KeptReply | None:
        def find(db: sqlite3.Connection) -> KeptReply | None:
            row = db.execute(
                f"SELECT {KEPT_COLUMNS} FROM idempotency_keys WHERE scope = ? AND key = ?",
                (scope, key),
            ).fetchone()
            return None if row is None else kept_reply(row)

        return await self._run(find)

    async def keep_reply(self, kept: KeptReply, ledger: list[LedgerRow]) -> None:
        values = [ledger_tuple(r) for r in ledger]
        row = kept_values(kept)

        def keep(db: sqlite3.Connection) -> None:
            _insert_kept(db, row)
            if values:
                db.executemany(_LEDGER_INSERT, values)

        await self._write(keep)

    async def purge_kept_replies(self, older_than: float) -> int:
        def purge(db: sqlite3.Connection) -> int:
            with _transaction(db):
                sql = "DELETE FROM idempotency_keys WHERE created < ?"
                return int(db.execute(sql, (older_than,)).rowcount)

        return await self._run(purge)

    # -- Responses API responses ----------------------------------------------------------

    async def put_response(self, record: StoredResponse) -> None:
        row = response_values(record)

        def put(db: sqlite3.Connection) -> None:
            db.execute(_RESPONSE_PUT, row)

        await self._write(put)

    async def response_chain(self, response_id: str, limit: int) -> list[StoredResponse]:
        def chain(db: sqlite3.Connection) -> list[Any]:
            return db.execute(_RESPONSE_CHAIN, (response_id, limit)).fetchall()

        rows = await self._run(chain)
        return [stored_response(r) for r in rows]

    async def delete_response(self, response_id: str) -> bool:
        def delete(db: sqlite3.Connection) -> bool:
            cur = db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
            return cur.rowcount > 0

        return await self._run(delete)

    # -- ledger ---------------------------------------------------------------------------

    async def add_ledger_rows(self, rows: list[LedgerRow]) -> None:
        if not rows:
            return
        values = [ledger_tuple(r) for r in rows]

        def add(db: sqlite3.Connection) -> int:
            db.executemany(_LEDGER_INSERT, values)
            return len(values)

        # On the loop's thread when that cannot wait, as a lone commit (module docstring):
        # the rows of forwarded calls come here in groups while the store thread is idle,
        # and handing each group over made that thread take the GIL back after every row's
        # statement, against a loop that is busy then (see docs/benchmarks.md).
        pages = _ledger_pages(len(values))
        db = self._db_now()
        if db is not None and self._write_now(db, add) is not None:
            self._written(pages)
            return
        await self._write(add, pages, _LEDGER_SHARED_PAGES)

    async def ledger_rows(
        self, since: float, until: float, session: str | None = None, prefix: str | None = None
    ) -> list[LedgerRow]:
        where, args = ledger_where(since, until, session, prefix)
        sql = f"SELECT {', '.join(LEDGER_COLUMNS)} FROM ledger{where} ORDER BY ts"

        def rows(db: sqlite3.Connection) -> list[LedgerRow]:
            return [LedgerRow(*r) for r in db.execute(sql, args)]

        return await self._read(rows)

    async def ledger_sums(
        self,
        since: float,
        until: float,
        session: str | None = None,
        prefix: str | None = None,
        group_by: str | None = None,
    ) -> list[LedgerSums]:
        where, args = ledger_where(since, until, session, prefix)
        sql = sums_select(GROUP_KEYS, group_by) + where + GROUP_BY

        def sums(db: sqlite3.Connection) -> list[LedgerSums]:
            return [sums_of(r, group_by) for r in db.execute(sql, args)]

        return await self._read(sums)

    async def ledger_spend(
        self,
        prefix: str,
        since: float,
        *,
        whole: bool = False,
        unpriced: tuple[float, float] | None = None,
        pending: LedgerRow | None = None,
        in_flight: tuple[str, float] | None = None,
    ) -> float:
        """USD of the ledger rows since ``since`` whose session id starts with ``prefix``
        (``whole``: is ``prefix``); see ``ledgersql.spend_select`` for ``unpriced`` and
        ``in_flight``. ``pending`` is written in the same group-commit transaction."""
        sql = spend_select(whole, unpriced, in_flight=in_flight is not None)
        args: tuple[Any, ...] = (prefix, since) if whole else (*prefix_range(prefix), since)
        args += in_flight or ()
        row = None if pending is None else ledger_tuple(pending)

        def spend(db: sqlite3.Connection) -> float:
            if row is not None:
                db.execute(_LEDGER_INSERT, row)
            return float(db.execute(sql, args).fetchone()[0])

        return await (self._run(spend) if row is None else self._write(spend))

    async def drop_ledger_rows(self, row_ids: list[str]) -> None:
        def drop(db: sqlite3.Connection) -> None:
            sql = "DELETE FROM ledger WHERE row_id = ? AND pricing = ?"
            db.executemany(sql, [(i, PENDING) for i in row_ids])

        await self._write(drop)

    async def settle_pending(self, older_than: float) -> int:
        def settle(db: sqlite3.Connection) -> int:
            sql = "UPDATE ledger SET pricing = ? WHERE pricing = ? AND ts < ?"
            return int(db.execute(sql, (INTERRUPTED, PENDING, older_than)).rowcount)

        return await self._write(settle)

    # -- session budgets (cost.budgets) -------------------------------------------------

    async def session_budget(self, session: str) -> float | None:
        known, usd = self._budgets.get(session)
        if known:
            return usd
        epoch = self._budgets.epoch

        def read(db: sqlite3.Connection) -> float | None:
            row = db.execute(
                "SELECT budget_usd FROM session_budgets WHERE session = ?", (session,)
            ).fetchone()
            return None if row is None else float(row[0])

        usd = await self._run(read)
        self._budgets.remember(session, usd, epoch)
        return usd

    async def set_session_budget(
        self, session: str, usd: float | None, *, replace: bool
    ) -> float | None:
        def write(db: sqlite3.Connection) -> float | None:
            with _transaction(db):
                if usd is None:
                    db.execute("DELETE FROM session_budgets WHERE session = ?", (session,))
                    return None
                verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
                db.execute(
                    f"{verb} INTO session_budgets (session, budget_usd, updated) VALUES (?, ?, ?)",
                    (session, usd, time.time()),
                )
                row = db.execute(
                    "SELECT budget_usd FROM session_budgets WHERE session = ?", (session,)
                ).fetchone()
                return float(row[0])

        self._budgets.changed(session)
        try:
            return await self._run(write)
        finally:
            self._budgets.changed(session)

    # -- client keys ----------------------------------------------------------------------

    async def save_key(self, record: KeyRecord, *, new: bool) -> None:
        """Insert a key (``new``: StoreError if the name is taken) or replace it."""
        values = key_values(record)
        verb = "INSERT" if new else "INSERT OR REPLACE"
        marks = ",".join("?" * len(values))

        def save(db: sqlite3.Connection) -> None:
            try:
                db.execute(f"{verb} INTO api_keys ({KEY_COLUMNS}) VALUES ({marks})", values)
            except sqlite3.IntegrityError:
                raise StoreError(f"a key named {record.name!r} already exists") from None

        await self._run(save)

    async def keys(self) -> list[KeyRecord]:
        def keys(db: sqlite3.Connection) -> list[KeyRecord]:
            rows = db.execute(f"SELECT {KEY_COLUMNS} FROM api_keys ORDER BY name").fetchall()
            return [key_record(r) for r in rows]

        return await self._run(keys)

    async def has_keys(self) -> bool:
        def any_key(db: sqlite3.Connection) -> bool:
            return bool(db.execute("SELECT EXISTS (SELECT 1 FROM api_keys)").fetchone()[0])

        return await self._run(any_key)

    async def key_by_digest(self, digest: str) -> KeyRecord | None:
        def find(db: sqlite3.Connection) -> KeyRecord | None:
            row = db.execute(
                f"SELECT {KEY_COLUMNS} FROM api_keys WHERE digest = ?", (digest,)
            ).fetchone()
            return None if row is None else key_record(row)

        return await self._run(find)

    async def purge_ledger(self, older_than: float) -> int:
        """Delete the ledger rows older than ``older_than``, ``PURGE_CHUNK`` at a time, each
        chunk its own transaction: a big purge (ledger_retention lowered on a big ledger:
        26 s for 500k rows in one DELETE on a loaded machine) lets the turns' commits in
        between its chunks instead of holding the store thread the whole time."""

        def purge(db: sqlite3.Connection) -> int:
            with _transaction(db):
                return db.execute(
                    "DELETE FROM ledger WHERE rowid IN"
                    " (SELECT rowid FROM ledger WHERE ts < ? LIMIT ?)",
                    (older_than, PURGE_CHUNK),
                ).rowcount

        purged = 0
        while (deleted := await self._run(purge)) == PURGE_CHUNK:
            purged += deleted
        return purged + deleted

    # -- export and import (skillstate store copy) ----------------------------------------

    async def counts(self) -> dict[str, int]:
        def counts(db: sqlite3.Connection) -> dict[str, int]:
            return {
                name: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for name, table in zip(COUNTED, COUNTED_TABLES, strict=True)
            }

        return await self._run(counts)

    async def export_sessions(self, after: str | None, limit: int) -> list[SessionRecord]:
        def page(db: sqlite3.Connection) -> list[SessionRecord]:
            rows = db.execute(
                f"SELECT {EXPORTED_SESSION_COLUMNS} FROM sessions WHERE id > ? ORDER BY id LIMIT ?",
                ("" if after is None else after, limit),
            ).fetchall()
            return [exported_session(r) for r in rows]

        return await self._run(page)

    async def import_session(self, record: SessionRecord) -> None:
        row = (
            record.session,
            orjson.dumps(record.state),
            orjson.dumps(record.schema),
            record.step,
            record.created,
            record.updated,
        )

        def insert(db: sqlite3.Connection) -> None:
            try:
                db.execute(_SESSION_INSERT, row)
            except sqlite3.IntegrityError:
                raise StoreError(f"session {record.session} already exists") from None
            self._batch_new += 1  # counted once its transaction commits (_commit_batch)

        await self._write(insert)

    async def import_transitions(self, session: str, history: list[TransitionRecord]) -> None:
        rows = [(session, t.step, *_transition_values(t, t.ts)) for t in history]

        def insert(db: sqlite3.Connection) -> None:
            db.executemany(_TRANSITION_INSERT, rows)

        await self._write(insert)

    async def export_responses(self, after: str | None, limit: int) -> list[StoredResponse]:
        def page(db: sqlite3.Connection) -> list[Any]:
            return db.execute(
                f"SELECT {RESPONSE_COLUMNS} FROM responses WHERE id > ? ORDER BY id LIMIT ?",
                ("" if after is None else after, limit),
            ).fetchall()

        rows = await self._run(page)
        return [stored_response(r) for r in rows]

    async def export_session_budgets(
        self, after: str | None, limit: int
    ) -> list[tuple[str, float]]:
        def page(db: sqlite3.Connection) -> list[tuple[str, float]]:
            return db.execute(
                "SELECT session, budget_usd FROM session_budgets WHERE session > ?"
                " ORDER BY session LIMIT ?",
                ("" if after is None else after, limit),
            ).fetchall()

        return [(str(s), float(usd)) for s, usd in await self._run(page)]

    async def export_kept_replies(
        self, after: tuple[str, str] | None, limit: int
    ) -> list[KeptReply]:
        def page(db: sqlite3.Connection) -> list[Any]:
            return db.execute(
                f"SELECT {KEPT_COLUMNS} FROM idempotency_keys WHERE (scope, key) > (?, ?)"
                " ORDER BY scope, key LIMIT ?",
                (*(after or ("", "")), limit),
            ).fetchall()

        return [kept_reply(r) for r in await self._run(page)]

    async def export_ledger(self, after: int, limit: int) -> tuple[list[LedgerRow], int]:
        sql = (
            f"SELECT rowid, {', '.join(LEDGER_COLUMNS)} FROM ledger"
            " WHERE rowid > ? ORDER BY rowid LIMIT ?"
        )

        def page(db: sqlite3.Connection) -> tuple[list[LedgerRow], int]:
            rows = db.execute(sql, (after, limit)).fetchall()
            return [LedgerRow(*r[1:]) for r in rows], rows[-1][0] if rows else after

        return await self._run(page)

    async def shared_secret(self) -> None:
        """None: one proxy per data dir, whose secret file (auth.keys.server_secret) it is."""
        return None

    async def set_shared_secret(self, secret: bytes) -> bool:
        return False


PURGE_CHUNK = 2000  # ledger rows per purge transaction (see purge_ledger)


def _pages(state: bytes | None) -> int:
    """About how many WAL pages a turn's commit writes (see ``SQLiteStore._written``): the
    session's row with its state, the transition, a ledger row and their indexes (8 in a
    run of small turns), and the state's overflow pages."""
    return 8 + (len(state) >> 12 if state is not None else 0)


# Of a commit's ``_pages``, those a batch of commits writes once (``SQLiteStore._write``):
# the newest pages of the four b-trees in time order (the transitions, the ledger, its
# ``ts`` index and its ``row_id`` index, whose ids begin with their milliseconds:
# ``cost.meter._new_id``), not the session's row nor its entries in the keys by session
# (the transitions' and ``ledger_session``), which are each on a page of their own once
# those indexes have grown. Measured (WAL frames a batch
# of n commits, 3-4 KiB states): 8.3 for n = 1 and 84 for n = 64 on a new file, 137-230
# for n = 64 after 10,000-20,000 commits.
_SHARED_PAGES = 4


def _ledger_pages(rows: int) -> int:
    """About how many WAL pages a group of ``rows`` ledger rows writes (see ``_written``):
    4.3 measured for one row; 0.17-0.19 a row in groups of forwarded calls (the table and
    its three indexes; up to 0.66 when every row names another random session). Counted as
    4 whatever its size, forwarded load grew the WAL to ~6,000 pages before a checkpoint."""
    return 4 + rows // 5


_LEDGER_SHARED_PAGES = 4  # of _ledger_pages: the table's and its indexes' newest pages


def _roll_back(db: sqlite3.Connection) -> None:
    """End the open transaction, if SQLite has not ended it itself (after some errors)."""
    if db.in_transaction:
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:
            log.exception("store: rollback failed")


def _busy(e: sqlite3.Error) -> bool:
    """Whether ``e`` says that another connection holds the lock (nothing was written)."""
    return _primary_code(e) in (_BUSY, _LOCKED)


def _primary_code(e: sqlite3.Error) -> int | None:
    """SQLite's primary result code of ``e`` (the low byte of the extended one), for the
    codes in ``_CODE_BY_MESSAGE`` at least; None when it cannot tell."""
    code = getattr(e, "sqlite_errorcode", None)  # Python 3.11+
    if code is None:  # Python 3.10: only the message says which
        code = _CODE_BY_MESSAGE.get(str(e))
    return None if code is None else code & 0xFF


_RESPONSE_CHAIN = response_chain_sql("?", "?")


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
