"""The shared store: PostgreSQL through an asyncpg pool, for replicas behind a load balancer.

Same data and semantics as the SQLite store (store/sqlite/store.py), with these choices:

- **One statement per commit.** A turn's commit is a single SQL statement whose
  data-modifying CTEs update (or create) the session, append the transition and insert the
  turn's ledger rows: one round trip and one transaction, atomic by construction. It is a
  compare-and-set on the step (``UPDATE ... WHERE id = $1 AND step = $2``; a new session is
  an ``INSERT ... ON CONFLICT DO NOTHING``): when the step moved (another replica, or one
  that lost its lease, committed first) nothing is written and :class:`StepConflict` is
  raised. Concurrent commits on one row serialise on its row lock, and the second one
  re-checks the step after the first committed (READ COMMITTED), so exactly one wins.
- **A session cache only when leases verify it** (``cache_bytes`` > 0: the factory gives
  one when ``coordination`` is set). Replicas share the database, so a cached copy can be
  behind another replica's commit. Under a Redis lease the turn knows the step the
  session's last holder committed (``Hold.current``): a copy at that step is used (no round
  trip), any other is read again with ``load(fresh=True)``; ``GET /state`` checks the same
  way. Without coordination nothing could verify a copy, so nothing is cached and each load
  is one indexed SELECT by primary key. Either way the commit's compare-and-set is the
  guard: a turn built on a stale copy (Redis down under ``coordination_down: local``) gets
  StepConflict, writes nothing, and its copy is dropped.
- **Ledger rows written alone are group-committed** (:meth:`add_ledger_rows`): rows that
  arrive while an insert is running go together in the next one, one ``INSERT ... SELECT
  FROM unnest(...)`` for all of them. A turn's own rows go in its commit statement.
- **Fail fast.** Connecting, waiting for a pooled connection and every statement are bounded
  by ``timeout``; an unreachable, shut-down or read-only server is :class:`StoreUnavailable`
  (503, nothing written). A statement that times out is cancelled by the server-side
  cancel; being one statement, it either committed whole or not at all.
- **The key-hashing secret** lives in the database (``server_secret``, created once with
  ``INSERT ... ON CONFLICT DO NOTHING``), so every replica verifies the same client keys.
- ``max_sessions`` is checked in the new session's INSERT against ``count(*)`` (new sessions
  only); replicas creating sessions at the same instant can overshoot it by a few.

Round trips: load 1 (0 from a verified cached copy), commit 1 (2 when it conflicts: the
second says how the step moved), a group of ledger rows 1. Pooled connections keep no
session state, so they are returned to the pool without asyncpg's reset query (which would
be a round trip per use).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Collection
from typing import Any

import asyncpg
import orjson

from ...auth.record import KeyRecord
from ...config import ConfigError
from ...urltext import redacted
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
from ..cache import CachedSession, SessionCache
from ..ledgersql import (
    GROUP_BY,
    SEPARATOR,
    GroupKeys,
    ledger_where,
    spend_select,
    sums_of,
    sums_select,
)
from ..migrations import SchemaTooNew, SchemaTooOld
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
    ledger_column_kind,
    ledger_tuple,
    namespace_where,
    prefix_range,
    response_chain_sql,
    response_values,
    stored_response,
    transition_record,
)
from .migrations import POSTGRES_MIGRATIONS, migrate_postgres

log = logging.getLogger("skillstate")

GROUP_KEYS = GroupKeys(
    day="floor(ts / 86400)::bigint",
    key=f"CASE WHEN strpos(session, {SEPARATOR}) > 0 THEN split_part(session, {SEPARATOR}, 1) END",
)

_PG_TYPES = {"integer": "int8", "real": "float8", "text": "text"}
_LEDGER_ARRAY_TYPES = [_PG_TYPES[ledger_column_kind(c)] for c in LEDGER_COLUMNS]


def _unnest(first: int) -> str:
    """``SELECT * FROM unnest($first::type[], ...)``: one parameter (an array) per ledger
    column, so any number of rows is one statement."""
    arrays = ", ".join(f"${first + i}::{t}[]" for i, t in enumerate(_LEDGER_ARRAY_TYPES))
    return f"SELECT * FROM unnest({arrays})"


def _ledger_arrays(values: list[tuple[Any, ...]]) -> list[list[Any]]:
    if not values:
        return [[] for _ in LEDGER_COLUMNS]
    return [list(column) for column in zip(*values, strict=True)]


_LEDGER_INSERT = f"INSERT INTO ledger ({', '.join(LEDGER_COLUMNS)}) {_unnest(1)}{LEDGER_CONFLICT}"


# A stored response's parameters (RESPONSE_COLUMNS), and what replaces one with its id.
_RESPONSE_TYPES = ("text", "text", "float8", "text", "bytea", "bytea")
_RESPONSE_CONFLICT = (
    " ON CONFLICT (id) DO UPDATE SET session = EXCLUDED.session, created = EXCLUDED.created,"
    " previous = EXCLUDED.previous, input = EXCLUDED.input, response = EXCLUDED.response"
)


# A kept reply's parameters (KEPT_COLUMNS but session and step, which the commit has):
# scope, key, fingerprint, created, status, stream, headers, body.
_KEPT_TYPES = ("text", "text", "text", "float8", "int4", "bool", "bytea", "bytea")


def _commit_rest(ledger_first: int) -> str:
    """A commit after ``moved`` (the session row it changed, RETURNING the new step): the
    transition, the ledger rows, the kept reply (when its scope is not NULL) and the stored
    response (when its id is not NULL), written only when the session row was changed."""
    k = ledger_first + len(LEDGER_COLUMNS)
    kept = ", ".join(f"${k + i}::{t}" for i, t in enumerate(_KEPT_TYPES))
    r = k + len(_KEPT_TYPES)
    response = ", ".join(f"${r + i}::{t}" for i, t in enumerate(_RESPONSE_TYPES))
    return f"""
