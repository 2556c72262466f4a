from __future__ import annotations

import math
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skillstate.upstream.limits import Admission, RollingWindow, Ticket, UpstreamLimits

T = TypeVar("T")


def done(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that must finish without ever suspending: the in-process limits'
    reserve is atomic on the event loop only because it never awaits."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise AssertionError("suspended: another task could run between check and record")


def admit(limits: UpstreamLimits, tokens: int) -> Ticket | None:
    return done(limits.reserve(tokens)).ticket


def reconcile(limits: UpstreamLimits, ticket: Ticket, actual: int) -> None:
    done(limits.settle(ticket, actual))


class FakeClock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


# --- RollingWindow ---------------------------------------------------------------


def test_window_totals_and_expires_at_exactly_t_plus_span() -> None:
    clock = FakeClock()
    window = RollingWindow(60.0, clock)
    window.record(5)
    clock.t = 10.0
    window.record(7)
    assert window.total() == 12
    clock.t = 59.999
    assert window.total() == 12
    clock.t = 60.0  # the entry from t=0 is gone at exactly t+span
    assert window.total() == 7
    clock.t = 70.0
    assert window.total() == 0


def test_wait_for_fits_now_and_never() -> None:
    window = RollingWindow(60.0, FakeClock())
    window.record(40)
    assert window.wait_for(60, 100) == 0.0
    assert window.wait_for(101, 100) == math.inf


def test_wait_for_walks_entries_until_enough_expires() -> None:
    clock = FakeClock()
    window = RollingWindow(60.0, clock)
    for at, amount in [(0.0, 30), (5.0, 20), (12.5, 40)]:
        clock.t = at
        window.record(amount)
    clock.t = 20.0
    # total 90, limit 100: 10 fits now, 11 needs the t=0 entry (30) to expire
    assert window.wait_for(10, 100) == 0.0
    assert window.wait_for(11, 100) == 40.0
    # 45 needs 35 freed: 30 (t=0) is not enough, 30+20 (t=5) is
    assert window.wait_for(45, 100) == 45.0
    # 100 needs everything gone: the last expires at 72.5
    assert window.wait_for(100, 100) == 52.5


def test_wait_for_is_never_one_float_step_short() -> None:
    # deadline - now rounds down here: now + (deadline - now) < deadline
    now, span = 0.29053447915412756, 6.825903023294777
    assert now + (span - now) < span
    clock = FakeClock()
    window = RollingWindow(span, clock)
    window.record(1)
    clock.t = now
    wait = window.wait_for(1, 1)
    assert wait > 0.0
    clock.t = now + wait
    assert window.wait_for(1, 1) == 0.0


def test_adjust_keeps_timestamp_and_changes_total() -> None:
    clock = FakeClock()
    window = RollingWindow(60.0, clock)
    entry = window.record(100)
    clock.t = 30.0
    window.adjust(entry, 10)
    assert entry.at == 0.0
    assert window.total() == 10
    clock.t = 60.0
    assert window.total() == 0


def test_adjust_after_expiry_does_not_touch_total() -> None:
    clock = FakeClock()
    window = RollingWindow(60.0, clock)
    old = window.record(100)
    clock.t = 61.0
    window.record(5)
    window.adjust(old, 500)
    assert window.total() == 5


def test_prune_is_lazy_but_correct_on_record() -> None:
    clock = FakeClock()
    window = RollingWindow(60.0, clock)
    for i in range(100):
        clock.t = float(i)
        window.record(1)
    assert window.total() == 60
    assert len(window._entries) == 60  # pruned on record, not only on total()


def test_negative_amounts_rejected() -> None:
    window = RollingWindow(60.0, FakeClock())
    with pytest.raises(ValueError):
        window.record(-1)
    entry = window.record(1)
    with pytest.raises(ValueError):
        window.adjust(entry, -1)


# --- UpstreamLimits ------------------------------------------------------------


def test_rpm_exact_at_window_boundary() -> None:
    clock = FakeClock()
    limits = UpstreamLimits(rpm=3, tpm=None, now=clock)
    for t in (0.0, 1.0, 2.0):
        clock.t = t
        assert admit(limits, 0) is not None
    clock.t = 30.0
    assert limits.check(0) == Admission(ok=False, retry_after=30.0, never_fits=False)
    assert admit(limits, 0) is None
    clock.t = 59.999
    assert not limits.check(0).ok
    clock.t = 60.0  # the t=0 request expires at exactly 60.0
    assert limits.check(0) == Admission(ok=True, retry_after=0.0, never_fits=False)
    assert admit(limits, 0) is not None
    # now t=1, t=2, t=60 are in the window; next slot frees at 61
    assert limits.check(0).retry_after == 1.0


def test_refused_admit_records_nothing() -> None:
    clock = FakeClock()
    limits = UpstreamLimits(rpm=1, tpm=1000, now=clock)
    assert admit(limits, 100) is not None
    assert admit(limits, 100) is None
    assert limits.snapshot() == {
        "rpm": {"limit": 1, "used": 1},
        "tpm": {"limit": 1000, "used": 100},
    }


def test_tpm_arithmetic_with_several_entries() -> None:
    clock = FakeClock()
    limits = UpstreamLimits(rpm=None, tpm=1000, now=clock)
    for at, tokens in [(0.0, 400), (10.0, 300), (20.0, 200)]:
        clock.t = at
        assert admit(limits, tokens) is not None
    clock.t = 25.0
    assert limits.check(100).ok  # 900 + 100 = 1000 fits exactly
    assert limits.check(101).retry_after == 35.0  # t=0 entry expires at 60
    assert limits.check(500).retry_after == 35.0  # freeing 400 leaves 500 + 500
    assert limits.check(501).retry_after == 45.0  # also needs the t=10 entry
    assert limits.check(1000).retry_after == 55.0  # needs all three gone


def test_retry_after_is_max_of_rpm_and_tpm() -> None:
    clock = FakeClock()
    limits = UpstreamLimits(rpm=2, tpm=1000, now=clock)
    assert admit(limits, 900) is not None
    clock.t = 20.0
    assert admit(limits, 10) is not None
    clock.t = 30.0
    # rpm frees at 60 (wait 30); 500 tokens also needs the t=0 entry gone (wait 30)
    assert limits.check(500).retry_after == 30.0
    # rpm full; tpm fits 50 now -> rpm dominates
    assert limits.check(50).retry_after == 30.0
    clock.t = 65.0
    # rpm: one request left (t=20), fits; tpm: 10 used, 995 needs t=20 gone at 80
    assert limits.check(995).retry_after == 15.0


def test_reconcile_changes_the_wait() -> None:
    clock = FakeClock()
    limits = UpstreamLimits(rpm=None, tpm=1000, now=clock)
    ticket = admit(limits, 800)
    assert ticket is not None
    clock.t = 10.0
    assert limits.check(500).retry_after == 50.0
    reconcile(limits, ticket, 300)  # real usage was lower than estimated
    assert limits.check(500).ok
    reconcile(limits, ticket, 900)  # ...or higher
    assert limits.check(200).retry_after == 50.0
    assert limits.snapshot()["tpm"] == {"limit": 1000, "used": 900}


def test_reconcile_after_expiry_is_harmless() -> None:
    clock = FakeClock()
    limits = UpstreamLimits(rpm=None, tpm=1000, now=clock)
    ticket = admit(limits, 800)
    assert ticket is not None
    clock.t = 120.0
    reconcile(limits, ticket, 5000)
    assert limits.snapshot()["tpm"] == {"limit": 1000, "used": 0}


@pytest.mark.parametrize("rpm, tpm", [(None, None), (0, 0)])
def test_disabled_counters_store_nothing(rpm: int | None, tpm: int | None) -> None:
    limits = UpstreamLimits(rpm=rpm, tpm=tpm, now=FakeClock())
    for _ in range(1000):
        ticket = admit(limits, 10**9)
        assert ticket is not None
        reconcile(limits, ticket, 10**9)
    assert limits._requests is None and limits._tokens is None
    assert limits.snapshot() == {"rpm": None, "tpm": None}
    assert limits.check(10**12) == Admission(ok=True, retry_after=0.0, never_fits=False)


def test_only_tpm_disabled_keeps_request_history_only() -> None:
    limits = UpstreamLimits(rpm=10, tpm=None, now=FakeClock())
    ticket = admit(limits, 500)
    assert ticket is not None and ticket.token_entry is None
    assert limits.snapshot() == {"rpm": {"limit": 10, "used": 1}, "tpm": None}


def test_never_fits() -> None:
    limits = UpstreamLimits(rpm=10, tpm=1000, now=FakeClock())
    assert limits.check(1000).ok
    verdict = limits.check(1001)
    assert verdict == Admission(ok=False, retry_after=math.inf, never_fits=True)
    assert admit(limits, 1001) is None
    assert limits.snapshot()["rpm"]["used"] == 0


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        UpstreamLimits(rpm=-1, tpm=None)
    with pytest.raises(ValueError):
        UpstreamLimits(rpm=None, tpm=10).check(-1)


# --- property: retry_after is exact ---------------------------------------------

_history = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=50.0, allow_nan=False),  # gap before it
        st.integers(min_value=0, max_value=500),  # estimated tokens
        st.one_of(st.none(), st.integers(min_value=0, max_value=500)),  # reconciled
    ),
    max_size=30,
)


