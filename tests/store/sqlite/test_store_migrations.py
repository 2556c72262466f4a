"""Versioned SQLite schemas: an empty database is created at the newest version, one made
by the code before schema_version is recognised and brought up (its data kept), and one
from a newer release is refused in one line."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from skillstate.store import SessionCommit, TransitionRecord
from skillstate.store.migrations import SchemaTooNew
from skillstate.store.sqlite import SQLiteStore
from skillstate.store.sqlite.migrations import SQLITE_MIGRATIONS
from tests.conftest import proxy_env
from tests.storefill import listed_in_pages

LATEST = SQLITE_MIGRATIONS[-1].version

# The schema as the code before schema_version made it (git show c4add7e:src/skillstate/
# store/sqlite/store.py): every table, no schema_version.
BEFORE_VERSIONING = """
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
CREATE INDEX IF NOT EXISTS responses_session ON responses(session);
"""

# Older still (before b174f8f/84ced9c): a ledger and transitions without the later columns.
BEFORE_COST_COLUMNS = """
CREATE TABLE sessions (id TEXT PRIMARY KEY, state BLOB NOT NULL, schema TEXT NOT NULL,
    step INTEGER NOT NULL, created REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE transitions (session TEXT NOT NULL, step INTEGER NOT NULL, patch BLOB,
    action TEXT, status TEXT NOT NULL, errors TEXT NOT NULL, ts REAL NOT NULL,
    PRIMARY KEY (session, step));
CREATE TABLE ledger (ts REAL NOT NULL, session TEXT, upstream TEXT, model TEXT,
    kind TEXT NOT NULL, status INTEGER NOT NULL, input_tokens INTEGER, output_tokens INTEGER,
    cache_read_tokens INTEGER, cache_write_tokens INTEGER, pricing TEXT NOT NULL,
    cost_usd REAL, baseline_input_tokens INTEGER, baseline_cost_usd REAL, mode TEXT);
"""

ROWS = """
INSERT INTO sessions VALUES ('old', '{"k": 2}', '["k"]', 2, 1.0, 2.0);
INSERT INTO transitions (session, step, patch, action, status, errors, ts)
    VALUES ('old', 1, '{"k": 1}', 'a', 'valid', '[]', 1.0),
           ('old', 2, '{"k": 2}', 'b', 'valid', '[]', 2.0);
INSERT INTO ledger (ts, session, kind, status, pricing, cost_usd)
    VALUES (1.0, 'old', 'generation', 200, 'known', 0.25);
"""


def make_db(path: Path, script: str) -> None:
    db = sqlite3.connect(path)
    db.executescript(script + ROWS)
    db.close()


def versions(path: Path) -> list[int]:
    db = sqlite3.connect(path)
    try:
        return [r[0] for r in db.execute("SELECT version FROM schema_version ORDER BY version")]
    finally:
        db.close()


def migrate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "skillstate", "migrate", "--store", f"sqlite://{path}"],
        capture_output=True, text=True, timeout=60, env=proxy_env(),
    )  # fmt: skip


async def test_an_empty_database_is_made_at_the_newest_version(tmp_path: Path) -> None:
    path = tmp_path / "skillstate.db"
    store = SQLiteStore(path)
    await store.open()
    await store.close()
    assert versions(path) == list(range(1, LATEST + 1))
    again = migrate(path)
    assert again.returncode == 0 and f"at schema {LATEST}" in again.stdout
    assert "nothing to do" in again.stdout


@pytest.mark.parametrize("script", [BEFORE_VERSIONING, BEFORE_COST_COLUMNS])
async def test_a_database_from_before_versioning_is_brought_up(tmp_path: Path, script: str) -> None:
    path = tmp_path / "old.db"
    make_db(path, script)
    r = migrate(path)
    assert r.returncode == 0, r.stderr
    line, *later = r.stdout.splitlines()
    assert line.startswith(f"sqlite://{path}: schema 0 -> 1: adopted the tables made before")
    # Then each later migration, in order (2: session budgets, 3: idempotency_keys, ...).
    assert [x.split(": ")[1] for x in later] == [
        f"schema {v - 1} -> {v}" for v in range(2, LATEST + 1)
    ]
    if script is BEFORE_COST_COLUMNS:
        assert "added ledger.baseline_cached_tokens" in line and "transitions.estimate" in line
    else:
        assert "added" not in line  # it had every column already
    assert versions(path) == list(range(1, LATEST + 1))
    assert "nothing to do" in migrate(path).stdout
    # The data is all there, and the session goes on.
    store = SQLiteStore(path)
    await store.open()
    try:
        rec = await store.load("old")
        assert rec is not None and (rec.step, rec.state) == (2, {"k": 2})
        tr = TransitionRecord(3, "valid", {"k": 3}, "c", [], 3.0, "full", {"form": "full"})
        step = await store.commit(
            SessionCommit(
                "old", expected_step=2, state={"k": 3}, schema=["k"], transition=tr, now=3.0
            )
        )
        assert step == 3
        assert [t.step for t in await store.history_page("old", 10)] == [1, 2, 3]
        (row,) = await store.ledger_rows(0, 10)
        assert row.cost_usd == 0.25 and row.context is None
    finally:
        await store.close()


async def test_opening_an_old_database_migrates_it(tmp_path: Path) -> None:
    # The proxy (one process per SQLite file) brings it up when it opens it.
    path = tmp_path / "old.db"
    make_db(path, BEFORE_COST_COLUMNS)
    store = SQLiteStore(path)
    await store.open()
    await store.close()
    assert versions(path) == list(range(1, LATEST + 1))


async def test_a_newer_schema_is_refused_in_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    path = data / "skillstate.db"
    store = SQLiteStore(path)
    await store.open()
    await store.close()
    db = sqlite3.connect(path)
    db.execute("INSERT INTO schema_version VALUES (?, 1.0, 'from the future')", (LATEST + 1,))
    db.commit()
    db.close()
    with pytest.raises(SchemaTooNew, match=f"schema version {LATEST + 1}, newer than"):
        await asyncio.wait_for(SQLiteStore(path).open(), 30)
    for argv in (
        ["--port", "0", "--upstream", "http://127.0.0.1:9/v1", "--data-dir", str(data)],
        ["migrate", "--data-dir", str(data)],
    ):
        r = subprocess.run(
            [sys.executable, "-m", "skillstate", *argv],
            capture_output=True, text=True, timeout=60, env=proxy_env(SKILLSTATE_API_KEY="k"),
        )  # fmt: skip
        assert r.returncode == 2 and "Traceback" not in r.stderr
        (line,) = r.stderr.splitlines()
        assert f"schema version {LATEST + 1}, newer than this skillstate-proxy knows" in line


def at_version_5(path: Path) -> None:
    """A database as the release before migration 6 left it: migrations 1-5 applied."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(
        "CREATE TABLE schema_version"
        " (version INTEGER PRIMARY KEY, applied REAL NOT NULL, description TEXT NOT NULL)"
    )
    for m in SQLITE_MIGRATIONS[:5]:
        for statement in m.statements:
            db.execute(statement)
        db.execute("INSERT INTO schema_version VALUES (?, 1.0, ?)", (m.version, m.description))
    db.close()


