"""Versioned schemas for both store backends.

Each backend has an ordered list of migrations; a ``schema_version`` table holds one row
per migration applied (version, when, what). Version 1 is the schema the SQLite store had
before versioning: a SQLite database made by that code (its tables, no ``schema_version``,
maybe without the ledger and transition columns added later) is recognised and adopted by
migration 1, which creates only what is missing.

What happens at start-up (``check`` / ``migrate_*``):
- a schema NEWER than this code knows is refused in one line (:class:`SchemaTooNew`);
- SQLite (one process per database) upgrades an older schema when it opens it;
- PostgreSQL creates the schema in an empty database (replicas starting together take an
  advisory lock, so exactly one of them runs it), but refuses a non-empty database at an
  older version (:class:`SchemaTooOld`): replicas of the previous release may still be
  running against it, so an upgrade is the operator's step, ``skillstate migrate``, before
  the rollout; each migration runs in its own transaction, all under that advisory lock.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .base import StoreError

if TYPE_CHECKING:
    import asyncpg


class SchemaTooNew(StoreError):
    """The database was migrated by a newer skillstate-proxy than this one."""


class SchemaTooOld(StoreError):
    """The database needs ``skillstate migrate`` before this code can use it."""


@dataclass(frozen=True, slots=True)
class Migration:
    """One step: DDL statements run in one transaction, then an optional ``fixup`` that
    adapts what an older release left (returns what it did, for the log line)."""

    version: int
    description: str
    statements: tuple[str, ...]
    fixup: Callable[[sqlite3.Connection], str | None] | None = field(default=None)


def _statements(script: str) -> tuple[str, ...]:
    # Our DDL has no ';' inside a statement.
    return tuple(s.strip() for s in script.split(";") if s.strip())


# -- SQLite -----------------------------------------------------------------------------

_SQLITE_V1 = """
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
    context TEXT,
    estimate BLOB,
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
    mode TEXT,
    baseline_cached_tokens INTEGER,
    baseline_output_tokens INTEGER,
    saved_cost_usd REAL,
    saved_cost_pct REAL,
    context TEXT
);
CREATE INDEX IF NOT EXISTS ledger_ts ON ledger(ts);
CREATE INDEX IF NOT EXISTS ledger_session ON ledger(session, ts);
CREATE TABLE IF NOT EXISTS api_keys (
    name TEXT PRIMARY KEY,
    digest TEXT NOT NULL UNIQUE,
    admin INTEGER NOT NULL,
    rpm INTEGER,
    tpm INTEGER,
    budget_usd_per_day REAL,
    created REAL NOT NULL,
    expires REAL,
    revoked REAL
);
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    session TEXT NOT NULL,
    created REAL NOT NULL,
    previous TEXT,
    input BLOB NOT NULL,
    response BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_created ON responses(created);