, transition AS (
    INSERT INTO transitions (session, step, patch, action, status, errors, ts, context, estimate)
    SELECT $1, step, $5, $6, $7, $8, $4, $9, $10 FROM moved
), spent AS (
    INSERT INTO ledger ({", ".join(LEDGER_COLUMNS)})
    {_unnest(ledger_first)} WHERE EXISTS (SELECT 1 FROM moved){LEDGER_CONFLICT}
), kept AS (
    INSERT INTO idempotency_keys
    (scope, key, fingerprint, created, status, stream, headers, body, session, step)
    SELECT {kept}, $1, step FROM moved WHERE ${k}::text IS NOT NULL
), stored AS (
    INSERT INTO responses ({RESPONSE_COLUMNS})
    SELECT {response} FROM moved WHERE ${r}::text IS NOT NULL{_RESPONSE_CONFLICT}
)
SELECT step FROM moved
"""


def _kept_args(kept: KeptReply | None) -> tuple[Any, ...]:
    """The commit's kept-reply parameters (all NULL without one)."""
    if kept is None:
        return (None,) * len(_KEPT_TYPES)
    v = kept_values(kept)
    return (*v[:3], *v[4:9])


def _minute(param: str) -> str:
    """The minute of the time in ``param``, as a session's row keeps it in ``touched``
    (generated from ``updated`` and indexed by sessions_touched: migration 6), for the
    statements that read the sessions by their last update."""
    return f"trunc({param}::float8 / 60)::bigint"


# $1 session, $2 expected step, $3 state (NULL: unchanged), $4 now, $5-$10 the transition
# (patch, action, status, errors, context, estimate), $11- the ledger columns.
_COMMIT_EXISTING = """
WITH moved AS (
    UPDATE sessions SET state = coalesce($3::bytea, state), step = step + 1, updated = $4
    WHERE id = $1 AND step = $2::bigint
    RETURNING step
)""" + _commit_rest(11)

# $2 max_sessions (0: no cap), $11 the schema, $12- the ledger columns; the rest as above.
_COMMIT_NEW = """
WITH moved AS (
    INSERT INTO sessions (id, state, schema, step, created, updated)
    SELECT $1, $3::bytea, $11::text, 1, $4, $4
    WHERE $2::bigint = 0 OR (SELECT count(*) FROM sessions) < $2::bigint
    ON CONFLICT (id) DO NOTHING
    RETURNING step
)""" + _commit_rest(12)

_RESPONSE_CHAIN = response_chain_sql("$1", "$2")

_KEEP = f"""
WITH kept AS (
    INSERT INTO idempotency_keys ({KEPT_COLUMNS})
    VALUES ({", ".join(f"${i + 1}" for i in range(len(KEPT_COLUMNS.split(","))))})
), spent AS (
    INSERT INTO ledger ({", ".join(LEDGER_COLUMNS)}) {_unnest(len(KEPT_COLUMNS.split(",")) + 1)}
    {LEDGER_CONFLICT}
)
SELECT 1
"""


# SQLSTATE classes and codes for "cannot write now, nothing written": connection problems
# (08), insufficient resources (53), operator intervention such as a shutdown (57),
# serialization failures and deadlocks (40), a read-only transaction, a lock not available.
_UNAVAILABLE_CLASSES = ("08", "40", "53", "57")
_UNAVAILABLE_CODES = ("25006", "55P03")


