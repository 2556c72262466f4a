from __future__ import annotations

import math
import random
from email.utils import formatdate

import pytest

from skillstate.upstream.retry import (
    RETRYABLE_STATUSES,
    Backoff,
    fails_over,
    is_retryable_status,
    parse_retry_after,
    parse_retry_after_ms,
    retry_after_from_headers,
)

NOW_WALL = 1_700_000_000.0


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504, 529, 599])
def test_retryable_statuses(status: int) -> None:
    assert status in RETRYABLE_STATUSES
    assert is_retryable_status(status)
    assert fails_over(status)


@pytest.mark.parametrize("status", [200, 400, 401, 403, 404, 409, 413, 422, 600])
def test_not_retryable(status: int) -> None:
    assert not is_retryable_status(status)


@pytest.mark.parametrize("status", [401, 403])
def test_auth_errors_fail_over(status: int) -> None:
    assert fails_over(status)


@pytest.mark.parametrize("status", [400, 404, 409, 413, 422])
def test_other_client_errors_go_straight_back(status: int) -> None:
    assert not fails_over(status)


@pytest.mark.parametrize(
    "value, expected",
    [
        ("0", 0.0),
        ("7", 7.0),
        (" 12 ", 12.0),
        ("1.5", 1.5),
        ("-3", 0.0),
    ],
)
def test_retry_after_seconds(value: str, expected: float) -> None:
    assert parse_retry_after(value, NOW_WALL) == expected


@pytest.mark.parametrize(
    "value",
    # and other scripts' digits, which float() reads
    [
        None,
        "",
        "soon",
        "nan",
        "inf",
        "1e3",
        "1_0",
        "0x10",
        "12 s",
        "Mon, 99 Foo",
        "\uff11",
        "\u0663",
    ],
)
def test_retry_after_garbage(value: str | None) -> None:
    assert parse_retry_after(value, NOW_WALL) is None


def test_retry_after_http_date() -> None:
    future = formatdate(NOW_WALL + 42, usegmt=True)
    assert parse_retry_after(future, NOW_WALL) == 42.0
    past = formatdate(NOW_WALL - 42, usegmt=True)
    assert parse_retry_after(past, NOW_WALL) == 0.0


def test_retry_after_http_date_with_minus_zero_zone_is_utc() -> None:
    value = formatdate(NOW_WALL + 10)  # non-GMT form ends in "-0000"
    assert value.endswith("-0000")
    assert parse_retry_after(value, NOW_WALL) == 10.0


def test_retry_after_http_date_defaults_to_wall_clock() -> None:
    far = formatdate(4_000_000_000, usegmt=True)  # year 2096
    waited = parse_retry_after(far)
    assert waited is not None and waited > 1e9


@pytest.mark.parametrize(
    "value, expected",
    [
        ("1500", 1.5),
        ("0", 0.0),
        ("250.5", 0.2505),
        ("-20", 0.0),
        ("x", None),
        (None, None),
        ("\uff11\uff15", None),  # full-width digits: float() would read 15
    ],
)
def test_retry_after_ms(value: str | None, expected: float | None) -> None:
    assert parse_retry_after_ms(value) == expected


def test_headers_prefer_ms_and_ignore_case() -> None:
    assert retry_after_from_headers({"Retry-After": "2", "Retry-After-Ms": "1500"}) == 1.5
    assert retry_after_from_headers({"retry-after": "2"}) == 2.0
    assert retry_after_from_headers({"retry-after": "2", "retry-after-ms": "junk"}) == 2.0
    assert retry_after_from_headers({}) is None
    date = formatdate(NOW_WALL + 5, usegmt=True)
    assert retry_after_from_headers({"RETRY-AFTER": date}, NOW_WALL) == 5.0


def test_backoff_ceiling_grows_and_caps() -> None:
    backoff = Backoff(base=0.25, factor=2.0, max_delay=8.0)
    assert [backoff.ceiling(n) for n in range(7)] == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert backoff.ceiling(10_000) == 8.0  # no OverflowError
    with pytest.raises(ValueError):
        backoff.ceiling(-1)


def test_backoff_full_jitter_is_seeded_and_within_bounds() -> None:
    first = Backoff(rng=random.Random(1234))
    second = Backoff(rng=random.Random(1234))
    delays = [first.delay(n) for n in range(8)]
    assert delays == [second.delay(n) for n in range(8)]
    reference = random.Random(1234)
    expected = [reference.uniform(0.0, min(8.0, 0.25 * 2.0**n)) for n in range(8)]
    assert delays == expected
    for n, d in enumerate(delays):
        assert d is not None and 0.0 <= d <= first.ceiling(n)


def test_backoff_jitter_spreads_over_the_whole_range() -> None:
    backoff = Backoff(base=1.0, factor=2.0, max_delay=4.0, rng=random.Random(7))
    samples = [backoff.delay(5) for _ in range(2000)]
    assert all(s is not None and 0.0 <= s <= 4.0 for s in samples)
    assert min(s for s in samples if s is not None) < 0.1
    assert max(s for s in samples if s is not None) > 3.9


def test_backoff_honours_retry_after_exactly() -> None:
    backoff = Backoff(retry_after_cap=30.0, rng=random.Random(0))
    assert backoff.delay(0, retry_after=12.5) == 12.5
    assert backoff.delay(3, retry_after=30.0) == 30.0  # the cap itself is still honoured
    assert backoff.delay(0, retry_after=0.0) == 0.0
    assert backoff.delay(0, retry_after=20.0) == 20.0  # above max_delay is fine


def test_backoff_retry_after_above_cap_means_fail_over() -> None:
    backoff = Backoff(retry_after_cap=30.0, rng=random.Random(0))
    assert backoff.delay(0, retry_after=30.001) is None
    assert backoff.delay(0, retry_after=math.inf) is None
    assert backoff.delay(0, retry_after=math.nan) is None


def test_backoff_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        Backoff(factor=0.5)
    with pytest.raises(ValueError):
        Backoff(base=-1.0)
