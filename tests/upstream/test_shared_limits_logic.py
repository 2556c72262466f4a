"""The shared windows and breaker without a Redis server: what they do when the link says
LOCAL (coordination_down: local while Redis is down), and the conversion of Redis's
microsecond waits into Retry-After seconds. Against a real Redis: tests/scale/."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from skillstate.coordination.breakers import SharedBreaker
from skillstate.coordination.link import CoordinationLink
from skillstate.coordination.windows import US, SharedWindows, _seconds
from skillstate.upstream.limits import UpstreamLimits


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@given(st.integers(min_value=1, max_value=60 * US))
def test_a_wait_in_microseconds_is_never_shortened_in_seconds(wait_us: int) -> None:
    seconds = _seconds(wait_us)
    assert seconds * US >= wait_us  # waiting that long is enough...
    assert (seconds - 1e-6) * US < wait_us  # ...and it is no microsecond more


async def test_windows_on_the_local_answer_are_the_in_process_windows() -> None:
    clock = FakeClock()
    link = CoordinationLink(None)  # no Redis: every call answers LOCAL
    shared = SharedWindows(link, "upstream:a", 2, 100, local=UpstreamLimits(2, 100, clock))
    first = await shared.reserve(60)
    assert first.ok and first.ticket is not None
    clock.t += 10.0
    second = await shared.reserve(50)
    assert not second.ok and second.retry_after == 50.0  # 110 tokens > 100 until t=160
    await shared.settle(first.ticket, 40)  # a local ticket settles locally
    assert (await shared.reserve(50)).ok
    assert (await shared.reserve(0)).retry_after == 50.0  # rpm 2: the first one frees it
    assert shared.snapshot() == {
        "rpm": {"limit": 2, "used": 2},
        "tpm": {"limit": 100, "used": 90},
    }
    assert (await shared.reserve(101)).never_fits


async def test_breaker_on_the_local_answer_is_the_in_process_breaker() -> None:
    clock = FakeClock()
    link = CoordinationLink(None)
    breaker = SharedBreaker(link, "a", 2, 30.0, sync=100.0, monotonic=clock)
    changes: list[str] = []
    breaker.on_change = changes.append
    assert await breaker.acquire() == "call"
    await breaker.record_failure()
    await breaker.record_failure()
    assert breaker.state == "open" and await breaker.acquire() is None
    clock.t += 30.0
    assert [await breaker.acquire(), await breaker.acquire()] == ["probe", None]
    await breaker.release()  # the probe cancelled: the in-process slot is free again
    assert await breaker.acquire() == "probe"
    await breaker.record_success()
    assert breaker.state == "closed" and breaker.snapshot()["consecutive_failures"] == 0
    assert changes == ["open", "half_open", "closed"]  # metrics hear of them meanwhile