def as_store_error(e: BaseException) -> StoreError:
    """Any exception from asyncpg as the StoreError the caller gets (never with the URL)."""
    if isinstance(e, StoreError):
        return e
    if isinstance(e, asyncpg.PostgresError):
        state = e.sqlstate or ""
        if state[:2] in _UNAVAILABLE_CLASSES or state in _UNAVAILABLE_CODES:
            return StoreUnavailable(f"postgresql: {e}")
        return StoreError(f"postgresql: {e}")
    if isinstance(e, asyncio.TimeoutError | TimeoutError):
        return StoreUnavailable("postgresql did not answer in time")
    if isinstance(e, OSError | asyncpg.InterfaceError):  # refused, cut, pool closing
        return StoreUnavailable(f"postgresql is unreachable ({e})")
    log.error("store: unexpected %s from postgresql", type(e).__name__, exc_info=e)
    return StoreError(f"unexpected {type(e).__name__} from postgresql: {e}")


async def _keep_connection(conn: asyncpg.Connection) -> None:
    """The pool's reset: nothing (our connections keep no session state), saving a round
    trip per use. asyncpg still rolls back a transaction left open."""


def _text(value: str | None) -> str | None:
    # PostgreSQL text cannot hold NUL; JSON columns are bytes and escape it anyway.
    return None if value is None else value.replace("\x00", "")


