"""The wrong-key limiter (auth/failures.py) on its own: windows, the bound on addresses."""

from __future__ import annotations

from skillstate.auth.failures import WrongKeyLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_address_is_refused_after_the_limit_until_its_window_ends() -> None:
    clock = Clock()
    limiter = WrongKeyLimiter(3, 60.0, clock=clock)
    for _ in range(3):
        assert limiter.refused_for("10.0.0.1") is None
        limiter.failed("10.0.0.1")
    clock.now += 10
    assert limiter.refused_for("10.0.0.1") == 50.0  # the rest of the window
    assert limiter.refused_for("10.0.0.2") is None  # another address is unaffected
    clock.now += 50
    assert limiter.refused_for("10.0.0.1") is None  # a new window: a clean slate
    assert len(limiter) == 0


def test_failures_spread_over_windows_never_add_up() -> None:
    clock = Clock()
    limiter = WrongKeyLimiter(3, 60.0, clock=clock)
    for _ in range(10):
        limiter.failed("a")
        limiter.failed("a")
        clock.now += 61
        assert limiter.refused_for("a") is None


def test_memory_is_bounded_by_max_addresses_the_least_recent_forgotten() -> None:
    limiter = WrongKeyLimiter(1, 60.0, max_addresses=100, clock=Clock())
    for i in range(100_000):
        limiter.failed(f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}")
    assert len(limiter) == 100
    assert limiter.refused_for("10.1.134.159") is not None  # the last one (i = 99,999)
    assert limiter.refused_for("10.0.0.0") is None  # long forgotten


def test_a_zero_limit_is_off() -> None:
    limiter = WrongKeyLimiter(0, 60.0, clock=Clock())
    for _ in range(1000):
        limiter.failed("a")
    assert limiter.refused_for("a") is None and len(limiter) == 0
