"""The SQLite store: one writer per data dir, and a session cache that never serves a state
the database has moved past."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from skillstate.store import StoreError, TransitionRecord
from skillstate.store.sqlite import SQLiteStore


def transition(step: int) -> TransitionRecord:
    return TransitionRecord(step, "valid", {}, "a", [], float(step))


async def commit(store: SQLiteStore, expected: int, state: dict[str, Any]) -> int:
    return await store.commit(
        "s", expected_step=expected, state=state, schema=["k"], transition=transition(expected + 1),
        now=float(expected + 1),
    )  # fmt: skip


async def test_a_second_exclusive_store_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "skillstate.db"
    first = SQLiteStore(db, exclusive=True)
    await first.open()
    try:
        with pytest.raises(StoreError, match="in use by another skillstate proxy"):
            await SQLiteStore(db, exclusive=True).open()
        reader = SQLiteStore(db)  # `skillstate cost` reads while the proxy runs
        await reader.open()
        assert await reader.ping()
        await reader.close()
    finally:
        await first.close()
    again = SQLiteStore(db, exclusive=True)  # released on close
    await again.open()
    await again.close()


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
