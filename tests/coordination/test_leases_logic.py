"""What a turn's hold decides without Redis: when a lease counts as lost, when a loaded copy
is current, and that a session's commit takes nothing under a lost hold (its 409) and reads the
store again when its copy is behind. (Leases against a real Redis: tests/scale/.)"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from skillstate.config import Settings
from skillstate.coordination.leases import UNKNOWN, Lease
from skillstate.errors import ProxyError
from skillstate.sessions.locks import Hold, SessionLocks
from skillstate.sessions.operator import SessionOperator
from skillstate.store import SessionCommit, SessionRecord, TransitionRecord
from skillstate.store.sqlite import SQLiteStore


class _Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def _record(step: int, updated: float | None = None) -> SessionRecord:
    now = time.time() if updated is None else updated
    return SessionRecord("s", {}, [], step, now, now)


def test_a_lease_is_lost_once_unconfirmed_for_its_ttl_or_taken_over() -> None:
    clock = _Clock()
    lease = Lease("s", "tok", 3, confirmed_until=clock.now + 10, session_ttl=0, clock=clock)
    lease.check()  # held
    clock.now += 9.9
    lease.check()
    clock.now += 0.1  # the process was paused past the lease's TTL: maybe another holder now
    with pytest.raises(ProxyError) as err:
        lease.check()
    assert (err.value.status, err.value.code) == (409, "lease_lost")
    taken = Lease("s", "tok", 3, confirmed_until=clock.now + 10, session_ttl=0, clock=clock)
    taken.lost = True  # a renewal found another token
    with pytest.raises(ProxyError):
        taken.check()


def test_a_loaded_copy_is_current_only_at_the_last_committed_step() -> None:
    lease = Lease("s", "t", 4, confirmed_until=1e18, session_ttl=0, clock=time.monotonic)
    assert lease.current(_record(4))
    assert not lease.current(_record(3))  # another replica committed step 4
    unknown = Lease("s", "t", UNKNOWN, confirmed_until=1e18, session_ttl=0, clock=time.monotonic)
    assert not unknown.current(_record(4))  # the last holder died: maybe it committed


def test_a_copy_older_than_the_session_ttl_is_read_again() -> None:
    lease = Lease("s", "t", 4, confirmed_until=1e18, session_ttl=60, clock=time.monotonic)
    assert lease.current(_record(4, time.time() - 30))
    assert not lease.current(_record(4, time.time() - 61))  # maybe purged elsewhere


class _ScriptedHold(Hold):
    def __init__(self, *, lost: bool = False, current: bool = True) -> None:
        self.lost = lost
        self.is_current = current
        self.reported: list[int | None] = []

    def current(self, record: SessionRecord) -> bool:
        return self.is_current

    def check(self) -> None:
        if self.lost:
            raise ProxyError("conflict", "lease lost", code="lease_lost")

    def committed(self, step: int) -> None:
        self.reported.append(step)

    def unsure(self) -> None:
        self.reported.append(None)


class _ScriptedLocks(SessionLocks):
    """In-process locks whose holds say what the test scripts (a Redis lease's answers)."""

    def __init__(self, hold: Hold) -> None:
        super().__init__()
        self.scripted = hold

    @asynccontextmanager
    async def hold(self, session: str) -> AsyncIterator[Hold]:
        async with super().hold(session):
            yield self.scripted


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "s.db")
    await s.open()
    await s.commit(
        SessionCommit(
            "s",
            expected_step=0,
            state={"n": 1},
            schema=["n"],
            transition=TransitionRecord(1, "valid", {"n": 1}, "a", [], time.time()),
            now=time.time(),
        )
    )
    yield s
    await s.close()


def _sessions(store: SQLiteStore, hold: Hold, tmp_path: Path) -> SessionOperator:
    settings = Settings(data_dir=tmp_path, schema=["n"])
    return SessionOperator(settings, store, _ScriptedLocks(hold))


async def test_a_lost_hold_commits_nothing_and_is_a_409(store: SQLiteStore, tmp_path: Path) -> None:
    hold = _ScriptedHold(lost=True)
    sessions = _sessions(store, hold, tmp_path)
    with pytest.raises(ProxyError) as err:
        await sessions.operator_patch("s", {"n": 2})
    assert (err.value.status, err.value.code) == (409, "lease_lost")
    record = await store.load("s", fresh=True)
    assert record is not None and (record.step, record.state) == (1, {"n": 1})
    assert hold.reported == []  # no commit was tried: the step is as the last holder left it


async def test_a_commit_reports_its_step_to_the_hold(store: SQLiteStore, tmp_path: Path) -> None:
    hold = _ScriptedHold()
    change = await _sessions(store, hold, tmp_path).operator_patch("s", {"n": 2})
    assert change.step == 2 and hold.reported == [2]


async def test_a_copy_behind_another_writer_is_read_again(
    store: SQLiteStore, tmp_path: Path
) -> None:
    # Another replica (here: another store on the same file) commits step 2.
    other = SQLiteStore(tmp_path / "s.db")
    await other.open()
    try:
        await other.commit(
            SessionCommit(
                "s",
                expected_step=1,
                state={"n": 5},
                schema=["n"],
                transition=TransitionRecord(2, "valid", {"n": 5}, "b", [], time.time()),
                now=time.time(),
            )
        )
    finally:
        await other.close()
    stale = await store.load("s")
    assert stale is not None and stale.step == 1  # this store's cache is behind
    change = await _sessions(store, _ScriptedHold(current=False), tmp_path).operator_patch(
        "s", {"n": 6}
    )
    assert change.step == 3 and change.state == {"n": 6}
