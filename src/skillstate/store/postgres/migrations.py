"""The PostgreSQL store's schema versions and how they are applied (store/migrations.py says
what every backend shares). Start-up creates the schema in an empty database (replicas
starting together take an advisory lock, so exactly one of them runs it) but refuses a
non-empty database at an older version (SchemaTooOld): replicas of the previous release
may still be running against it, so an upgrade is the operator's step, ``skillstate
migrate``, before the rollout; each migration runs in its own transaction, all under that
advisory lock."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..migrations import Migration, SchemaTooOld, applied_line, ddl_statements, refuse_newer

if TYPE_CHECKING:
    import asyncpg

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

# Version 4: each ledger row's id (LedgerRow.row_id), unique: an attempt written again
# replaces its row. Rows from before it have none.
_POSTGRES_ROW_IDS = """
ALTER TABLE ledger ADD COLUMN row_id TEXT;
CREATE UNIQUE INDEX ledger_row_id ON ledger(row_id)
"""

# Version 5: what a call without usage is charged (LedgerRow.estimated_cost_usd). Rows from
# before it have none (they counted as nothing, as they did then).
_POSTGRES_ESTIMATES = "ALTER TABLE ledger ADD COLUMN estimated_cost_usd DOUBLE PRECISION"

# Version 6: sessions indexed by the minute they were last updated (``touched``), not by
# ``updated``, as SQLite's version 6 does. A turn's commit changes ``updated``; with an index
# on it no UPDATE of a session can be a heap-only tuple (HOT) update, so every commit adds
# an entry to both of the table's indexes (left for VACUUM to clear). ``touched`` changes
# on a session's first commit of a minute only: the other commits of the minute are HOT
# when the page has room, which the lower fill factor keeps for the new pages. A generated
# column, so that it is right whoever writes the row: replicas of the release before,
# still running while the operator upgrades, write ``updated`` alone.
_POSTGRES_TOUCHED = """
ALTER TABLE sessions
    ADD COLUMN touched BIGINT GENERATED ALWAYS AS (trunc(updated / 60)::bigint) STORED;
DROP INDEX sessions_updated;
CREATE INDEX sessions_touched ON sessions(touched);
ALTER TABLE sessions SET (fillfactor = 80)
"""

POSTGRES_MIGRATIONS = (
    Migration(
        1,
        "sessions, transitions, ledger, api_keys, responses, server_secret",
        ddl_statements(_POSTGRES_V1),
    ),
    Migration(
        2,
        "session_budgets; api_keys.max_session_budget_usd, api_keys.allow_unpriced",
        ddl_statements(_POSTGRES_V2),
    ),
    Migration(3, "idempotency_keys", ddl_statements(_POSTGRES_IDEMPOTENCY)),
    Migration(4, "ledger.row_id", ddl_statements(_POSTGRES_ROW_IDS)),
    Migration(5, "ledger.estimated_cost_usd", ddl_statements(_POSTGRES_ESTIMATES)),
    Migration(6, "sessions.touched, indexed instead of updated", ddl_statements(_POSTGRES_TOUCHED)),
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
    refuse_newer(version, latest, where)
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
        refuse_newer(version, latest, where)
        if version and version < latest and not upgrade:
            raise SchemaTooOld(
                f"{where} has schema version {version}, older than this skillstate-proxy's"
                f" {latest}: run `skillstate migrate --store URL` once before starting it"
            )
        for migration in POSTGRES_MIGRATIONS:
            async with conn.transaction():
                version = await postgres_version(conn)
                refuse_newer(version, latest, where)
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
            lines.append(applied_line(where, version, migration, False, None))
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK)
    return lines
