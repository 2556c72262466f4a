"""/cost summed in SQL (Store.ledger_sums + summarize_sums) gives what summing every row in
Python (ledger_rows + summarize) gives, on a randomised ledger: every group_by, time
windows, one session, one key's prefix."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from skillstate.choices import GroupBy
from skillstate.cost.ledger import KINDS, summarize, summarize_sums
from skillstate.store import SessionCommit, Store
from skillstate.store.records import LedgerRow
from skillstate.store.sqlite import SQLiteStore

DAY = 86400.0
START = 20_000 * DAY  # 2024-10-04T00:00:00Z
SESSIONS = ["alice:s1", "alice:s2", "bob:s1", "bob:t", "s1", "plain", "", None]


def maybe(rng: random.Random, value: Any, none_share: float = 0.15) -> Any:
    return None if rng.random() < none_share else value


def random_row(rng: random.Random) -> LedgerRow:
    """A row as the proxy writes them, with every field that may be null sometimes null;
    now and then a kind the proxy does not write (listed after the known ones, in order of
    first appearance: never at a tied time, where even the row order is not defined)."""
    inp = maybe(rng, rng.randrange(0, 200_000))
    cost = maybe(rng, rng.random() * 0.3)
    baseline_cost = maybe(rng, rng.random() * 0.5)
    kind = rng.choice(KINDS) if rng.random() > 0.02 else rng.choice(["odd", "later"])
    ts = START + rng.random() * 4 * DAY
    if rng.random() < 0.05 and kind in KINDS:  # on a day's first instant (and tied)
        ts = START + rng.randrange(5) * DAY
    return LedgerRow(
        ts=ts,
        session=rng.choice(SESSIONS),
        upstream=maybe(rng, rng.choice(["up-a", "up-b", "Up-c"])),
        model=maybe(rng, rng.choice(["gpt-x", "claude-y", "m_z", "é-model"])),
        kind=kind,
        status=rng.choice([200, 200, 429, 500]),
        input_tokens=inp,
        output_tokens=maybe(rng, rng.randrange(0, 5000)),
        cache_read_tokens=maybe(rng, rng.randrange(0, 50_000)),
        cache_write_tokens=maybe(rng, rng.randrange(0, 5000)),
        pricing=rng.choice(["list", "override", "unknown", "usage-unavailable"]),
        cost_usd=cost,
        baseline_input_tokens=maybe(rng, rng.randrange(0, 300_000), 0.3),
        baseline_cost_usd=baseline_cost,
        mode=rng.choice(["state", "passthrough"]),
        baseline_cached_tokens=maybe(rng, rng.randrange(0, 50_000), 0.4),
        baseline_output_tokens=maybe(rng, rng.randrange(0, 5000), 0.4),
        saved_cost_usd=None,
        saved_cost_pct=None,
        context=maybe(rng, rng.choice(["compact", "transcript", "masked"])),
    )


def assert_same_summary(sql: Any, python: Any, path: str = "") -> None:
    """Equal, key order included; USD sums to 1e-9 (SQL adds floats in another order),
    percentages to their last rounded digit."""
    if isinstance(python, dict):
        assert isinstance(sql, dict) and list(sql) == list(python), path
        for k in python:
            assert_same_summary(sql[k], python[k], f"{path}.{k}")
    elif isinstance(python, list):
        assert isinstance(sql, list) and len(sql) == len(python), path
        for i, (a, b) in enumerate(zip(sql, python, strict=True)):
            assert_same_summary(a, b, f"{path}[{i}]")
    elif isinstance(python, float):
        tolerance = 0.0100001 if path.endswith("pct") else 1e-9
        assert sql == pytest.approx(python, abs=tolerance), path
    else:
        assert type(sql) is type(python) and sql == python, path


async def check_sums_match_rows(store: Store, rows: list[LedgerRow]) -> None:
    """Insert ``rows`` and compare both summaries over several windows and filters."""
    for i in range(0, len(rows), 500):
        await store.add_ledger_rows(rows[i : i + 500])
    windows = [(0.0, START + 10 * DAY), (START + DAY, START + 2.5 * DAY), (START + 9 * DAY, 1e11)]
    filters: list[tuple[str | None, str | None]] = [
        (None, None),
        ("alice:s1", None),
        ("plain", None),
        (None, "alice:"),
        (None, "bob:"),
    ]
    compared = 0
    for since, until in windows:
        for session, prefix in filters:
            stored = await store.ledger_rows(since, until, session, prefix)
            for group_by in (None, *GroupBy.values()):
                python = summarize(stored, group_by)
                sums = await store.ledger_sums(since, until, session, prefix, group_by)
                assert_same_summary(summarize_sums(sums, group_by), python, f"{group_by}")
                compared += bool(stored)
    assert compared > 50  # most combinations had rows to sum


@pytest.mark.parametrize("seed", [1, 2])
async def test_sql_sums_equal_python_summary_sqlite(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    store = SQLiteStore(tmp_path / "skillstate.db")
    await store.open()
    try:
        await check_sums_match_rows(store, [random_row(rng) for _ in range(3000)])
    finally:
        await store.close()


async def test_sums_of_an_empty_window_are_the_empty_summary(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "skillstate.db")
    await store.open()
    try:
        for group_by in (None, *GroupBy.values()):
            sums = await store.ledger_sums(0.0, 1e11, None, None, group_by)
            assert sums == []
            assert summarize_sums(sums, group_by) == summarize([], group_by)
    finally:
        await store.close()


def test_sqlite_sums_read_the_time_and_session_indexes(tmp_path: Path) -> None:
    """The window is a range of the ts index, one session's rows a range of the (session,
    ts) index: /cost never scans the whole ledger."""
    import sqlite3

    from skillstate.store.ledgersql import GROUP_BY, ledger_where, sums_select
    from skillstate.store.sqlite.store import GROUP_KEYS, connect

    db: sqlite3.Connection = connect(tmp_path / "skillstate.db")
    try:
        used = {}
        for name, session, prefix in [
            ("window", None, None),
            ("session", "s1", None),
            ("prefix", None, "alice:"),
        ]:
            where, args = ledger_where(0.0, 1.0, session, prefix)
            sql = sums_select(GROUP_KEYS, "model") + where + GROUP_BY
            used[name] = " ".join(str(r[-1]) for r in db.execute(f"EXPLAIN QUERY PLAN {sql}", args))
        assert "SEARCH ledger USING INDEX ledger_ts" in used["window"], used
        assert "SEARCH ledger USING INDEX ledger_session" in used["session"], used
        # one key's rows: a range of either index (the planner picks), never a full scan
        assert "SEARCH ledger USING INDEX ledger_" in used["prefix"], used
    finally:
        db.close()


async def test_a_long_ledger_read_does_not_hold_up_commits(tmp_path: Path) -> None:
    """/cost's sums run on the store's reader connection: a turn commits while one is
    still reading (on the store's own thread it would wait for the whole read)."""
    import asyncio
    import threading

    from skillstate.store import TransitionRecord

    store = SQLiteStore(tmp_path / "skillstate.db")
    await store.open()
    release = threading.Event()
    try:
        await store.add_ledger_rows([random_row(random.Random(3))])
        reading = asyncio.ensure_future(store._read(lambda db: release.wait(60)))
        step = await asyncio.wait_for(
            store.commit(SessionCommit(
                "s", expected_step=0, state={"a": 1}, schema=["a"], now=START,
                transition=TransitionRecord(1, "valid", {"a": 1}, None, [], START),
            )),
            timeout=30,  # a hang guard, not a timing threshold: it fails only when blocked
        )  # fmt: skip
        assert step == 1 and not reading.done()
        release.set()
        assert await reading is True
        assert len(await store.ledger_sums(0.0, 1e11)) == 1
    finally:
        release.set()
        await store.close()