@given(
    history=_history,
    rpm=st.one_of(st.none(), st.integers(min_value=1, max_value=8)),
    tpm=st.one_of(st.none(), st.integers(min_value=1, max_value=1500)),
    start=st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    gap=st.floats(min_value=0.0, max_value=70.0, allow_nan=False),
    tokens=st.integers(min_value=0, max_value=1500),
)
def test_waiting_retry_after_fits_and_a_bit_less_does_not(
    history: list[tuple[float, int, int | None]],
    rpm: int | None,
    tpm: int | None,
    start: float,
    gap: float,
    tokens: int,
) -> None:
    clock = FakeClock(start)
    limits = UpstreamLimits(rpm=rpm, tpm=tpm, now=clock)
    for step, estimate, actual in history:
        clock.t += step
        ticket = admit(limits, estimate)
        if ticket is not None and actual is not None:
            reconcile(limits, ticket, actual)
    clock.t += gap

    verdict = limits.check(tokens)
    if verdict.never_fits:
        assert tpm is not None and tokens > tpm
        assert not verdict.ok and verdict.retry_after == math.inf
        return
    assert verdict.ok == (verdict.retry_after == 0.0)
    assert 0.0 <= verdict.retry_after <= 60.0 + 1e-9  # float rounding of (t + 60) - now
    if verdict.ok:
        return

    asked_at = clock.t
    fits_at = asked_at + verdict.retry_after
    # "slightly before": a relative hair earlier, and at least one float step earlier
    clock.t = min(asked_at + verdict.retry_after * (1 - 1e-9), math.nextafter(fits_at, 0.0))
    assert not limits.check(tokens).ok
    clock.t = fits_at
    assert limits.check(tokens).ok
    assert admit(limits, tokens) is not None