CREATE INDEX IF NOT EXISTS responses_session ON responses(session)
"""

# Columns added to tables after their first release: a database made before them gets
# them (NULL in old rows).
_ADDED_COLUMNS = {
    "ledger": {
        "baseline_cached_tokens": "INTEGER",
        "baseline_output_tokens": "INTEGER",
        "saved_cost_usd": "REAL",
        "saved_cost_pct": "REAL",
        "context": "TEXT",
    },
    "transitions": {"context": "TEXT", "estimate": "BLOB"},
}


def _add_missing_columns(db: sqlite3.Connection) -> str | None:
    added = []
    for table, columns in _ADDED_COLUMNS.items():
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        for name, kind in columns.items():
            if name not in have:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
                added.append(f"{table}.{name}")
    return f"added {', '.join(added)}" if added else None


# Version 2: per-session budgets (issue 26), and what a key allows its sessions.
_SQLITE_V2 = """
CREATE TABLE IF NOT EXISTS session_budgets (
    session TEXT PRIMARY KEY,
    budget_usd REAL NOT NULL,
    updated REAL NOT NULL
);
ALTER TABLE api_keys ADD COLUMN max_session_budget_usd REAL;
ALTER TABLE api_keys ADD COLUMN allow_unpriced INTEGER NOT NULL DEFAULT 0
"""

# Replies kept under their Idempotency-Key (skillstate.turn.idempotency), for
# idempotency_ttl: one row per keyed turn, written in the turn's commit.
_SQLITE_IDEMPOTENCY = """
CREATE TABLE idempotency_keys (
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    session TEXT NOT NULL,
    created REAL NOT NULL,
    status INTEGER NOT NULL,
    stream INTEGER NOT NULL,
    headers BLOB NOT NULL,
    body BLOB,
    step INTEGER,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_keys_created ON idempotency_keys(created);
CREATE INDEX idempotency_keys_session ON idempotency_keys(session)
"""

SQLITE_MIGRATIONS = (
    Migration(
        1,
        "sessions, transitions, ledger, api_keys, responses",
        _statements(_SQLITE_V1),
        _add_missing_columns,
    ),
    Migration(
        2,
        "session_budgets; api_keys.max_session_budget_usd, api_keys.allow_unpriced",
        _statements(_SQLITE_V2),
    ),
    Migration(3, "idempotency_keys", _statements(_SQLITE_IDEMPOTENCY)),
)

_SQLITE_VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_version"
    " (version INTEGER PRIMARY KEY, applied REAL NOT NULL, description TEXT NOT NULL)"
)


def sqlite_version(db: sqlite3.Connection) -> tuple[int, bool]:
    """(version, legacy): the database's schema version, 0 for none; ``legacy`` when it
    has tables from before schema_version."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "schema_version" in tables:
        row = db.execute("SELECT max(version) FROM schema_version").fetchone()
        return int(row[0] or 0), False
    return 0, bool(tables & {"sessions", "ledger", "transitions", "api_keys", "responses"})


def migrate_sqlite(db: sqlite3.Connection, where: str) -> list[str]:
    """Bring the database (a connection in autocommit mode) to the newest version, each
    migration in its own transaction; returns one line per migration applied. Raises
    SchemaTooNew for a database from a newer release."""
    latest = SQLITE_MIGRATIONS[-1].version
    version, _ = sqlite_version(db)
    if version == latest:
        return []  # the common case: no write lock taken
    lines = []
    for migration in SQLITE_MIGRATIONS:
        db.execute("BEGIN IMMEDIATE")
        try:
            version, legacy = sqlite_version(db)  # another process may have done it
            _refuse_newer(version, latest, where)
            if migration.version <= version:
                db.execute("ROLLBACK")
                continue
            for statement in migration.statements:
                db.execute(statement)
            done = migration.fixup(db) if migration.fixup else None
            db.execute(_SQLITE_VERSION_TABLE)
            db.execute(
                "INSERT INTO schema_version VALUES (?, ?, ?)",
                (migration.version, time.time(), migration.description),
            )
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        lines.append(_line(where, version, migration, legacy, done))
    return lines


# -- PostgreSQL -------------------------------------------------------------------------

_POSTGRES_V1 = """
CREATE TABLE sessions (
    id TEXT COLLATE "C" PRIMARY KEY,
    state BYTEA NOT NULL,
    schema TEXT NOT NULL,
    step BIGINT NOT NULL,
    created DOUBLE PRECISION NOT NULL,
    updated DOUBLE PRECISION NOT NULL
);
CREATE INDEX sessions_updated ON sessions(updated);
CREATE TABLE transitions (
    session TEXT NOT NULL,
    step BIGINT NOT NULL,
    patch BYTEA,
    action TEXT,
    status TEXT NOT NULL,
    errors TEXT NOT NULL,
    ts DOUBLE PRECISION NOT NULL,
    context TEXT,
    estimate BYTEA,
    PRIMARY KEY (session, step)
);
CREATE TABLE ledger (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ts DOUBLE PRECISION NOT NULL,
    session TEXT COLLATE "C",
    upstream TEXT,
    model TEXT,
    kind TEXT NOT NULL,
    status INTEGER NOT NULL,
    input_tokens BIGINT,
    output_tokens BIGINT,
    cache_read_tokens BIGINT,
    cache_write_tokens BIGINT,
    pricing TEXT NOT NULL,
    cost_usd DOUBLE PRECISION,
    baseline_input_tokens BIGINT,
    baseline_cost_usd DOUBLE PRECISION,
    mode TEXT,
    baseline_cached_tokens BIGINT,
    baseline_output_tokens BIGINT,
    saved_cost_usd DOUBLE PRECISION,
    saved_cost_pct DOUBLE PRECISION,
    context TEXT
);
CREATE INDEX ledger_ts ON ledger(ts);
CREATE INDEX ledger_session ON ledger(session, ts);
CREATE TABLE api_keys (
    name TEXT PRIMARY KEY,
    digest TEXT NOT NULL UNIQUE,
    admin BOOLEAN NOT NULL,
    rpm BIGINT,
    tpm BIGINT,
    budget_usd_per_day DOUBLE PRECISION,
    created DOUBLE PRECISION NOT NULL,
    expires DOUBLE PRECISION,
    revoked DOUBLE PRECISION
);
CREATE TABLE responses (
    id TEXT PRIMARY KEY,
    session TEXT NOT NULL,
    created DOUBLE PRECISION NOT NULL,
    previous TEXT,
    input BYTEA NOT NULL,
    response BYTEA NOT NULL
);
CREATE INDEX responses_created ON responses(created);
CREATE INDEX responses_session ON responses(session);
CREATE TABLE server_secret (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    secret BYTEA NOT NULL
)
"""

# Session ids are compared in code-point order (COLLATE "C"), whatever the database's
# default: a key's sessions and ledger rows are the id range ["alice:", "alice;"), which a
# language's collation (en_US: punctuation ignored at first) does not keep together.
_POSTGRES_V2 = """
CREATE TABLE session_budgets (
    session TEXT COLLATE "C" PRIMARY KEY,
    budget_usd DOUBLE PRECISION NOT NULL,
    updated DOUBLE PRECISION NOT NULL
);
ALTER TABLE api_keys ADD COLUMN max_session_budget_usd DOUBLE PRECISION;
ALTER TABLE api_keys ADD COLUMN allow_unpriced BOOLEAN NOT NULL DEFAULT FALSE
"""

_POSTGRES_IDEMPOTENCY = """
CREATE TABLE idempotency_keys (
    scope TEXT COLLATE "C" NOT NULL,
    key TEXT COLLATE "C" NOT NULL,
    fingerprint TEXT NOT NULL,
    session TEXT COLLATE "C" NOT NULL,
    created DOUBLE PRECISION NOT NULL,
    status INTEGER NOT NULL,
    stream BOOLEAN NOT NULL,
    headers BYTEA NOT NULL,
    body BYTEA,
    step BIGINT,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_keys_created ON idempotency_keys(created);
CREATE INDEX idempotency_keys_session ON idempotency_keys(session)
"""

POSTGRES_MIGRATIONS = (
    Migration(
        1,
        "sessions, transitions, ledger, api_keys, responses, server_secret",
        _statements(_POSTGRES_V1),
    ),
    Migration(
        2,
        "session_budgets; api_keys.max_session_budget_usd, api_keys.allow_unpriced",
        _statements(_POSTGRES_V2),
    ),
    Migration(3, "idempotency_keys", _statements(_POSTGRES_IDEMPOTENCY)),
)

# pg_advisory_lock's key for migrations: "skillsta" as a big-endian int64.
MIGRATION_LOCK = int.from_bytes(b"skillsta", "big")


async def postgres_version(conn: asyncpg.Connection) -> int:
    """The database's schema version, 0 for an empty database."""
    if not await conn.fetchval("SELECT to_regclass('schema_version') IS NOT NULL"):
        return 0
    return int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM schema_version"))


async def migrate_postgres(conn: asyncpg.Connection, where: str, *, upgrade: bool) -> list[str]:
    """Bring the database to the newest version under the migration advisory lock; returns
    one line per migration applied. ``upgrade`` False (start-up) only creates the schema in
    an empty database and raises SchemaTooOld for an older one; SchemaTooNew either way."""
    latest = POSTGRES_MIGRATIONS[-1].version
    version = await postgres_version(conn)
    _refuse_newer(version, latest, where)
    if version == latest:
        return []
    lines = []
    # Replicas starting together: one migrates, the others wait for the lock and then find
    # nothing left to do. A session lock, taken before each transaction begins: a
    # transaction that began before the other's commit could see the catalog as it was.
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK)
    try:
        # Read again under the lock: a version between 0 and the latest seen before it may
        # be another replica creating the schema one migration at a time (done by now),
        # not a database left by an older release.
        version = await postgres_version(conn)
        _refuse_newer(version, latest, where)
        if version and version < latest and not upgrade:
            raise SchemaTooOld(
                f"{where} has schema version {version}, older than this skillstate-proxy's"
                f" {latest}: run `skillstate migrate --store URL` once before starting it"
            )
        for migration in POSTGRES_MIGRATIONS:
            async with conn.transaction():
                version = await postgres_version(conn)
                _refuse_newer(version, latest, where)
                if migration.version <= version:
                    continue
                for statement in migration.statements:
                    await conn.execute(statement)
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY,"
                    " applied DOUBLE PRECISION NOT NULL, description TEXT NOT NULL)"
                )
                await conn.execute(
                    "INSERT INTO schema_version VALUES ($1, $2, $3)",
                    migration.version,
                    time.time(),
                    migration.description,
                )
            lines.append(_line(where, version, migration, False, None))
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK)
    return lines


# -- both -------------------------------------------------------------------------------


def _refuse_newer(version: int, latest: int, where: str) -> None:
    if version > latest:
        raise SchemaTooNew(
            f"{where} has schema version {version}, newer than this skillstate-proxy knows"
            f" ({latest}); run the release that migrated it, or a newer one"
        )


def _line(where: str, before: int, m: Migration, legacy: bool, done: str | None) -> str:
    what = m.description
    if legacy:
        what = f"adopted the tables made before schema_version ({what})"
    if done:
        what += f"; {done}"
    return f"{where}: schema {before} -> {m.version}: {what}"