# (id, updated): minutes 16666 (999,960 to 1,000,020) and 16667, a tie, a row at a minute's
# first second, and one of 1970.
V5_SESSIONS = [
    ("a", 1_000_000.0), ("b", 1_000_010.0), ("f", 1_000_010.0), ("d", 1_000_020.0),
    ("c", 1_000_030.5), ("e", 2.0),
]  # fmt: skip


async def test_a_version_5_database_keeps_every_session_and_its_order(tmp_path: Path) -> None:
    path = tmp_path / "v5.db"
    at_version_5(path)
    db = sqlite3.connect(path)
    db.executemany(
        "INSERT INTO sessions (id, state, schema, step, created, updated)"
        " VALUES (?, ?, ?, 1, ?, ?)",
        [(s, f'{{"k": "{s}"}}'.encode(), '["k"]', t - 1, t) for s, t in V5_SESSIONS],
    )
    db.execute(
        "INSERT INTO transitions (session, step, patch, action, status, errors, ts)"
        " VALUES ('a', 1, '{\"k\": \"a\"}', 'x', 'valid', '[]', 1000000.0)"
    )
    db.commit()
    before = db.execute("SELECT * FROM sessions ORDER BY id").fetchall()
    db.close()
    store = SQLiteStore(path)
    await store.open()
    try:
        db = sqlite3.connect(path)
        assert versions(path) == list(range(1, LATEST + 1))
        columns = "id, state, schema, step, created, updated"
        assert db.execute(f"SELECT {columns} FROM sessions ORDER BY id").fetchall() == before
        indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "sessions_touched" in indexes and "sessions_updated" not in indexes
        db.close()
        # GET /state's order, two at a time: most recently updated first, ties by id.
        assert await listed_in_pages(store, 2) == ["c", "d", "b", "f", "a", "e"]
        assert [t.step for t in await store.history_page("a", 10)] == [1]
        # A turn of "e" in a later minute puts it first; the TTL purge takes exactly the
        # sessions updated before its time.
        tr = TransitionRecord(2, "valid", {"k": 2}, "c", [], 1_000_100.0)
        await store.commit(SessionCommit("e", 1, {"k": 2}, ["k"], tr, 1_000_100.0))
        assert [p["session"] for p in await store.sessions_page(1)] == ["e"]
        assert await store.purge_sessions(older_than=1_000_010.0) == 1  # "a"
        assert [p["session"] for p in await store.sessions_page(10)] == ["e", "c", "d", "b", "f"]
    finally:
        await store.close()
