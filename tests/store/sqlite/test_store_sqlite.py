"""The SQLite store: one writer per data dir, and a session cache that never serves a state
the database has moved past."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from skillstate.cost.usage import MAX_TOKEN_COUNT
from skillstate.store import (
    SessionCommit,
    SessionRecord,
    StoreError,
    StoreFull,
    StoreUnavailable,
    TransitionRecord,
)
from skillstate.store.datadir import lock_data_dir, unlock_data_dir
from skillstate.store.rows import MAX_USD
from skillstate.store.sqlite import SQLiteStore
from skillstate.store.sqlite.store import CHECKPOINT_PAGES
from tests.helpers import locked_by_another_process
from tests.storefill import ledger_row

T = TypeVar("T")


def transition(step: int) -> TransitionRecord:
    return TransitionRecord(step, "valid", {}, "a", [], float(step))


async def commit(store: SQLiteStore, expected: int, state: dict[str, Any]) -> int:
    return await store.commit(SessionCommit(
        "s", expected_step=expected, state=state, schema=["k"], transition=transition(expected + 1),
        now=float(expected + 1),
    ))  # fmt: skip


HOLD = """
import sys, time
from pathlib import Path
from skillstate.store.datadir import lock_data_dir
lock_data_dir(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(60)
"""


async def test_a_data_dir_held_by_another_process_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "skillstate.db"
    other = subprocess.Popen([sys.executable, "-c", HOLD, str(db)], stdout=subprocess.PIPE)
    try:
        assert other.stdout is not None and other.stdout.readline() == b"held\n"
        with pytest.raises(
            StoreError, match=f"in use by another skillstate proxy .pid {other.pid}"
        ):
            await SQLiteStore(db, exclusive=True).open()
        reader = SQLiteStore(db)  # `skillstate cost` reads while the proxy runs
        await reader.open()
        assert await reader.check(timeout=5.0) is None
        await reader.close()
    finally:
        other.kill()
        other.wait()
    again = SQLiteStore(db, exclusive=True)  # the holder died: free again
    await again.open()
    await again.close()


def test_the_lock_is_reentrant_within_a_process(tmp_path: Path) -> None:
    # The CLI's pre-flight check keeps its hold while the store takes its own.
    db = tmp_path / "skillstate.db"
    lock_data_dir(db)
    lock_data_dir(db)
    unlock_data_dir(db)
    probe = subprocess.run([sys.executable, "-c", HOLD, str(db)], capture_output=True, timeout=30)
    assert b"in use by another skillstate proxy" in probe.stderr  # one hold remains
    unlock_data_dir(db)
    lock_data_dir(db)  # and it can be taken again
    unlock_data_dir(db)


async def test_a_store_exists_when_its_file_has_tables_or_a_wal(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    assert not SQLiteStore(db).exists()  # no file
    db.write_bytes(b"")
    assert not SQLiteStore(db).exists()  # an empty file: no store to read
    store = SQLiteStore(db, exclusive=True)
    await store.open()
    try:
        assert SQLiteStore(db).exists()  # open: its tables (and its WAL)
    finally:
        await store.close()
    assert SQLiteStore(db).exists() and not Path(f"{db}-wal").exists()  # closed: tables
    other = tmp_path / "o.db"
    with contextlib.closing(sqlite3.connect(other)) as made:
        made.execute("PRAGMA user_version = 3")
    assert not SQLiteStore(other).exists()  # a database with no table
    Path(f"{other}-wal").write_bytes(b"")
    assert SQLiteStore(other).exists()  # a WAL may hold tables: left to open() to read


async def test_a_commit_conflict_drops_the_stale_cached_session(tmp_path: Path) -> None:
    db = tmp_path / "skillstate.db"
    a, b = SQLiteStore(db), SQLiteStore(db)
    await a.open()
    await b.open()
    try:
        assert await commit(a, 0, {"k": "a1"}) == 1
        assert (await a.load("s")).step == 1  # type: ignore[union-attr]  # cached in a
        assert await commit(b, 1, {"k": "b2"}) == 2  # another writer moves the session on
        with pytest.raises(StoreError, match="moved from step 1 to 2"):
            await commit(a, 1, {"k": "a2"})
        fresh = await a.load("s")
        assert fresh is not None and (fresh.step, fresh.state) == (2, {"k": "b2"})
        assert await commit(a, 2, {"k": "a3"}) == 3
    finally:
        await a.close()
        await b.close()


# -- issue 13 item 3: the store thread survives anything; numbers are clamped ----------------

# A guard against a hang, not a performance threshold: before the fix these waits never end.
HANG = 30.0


def boom(db: Any) -> None:
    """A write that fails after its first statement: none of it may stay."""
    db.execute("INSERT INTO ledger (ts, kind, status, pricing) VALUES (1, 'x', 0, 'p')")
    raise OverflowError("Python int too large to convert to SQLite INTEGER")


async def test_an_unexpected_exception_fails_only_its_own_write(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "skillstate.db")
    await store.open()
    try:

        def fine(db: Any) -> int:
            db.execute("INSERT INTO ledger (ts, kind, status, pricing) VALUES (2, 'y', 0, 'p')")
            return 7

        # One batch: the failing write in the middle, its neighbours commit.
        results = await asyncio.wait_for(
            asyncio.gather(store._write(fine), store._write(boom), store._write(fine),
                           return_exceptions=True),
            HANG,
        )  # fmt: skip
        assert results[0] == results[2] == 7
        assert isinstance(results[1], StoreError) and "OverflowError" in str(results[1])
        rows = await store.ledger_rows(0, 10)
        assert [r.kind for r in rows] == ["y", "y"]  # the failed write left nothing behind
        # And the store keeps writing: later commits are not stuck behind the failure.
        assert await asyncio.wait_for(commit(store, 0, {"k": 1}), HANG) == 1
        assert await store.check(timeout=HANG) is None
    finally:
        await asyncio.wait_for(store.close(), HANG)


async def test_a_lone_failed_write_leaves_nothing_and_the_store_writes_on(tmp_path: Path) -> None:
    # A batch of one write (a lone client's turn) is its own transaction, without a savepoint.
    store = SQLiteStore(tmp_path / "skillstate.db")
    await store.open()
    try:
        with pytest.raises(StoreError, match="OverflowError"):
            await asyncio.wait_for(store._write(boom), HANG)
        assert await store.ledger_rows(0, 10) == []
        assert await asyncio.wait_for(commit(store, 0, {"k": 1}), HANG) == 1
        assert await store.check(timeout=HANG) is None
    finally:
        await asyncio.wait_for(store.close(), HANG)


async def test_a_new_session_whose_commit_fails_is_not_created_nor_counted(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "skillstate.db", max_sessions=1)
    await store.open()
    try:
        # A transition row already at ("s", 1): the commit creating "s" fails after its
        # session row was inserted, alone in its batch or beside another session's commit.
        def stray(db: Any) -> None:
            db.execute(
                "INSERT INTO transitions (session, step, status, errors, ts)"
                " VALUES ('s', 1, 'valid', '[]', 1)"
            )

        await store._write(stray)
        with pytest.raises(StoreError, match="UNIQUE"):
            await commit(store, 0, {"k": 1})
        assert await store.load("s", fresh=True) is None
        results = await asyncio.gather(
            commit(store, 0, {"k": 2}),
            store.commit(SessionCommit(
                "t", expected_step=0, state={"k": 3}, schema=["k"], transition=transition(1),
                now=1.0,
            )),
            return_exceptions=True,
        )  # fmt: skip
        assert isinstance(results[0], StoreError) and results[1] == 1  # room for one: "t"
        assert await store.load("s", fresh=True) is None
    finally:
        await store.close()


async def test_a_commit_conflicts_with_a_session_deleted_or_created_meanwhile(
    tmp_path: Path,
) -> None:
    db = tmp_path / "skillstate.db"
    a, b = SQLiteStore(db), SQLiteStore(db)
    await a.open()
    await b.open()
    try:
        assert await commit(a, 0, {"k": "a1"}) == 1
        assert await b.delete("s")
        with pytest.raises(StoreError, match="moved from step 1 to 0"):
            await commit(a, 1, {"k": "a2"})
        assert await b.load("s", fresh=True) is None
        assert await commit(b, 0, {"k": "b1"}) == 1
        assert await commit(b, 1, {"k": "b2"}) == 2
        with pytest.raises(StoreError, match="moved from step 0 to 2"):
            await commit(a, 0, {"k": "a1"})
        # A turn that changes no state moves the step on and keeps the state.
        step = await a.commit(SessionCommit(
            "s", expected_step=2, state=None, schema=["k"], transition=transition(3), now=3.0,
        ))  # fmt: skip
        assert step == 3
        kept = await b.load("s", fresh=True)
        assert kept is not None and (kept.step, kept.state) == (3, {"k": "b2"})
        assert [t.step for t in await b.history_page("s", 10)] == [1, 2, 3]
    finally:
        await a.close()
        await b.close()


async def test_numbers_beyond_what_sqlite_holds_are_clamped(tmp_path: Path) -> None:
    # The repro: prompt_tokens = 2^53 and a transcript > 1,024x the compact context make
    # baseline_input_tokens > 2^63, which SQLite refuses with OverflowError.
    store = SQLiteStore(tmp_path / "skillstate.db")
    await store.open()
    try:
        huge = ledger_row(
            input_tokens=2**53, baseline_input_tokens=2**64, output_tokens=-5,
            cost_usd=math.inf, baseline_cost_usd=math.nan, status=10**6, model="m" * 10_000,
        )  # fmt: skip
        step = await asyncio.wait_for(
            store.commit(SessionCommit("s", expected_step=0, state={"k": 1}, schema=["k"],
                         transition=transition(1), now=math.inf, ledger=[huge])),
            HANG,
        )  # fmt: skip
        assert step == 1
        (row,) = await store.ledger_rows(0, math.inf)
        assert row.input_tokens == MAX_TOKEN_COUNT and row.baseline_input_tokens == MAX_TOKEN_COUNT
        assert row.output_tokens == 0 and row.status == 999
        assert row.cost_usd == MAX_USD and row.baseline_cost_usd is None
        assert row.model is not None and len(row.model) == 256
        assert math.isfinite((await store.load("s")).updated)  # type: ignore[union-attr]
        await store.add_ledger_rows([ledger_row(input_tokens=2**70)])  # not wedged
    finally:
        await asyncio.wait_for(store.close(), HANG)


def store_thread_stuck(store: SQLiteStore, release: threading.Event) -> None:
    """The store thread busy until ``release``, so that a write queued next goes to it.
    (With the thread idle, a batch is written on the loop's thread instead, and a write
    stuck there stops the test's own loop: which of the two a test got after ``open()``
    depended on whether the thread had yet counted its last call done.)"""
    store._exec.post(release.wait, HANG)


async def test_close_finishes_even_when_a_write_never_does(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "skillstate.db", close_timeout=0.2)
    await store.open()
    release = threading.Event()

    def stuck(db: Any) -> None:
        release.wait(HANG)

    store_thread_stuck(store, release)
    first = asyncio.ensure_future(store._write(stuck))
    await asyncio.sleep(0)
    queued = asyncio.ensure_future(commit(store, 0, {"k": 1}))  # waits behind it
    await asyncio.sleep(0)
    try:
        await asyncio.wait_for(store.close(), HANG)
        with pytest.raises(StoreError, match="closed"):
            await asyncio.wait_for(queued, HANG)
    finally:
        release.set()
        await asyncio.wait_for(asyncio.gather(first, return_exceptions=True), HANG)


# -- issue 13 item 10: a database locked by another process ------------------------------


async def test_a_database_locked_by_another_process_is_reported_not_waited_on(
    tmp_path: Path,
) -> None:
    db = tmp_path / "skillstate.db"
    store = SQLiteStore(db, busy_timeout=0.05)
    await store.open()
    with locked_by_another_process(db, timeout=HANG):
        problem = await store.check(timeout=HANG)
        assert problem is not None and "locked by another process" in problem
        with pytest.raises(StoreUnavailable, match="locked by another process") as err:
            await asyncio.wait_for(commit(store, 0, {"k": 1}), HANG)
        assert err.value.status == 503 and err.value.retry_after
        assert await store.load("s") is None  # nothing was written
    assert await store.check(timeout=HANG) is None
    assert await commit(store, 0, {"k": 1}) == 1
    await store.close()


# -- issue 13 item 5: the session cache is bounded by bytes; a cap on sessions -------------


async def test_the_session_cache_is_bounded_by_bytes(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "skillstate.db", cache_bytes=200_000)
    await store.open()
    # The shape: nested empty arrays, which take ~20x their JSON size once parsed.
    state = {"k": [[[]] for _ in range(6000)]}  # ~36 KB of JSON
    try:
        for i in range(40):
            await store.commit(SessionCommit(
                f"s{i}", expected_step=0, state=state, schema=["k"], transition=transition(1),
                now=1.0,
            ))  # fmt: skip
            assert store.cache_bytes <= 200_000
        assert store.cache_bytes > 100_000  # it does cache what fits
        for i in range(40):  # evicted or not, every session loads whole
            rec = await store.load(f"s{i}")
            assert rec is not None and rec.state == state and rec.step == 1
            assert store.cache_bytes <= 200_000
        loaded = await store.load("s39")
        assert loaded is not None
        loaded.state["k"].append("mutated")  # a caller's copy is its own
        assert (await store.load("s39")).state == state  # type: ignore[union-attr]
    finally:
        await store.close()


async def test_max_sessions_refuses_a_new_session_but_not_old_ones(tmp_path: Path) -> None:
    db = tmp_path / "skillstate.db"
    store = SQLiteStore(db, max_sessions=2)
    await store.open()

    async def start(session: str) -> int:
        return await store.commit(
            SessionCommit(
                session, expected_step=0, state={}, schema=[], transition=transition(1), now=1.0
            )
        )

    try:
        # Two new sessions in one batch fill it; the third of that batch is refused.
        results = await asyncio.gather(start("a"), start("b"), start("c"), return_exceptions=True)
        assert results[:2] == [1, 1]
        assert isinstance(results[2], StoreFull) and results[2].status == 507
        assert "max_sessions" in str(results[2])
        with pytest.raises(StoreFull):
            store.ensure_room_for_session()
        assert (
            await store.commit(
                SessionCommit(  # an existing session goes on
                    "a",
                    expected_step=1,
                    state={"x": 1},
                    schema=[],
                    transition=transition(2),
                    now=2.0,
                )
            )
            == 2
        )
        assert await store.delete("b")
        store.ensure_room_for_session()
        assert await start("c") == 1
    finally:
        await store.close()
    reopened = SQLiteStore(db, max_sessions=2)  # the count survives a restart
    await reopened.open()
    with pytest.raises(StoreFull):
        reopened.ensure_room_for_session()
    assert await reopened.purge_sessions(older_than=1.5) == 1  # "c" (updated at 1.0)
    reopened.ensure_room_for_session()
    await reopened.close()


async def test_health_check_answers_while_a_write_is_stuck(tmp_path: Path) -> None:
    # /health must not queue behind a write that does not finish: it reports it instead.
    store = SQLiteStore(tmp_path / "skillstate.db", close_timeout=0.2)
    await store.open()
    release = threading.Event()
    store_thread_stuck(store, release)
    stuck = asyncio.ensure_future(store._write(lambda db: release.wait(HANG)))
    await asyncio.sleep(0)
    try:
        problem = await asyncio.wait_for(store.check(timeout=0.05), HANG)
        assert problem is not None
        assert "did not answer" in problem or "has been waiting" in problem
    finally:
        release.set()
        await asyncio.wait_for(stuck, HANG)
    assert await store.check(timeout=HANG) is None
    await store.close()


async def test_a_database_from_before_the_cost_columns_gets_them(tmp_path: Path) -> None:
    """A ledger and transitions table made before issue 14's columns: opening the store adds
    them; old rows read as NULL, new rows keep a negative saving and auto's estimate."""
    import sqlite3

    path = tmp_path / "skillstate.db"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE ledger (ts REAL NOT NULL, session TEXT, upstream TEXT, model TEXT,"
        " kind TEXT NOT NULL, status INTEGER NOT NULL, input_tokens INTEGER,"
        " output_tokens INTEGER, cache_read_tokens INTEGER, cache_write_tokens INTEGER,"
        " pricing TEXT NOT NULL, cost_usd REAL, baseline_input_tokens INTEGER,"
        " baseline_cost_usd REAL, mode TEXT);"
        "INSERT INTO ledger (ts, kind, status, pricing) VALUES (1, 'generation', 200, 'known');"
        "CREATE TABLE transitions (session TEXT NOT NULL, step INTEGER NOT NULL, patch BLOB,"
        " action TEXT, status TEXT NOT NULL, errors TEXT NOT NULL, ts REAL NOT NULL,"
        " PRIMARY KEY (session, step));"
    )
    old.close()
    store = SQLiteStore(path)
    await store.open()
    try:
        new = ledger_row(ts=2.0, saved_cost_usd=-0.5, saved_cost_pct=-25.0, context="full")
        tr = TransitionRecord(1, "valid", {}, "a", [], 2.0, "full", {"form": "full", "turns": 3})
        await asyncio.wait_for(
            store.commit(SessionCommit("s", expected_step=0, state={"k": 1}, schema=["k"],
                                       transition=tr, now=2.0, ledger=[new])),
            HANG,
        )  # fmt: skip
        first, second = await store.ledger_rows(0, 10)
        assert first.saved_cost_usd is None and first.context is None
        assert (second.saved_cost_usd, second.saved_cost_pct, second.context) == (
            -0.5,
            -25.0,
            "full",
        )
        (history,) = await store.history_page("s", 10)
        assert history.context == "full" and history.estimate == {"form": "full", "turns": 3}
    finally:
        await asyncio.wait_for(store.close(), HANG)


# -- the session budget cache: a turn's budget read needs no database read ------------------


async def test_a_session_budget_is_read_once_and_every_budget_write_drops_it(
    tmp_path: Path,
) -> None:
    import sqlite3

    db = tmp_path / "skillstate.db"
    store = SQLiteStore(db)
    await store.open()
    behind = sqlite3.connect(db, isolation_level=None)  # changes the rows behind its back

    def set_behind(session: str, usd: float) -> None:
        behind.execute(
            "INSERT OR REPLACE INTO session_budgets (session, budget_usd, updated)"
            " VALUES (?, ?, 0)",
            (session, usd),
        )

    try:
        assert await store.session_budget("s") is None
        assert await store.set_session_budget("s", 5.0, replace=False) == 5.0
        assert await store.session_budget("s") == 5.0  # read again after the write
        set_behind("s", 9.0)
        assert await store.session_budget("s") == 5.0  # served from the cache: no read
        assert await store.set_session_budget("s", 7.0, replace=False) == 9.0  # kept: 9 is there
        assert await store.session_budget("s") == 9.0
        assert await store.set_session_budget("s", 3.0, replace=True) == 3.0
        assert await store.session_budget("s") == 3.0
        assert await store.set_session_budget("s", None, replace=True) is None
        assert await store.session_budget("s") is None
        # A session without a budget is cached as such, until a write gives it one.
        set_behind("t", 4.0)
        assert await store.session_budget("u") is None
        set_behind("u", 2.0)
        assert await store.session_budget("u") is None
        assert await store.set_session_budget("u", 6.0, replace=True) == 6.0
        assert await store.session_budget("u") == 6.0
        # delete and purge take the session's budget with them.
        await commit(store, 0, {"k": 1})
        assert await store.set_session_budget("s", 8.0, replace=True) == 8.0
        assert await store.session_budget("s") == 8.0
        assert await store.delete("s")
        assert await store.session_budget("s") is None
        assert await store.session_budget("t") == 4.0
        assert await store.session_budget("u") == 6.0
        assert await store.purge_sessions(older_than=time.time() + 10) == 0  # no state rows
        assert await store.session_budget("t") is None  # orphan budgets expired
        assert await store.session_budget("u") is None
    finally:
        behind.close()
        await store.close()


async def test_a_budget_read_overlapping_a_write_is_not_kept(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "skillstate.db")
    await store.open()
    release = threading.Event()
    try:
        # The store thread is busy: the read and the write queue behind it, in that order.
        store_thread_stuck(store, release)
        stuck = asyncio.ensure_future(store._write(lambda db: release.wait(HANG)))
        await asyncio.sleep(0)
        read = asyncio.ensure_future(store.session_budget("s"))
        await asyncio.sleep(0)
        write = asyncio.ensure_future(store.set_session_budget("s", 5.0, replace=True))
        await asyncio.sleep(0)
        release.set()
        assert await asyncio.wait_for(read, HANG) is None  # it ran before the write
        assert await asyncio.wait_for(write, HANG) == 5.0
        await asyncio.wait_for(stuck, HANG)
        assert await store.session_budget("s") == 5.0  # not the read's stale None
    finally:
        await store.close()


def test_the_budget_cache_is_bounded_and_refuses_a_read_older_than_a_write() -> None:
    from skillstate.store.cache import BudgetCache

    cache = BudgetCache(max_sessions=2)
    epoch = cache.epoch
    cache.remember("a", 1.0, epoch)
    cache.remember("b", None, epoch)
    assert cache.get("a") == (True, 1.0) and cache.get("b") == (True, None)
    cache.remember("c", 3.0, epoch)  # "a" was used before "b": "a" goes
    assert cache.get("a") == (False, None) and cache.get("c") == (True, 3.0)
    started = cache.epoch
    cache.changed("c")  # a write of "c" while a read of it was in flight
    cache.remember("c", 3.0, started)
    assert cache.get("c") == (False, None)
    cache.remember("c", 4.0, cache.epoch)
    cache.changed()  # a purge: every budget may be gone
    assert cache.get("b") == (False, None) and cache.get("c") == (False, None)


@pytest.mark.parametrize(("setting", "pragma"), [(None, 1), ("normal", 1), ("full", 2)])
def test_store_synchronous_sets_the_writers_fsync_policy(
    tmp_path: Path, setting: str | None, pragma: int
) -> None:
    """``store_synchronous`` (in the config file, as a deployment sets it) reaches the
    connection that commits: NORMAL (1) syncs at checkpoints, FULL (2) on every commit."""
    from skillstate.config import load_settings
    from skillstate.store.factory import make_store

    config = {} if setting is None else {"store_synchronous": setting}
    (tmp_path / "skillstate.json").write_text(json.dumps(config))
    settings = load_settings({}, env={"SKILLSTATE_DATA_DIR": str(tmp_path)}, cwd=tmp_path)
    store = make_store(settings)
    assert isinstance(store, SQLiteStore)

    async def run() -> int:
        await store.open()
        try:
            return await store._write(lambda db: db.execute("PRAGMA synchronous").fetchone()[0])
        finally:
            await store.close()

    assert asyncio.run(run()) == pragma


# -- a lone turn's commit on the event loop's thread (commit_at_once) ----------------------


def turn_commit(session: str, expected: int, state: dict[str, Any]) -> SessionCommit:
    return SessionCommit(
        session, expected_step=expected, state=state, schema=["k"],
        transition=transition(expected + 1), now=float(expected + 1),
        ledger=[ledger_row(ts=float(expected + 1), session=session)],
    )  # fmt: skip


async def thread_idle(store: SQLiteStore) -> None:
    """Until the store thread has finished its last call: its answer can reach the loop
    a moment before the thread counts the call done, and till then no commit is at once."""
    while not store._exec.idle:
        await asyncio.sleep(0)


async def idle_store(db: Path) -> SQLiteStore:
    """An open store on ``db`` whose thread is idle (so that a write may go in at once),
    and which waits out locks on that thread (busy_timeout HANG)."""
    store = SQLiteStore(db, busy_timeout=HANG)
    await store.open()
    await thread_idle(store)
    return store


def committed_steps(db: Path, session: str) -> tuple[int | None, list[int]]:
    """The session's step and its transitions' steps, as another connection reads them."""
    with contextlib.closing(sqlite3.connect(db)) as other:
        row = other.execute("SELECT step FROM sessions WHERE id = ?", (session,)).fetchone()
        steps = other.execute(
            "SELECT step FROM transitions WHERE session = ? ORDER BY step", (session,)
        ).fetchall()
    return (None if row is None else row[0]), [s[0] for s in steps]


async def test_a_lone_commit_at_once_is_in_the_database_when_it_returns(tmp_path: Path) -> None:
    db = tmp_path / "skillstate.db"
    store = await idle_store(db)
    try:
        handed_over = store._exec._posted
        assert store.commit_at_once(turn_commit("s", 0, {"k": 1})) == 1
        assert store.commit_at_once(turn_commit("s", 1, {"k": 2})) == 2
        assert store._exec._posted == handed_over  # no call went to the store thread
        assert committed_steps(db, "s") == (2, [1, 2])  # another connection sees both
        assert len(await store.ledger_rows(0, 10, session="s")) == 2
        # Its failures are commit()'s: a step conflict writes nothing, the store goes on.
        with pytest.raises(StoreError, match="moved from step 1 to 2"):
            store.commit_at_once(turn_commit("s", 1, {"k": 3}))
        assert committed_steps(db, "s") == (2, [1, 2])
        assert store.commit_at_once(turn_commit("s", 2, {"k": 3})) == 3
        loaded = await store.load("s", fresh=True)
        assert loaded is not None and (loaded.step, loaded.state) == (3, {"k": 3})
    finally:
        await store.close()


async def test_commit_at_once_declines_while_the_store_thread_has_work(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "skillstate.db")
    await store.open()
    release = threading.Event()

    def stuck(db: Any) -> None:
        release.wait(HANG)

    store_thread_stuck(store, release)
    first = asyncio.ensure_future(store._write(stuck))
    await asyncio.sleep(0)
    try:
        assert store.commit_at_once(turn_commit("s", 0, {"k": 1})) is None
        assert await store.load("s") is None  # nothing was written
    finally:
        release.set()
        await asyncio.wait_for(first, HANG)
    await thread_idle(store)
    assert store.commit_at_once(turn_commit("s", 0, {"k": 1})) == 1
    await store.close()


async def waited_out_a_lock(
    store: SQLiteStore,
    db: Path,
    write: Coroutine[Any, Any, T],
    first: Callable[[], None] = lambda: None,
) -> T:
    """``write`` started (after ``first``) while another process holds ``db``'s lock: it
    is handed to the store thread, which waits for the lock; its result once it is gone."""
    with locked_by_another_process(db, timeout=HANG):
        first()
        started = asyncio.ensure_future(write)
        while not store._writing:  # handed to the thread, which waits for the lock
            await asyncio.sleep(0)
        assert not started.done()
    return await asyncio.wait_for(started, HANG)


async def test_on_a_locked_database_commit_at_once_declines_at_once_and_commit_waits(
    tmp_path: Path,
) -> None:
    # The loop's thread never waits for another process's lock: the commit goes to the
    # store thread, which waits up to busy_timeout (here long enough for the lock to go).
    db = tmp_path / "skillstate.db"
    store = await idle_store(db)
    try:

        def declined_at_once() -> None:
            assert store.commit_at_once(turn_commit("s", 0, {"k": 1})) is None

        fallback = store.commit(turn_commit("s", 0, {"k": 1}))
        assert await waited_out_a_lock(store, db, fallback, first=declined_at_once) == 1
        assert committed_steps(db, "s") == (1, [1])
        await thread_idle(store)
        assert store.commit_at_once(turn_commit("s", 1, {"k": 2})) == 2  # at once again
    finally:
        await store.close()


async def test_commits_at_once_leave_checkpoints_to_the_store_thread(tmp_path: Path) -> None:
    # wal_autocheckpoint is off (a checkpoint syncs the file: never on the loop's thread);
    # the store thread checkpoints instead, so the WAL stays about as small as SQLite's own
    # policy keeps it.
    db = tmp_path / "skillstate.db"
    store = SQLiteStore(db)
    await store.open()
    try:
        step = 0
        while step < 3 * CHECKPOINT_PAGES // 8:  # ~3x CHECKPOINT_PAGES pages of commits
            c = turn_commit("s", step, {"k": step})
            done = store.commit_at_once(c)
            step = done if done is not None else await store.commit(c)
        assert await store.check(timeout=HANG) is None  # after any checkpoint handed over
        with contextlib.closing(sqlite3.connect(db)) as other:
            (autocheckpoint,) = other.execute("PRAGMA wal_autocheckpoint").fetchone()
            _, frames, _ = other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        assert autocheckpoint == 1000  # another connection's own setting, untouched
        assert frames < 2 * CHECKPOINT_PAGES  # without the thread's checkpoints: > 3x
    finally:
        await store.close()


async def test_groups_of_ledger_rows_leave_the_wal_about_as_small_as_commits_do(
    tmp_path: Path,
) -> None:
    # The forwarded calls' rows come in groups (cost.ledgerwrites); each group is counted
    # by its size towards the store thread's checkpoints. Counted as 4 pages whatever its
    # size, 300 groups of 100 rows grew the WAL file to ~5,000 pages before a checkpoint.
    db = tmp_path / "skillstate.db"
    store = SQLiteStore(db)
    await store.open()
    try:
        ts = 1.0
        for g in range(300):
            rows = []
            for i in range(100):
                ts += 0.001
                rows.append(ledger_row(ts=ts, session=f"s{g}-{i % 7}"))
            await store.add_ledger_rows(rows)
        assert await store.check(timeout=HANG) is None  # after any checkpoint handed over
        with contextlib.closing(sqlite3.connect(db)) as other:
            (rows_in,) = other.execute("SELECT count(*) FROM ledger").fetchone()
        assert rows_in == 30_000
        # The WAL file keeps its largest size (a checkpoint starts it over, never shrinks it).
        wal = db.with_name(db.name + "-wal").stat().st_size
        assert wal < 2 * CHECKPOINT_PAGES * (4096 + 24)
    finally:
        await store.close()


async def test_batches_of_commits_checkpoint_by_the_pages_they_write(tmp_path: Path) -> None:
    # A batch writes the newest pages of the ledger's and the transitions' b-trees once for
    # all its commits. Counted in full for each commit, batches of 64 turns with 4 KiB
    # states had the store thread checkpoint (holding the connection, and the writes, each
    # time) every 110-190 WAL frames; counted once a batch, every 250-380, still well under
    # the bound the WAL is kept under.
    db = tmp_path / "skillstate.db"
    store = SQLiteStore(db)
    await store.open()
    found: list[int] = []  # the WAL's frames at each of the store thread's checkpoints
    checkpoint = store._checkpoint

    def counted() -> tuple[int, int, int] | None:
        outcome = checkpoint()
        if outcome is not None:
            found.append(outcome[1])
        return outcome

    store._checkpoint = counted  # type: ignore[method-assign]
    try:
        steps = dict.fromkeys((f"s{i}" for i in range(64)), 0)
        state = {"k": "x" * 4000}
        for _ in range(25):
            news = await asyncio.gather(
                *(store.commit(turn_commit(s, step, state)) for s, step in steps.items())
            )
            steps = dict(zip(steps, news, strict=True))
        assert await store.check(timeout=HANG) is None  # after any checkpoint handed over
        assert set(steps.values()) == {25}
        assert found and all(CHECKPOINT_PAGES // 5 < n < 2 * CHECKPOINT_PAGES for n in found)
    finally:
        await store.close()


async def test_under_store_synchronous_full_every_commit_goes_to_the_store_thread(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "skillstate.db", synchronous="FULL")  # fsyncs each commit
    await store.open()
    await thread_idle(store)
    try:
        assert store.commit_at_once(turn_commit("s", 0, {"k": 1})) is None
        assert await store.commit(turn_commit("s", 0, {"k": 1})) == 1
    finally:
        await store.close()


async def test_concurrent_commits_go_in_on_the_loops_thread_while_the_store_thread_is_idle(
    tmp_path: Path,
) -> None:
    # The commits of one pass of the loop, one batch at its next pass: no hand-off to the
    # store thread, each commit in the database when it returns, a failed one alone.
    db = tmp_path / "skillstate.db"
    store = await idle_store(db)
    try:
        handed_over = store._exec._posted
        steps = await asyncio.gather(
            store.commit(turn_commit("a", 0, {"k": 1})),
            store.commit(turn_commit("b", 0, {"k": 1})),
            store.commit(turn_commit("a", 5, {"k": 1})),  # a step conflict
            return_exceptions=True,
        )
        assert steps[:2] == [1, 1] and isinstance(steps[2], StoreError)
        assert store._exec._posted == handed_over
        assert committed_steps(db, "a") == (1, [1]) and committed_steps(db, "b") == (1, [1])
    finally:
        await store.close()


def ledger_count(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(db)) as other:
        return int(other.execute("SELECT count(*) FROM ledger").fetchone()[0])


async def test_ledger_rows_go_in_on_the_loops_thread_while_the_store_thread_is_idle(
    tmp_path: Path,
) -> None:
    # The groups of forwarded calls' rows (cost.ledgerwrites): no hand-off to the store
    # thread, and in the database, for any connection, when add_ledger_rows returns.
    db = tmp_path / "skillstate.db"
    store = await idle_store(db)
    try:
        handed_over = store._exec._posted
        await store.add_ledger_rows([ledger_row(session="a"), ledger_row(session="b")])
        assert store._exec._posted == handed_over
        assert ledger_count(db) == 2
    finally:
        await store.close()


async def test_on_a_locked_database_ledger_rows_go_to_the_store_thread_which_waits(
    tmp_path: Path,
) -> None:
    db = tmp_path / "skillstate.db"
    store = await idle_store(db)
    try:
        await waited_out_a_lock(store, db, store.add_ledger_rows([ledger_row(session="a")]))
        assert ledger_count(db) == 1
    finally:
        await store.close()


# -- a batch of writes: savepoints only when one of them fails ---------------------------


async def one_batch(store: SQLiteStore, writes: list[Any]) -> list[Any]:
    """Run ``writes`` (coroutines of store writes) as one batch: queued behind a write that
    holds the store thread until all of them wait."""
    release = threading.Event()
    store_thread_stuck(store, release)
    held = asyncio.ensure_future(store._write(lambda db: release.wait(HANG)))
    await asyncio.sleep(0)
    queued = [asyncio.ensure_future(w) for w in writes]
    await asyncio.sleep(0)
    assert len(store._queue) == len(writes)
    release.set()
    await asyncio.wait_for(held, HANG)
    return await asyncio.wait_for(asyncio.gather(*queued, return_exceptions=True), HANG)


async def test_a_batch_runs_savepoints_only_when_one_of_its_writes_fails(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "skillstate.db")
    await store.open()
    statements: list[str] = []
    assert store._db is not None
    store._db.set_trace_callback(statements.append)
    try:
        commits = [store.commit(turn_commit(f"s{i}", 0, {"k": i})) for i in range(3)]
        assert await one_batch(store, commits) == [1, 1, 1]
        assert not [s for s in statements if "SAVEPOINT" in s]  # two statements a write fewer
        statements.clear()
        # One write fails: the batch runs again with a savepoint each; the failed one
        # leaves nothing, the others commit once, and the sessions count stays right.
        imported = SessionRecord("n", {"k": 9}, ["k"], 4, 1.0, 1.0)
        results = await one_batch(
            store,
            [
                store.import_session(imported),
                store._write(boom),
                store.commit(turn_commit("s0", 1, {"k": 5})),
            ],
        )
        assert results[0] is None and results[2] == 2
        assert isinstance(results[1], StoreError) and "OverflowError" in str(results[1])
        assert len([s for s in statements if s.startswith("SAVEPOINT")]) == 3
        assert store._sessions == 4  # s0, s1, s2 and n: the import counted once
        assert [r.kind for r in await store.ledger_rows(0, 10)] == ["generation"] * 4
        assert committed_steps(tmp_path / "skillstate.db", "s0") == (2, [1, 2])
    finally:
        await store.close()


async def test_sessions_are_listed_and_purged_by_their_last_update_across_minutes(
    tmp_path: Path,
) -> None:
    # The index keeps each session's minute (written on its first commit of a minute);
    # the list and the purge are still by the exact time of the last update.
    store = SQLiteStore(tmp_path / "s.db")
    await store.open()
    steps: dict[str, int] = {}

    async def turn(session: str, now: float) -> None:
        step = steps.get(session, 0)
        tr = TransitionRecord(step + 1, "valid", {"n": now}, "a", [], now)
        steps[session] = await store.commit(SessionCommit(session, step, {}, [], tr, now))

    try:
        # (minute 1: 60-119 s, minute 2: 120-179 s, minute 3)
        for session, now in [("s1", 100.0), ("s2", 110.0), ("s3", 130.0), ("s4", 115.0)]:
            await turn(session, now)
        await turn("s1", 119.5)  # again within its minute
        await turn("s2", 200.0)  # again in a later one
        await turn("s4", 125.0)  # in the next one
        listed = [p["session"] for p in await store.sessions_page(10)]
        assert listed == ["s2", "s3", "s4", "s1"]
        first, second = await store.sessions_page(2), None
        second = await store.sessions_page(2, (first[-1]["updated"], first[-1]["session"]))
        assert [p["session"] for p in first + second] == listed
        assert await store.purge_sessions(older_than=125.0) == 1  # s1 (119.5), not s4 (125)
        assert [p["session"] for p in await store.sessions_page(10)] == ["s2", "s3", "s4"]
    finally:
        await store.close()
