"""Versioned PostgreSQL schemas: an empty database is created at start-up exactly once
however many replicas start together, an older one is refused until `skillstate migrate`
upgrades it, and a newer one is refused in one line."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import pytest

from skillstate.store import SessionCommit, TransitionRecord
from skillstate.store.migrations import Migration, SchemaTooNew, SchemaTooOld
from skillstate.store.postgres import migrations
from skillstate.store.postgres.migrations import POSTGRES_MIGRATIONS, migrate_postgres
from skillstate.store.postgres.store import PostgresStore
from tests.conftest import proxy_env
from tests.storefill import listed_in_pages

LATEST = POSTGRES_MIGRATIONS[-1].version
HANG = 60.0  # a guard against a hang, not a performance threshold


async def versions(url: str) -> list[int]:
    conn = await asyncpg.connect(url)
    try:
        return [r[0] for r in await conn.fetch("SELECT version FROM schema_version ORDER BY 1")]
    finally:
        await conn.close()


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "skillstate", *argv],
        capture_output=True, text=True, timeout=HANG, env=proxy_env(SKILLSTATE_API_KEY="k"),
    )  # fmt: skip


async def test_replicas_starting_together_create_the_schema_once(pg_url: str) -> None:
    stores = [PostgresStore(pg_url, pool_size=2) for _ in range(6)]
    try:
        await asyncio.wait_for(asyncio.gather(*(s.open() for s in stores)), HANG)
        assert await versions(pg_url) == list(range(1, LATEST + 1))
        assert await stores[0].commit(SessionCommit(
            "s", expected_step=0, state={}, schema=[], now=1.0,
            transition=TransitionRecord(1, "valid", {}, None, [], 1.0),
        )) == 1  # fmt: skip
    finally:
        await asyncio.gather(*(s.close() for s in stores))


async def test_a_replica_finding_the_schema_half_made_waits_for_it(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another replica is creating the schema, one migration (one transaction) at a time:
    # version 1 of LATEST is committed and it still holds the migration lock.
    creator = await asyncpg.connect(pg_url)
    try:
        await creator.execute("SELECT pg_advisory_lock($1)", migrations.MIGRATION_LOCK)
        monkeypatch.setattr(migrations, "POSTGRES_MIGRATIONS", POSTGRES_MIGRATIONS[:1])
        await migrate_postgres(creator, "db", upgrade=False)
        monkeypatch.setattr(migrations, "POSTGRES_MIGRATIONS", POSTGRES_MIGRATIONS)
        replica = PostgresStore(pg_url)
        opening = asyncio.ensure_future(replica.open())
        waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        while not await creator.fetchval(waiting):  # not SchemaTooOld: it waits for the lock
            assert not opening.done(), opening.exception()
            await asyncio.sleep(0.01)
        await migrate_postgres(creator, "db", upgrade=True)  # the creator finishes
        await creator.execute("SELECT pg_advisory_unlock_all()")
        await asyncio.wait_for(opening, HANG)
        await replica.close()
    finally:
        await creator.close()
    assert await versions(pg_url) == list(range(1, LATEST + 1))


def test_migrate_command_on_an_empty_database(pg_url: str) -> None:
    first = cli("migrate", "--store", pg_url)
    assert first.returncode == 0, first.stderr
    line, *later = first.stdout.splitlines()
    assert line.startswith(f"{pg_url}: schema 0 -> 1: sessions, transitions, ledger")
    assert later[1:2] == [f"{pg_url}: schema 2 -> 3: idempotency_keys"]
    assert len(later) == LATEST - 1  # one line per later migration
    again = cli("migrate", "--store", pg_url)
    assert again.returncode == 0 and "nothing to do" in again.stdout


async def test_an_older_schema_is_refused_until_migrated(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = PostgresStore(pg_url)
    await store.open()  # at this release's version
    await store.close()
    # The next release adds a migration: its replicas refuse the database until the
    # operator's `skillstate migrate`, which applies exactly the missing step.
    step = Migration(LATEST + 1, "ledger by model", ("CREATE INDEX ledger_model ON ledger(model)",))
    monkeypatch.setattr(migrations, "POSTGRES_MIGRATIONS", (*POSTGRES_MIGRATIONS, step))
    with pytest.raises(SchemaTooOld, match="run `skillstate migrate --store URL`"):
        await PostgresStore(pg_url).open()
    conn = await asyncpg.connect(pg_url)
    try:
        lines = await migrate_postgres(conn, "db", upgrade=True)
        assert lines == [f"db: schema {LATEST} -> {LATEST + 1}: ledger by model"]
        assert await migrate_postgres(conn, "db", upgrade=True) == []
    finally:
        await conn.close()
    assert await versions(pg_url) == list(range(1, LATEST + 2))
    upgraded = PostgresStore(pg_url)
    await upgraded.open()
    await upgraded.close()


async def test_a_version_1_database_gets_session_budgets_with_its_keys_kept(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(migrations, "POSTGRES_MIGRATIONS", POSTGRES_MIGRATIONS[:1])
    conn = await asyncpg.connect(pg_url)
    try:
        await migrate_postgres(conn, "db", upgrade=False)  # what the release before made
        await conn.execute(
            "INSERT INTO api_keys (name, digest, admin, budget_usd_per_day, created)"
            " VALUES ('alice', 'd1', false, 2.5, 1.0)"
        )
        monkeypatch.setattr(migrations, "POSTGRES_MIGRATIONS", POSTGRES_MIGRATIONS)
        lines = await migrate_postgres(conn, "db", upgrade=True)
        assert lines[:1] == [f"db: schema 1 -> 2: {POSTGRES_MIGRATIONS[1].description}"]
        assert len(lines) == len(POSTGRES_MIGRATIONS) - 1  # and each later one
    finally:
        await conn.close()
    store = PostgresStore(pg_url)
    await store.open()
    try:
        (alice,) = await store.keys()
        assert (alice.budget_usd_per_day, alice.max_session_budget_usd) == (2.5, None)
        assert alice.allow_unpriced is False
        assert await store.set_session_budget("alice:s", 5.0, replace=False) == 5.0
    finally:
        await store.close()


async def test_a_newer_schema_is_refused_in_one_line(pg_url: str, tmp_path: Path) -> None:
    store = PostgresStore(pg_url)
    await store.open()
    await store.close()
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("INSERT INTO schema_version VALUES ($1, 1.0, 'future')", LATEST + 1)
    finally:
        await conn.close()
    with pytest.raises(SchemaTooNew, match=f"schema version {LATEST + 1}, newer than"):
        await PostgresStore(pg_url).open()
    cfg = tmp_path / "skillstate.json"
    cfg.write_text(json.dumps({"store": pg_url}))
    for argv in (
        ["--config", str(cfg), "--port", "0", "--upstream", "http://127.0.0.1:9/v1"],
        ["migrate", "--store", pg_url],
    ):
        r = cli(*argv, "--data-dir", str(tmp_path / "data"))
        assert r.returncode == 2 and "Traceback" not in r.stderr
        (line,) = r.stderr.splitlines()
        assert f"schema version {LATEST + 1}, newer than this skillstate-proxy knows" in line


# (id, updated): minutes 16666 (999,960 to 1,000,020) and 16667, a tie, a row at a minute's
# first second, and one of 1970.
V5_SESSIONS = [
    ("a", 1_000_000.0), ("b", 1_000_010.0), ("f", 1_000_010.0), ("d", 1_000_020.0),
    ("c", 1_000_030.5), ("e", 2.0),
]  # fmt: skip
SESSION_COLUMNS = "id, state, schema, step, created, updated"


async def test_a_version_5_database_keeps_every_session_and_its_order(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(migrations, "POSTGRES_MIGRATIONS", POSTGRES_MIGRATIONS[:5])
    conn = await asyncpg.connect(pg_url)
    try:
        await migrate_postgres(conn, "db", upgrade=False)  # what the release before made
        await conn.executemany(
            f"INSERT INTO sessions ({SESSION_COLUMNS}) VALUES ($1, $2, '[\"k\"]', 1, $3, $4)",
            [(s, f'{{"k": "{s}"}}'.encode(), t - 1, t) for s, t in V5_SESSIONS],
        )
        before = await conn.fetch(f"SELECT {SESSION_COLUMNS} FROM sessions ORDER BY id")
        monkeypatch.setattr(migrations, "POSTGRES_MIGRATIONS", POSTGRES_MIGRATIONS)
        assert await migrate_postgres(conn, "db", upgrade=True) == [
            f"db: schema 5 -> 6: {POSTGRES_MIGRATIONS[5].description}"
        ]
        assert await conn.fetch(f"SELECT {SESSION_COLUMNS} FROM sessions ORDER BY id") == before
        indexes = {r[0] for r in await conn.fetch("SELECT indexname FROM pg_indexes")}
        assert "sessions_touched" in indexes and "sessions_updated" not in indexes
    finally:
        await conn.close()
    store = PostgresStore(pg_url)
    await store.open()
    try:
        # GET /state's order, two at a time: most recently updated first, ties by id.
        assert await listed_in_pages(store, 2) == ["c", "d", "b", "f", "a", "e"]
        # A turn of "e" in a later minute puts it first; the TTL purge takes exactly the
        # sessions updated before its time.
        tr = TransitionRecord(2, "valid", {"k": 2}, "c", [], 1_000_100.0)
        await store.commit(SessionCommit("e", 1, {"k": 2}, ["k"], tr, 1_000_100.0))
        assert [p["session"] for p in await store.sessions_page(1)] == ["e"]
        assert await store.purge_sessions(older_than=1_000_010.0) == 1  # "a"
        assert [p["session"] for p in await store.sessions_page(10)] == ["e", "c", "d", "b", "f"]
    finally:
        await store.close()
    # Replicas of the release before, still running while the operator upgrades, write
    # `updated` alone: their sessions are still listed and purged by their last update.
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("UPDATE sessions SET updated = 1000200.0, step = 2 WHERE id = 'b'")
        await conn.execute(
            f"INSERT INTO sessions ({SESSION_COLUMNS})"
            " VALUES ('g', '{}', '[]', 1, 1.0, 1000150.0)"
        )
    finally:
        await conn.close()
    store = PostgresStore(pg_url)
    await store.open()
    try:
        assert await listed_in_pages(store, 2) == ["b", "g", "e", "c", "d", "f"]
        assert await store.purge_sessions(older_than=1_000_160.0) == 5  # all but "b"
        assert [p["session"] for p in await store.sessions_page(10)] == ["b"]
    finally:
        await store.close()


async def test_a_sessions_turns_within_a_minute_leave_its_indexes_alone(pg_url: str) -> None:
    """Every commit but a session's first of a minute is a heap-only tuple (HOT) update:
    no entry added to the sessions' indexes (with an index on ``updated``, none could be)."""
    store = PostgresStore(pg_url)
    await store.open()
    state = {"notes": "n" * 900}
    turns = 40
    try:
        for step in range(turns):  # at 1,000,020.0-1,000,059.0: all in minute 16,667
            tr = TransitionRecord(step + 1, "valid", {"k": step}, "c", [], 1_000_020.0 + step)
            await store.commit(SessionCommit("s", step, state, ["notes"], tr, tr.ts))
    finally:
        await store.close()  # its connections end, and with them their pending statistics
    conn = await asyncpg.connect(pg_url)
    try:
        sql = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'sessions'"
        deadline = time.monotonic() + HANG  # a guard against a hang
        while (counts := tuple(await conn.fetchrow(sql)))[0] < turns - 1:
            assert time.monotonic() < deadline, counts
            await asyncio.sleep(0.05)  # the ended backends' statistics arrive
        assert counts == (turns - 1, turns - 1)
    finally:
        await conn.close()