class PostgresStore:
    """Sessions, transitions, the ledger, client keys and stored responses in PostgreSQL,
    shared by every replica that points at it.

    ``pool_size`` connections at most; ``timeout`` bounds connecting, waiting for a pooled
    connection and (unless ``unbounded_statements``) each statement, in seconds;
    ``max_sessions`` (0 = no limit) as in SQLite; ``close_timeout`` bounds how long close()
    waits for queued ledger writes; ``cache_bytes`` > 0 keeps a session cache, for replicas
    whose leases verify it (module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 10,
        timeout: float = 5.0,
        max_sessions: int = 0,
        close_timeout: float = 10.0,
        unbounded_statements: bool = False,
        cache_sessions: int = 4096,
        cache_bytes: int = 0,
    ) -> None:
        self.url = url
        self.where = redacted(url)
        self._pool_size = pool_size
        self._timeout = timeout
        # ``skillstate migrate``'s statements are not bounded: DDL on a big table takes long.
        self._statement_timeout = None if unbounded_statements else timeout
        self._max_sessions = max_sessions
        self._close_timeout = close_timeout
        self._pool: asyncpg.Pool | None = None
        self._sessions = 0  # sessions in the database, as this replica last knew it
        self._cache = SessionCache(cache_sessions, cache_bytes)  # see the module docstring
        self._write_failure: StoreError | None = None
        # Group commit of ledger rows written alone: (rows, waiter) queued while one runs.
        self._ledger_queue: list[tuple[list[tuple[Any, ...]], asyncio.Future[None]]] = []
        self._ledger_writer: asyncio.Future[None] | None = None

    # -- before the proxy runs (Store: home, exists, preflight, migrate) -----------------

    @property
    def home(self) -> None:
        return None  # the server keeps the client keys' secret (shared_secret)

    def exists(self) -> bool:
        return True  # the server's database is there to ask; open() says when it is not

    def preflight(self) -> None:
        """The server is reachable and its schema is one this code can use."""

        async def probe() -> None:
            await self.open()
            await self.close()

        try:
            asyncio.run(probe())
        except StoreError as e:
            raise ConfigError(f"store: {e}") from None

    def migrate(self) -> list[str]:
        """Each migration in its own transaction, under the advisory lock (migrations.py)."""

        async def run() -> list[str]:
            # No bound on a statement: a migration's DDL on a big table may take long.
            store = PostgresStore(
                self.url, pool_size=1, timeout=self._timeout, unbounded_statements=True
            )
            await store.open_pool()
            try:
                async with store.connection() as conn:
                    return await migrate_postgres(conn, store.where, upgrade=True)
            finally:
                await store.close()

        try:
            lines = asyncio.run(run())
        except StoreError as e:
            raise ConfigError(f"store: {e}") from None
        latest = POSTGRES_MIGRATIONS[-1].version
        return lines or [f"{self.where}: at schema {latest}, this release's: nothing to do"]

    # -- plumbing -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection; every failure inside comes out as a StoreError."""
        pool = self._pool
        if pool is None:
            raise StoreUnavailable("store is closed")
        acquired = False
        try:
            async with pool.acquire(timeout=self._timeout) as conn:
                acquired = True
                yield conn
        except (ValueError, TypeError) as e:
            if not acquired:  # the pool connects on use: asyncpg read the URL only now
                # Its message may quote the URL (a password holding a "/" read as a port).
                raise StoreError(f"{self.where} is not a usable PostgreSQL URL") from e
            raise as_store_error(e) from e
        except Exception as e:
            raise as_store_error(e) from e

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        async with self.connection() as conn:
            return list(await conn.fetch(sql, *args))

    async def _fetchval(self, sql: str, *args: Any) -> Any:
        async with self.connection() as conn:
            return await conn.fetchval(sql, *args)

    async def _write(self, sql: str, *args: Any) -> Any:
        """One writing statement; its first value. A failure to reach the server marks the
        store unable to write (ensure_writable probes before the next turn)."""
        try:
            return await self._fetchval(sql, *args)
        except StoreUnavailable as e:
            self._write_failure = e
            raise

    async def open(self) -> None:
        """Connect, then create the schema in an empty database (SchemaTooOld/SchemaTooNew
        for a database this code cannot use as it is: see store/migrations.py)."""
        await self.open_pool()
        try:
            async with self.connection() as conn:
                for line in await migrate_postgres(conn, self.where, upgrade=False):
                    log.info("store: %s", line)
                self._sessions = int(await conn.fetchval("SELECT count(*) FROM sessions"))
        except (SchemaTooNew, SchemaTooOld):
            await self.close()
            raise  # they name the store already
        except StoreError as e:
            await self.close()
            raise type(e)(f"cannot open store {self.where}: {e}") from e
        except BaseException:
            await self.close()
            raise

    async def open_pool(self) -> None:
        """Only the pool (``skillstate migrate`` migrates through it itself)."""
        try:
            self._pool = await asyncpg.create_pool(
                self.url,
                min_size=0,  # connects on use: no reconnect loop (and its log) while down
                max_size=self._pool_size,
                timeout=self._timeout,
                command_timeout=self._statement_timeout,
                reset=_keep_connection,
            )
        except (ValueError, TypeError) as e:  # a malformed URL; the message may quote it
            raise StoreError(f"{self.where} is not a usable PostgreSQL URL") from e
        except Exception as e:
            err = as_store_error(e)
            raise type(err)(f"cannot open store {self.where}: {err}") from e

    async def close(self) -> None:
        """Close after the queued ledger rows landed, or after ``close_timeout`` at most."""
        if self._ledger_writer is not None:
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._ledger_writer), self._close_timeout)
        for _, fut in self._ledger_queue:
            if not fut.done():
                fut.set_exception(StoreUnavailable("the store closed before this write"))
        self._ledger_queue = []
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), self._close_timeout)
            except (Exception, asyncio.TimeoutError):
                pool.terminate()

    async def check(self, timeout: float) -> str | None:
        """None when the database takes writes now, else why not (at most ``timeout``)."""
        if self._pool is None:
            return "closed"
        try:
            standby = await asyncio.wait_for(self._fetchval("SELECT pg_is_in_recovery()"), timeout)
        except asyncio.TimeoutError:  # not the builtin on Python 3.10
            return f"the store did not answer within {timeout:g}s"
        except StoreError as e:
            return str(e)
        return "the database is a read-only standby" if standby else None

    async def ensure_writable(self, timeout: float) -> None:
        if self._pool is None:
            raise StoreUnavailable("store is closed")
        if self._write_failure is None:
            return
        problem = await self.check(timeout)
        if problem is not None:
            raise StoreUnavailable(problem)
        self._write_failure = None

    def ensure_room_for_session(self) -> None:
        if self._max_sessions and self._sessions >= self._max_sessions:
            raise StoreFull(full_message(self._max_sessions))

    async def shared_secret(self) -> bytes:
        """The secret client keys are hashed with, the same for every replica: made by the
        first one that asks, kept in the database."""
        async with self.connection() as conn:
            await conn.execute(
                "INSERT INTO server_secret (id, secret) VALUES (1, $1) ON CONFLICT (id) DO NOTHING",
                secrets.token_bytes(32),
            )
            secret: bytes = await conn.fetchval("SELECT secret FROM server_secret WHERE id = 1")
        return secret

    async def set_shared_secret(self, secret: bytes) -> bool:
        await self._write(
            "INSERT INTO server_secret (id, secret) VALUES (1, $1)"
            " ON CONFLICT (id) DO UPDATE SET secret = EXCLUDED.secret",
            secret,
        )
        return True

    # -- sessions -------------------------------------------------------------------------

    async def load(self, session: str, *, fresh: bool = False) -> SessionRecord | None:
        """The cached copy unless ``fresh`` (the caller verifies its step), else the
        database's row."""
        cached = None if fresh else self._cache.get(session)
        if cached is not None:
            return cached.record(session)
        rows = await self._fetch(
            "SELECT state, schema, step, created, updated FROM sessions WHERE id = $1", session
        )
        if not rows:
            self._cache.forget(session)
            return None
        state, schema, step, created, updated = rows[0]
        entry = CachedSession(state, orjson.loads(schema), step, created, updated)
        self._cache.remember(session, entry)
        return entry.record(session)

    async def commit(self, c: SessionCommit) -> int:
        """One statement, one transaction: the compare-and-set of the step, the transition,
        the ledger rows and the kept reply (see the module's docstring). StepConflict when
        the step moved, KeptAlready when the reply's key is kept, StoreFull past
        max_sessions; nothing is written in any of these cases."""
        session, expected_step, transition, kept = c.session, c.expected_step, c.transition, c.kept
        now = clamp_time(c.now)
        try:
            ledger_values = [ledger_tuple(r) for r in c.ledger or []]
            state_blob = c.state_blob()
            patch_blob = orjson.dumps(transition.patch) if transition.patch is not None else None
            errors = orjson.dumps(transition.errors).decode()
            estimate = None if transition.estimate is None else orjson.dumps(transition.estimate)
            schema_text = orjson.dumps(c.schema).decode()
        except (TypeError, ValueError) as e:  # orjson.JSONEncodeError is a TypeError
            raise StoreError(f"cannot store the turn: {e}") from e
        new = expected_step == 0
        stored_state = (state_blob or b"{}") if new else state_blob
        args = (
            session,
            self._max_sessions if new else expected_step,
            stored_state,
            now,
            patch_blob,
            _text(transition.action),
            transition.status,
            errors,
            _text(transition.context),
            estimate,
            *((schema_text,) if new else ()),
            *_ledger_arrays(ledger_values),
            *_kept_args(kept),
            *(response_values(c.response) if c.response else (None,) * len(_RESPONSE_TYPES)),
        )
        try:
            try:
                step = await self._write(_COMMIT_NEW if new else _COMMIT_EXISTING, *args)
            except StoreError as e:
                raise _kept_already(e, kept) from e
            if step is None:
                raise await self._refusal(session, expected_step)
        except StoreError:
            self._cache.forget(session)  # the copy may be what is stale
            raise
        if new:
            self._sessions += 1
        self._cache.committed(session, stored_state, c.schema, int(step), now)
        return int(step)

    def commit_at_once(self, c: SessionCommit) -> int | None:
        """None: a commit is a round trip to the server (``commit``)."""
        return None

    async def kept_reply(self, scope: str, key: str) -> KeptReply | None:
        rows = await self._fetch(
            f"SELECT {KEPT_COLUMNS} FROM idempotency_keys WHERE scope = $1 AND key = $2",
            scope,
            key,
        )
        return kept_reply(rows[0]) if rows else None

    async def keep_reply(self, kept: KeptReply, ledger: list[LedgerRow]) -> None:
        rows = _ledger_arrays([ledger_tuple(r) for r in ledger])
        try:
            await self._write(_KEEP, *kept_values(kept), *rows)
        except StoreError as e:
            raise _kept_already(e, kept) from e

    async def purge_kept_replies(self, older_than: float) -> int:
        purged = await self._write(
            "WITH gone AS (DELETE FROM idempotency_keys WHERE created < $1 RETURNING 1)"
            " SELECT count(*) FROM gone",
            older_than,
        )
        return int(purged)

    async def _refusal(self, session: str, expected_step: int) -> StoreError:
        """Why a commit wrote nothing: the step moved, or the store is full."""
        current = await self._fetchval("SELECT step FROM sessions WHERE id = $1", session)
        if current is None and expected_step == 0 and self._max_sessions:
            self._sessions = max(self._sessions, self._max_sessions)
            return StoreFull(full_message(self._max_sessions))
        return StepConflict(f"session {session} moved from step {expected_step} to {current or 0}")

    async def sessions_page(
        self, limit: int, after: tuple[float, str] | None = None, prefix: str | None = None
    ) -> list[dict[str, Any]]:
        sql = "SELECT id, step, updated, octet_length(state) FROM sessions WHERE TRUE"
        args: list[Any] = []
        if after is not None:
            args += [after[0], after[1]]
            sql += f" AND touched <= {_minute('$1')}"
            sql += " AND (updated < $1 OR (updated = $1 AND id > $2))"
        if prefix:
            low, high = f"${len(args) + 1}", f"${len(args) + 2}"
            where, range_args = namespace_where("id", prefix, low, high)
            sql += where
            args += range_args
        args.append(limit)
        # The same order as by updated alone (touched is its minute), read by sessions_touched.
        sql += f" ORDER BY touched DESC, updated DESC, id LIMIT ${len(args)}"
        rows = await self._fetch(sql, *args)
        return [{"session": r[0], "step": r[1], "updated": r[2], "state_bytes": r[3]} for r in rows]

    async def history_page(
        self, session: str, limit: int, after_step: int = 0
    ) -> list[TransitionRecord]:
        rows = await self._fetch(
            f"SELECT {TRANSITION_COLUMNS} FROM transitions"
            " WHERE session = $1 AND step > $2 ORDER BY step LIMIT $3",
            session,
            after_step,
            limit,
        )
        return [transition_record(r) for r in rows]

    async def delete(self, session: str) -> bool:
        deleted = await self._write(
            "WITH gone AS (DELETE FROM sessions WHERE id = $1 RETURNING 1),"
            " t AS (DELETE FROM transitions WHERE session = $1),"
            " r AS (DELETE FROM responses WHERE session = $1),"
            " b AS (DELETE FROM session_budgets WHERE session = $1),"
            " k AS (DELETE FROM idempotency_keys WHERE session = $1)"
            " SELECT count(*) FROM gone",
            session,
        )
        self._cache.forget(session)
        self._sessions = max(self._sessions - int(deleted), 0)
        return bool(deleted)

    async def purge_sessions(self, older_than: float, keep: Collection[str] = ()) -> int:
        async with self.connection() as conn:
            purged: list[str] = await conn.fetchval(
                f"WITH gone AS (DELETE FROM sessions WHERE touched <= {_minute('$1')}"
                " AND updated < $1 AND id <> ALL($2::text[]) RETURNING id),"
                " t AS (DELETE FROM transitions WHERE session IN (SELECT id FROM gone)),"
                # Stored responses expire with the same TTL (passthrough turns store them
                # under sessions that have no state row).
                " r AS (DELETE FROM responses WHERE created < $1),"
                # Budgets go with their sessions; one of a session with no state row
                # (passthrough) with the same TTL, counted from when it was set.
                " b AS (DELETE FROM session_budgets WHERE session IN (SELECT id FROM gone)"
                " OR (updated < $1 AND session <> ALL($2::text[]) AND NOT EXISTS"
                " (SELECT 1 FROM sessions s WHERE s.id = session_budgets.session)))"
                " SELECT coalesce(array_agg(id), '{}') FROM gone",
                older_than,
                list(keep),
            )
            # Other replicas create sessions too: recount while at it.
            self._sessions = int(await conn.fetchval("SELECT count(*) FROM sessions"))
        for session in purged:
            self._cache.forget(session)
        return len(purged)

    # -- Responses API responses ----------------------------------------------------------

    async def put_response(self, record: StoredResponse) -> None:
        await self._write(
            f"INSERT INTO responses ({RESPONSE_COLUMNS})"
            f" VALUES ($1, $2, $3, $4, $5, $6){_RESPONSE_CONFLICT}",
            *response_values(record),
        )

    async def response_chain(self, response_id: str, limit: int) -> list[StoredResponse]:
        rows = await self._fetch(_RESPONSE_CHAIN, response_id, limit)
        return [stored_response(r) for r in rows]

    async def delete_response(self, response_id: str) -> bool:
        deleted = await self._write(
            "WITH gone AS (DELETE FROM responses WHERE id = $1 RETURNING 1)"
            " SELECT count(*) FROM gone",
            response_id,
        )
        return bool(deleted)

    # -- ledger ---------------------------------------------------------------------------

    async def add_ledger_rows(self, rows: list[LedgerRow]) -> None:
        """Insert the rows together with whatever other rows are queued (group commit);
        returns once they are committed."""
        if not rows:
            return
        values = [ledger_tuple(r) for r in rows]
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ledger_queue.append((values, fut))
        if self._ledger_writer is None or self._ledger_writer.done():
            self._ledger_writer = asyncio.ensure_future(self._write_ledger())
        await fut

    async def _write_ledger(self) -> None:
        """Drain the queue, one INSERT per group; each waiter gets its group's outcome."""
        while self._ledger_queue:
            group, self._ledger_queue = self._ledger_queue, []
            try:
                rows = [v for values, _ in group for v in values]
                await self._write(_LEDGER_INSERT, *_ledger_arrays(rows))
            except Exception as exc:  # whatever it is, every waiter gets an answer
                e = as_store_error(exc)
                if len(group) > 1 and not isinstance(e, StoreUnavailable):
                    # A value the server refused: retry each write alone, so that only the
                    # bad one fails.
                    for values, fut in group:
                        await self._settle_alone(values, fut)
                    continue
                for _, fut in group:
                    if not fut.done():
                        fut.set_exception(e)
            else:
                for _, fut in group:
                    if not fut.done():  # a cancelled waiter: its rows landed all the same
                        fut.set_result(None)

    async def _settle_alone(self, values: list[tuple[Any, ...]], fut: asyncio.Future[None]) -> None:
        try:
            await self._write(_LEDGER_INSERT, *_ledger_arrays(values))
        except Exception as e:
            if not fut.done():
                fut.set_exception(as_store_error(e))
        else:
            if not fut.done():
                fut.set_result(None)

    async def ledger_rows(
        self, since: float, until: float, session: str | None = None, prefix: str | None = None
    ) -> list[LedgerRow]:
        where, args = ledger_where(since, until, session, prefix, mark="$N")
        sql = f"SELECT {', '.join(LEDGER_COLUMNS)} FROM ledger{where} ORDER BY ts"
        return [LedgerRow(*r) for r in await self._fetch(sql, *args)]

    async def ledger_sums(
        self,
        since: float,
        until: float,
        session: str | None = None,
        prefix: str | None = None,
        group_by: str | None = None,
    ) -> list[LedgerSums]:
        where, args = ledger_where(since, until, session, prefix, mark="$N")
        sql = sums_select(GROUP_KEYS, group_by) + where + GROUP_BY
        async with self.connection() as conn:
            # /cost (and store copy's check) may sum millions of rows: seconds, more than
            # the fail-fast bound of a turn's statements
            rows = await conn.fetch(sql, *args, timeout=max(self._timeout, LEDGER_SUMS_TIMEOUT))
        return [sums_of(r, group_by) for r in rows]

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
        sql = spend_select(whole, unpriced, mark="$N", in_flight=in_flight is not None)
        args: tuple[Any, ...] = (prefix, since) if whole else (*prefix_range(prefix), since)
        args += in_flight or ()
        if pending is None:
            return float(await self._fetchval(sql, *args))
        # One statement: the pending row's INSERT in a WITH, which the sum does not see (it
        # reads the statement's snapshot), committed before the sum is returned.
        insert = f"INSERT INTO ledger ({', '.join(LEDGER_COLUMNS)}) {_unnest(len(args) + 1)}"
        sql = f"WITH pending AS ({insert}{LEDGER_CONFLICT}) {sql}"
        return float(await self._write(sql, *args, *_ledger_arrays([ledger_tuple(pending)])))

    async def drop_ledger_rows(self, row_ids: list[str]) -> None:
        await self._write(
            "DELETE FROM ledger WHERE row_id = ANY($1::text[]) AND pricing = $2", row_ids, PENDING
        )

    async def settle_pending(self, older_than: float) -> int:
        settled = await self._write(
            "WITH settled AS (UPDATE ledger SET pricing = $1 WHERE pricing = $2 AND ts < $3"
            " RETURNING 1) SELECT count(*) FROM settled",
            INTERRUPTED,
            PENDING,
            older_than,
        )
        return int(settled)

    async def session_budget(self, session: str) -> float | None:
        usd = await self._fetchval(
            "SELECT budget_usd FROM session_budgets WHERE session = $1", session
        )
        return None if usd is None else float(usd)

    async def set_session_budget(
        self, session: str, usd: float | None, *, replace: bool
    ) -> float | None:
        if usd is None:
            await self._write("DELETE FROM session_budgets WHERE session = $1", session)
            return None
        conflict = "UPDATE SET budget_usd = EXCLUDED.budget_usd, updated = EXCLUDED.updated"
        stored = await self._write(
            "WITH put AS (INSERT INTO session_budgets (session, budget_usd, updated)"
            f" VALUES ($1, $2, $3) ON CONFLICT (session) DO {conflict if replace else 'NOTHING'}"
            " RETURNING budget_usd)"
            " SELECT coalesce((SELECT budget_usd FROM put),"
            " (SELECT budget_usd FROM session_budgets WHERE session = $1))",
            session,
            usd,
            time.time(),
        )
        if stored is None:  # another replica's insert landed after this statement began
            stored = await self.session_budget(session)
        return None if stored is None else float(stored)

    async def purge_ledger(self, older_than: float) -> int:
        purged = await self._write(
            "WITH gone AS (DELETE FROM ledger WHERE ts < $1 RETURNING 1) SELECT count(*) FROM gone",
            older_than,
        )
        return int(purged)

    # -- client keys ----------------------------------------------------------------------

    async def save_key(self, record: KeyRecord, *, new: bool) -> None:
        """Insert a key (``new``: StoreError if the name is taken) or replace it."""
        columns = [c.strip() for c in KEY_COLUMNS.split(",")]
        marks = ", ".join(f"${i + 1}" for i in range(len(columns)))
        sql = f"INSERT INTO api_keys ({KEY_COLUMNS}) VALUES ({marks})"
        if not new:
            updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns)
            sql += f" ON CONFLICT (name) DO UPDATE SET {updates}"
        try:
            await self._write(sql, *key_values(record))
        except StoreError as e:
            if isinstance(e.__cause__, asyncpg.UniqueViolationError) and new:
                raise StoreError(f"a key named {record.name!r} already exists") from None
            raise

    async def keys(self) -> list[KeyRecord]:
        rows = await self._fetch(f"SELECT {KEY_COLUMNS} FROM api_keys ORDER BY name")
        return [key_record(r) for r in rows]

    async def has_keys(self) -> bool:
        return bool(await self._fetchval("SELECT EXISTS (SELECT 1 FROM api_keys)"))

    async def key_by_digest(self, digest: str) -> KeyRecord | None:
        rows = await self._fetch(f"SELECT {KEY_COLUMNS} FROM api_keys WHERE digest = $1", digest)
        return key_record(rows[0]) if rows else None

    # -- export and import (skillstate store copy) ----------------------------------------

    async def counts(self) -> dict[str, int]:
        selects = ", ".join(f"(SELECT count(*) FROM {table})" for table in COUNTED_TABLES)
        rows = await self._fetch(f"SELECT {selects}")
        return {name: int(n) for name, n in zip(COUNTED, rows[0], strict=True)}

    async def export_sessions(self, after: str | None, limit: int) -> list[SessionRecord]:
        rows = await self._fetch(
            f"SELECT {EXPORTED_SESSION_COLUMNS} FROM sessions WHERE id > $1 ORDER BY id LIMIT $2",
            "" if after is None else after,
            limit,
        )
        return [exported_session(r) for r in rows]

    async def import_session(self, record: SessionRecord) -> None:
        inserted = await self._write(
            "WITH added AS (INSERT INTO sessions (id, state, schema, step, created, updated)"
            " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING RETURNING 1)"
            " SELECT count(*) FROM added",
            record.session,
            orjson.dumps(record.state),
            orjson.dumps(record.schema).decode(),
            record.step,
            record.created,
            record.updated,
        )
        if not inserted:
            raise StoreError(f"session {record.session} already exists")
        self._sessions += 1

    async def import_transitions(self, session: str, history: list[TransitionRecord]) -> None:
        if not history:
            return
        await self._write(
            "INSERT INTO transitions"
            " (session, step, patch, action, status, errors, ts, context, estimate)"
            " SELECT $1, * FROM unnest($2::int8[], $3::bytea[], $4::text[], $5::text[],"
            " $6::text[], $7::float8[], $8::text[], $9::bytea[])",
            session,
            [t.step for t in history],
            [None if t.patch is None else orjson.dumps(t.patch) for t in history],
            [_text(t.action) for t in history],
            [t.status for t in history],
            [orjson.dumps(t.errors).decode() for t in history],
            [t.ts for t in history],
            [_text(t.context) for t in history],
            [None if t.estimate is None else orjson.dumps(t.estimate) for t in history],
        )

    async def export_responses(self, after: str | None, limit: int) -> list[StoredResponse]:
        rows = await self._fetch(
            f"SELECT {RESPONSE_COLUMNS} FROM responses WHERE id > $1 ORDER BY id LIMIT $2",
            "" if after is None else after,
            limit,
        )
        return [stored_response(r) for r in rows]

    async def export_session_budgets(
        self, after: str | None, limit: int
    ) -> list[tuple[str, float]]:
        rows = await self._fetch(
            "SELECT session, budget_usd FROM session_budgets WHERE session > $1"
            " ORDER BY session LIMIT $2",
            "" if after is None else after,
            limit,
        )
        return [(str(s), float(usd)) for s, usd in rows]

    async def export_kept_replies(
        self, after: tuple[str, str] | None, limit: int
    ) -> list[KeptReply]:
        rows = await self._fetch(
            f"SELECT {KEPT_COLUMNS} FROM idempotency_keys WHERE (scope, key) > ($1, $2)"
            " ORDER BY scope, key LIMIT $3",
            *(after or ("", "")),
            limit,
        )
        return [kept_reply(r) for r in rows]

    async def export_ledger(self, after: int, limit: int) -> tuple[list[LedgerRow], int]:
        rows = await self._fetch(
            f"SELECT id, {', '.join(LEDGER_COLUMNS)} FROM ledger"
            " WHERE id > $1 ORDER BY id LIMIT $2",
            after,
            limit,
        )
        return [LedgerRow(*r[1:]) for r in rows], int(rows[-1][0]) if rows else after


def _kept_already(e: StoreError, kept: KeptReply | None) -> StoreError:
    """A unique violation on the kept replies' key as KeptAlready; any other error as is."""
    cause = e.__cause__
    if (
        kept is not None
        and isinstance(cause, asyncpg.UniqueViolationError)
        and cause.constraint_name == "idempotency_keys_pkey"
    ):
        return KeptAlready(f"Idempotency-Key {kept.key!r} was kept by another turn")
    return e


LEDGER_SUMS_TIMEOUT = 300.0  # seconds; summing 1M ledger rows took about 1 s (docs/scaling.md)
