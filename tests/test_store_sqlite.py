"""The SQLite store: one writer per data dir, and a session cache that never serves a state
the database has moved past."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from skillstate.store import StoreError, TransitionRecord
from skillstate.store.sqlite import SQLiteStore, lock_data_dir, unlock_data_dir


def transition(step: int) -> TransitionRecord:
    return TransitionRecord(step, "valid", {}, "a", [], float(step))


async def commit(store: SQLiteStore, expected: int, state: dict[str, Any]) -> int:
    return await store.commit(
        "s", expected_step=expected, state=state, schema=["k"], transition=transition(expected + 1),
        now=float(expected + 1),
    )  # fmt: skip


HOLD = """
import sys, time
from pathlib import Path
from skillstate.store.sqlite import lock_data_dir
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
        assert await reader.ping()
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
