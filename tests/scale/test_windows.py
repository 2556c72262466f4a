"""Shared rate windows (coordination.windows) against a real redis-server: the same verdicts
as the in-process windows, to the microsecond, and atomic under concurrent replicas."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as redis

from skillstate.choices import CoordinationDown
from skillstate.coordination.link import CoordinationLink
from skillstate.coordination.windows import SharedWindows
from skillstate.errors import ProxyError
from skillstate.upstream.limits import Admission, Ticket, UpstreamLimits

# These tests are about atomicity, not outages: a burst opens dozens of connections at once
# on a loaded 2-core machine, where the link's 1 s connect timeout can pass.
SLOW_MACHINE = 10.0


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
async def link(redis_url: str) -> AsyncIterator[CoordinationLink]:
    link = CoordinationLink(redis_url, timeout=SLOW_MACHINE)
    try:
        yield link
    finally:
        await link.close()


async def test_rpm_admits_exactly_the_limit_and_retry_after_is_exact(
    link: CoordinationLink,
) -> None:
    clock = FakeClock()
    shared = SharedWindows(link, "upstream:a", rpm=3, tpm=None, now=clock)
    for t in (1000.0, 1001.0, 1002.0):
        clock.t = t
        assert (await shared.reserve(0)).ok
    clock.t = 1030.0
    assert await shared.reserve(0) == Admission(ok=False, retry_after=30.0, never_fits=False)
    clock.t = 1059.999999
    assert not (await shared.reserve(0)).ok
    clock.t = 1060.0  # the request of t=1000 expires at exactly 1060
    assert (await shared.reserve(0)).ok
    assert (await shared.reserve(0)).retry_after == 1.0  # t=1001 frees the next slot
    assert shared.snapshot() == {"rpm": {"limit": 3, "used": 3}, "tpm": None}


async def test_tpm_wait_is_for_the_entry_that_frees_enough_and_settle_adjusts(
    link: CoordinationLink,
) -> None:
    clock = FakeClock()
    shared = SharedWindows(link, "upstream:a", rpm=None, tpm=1000, now=clock)
    tickets = []
    for at, tokens in [(1000.0, 400), (1010.0, 300), (1020.0, 200)]:
        clock.t = at
        verdict = await shared.reserve(tokens)
        assert verdict.ticket is not None
        tickets.append(verdict.ticket)
    clock.t = 1025.0
    assert (await shared.reserve(101)).retry_after == 35.0  # the t=1000 entry
    assert (await shared.reserve(501)).retry_after == 45.0  # also the t=1010 one
    assert (await shared.reserve(1000)).retry_after == 55.0  # all three
    assert await shared.reserve(1001) == Admission(ok=False, retry_after=math.inf, never_fits=True)
    await shared.settle(tickets[0], 50)  # the first call really used 50 tokens
    assert shared.snapshot()["tpm"] == {"limit": 1000, "used": 550}
    assert (await shared.reserve(450)).ok  # 550 + 450 fits exactly now
    assert (await shared.reserve(1)).retry_after == 35.0  # t=1000's 50 frees it
    clock.t = 1100.0
    await shared.settle(tickets[1], 5000)  # expired: a no-op
    await shared.refresh()
    assert shared.snapshot()["tpm"] == {"limit": 1000, "used": 0}


async def test_same_verdicts_as_the_in_process_windows(link: CoordinationLink) -> None:
    """A seeded random history (integer and half seconds, so both sides compute exactly):
    every verdict and every snapshot is the in-process one."""
    rng = random.Random(17)
    for case in range(12):
        clock = FakeClock(5000.0 * (case + 1))
        rpm = rng.choice([None, 2, 5])
        tpm = rng.choice([None, 300, 1000])
        local = UpstreamLimits(rpm, tpm, clock)
        shared = SharedWindows(link, f"case:{case}", rpm, tpm, now=clock)
        for _ in range(40):
            clock.t += rng.choice([0.0, 0.5, 1.0, 3.0, 10.0, 25.0])
            tokens = rng.randint(0, 400)
            mine, theirs = await local.reserve(tokens), await shared.reserve(tokens)
            assert (mine.ok, mine.retry_after, mine.never_fits) == (
                theirs.ok,
                theirs.retry_after,
                theirs.never_fits,
            )
            if mine.ok and rng.random() < 0.5:
                actual = rng.randint(0, 400)
                assert mine.ticket is not None and theirs.ticket is not None
                await local.settle(mine.ticket, actual)
                await shared.settle(theirs.ticket, actual)
            await shared.refresh()
            assert shared.snapshot() == local.snapshot()


async def test_concurrent_reserves_from_several_clients_admit_exactly_rpm(
    link: CoordinationLink, redis_url: str
) -> None:
    """90 reserves at once through three links (three replicas' clients), rpm=30, on
    Redis's own clock: exactly 30 admitted; each refusal waits for a recorded entry."""
    links = [link, *(CoordinationLink(redis_url, timeout=SLOW_MACHINE) for _ in range(2))]
    try:
        windows = [SharedWindows(ln, "upstream:x", rpm=30, tpm=None) for ln in links]
        verdicts = await asyncio.gather(*(windows[i % 3].reserve(10) for i in range(90)))
        assert sum(v.ok for v in verdicts) == 30
        refused = [v for v in verdicts if not v.ok]
        assert len(refused) == 60
        assert all(0.0 < v.retry_after <= 60.0 and not v.never_fits for v in refused)
        await windows[1].refresh()
        assert windows[1].snapshot()["rpm"] == {"limit": 30, "used": 30}
    finally:
        for ln in links[1:]:
            await ln.close()


async def test_concurrent_token_reserves_never_overshoot_tpm(
    link: CoordinationLink, redis_url: str
) -> None:
    other = CoordinationLink(redis_url, timeout=SLOW_MACHINE)
    try:
        windows = [SharedWindows(ln, "key:k", rpm=None, tpm=1000) for ln in (link, other)]
        verdicts = await asyncio.gather(*(windows[i % 2].reserve(70) for i in range(60)))
        assert sum(v.ok for v in verdicts) == 14  # 14 * 70 = 980; a 15th would be 1050
        await other.close()
        other = CoordinationLink(redis_url, timeout=SLOW_MACHINE)
        check = SharedWindows(other, "key:k", rpm=None, tpm=1000)
        await check.refresh()
        assert check.snapshot()["tpm"] == {"limit": 1000, "used": 980}
    finally:
        await other.close()


async def test_keys_expire_one_span_after_the_last_write(
    link: CoordinationLink, redis_url: str
) -> None:
    shared = SharedWindows(link, "upstream:e", rpm=5, tpm=500)
    assert (await shared.reserve(10)).ok
    client = redis.from_url(redis_url)
    try:
        keys = sorted(k.decode() for k in await client.keys("skillstate:win:*"))
        assert keys == [
            "skillstate:win:{upstream:e}:a",
            "skillstate:win:{upstream:e}:r",
            "skillstate:win:{upstream:e}:t",
        ]
        for key in keys:
            ttl = await client.pttl(key)
            assert 60_000 < ttl <= 61_000
    finally:
        await client.aclose()


async def test_redis_down_refuses_or_falls_back_to_this_replicas_windows(
    redis_url: str, redis_server: Any
) -> None:
    """``coordination_down``: refuse -> the turn's 503; local -> in-process windows (which
    then hold per replica), and Redis's own windows again once it answers."""
    refusing = CoordinationLink(redis_url, CoordinationDown.REFUSE, retry_every=0.0)
    local = CoordinationLink(redis_url, CoordinationDown.LOCAL, retry_every=0.0)
    try:
        strict = SharedWindows(refusing, "upstream:d", rpm=2, tpm=None)
        lenient = SharedWindows(local, "upstream:d", rpm=2, tpm=None)
        assert (await lenient.reserve(0)).ok  # one request recorded in Redis
        redis_server.stop()
        with pytest.raises(ProxyError) as e:
            await strict.reserve(0)
        assert e.value.status == 503 and e.value.code == "coordination_unavailable"
        verdicts = [await lenient.reserve(0) for _ in range(3)]
        assert [v.ok for v in verdicts] == [True, True, False]  # the local window: 2
        assert local.degraded
        assert lenient.snapshot()["rpm"] == {"limit": 2, "used": 2}
        await lenient.settle(verdicts[0].ticket or Ticket(0, None), 5)  # a local ticket
        redis_server.start()  # empty: the test server keeps nothing on disk
        assert (await lenient.reserve(0)).ok  # Redis's window again, shared by both
        assert (await strict.reserve(0)).ok
        assert not (await lenient.reserve(0)).ok
        assert not local.degraded
    finally:
        if redis_server.proc is None:
            redis_server.start()
        await refusing.close()
        await local.close()


async def test_a_burst_beyond_the_connection_pool_waits_for_connections(
    link: CoordinationLink,
) -> None:
    """More calls at once than the link has connections: they queue for one, and Redis is
    not taken for down (which would refuse them all with 503)."""
    shared = SharedWindows(link, "upstream:burst", rpm=30, tpm=None)
    verdicts = await asyncio.gather(*(shared.reserve(1) for _ in range(300)))
    assert sum(v.ok for v in verdicts) == 30 and link.up
