"""Per-session turn leases against a real redis-server: each ``SessionLeases`` here plays
one replica (its own link and client), all sharing the tier's Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from skillstate.choices import CoordinationDown
from skillstate.config import Settings
from skillstate.coordination.leases import UNKNOWN, Lease, SessionLeases, _keys
from skillstate.coordination.link import CoordinationLink
from skillstate.errors import ProxyError
from skillstate.sessions.locks import LOCAL_HOLD
from skillstate.sessions.operator import SessionOperator
from skillstate.store import SessionCommit, SessionRecord, TransitionRecord
from skillstate.store.sqlite import SQLiteStore

from .services import RedisServer

Replicas = Callable[..., SessionLeases]


@pytest.fixture
async def replica(redis_url: str) -> AsyncIterator[Replicas]:
    """Makes a replica's leases (closed after the test)."""
    links: list[CoordinationLink] = []

    def make(
        ttl: float = 5.0,
        wait: float = 10.0,
        policy: CoordinationDown = CoordinationDown.REFUSE,
        url: str = redis_url,
    ) -> SessionLeases:
        link = CoordinationLink(url, policy, retry_every=0.05)
        links.append(link)
        return SessionLeases(link, ttl=ttl, wait=wait)

    yield make
    for link in links:
        await link.close()


async def _queued(redis_url: str, session: str, n: int) -> None:
    """Wait until ``n`` tickets are queued for ``session``."""
    client = aioredis.from_url(redis_url)
    try:
        while await client.zcard(_keys(session)[1]) < n:
            await asyncio.sleep(0.005)
    finally:
        await client.aclose()


async def test_one_turn_at_a_time_across_replicas(replica: Replicas) -> None:
    replicas = [replica(), replica(), replica()]
    inside = 0
    most = 0
    done = 0

    async def turn(k: int) -> None:
        nonlocal inside, most, done
        async with replicas[k % 3].hold("s1"):
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.002)
            inside -= 1
            done += 1

    await asyncio.gather(*(turn(k) for k in range(30)))
    assert done == 30
    assert most == 1


async def test_waiters_get_the_lease_first_come_first_served(
    replica: Replicas, redis_url: str
) -> None:
    replicas = [replica(), replica(), replica()]
    order: list[int] = []
    first = replicas[0]
    holding = asyncio.Event()
    release = asyncio.Event()

    async def holder() -> None:
        async with first.hold("s1"):
            holding.set()
            await release.wait()

    async def waiter(k: int) -> None:
        async with replicas[k % 3].hold("s1"):
            order.append(k)

    held = asyncio.ensure_future(holder())
    await holding.wait()
    waiters = []
    for k in range(6):  # each waiter takes its ticket before the next one starts
        waiters.append(asyncio.ensure_future(waiter(k)))
        await _queued(redis_url, "s1", k + 1)
    release.set()
    await asyncio.gather(held, *waiters)
    assert order == [0, 1, 2, 3, 4, 5]


async def test_a_turn_that_waits_longer_than_lease_wait_gets_a_409(replica: Replicas) -> None:
    holder, other = replica(), replica(wait=0.2)
    async with holder.hold("s1"):
        with pytest.raises(ProxyError) as err:
            async with other.hold("s1"):
                pytest.fail("got a held session's lease")
    assert (err.value.status, err.value.code) == (409, "session_busy")
    assert "lease_wait" in err.value.message
    async with other.hold("s1"):  # and the session is free again after
        pass


async def test_a_waiter_that_goes_away_leaves_the_queue_at_once(
    replica: Replicas, redis_url: str
) -> None:
    a, b = replica(), replica()
    async with a.hold("s1"):
        gone = asyncio.ensure_future(b.hold("s1").__aenter__())
        await _queued(redis_url, "s1", 1)
        gone.cancel()  # its client disconnected
        with pytest.raises(asyncio.CancelledError):
            await gone
        client = aioredis.from_url(redis_url)
        try:
            assert await client.zcard(_keys("s1")[1]) == 0
        finally:
            await client.aclose()


