from __future__ import annotations

import pytest

from skillstate.upstream.breaker import CircuitBreaker


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


async def tripped(clock: FakeClock, threshold: int = 3, cooldown: float = 30.0) -> CircuitBreaker:
    breaker = CircuitBreaker(failure_threshold=threshold, open_cooldown=cooldown, now=clock)
    for _ in range(threshold):
        assert await breaker.acquire()
        await breaker.record_failure()
    assert breaker.state == "open"
    return breaker


async def test_starts_closed_and_lets_everything_through() -> None:
    breaker = CircuitBreaker(now=FakeClock())
    assert breaker.state == "closed"
    assert [await breaker.acquire() for _ in range(100)] == ["call"] * 100
    assert breaker.consecutive_failures == 0
    assert breaker.next_probe_at is None
    assert breaker.snapshot() == {
        "circuit": "closed",
        "consecutive_failures": 0,
        "next_probe_in_s": None,
    }


async def test_opens_after_threshold_consecutive_failures() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failure_threshold=3, open_cooldown=30.0, now=clock)
    await breaker.record_failure()
    await breaker.record_failure()
    assert breaker.state == "closed"
    assert breaker.consecutive_failures == 2
    await breaker.record_failure()
    assert breaker.state == "open"
    assert breaker.next_probe_at == 130.0
    assert not (await breaker.acquire())


async def test_success_resets_the_consecutive_count() -> None:
    breaker = CircuitBreaker(failure_threshold=3, now=FakeClock())
    await breaker.record_failure()
    await breaker.record_failure()
    await breaker.record_success()
    assert breaker.consecutive_failures == 0
    await breaker.record_failure()
    await breaker.record_failure()
    assert breaker.state == "closed"


async def test_open_becomes_half_open_exactly_when_cooldown_elapses() -> None:
    clock = FakeClock()
    breaker = await tripped(clock)
    clock.t = 129.999
    assert breaker.state == "open"
    assert not (await breaker.acquire())
    clock.t = 130.0
    assert breaker.state == "half_open"


async def test_half_open_allows_exactly_one_probe_among_many_callers() -> None:
    clock = FakeClock()
    breaker = await tripped(clock)
    clock.t = 200.0
    granted = [(await breaker.acquire()) for _ in range(50)]
    assert granted == ["probe"] + [None] * 49
    assert breaker.state == "half_open"


async def test_probe_success_closes_and_resets() -> None:
    clock = FakeClock()
    breaker = await tripped(clock)
    clock.t = 130.0
    assert await breaker.acquire()
    await breaker.record_success()
    assert breaker.state == "closed"
    assert breaker.consecutive_failures == 0
    assert breaker.next_probe_at is None
    assert all([await breaker.acquire() for _ in range(10)])
    # a fresh run of failures is needed to trip again
    await breaker.record_failure()
    await breaker.record_failure()
    assert breaker.state == "closed"


async def test_probe_failure_reopens_with_a_fresh_cooldown() -> None:
    clock = FakeClock()
    breaker = await tripped(clock)
    clock.t = 140.0
    assert await breaker.acquire()
    await breaker.record_failure()
    assert breaker.state == "open"
    assert breaker.consecutive_failures == 4
    assert breaker.next_probe_at == 170.0
    assert not (await breaker.acquire())
    clock.t = 170.0
    assert breaker.state == "half_open"
    assert await breaker.acquire()  # the slot was freed by the re-open
    assert not (await breaker.acquire())


async def test_release_frees_the_probe_slot_and_stays_half_open() -> None:
    clock = FakeClock()
    breaker = await tripped(clock)
    clock.t = 130.0
    assert await breaker.acquire()
    assert not (await breaker.acquire())
    await breaker.release()
    assert breaker.state == "half_open"
    assert breaker.consecutive_failures == 3
    assert await breaker.acquire()
    assert not (await breaker.acquire())


async def test_release_when_closed_is_a_no_op() -> None:
    breaker = CircuitBreaker(now=FakeClock())
    await breaker.release()
    assert breaker.state == "closed"
    assert await breaker.acquire()


async def test_late_failure_while_open_does_not_extend_cooldown() -> None:
    clock = FakeClock()
    breaker = await tripped(clock)
    clock.t = 120.0
    await breaker.record_failure()  # a call admitted before the trip, failing late
    assert breaker.next_probe_at == 130.0
    assert breaker.consecutive_failures == 4
    clock.t = 130.0
    assert breaker.state == "half_open"


async def test_late_success_while_open_closes() -> None:
    clock = FakeClock()
    breaker = await tripped(clock)
    clock.t = 110.0
    await breaker.record_success()
    assert breaker.state == "closed"
    assert await breaker.acquire()


async def test_threshold_one_and_zero_cooldown() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failure_threshold=1, open_cooldown=0.0, now=clock)
    await breaker.record_failure()
    assert breaker.state == "half_open"  # cooldown of 0 elapses immediately
    assert await breaker.acquire()
    assert not (await breaker.acquire())


async def test_snapshot_reports_time_to_next_probe() -> None:
    clock = FakeClock()
    breaker = await tripped(clock)
    clock.t = 112.5
    assert breaker.snapshot() == {
        "circuit": "open",
        "consecutive_failures": 3,
        "next_probe_in_s": 17.5,
    }
    snap = breaker.snapshot(wall_now=1_700_000_000.0)
    assert snap["next_probe_at"] == 1_700_000_017.5
    clock.t = 500.0
    assert breaker.snapshot(wall_now=1.0) == {
        "circuit": "half_open",
        "consecutive_failures": 3,
        "next_probe_in_s": 0.0,
        "next_probe_at": 1.0,
    }
    await breaker.record_success()
    assert breaker.snapshot(wall_now=1.0)["next_probe_at"] is None


async def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        CircuitBreaker(failure_threshold=0)
    with pytest.raises(ValueError):
        CircuitBreaker(open_cooldown=-1.0)


async def test_on_change_reports_each_state_entered_once() -> None:
    clock = FakeClock()
    b = CircuitBreaker(failure_threshold=2, open_cooldown=10, now=clock)
    seen: list[str] = []
    b.on_change = seen.append
    await b.record_failure()
    await b.record_success()  # closed stays closed: no change
    await b.record_failure()
    await b.record_failure()  # trips
    await b.record_failure()  # late failure while open: no change
    clock.t += 10
    assert await b.acquire()  # the probe: half_open
    await b.release()
    assert await b.acquire()  # the same half-open period: no second report
    await b.record_failure()  # the probe failed: open again
    clock.t += 10
    assert await b.acquire()
    await b.record_success()
    assert seen == ["open", "half_open", "open", "half_open", "closed"]
