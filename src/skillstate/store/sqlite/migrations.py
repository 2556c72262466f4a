"""The SQLite store's schema versions and how they are applied (store/migrations.py says
what every backend shares). Version 1 is the schema the SQLite store had before versioning:
a database made by that code (its tables, no ``schema_version``, maybe without the ledger
and transition columns added later) is recognised and adopted by migration 1, which creates
only what is missing. SQLite (one process per database) upgrades an older schema when it
opens it."""

from __future__ import annotations

import sqlite3
import time

from ..migrations import Migration, applied_line, ddl_statements, refuse_newer

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

# Version 4: each ledger row's id (LedgerRow.row_id), unique: an attempt written again
# replaces its row. Rows from before it have none.
_SQLITE_ROW_IDS = """
ALTER TABLE ledger ADD COLUMN row_id TEXT;
CREATE UNIQUE INDEX ledger_row_id ON ledger(row_id)
"""

# Version 5: what a call without usage is charged (LedgerRow.estimated_cost_usd). Rows from
# before it have none (they counted as nothing, as they did then).
_SQLITE_ESTIMATES = "ALTER TABLE ledger ADD COLUMN estimated_cost_usd REAL"

# Version 6: sessions indexed by the minute they were last updated (``touched``), not by
# ``updated``: a turn's commit changes ``updated`` and, with it, an index on it (its old
# entry's page and the newest page: 2 of a lone commit's 10 WAL pages), but ``touched``
# only on a session's first commit of a minute (store/sqlite/store.py, _advance_sql).
_SQLITE_TOUCHED = """
ALTER TABLE sessions ADD COLUMN touched INTEGER NOT NULL DEFAULT 0;
UPDATE sessions SET touched = CAST(updated / 60 AS INTEGER);
DROP INDEX sessions_updated;
CREATE INDEX sessions_touched ON sessions(touched)
"""

SQLITE_MIGRATIONS = (
    Migration(
        1,
        "sessions, transitions, ledger, api_keys, responses",
        ddl_statements(_SQLITE_V1),
        _add_missing_columns,
    ),
    Migration(
        2,
        "session_budgets; api_keys.max_session_budget_usd, api_keys.allow_unpriced",
        ddl_statements(_SQLITE_V2),
    ),
    Migration(3, "idempotency_keys", ddl_statements(_SQLITE_IDEMPOTENCY)),
    Migration(4, "ledger.row_id", ddl_statements(_SQLITE_ROW_IDS)),
    Migration(5, "ledger.estimated_cost_usd", ddl_statements(_SQLITE_ESTIMATES)),
    Migration(6, "sessions.touched, indexed instead of updated", ddl_statements(_SQLITE_TOUCHED)),
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
            refuse_newer(version, latest, where)
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
        lines.append(applied_line(where, version, migration, legacy, done))
    return lines