async def test_a_waiter_cancelled_while_its_poll_is_in_flight_leaves_the_queue(
    replica: Replicas, redis_url: str
) -> None:
    """A poll sent but not answered when the waiter is cancelled still runs in Redis: the
    leave must follow its answer, not race it on another connection (the poll would run
    after the leave and queue the ticket again, or take the lease)."""
    a, b = replica(), replica()
    real_acquire, real_leave = b._scripts.acquire, b._scripts.leave
    in_flight, answered = asyncio.Event(), asyncio.Event()
    events: list[str] = []
    polls: list[asyncio.Future[object]] = []

    async def sent_poll(kwargs: dict[str, object]) -> object:
        await answered.wait()  # Redis runs it, whoever still waits for its reply
        result = await real_acquire(**kwargs)
        events.append("poll answered")
        return result

    async def acquire(**kwargs: object) -> object:
        if not polls:
            polls.append(asyncio.ensure_future(real_acquire(**kwargs)))  # takes the ticket
        else:
            polls.append(asyncio.ensure_future(sent_poll(kwargs)))
            in_flight.set()
        return await asyncio.shield(polls[-1])  # once sent, a poll runs to its end

    async def leave(**kwargs: object) -> object:
        events.append("leave")
        return await real_leave(**kwargs)

    b._scripts.acquire = acquire  # type: ignore[method-assign]
    b._scripts.leave = leave  # type: ignore[method-assign]
    async with a.hold("s1"):
        gone = asyncio.ensure_future(b.hold("s1").__aenter__())
        await in_flight.wait()
        gone.cancel()  # its client disconnected while the poll was on the wire
        answered.set()
        with pytest.raises(asyncio.CancelledError):
            await gone
        await asyncio.gather(*polls)
        assert events == ["poll answered", "leave"]
        client = aioredis.from_url(redis_url)
        try:
            assert await client.zcard(_keys("s1")[1]) == 0
        finally:
            await client.aclose()


async def test_a_killed_holders_lease_expires_and_its_step_is_unknown(replica: Replicas) -> None:
    dead, alive = replica(ttl=0.3), replica(wait=10.0)
    async with alive.hold("s1") as hold:
        hold.committed(3)
    # The dead replica took the lease and was killed: no renewal, no release.
    lease = await dead._acquire("s1")
    assert isinstance(lease, Lease)
    async with alive.hold("s1") as hold:
        assert isinstance(hold, Lease)
        # It may have committed step 4 before it died: the store is read again.
        assert hold.known_step == UNKNOWN
    with pytest.raises(ProxyError) as err:
        lease.check()
    assert (err.value.status, err.value.code) == (409, "lease_lost")


async def test_renewal_keeps_a_long_turn_s_lease(replica: Replicas) -> None:
    holder, other = replica(ttl=0.3), replica(wait=0.0)
    async with holder.hold("s1") as hold:
        assert isinstance(hold, Lease)
        while hold.renewals < 4:  # more than a lease_ttl past the acquire
            await asyncio.sleep(0.05)
        with pytest.raises(ProxyError) as err:
            async with other.hold("s1"):
                pytest.fail("got a renewed lease")
        assert err.value.code == "session_busy"
        hold.check()  # still held: no raise


async def test_a_lease_taken_over_is_lost_and_refuses_to_commit(
    replica: Replicas, redis_url: str
) -> None:
    holder = replica(ttl=0.3)
    client = aioredis.from_url(redis_url)
    try:
        async with holder.hold("s1") as hold:
            assert isinstance(hold, Lease)
            # Another holder got it meanwhile (this one was paused past its TTL).
            await client.set(_keys("s1")[0], "someone-else", px=10_000)
            while not hold.lost:
                await asyncio.sleep(0.02)
            with pytest.raises(ProxyError) as err:
                hold.check()
            assert err.value.status == 409
        # The release left the other holder's lease alone.
        assert await client.get(_keys("s1")[0]) == b"someone-else"
    finally:
        await client.aclose()


