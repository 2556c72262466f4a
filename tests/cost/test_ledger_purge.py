"""Ledger retention on SQLite: a big purge goes in chunks, and turns commit in between."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path

import pytest

from skillstate.store import SessionCommit, TransitionRecord
from skillstate.store.sqlite import SQLiteStore
from skillstate.store.sqlite import store as sqlite_store
from tests.cost.test_ledger_sums import random_row


async def test_a_big_ledger_purge_lets_commits_in_between(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "PURGE_CHUNK", 3)
    rng = random.Random(8)
    store = SQLiteStore(tmp_path / "skillstate.db")
    await store.open()
    try:
        old = [dataclasses.replace(random_row(rng), ts=100.0 + i) for i in range(10)]
        kept = [dataclasses.replace(random_row(rng), ts=1000.0 + i) for i in range(5)]
        await store.add_ledger_rows(old + kept)
        purging = asyncio.ensure_future(store.purge_ledger(500.0))
        await asyncio.sleep(0)  # its first chunk is on the store thread
        step = await store.commit(SessionCommit(
            "s", expected_step=0, state={"a": 1}, schema=["a"], now=2000.0,
            transition=TransitionRecord(1, "valid", {"a": 1}, None, [], 2000.0),
        ))  # fmt: skip
        assert step == 1 and not purging.done()  # committed between two chunks
        assert await purging == 10  # 3 + 3 + 3 + 1
        assert [r.ts for r in await store.ledger_rows(0.0, 1e11)] == [r.ts for r in kept]
        assert await store.purge_ledger(500.0) == 0
    finally:
        await store.close()
