"""The shared circuit breaker (coordination.breakers) against a real redis-server: the
failures of all replicas count together, and in half_open exactly one of them probes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis

from skillstate.coordination.breakers import SharedBreaker
from skillstate.coordination.link import CoordinationLink
from skillstate.upstream.breaker import CircuitState

# These tests are about atomicity, not outages: a burst opens dozens of connections at once
# on a loaded 2-core machine, where the link's 1 s connect timeout can pass.
SLOW_MACHINE = 10.0


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
async def links(redis_url: str) -> AsyncIterator[list[CoordinationLink]]:
    """Three replicas' links to the same Redis."""
    links = [CoordinationLink(redis_url, timeout=SLOW_MACHINE) for _ in range(3)]
    try:
        yield links
    finally:
        for link in links:
            await link.close()


def replicas(
    links: list[CoordinationLink], clock: FakeClock | None = None, probe_ttl: float = 600.0
) -> tuple[list[SharedBreaker], list[list[CircuitState]]]:
    breakers, changes = [], []
    for link in links:
        b = SharedBreaker(
            link, "up", 5, 30.0, probe_ttl=probe_ttl, now=clock, monotonic=clock or time.monotonic
        )
        seen: list[CircuitState] = []
        b.on_change = seen.append
        breakers.append(b)
        changes.append(seen)
    return breakers, changes


async def test_failures_across_replicas_open_it_for_all(links: list[CoordinationLink]) -> None:
    clock = FakeClock()
    breakers, changes = replicas(links, clock)
    for i in range(4):
        await breakers[i % 3].record_failure()
    for b in breakers:
        await b.refresh()
        assert b.state == "closed" and b.consecutive_failures == 4
    await breakers[1].record_success()  # a success anywhere resets the count
    for i in range(5):
        await breakers[i % 3].record_failure()
    assert changes == [[], ["open"], []]  # the replica whose failure tripped it says so
    for b in breakers:
        await b.refresh()
        assert b.state == "open"
        assert b.snapshot()["next_probe_in_s"] == 30.0
        assert await b.acquire() is None


async def test_exactly_one_probe_across_replicas_and_its_verdict(
    links: list[CoordinationLink],
) -> None:
    clock = FakeClock()
    breakers, changes = replicas(links, clock)
    for _ in range(5):
        await breakers[0].record_failure()
    clock.t += 30.0  # the cooldown is over: half_open
    permits = await asyncio.gather(*(breakers[i % 3].acquire() for i in range(30)))
    assert permits.count("probe") == 1 and permits.count(None) == 29
    prober = permits.index("probe") % 3
    assert sum(c == ["open", "half_open"] or c == ["half_open"] for c in changes) == 1
    # The probe is cancelled: its slot is free again, for one caller.
    await breakers[prober].release()
    again = await asyncio.gather(*(b.acquire() for b in breakers))
    assert again.count("probe") == 1
    # Its failure re-opens the breaker with a fresh cooldown...
    await breakers[again.index("probe")].record_failure()
    await breakers[2].refresh()
    assert breakers[2].state == "open"
    clock.t += 30.0
    # ...and the next probe's success closes it for every replica.
    winner = [b for b in breakers if await b.acquire() == "probe"]
    assert len(winner) == 1
    await winner[0].record_success()
    for b in breakers:
        await b.refresh()
        assert b.state == "closed" and b.consecutive_failures == 0
        assert await b.acquire() == "call"


async def test_a_probe_claim_of_a_dead_replica_expires(links: list[CoordinationLink]) -> None:
    """The replica holding the probe dies (never releases it): the claim's PX runs out and
    another replica may probe. Redis's own clock, a 0.2 s claim."""
    breakers, _ = replicas(links, None, probe_ttl=0.2)
    b0 = SharedBreaker(links[0], "up", 1, 0.0, probe_ttl=0.2)
    await b0.record_failure()  # threshold 1, cooldown 0: half_open at once
    assert await breakers[0].acquire() == "probe"
    assert await breakers[1].acquire() is None
    for _ in range(200):  # the claim expires after 0.2 s (of Redis's clock)
        await asyncio.sleep(0.05)
        if await breakers[1].acquire() == "probe":
            break
    else:
        raise AssertionError("the dead replica's probe claim never expired")


async def script_calls(redis_url: str) -> int:
    """Scripts Redis has run so far (EVALSHA and EVAL)."""
    client = redis.from_url(redis_url)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


@pytest.mark.parametrize("sync", [0.0, 5.0])
async def test_round_trips_per_call_with_and_without_sync(
    links: list[CoordinationLink], redis_url: str, sync: float
) -> None:
    """sync 0: every acquire and success is a script (2 per call); sync 5: one read, then
    calls through a closed, clean breaker ask Redis nothing."""
    clock = FakeClock()
    warm = SharedBreaker(links[0], "warm", 5, 30.0, now=clock, monotonic=clock)
    await warm.acquire()  # the server learns the scripts (a NOSCRIPT and an EVAL)
    await warm.record_success()
    b = SharedBreaker(links[0], "rt", 5, 30.0, sync=sync, now=clock, monotonic=clock)
    before = await script_calls(redis_url)
    for _ in range(50):
        assert await b.acquire() == "call"
        await b.record_success()
    ran = await script_calls(redis_url) - before
    assert ran == (100 if sync == 0.0 else 1)


async def test_sync_is_bounded_staleness_and_never_bypasses_the_probe(
    links: list[CoordinationLink],
) -> None:
    clock = FakeClock()
    b0, b1, b2 = (
        SharedBreaker(ln, "s", 1, 30.0, sync=100.0, now=clock, monotonic=clock) for ln in links
    )
    assert await b0.acquire() == "call"  # read: closed, clean
    await b1.record_failure()  # threshold 1: open
    assert await b0.acquire() == "call"  # within sync (capped at 15 s): not asked again
    clock.t += 15.0
    assert await b0.acquire() is None  # asked: open
    clock.t += 15.0  # half_open: b0's closed read is long gone
    permits = [await b.acquire() for b in (b0, b1, b2, b0, b1, b2)]
    assert permits.count("probe") == 1 and permits.count(None) == 5