async def test_the_committed_step_reaches_the_next_holder(replica: Replicas) -> None:
    a, b = replica(), replica()
    async with a.hold("s1") as hold:
        assert isinstance(hold, Lease)
        assert hold.known_step == UNKNOWN  # a session Redis never saw
        hold.committed(7)
    async with b.hold("s1") as hold:
        assert isinstance(hold, Lease)
        assert hold.known_step == 7
        assert hold.current(_record(7))
        assert not hold.current(_record(6))  # b's cache is behind: reload
    async with a.hold("s1") as hold:  # nothing committed: still 7
        assert isinstance(hold, Lease)
        assert hold.known_step == 7
        hold.unsure()  # a commit failed halfway
    async with b.hold("s1") as hold:
        assert isinstance(hold, Lease)
        assert hold.known_step == UNKNOWN


async def test_a_purge_pauses_every_replica_and_spares_live_sessions(replica: Replicas) -> None:
    a, b = replica(), replica()
    busy_now = asyncio.Event()
    release = asyncio.Event()

    async def turn() -> None:
        async with a.hold("running"):
            busy_now.set()
            await release.wait()

    running = asyncio.ensure_future(turn())
    await busy_now.wait()
    got_new = asyncio.Event()

    async def new_turn() -> None:
        async with a.hold("new"):
            got_new.set()

    async with b.pause_new() as busy:
        assert "running" in busy
        late = asyncio.ensure_future(new_turn())
        for _ in range(10):  # it polls, and is not granted while the purge runs
            await asyncio.sleep(0.02)
        assert not got_new.is_set()
    await asyncio.wait_for(late, 5)
    assert got_new.is_set()
    release.set()
    await running


async def test_redis_down_refuses_or_runs_locally_and_recovers(
    replica: Replicas, redis_server: RedisServer
) -> None:
    refusing = replica(policy=CoordinationDown.REFUSE)
    local = replica(policy=CoordinationDown.LOCAL)
    redis_server.stop()
    try:
        with pytest.raises(ProxyError) as err:
            async with refusing.hold("s1"):
                pytest.fail("held a lease without Redis")
        assert (err.value.status, err.value.code) == (503, "coordination_unavailable")
        async with local.hold("s1") as hold:
            assert hold is LOCAL_HOLD
        assert local.link.degraded
    finally:
        redis_server.start()
    while True:  # one try per retry_every until Redis answers again
        async with local.hold("s1") as hold:
            if isinstance(hold, Lease):
                break
        await asyncio.sleep(0.05)
    assert not local.link.degraded
    async with refusing.hold("s1") as hold:
        assert isinstance(hold, Lease)


def _record(step: int) -> SessionRecord:
    now = time.time()
    return SessionRecord("s1", {}, [], step, now, now)


async def test_the_purge_is_skipped_while_redis_is_down_under_refuse(
    replica: Replicas, redis_server: RedisServer, tmp_path: Path
) -> None:
    leases = replica(policy=CoordinationDown.REFUSE)
    settings = Settings(data_dir=tmp_path)
    store = SQLiteStore(tmp_path / "s.db")
    await store.open()
    try:
        now = time.time()
        transition = TransitionRecord(1, "valid", {}, "a", [], now - 100)
        await store.commit(
            SessionCommit(
                "old", expected_step=0, state={}, schema=[], transition=transition, now=now - 100
            )
        )
        sessions = SessionOperator(settings, store, leases)
        redis_server.stop()
        try:
            # The purge cannot stop the other replicas' turns: it waits for the next round.
            assert await sessions.purge_expired(now - 10) == 0
            assert await store.load("old", fresh=True) is not None
        finally:
            redis_server.start()
        while True:  # Redis answers again (one try per retry_every): the purge runs
            try:
                purged = await sessions.purge_expired(now - 10)
            except ProxyError:
                purged = -1
            if purged >= 0 and leases.link.up:
                break
            await asyncio.sleep(0.05)
        assert purged == 1
        assert await store.load("old", fresh=True) is None
    finally:
        await store.close()


async def test_a_replica_keeps_nothing_for_sessions_no_turn_holds(replica: Replicas) -> None:
    a, b = replica(), replica(wait=0.1)
    for k in range(20):
        async with a.hold(f"s{k}"):
            with pytest.raises(ProxyError):
                async with b.hold(f"s{k}"):  # queues, then gives up
                    pass
    assert len(a) == 0 and len(b) == 0
    assert not a._wake and not b._wake
