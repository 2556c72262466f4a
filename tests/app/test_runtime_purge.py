"""The periodic purge keeps running whatever one round of it raises."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from skillstate.config import Settings
from skillstate.store import StoreUnavailable
from skillstate.web.runtime import Runtime


@pytest.mark.parametrize("error", [RuntimeError("a bug"), StoreUnavailable("disk gone")])
async def test_a_failed_purge_is_tried_again_next_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    settings = Settings(
        data_dir=tmp_path,
        upstreams=[{"name": "u", "url": "http://127.0.0.1:9"}],
        session_ttl=60,
        purge_interval=0.01,
    )
    rt = Runtime(settings)
    await rt.store.open()
    rounds: list[float] = []

    async def purge(older_than: float) -> int:
        rounds.append(older_than)
        if len(rounds) == 1:
            raise error
        return 0

    monkeypatch.setattr(rt.sessions, "purge_expired", purge)
    task = asyncio.ensure_future(rt.purge_forever())
    try:
        while len(rounds) < 3:
            await asyncio.sleep(0.01)
            assert not task.done(), task.exception()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await rt.store.close()
    assert len(rounds) >= 3
