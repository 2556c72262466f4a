"""Retry policy pieces: which statuses to retry or fail over on, Retry-After parsing and
exponential backoff with full jitter. The retry loop itself lives elsewhere."""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Mapping
from datetime import timezone
from email.utils import parsedate_to_datetime

RETRYABLE_STATUSES: frozenset[int] = frozenset({408, 429, *range(500, 600)})
_AUTH_STATUSES = frozenset({401, 403})  # this upstream's key is bad; another may work

# HTTP says delta-seconds is an integer; we also take decimals and (clamped) negatives,
# but not what float() would also swallow ("nan", "inf", "1_0", "1e3", other scripts' digits).
_SECONDS = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")


def is_retryable_status(status: int) -> bool:
    """408, 429 and 5xx: the upstream may answer differently if asked again."""
    return status in RETRYABLE_STATUSES


def is_key_rejected(status: int) -> bool:
    """401/403: this upstream refuses the key. Not retried on it; the next upstream (with its
    own key) may accept the request."""
    return status in _AUTH_STATUSES


def fails_over(status: int) -> bool:
    """True: try again or on the next upstream. False (other 4xx): the request itself is
    wrong, so the answer goes back to the client at once."""
    return is_key_rejected(status) or is_retryable_status(status)


def parse_retry_after(value: str | None, now_wall: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After value (delta-seconds or HTTP date).

    Negative or past -> 0.0; missing or unparseable -> None. ``now_wall`` is the
    wall-clock (epoch) time an HTTP date is measured against; default time.time().
    """
    if value is None:
        return None
    text = value.strip()
    if _SECONDS.fullmatch(text):
        return max(float(text), 0.0)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000" parses as naive; HTTP dates are GMT anyway
        when = when.replace(tzinfo=timezone.utc)
    now = time.time() if now_wall is None else now_wall
    return max(when.timestamp() - now, 0.0)


def parse_retry_after_ms(value: str | None) -> float | None:
    """Seconds from a ``retry-after-ms`` value (milliseconds, OpenAI style)."""
    if value is None or not _SECONDS.fullmatch(text := value.strip()):
        return None
    return max(float(text) / 1000.0, 0.0)


def retry_after_from_headers(
    headers: Mapping[str, str], now_wall: float | None = None
) -> float | None:
    """The upstream's requested wait, preferring the more precise ``retry-after-ms``."""
    lowered = {key.lower(): val for key, val in headers.items()}
    from_ms = parse_retry_after_ms(lowered.get("retry-after-ms"))
    if from_ms is not None:
        return from_ms
    return parse_retry_after(lowered.get("retry-after"), now_wall)


class Backoff:
    """Delays between attempts on one upstream.

    Without Retry-After: full jitter, uniform in [0, min(max_delay, base * factor**attempt)].
    With Retry-After: honour it exactly, unless it exceeds ``retry_after_cap``; then
    ``delay`` returns None, meaning "don't wait that long here, fail over instead".
    """

    def __init__(
        self,
        base: float = 0.25,
        factor: float = 2.0,
        max_delay: float = 8.0,
        retry_after_cap: float = 30.0,
        rng: random.Random | None = None,
    ) -> None:
        if base < 0 or factor < 1 or max_delay < 0 or retry_after_cap < 0:
            raise ValueError("need base, max_delay, retry_after_cap >= 0 and factor >= 1")
        self.base = base
        self.factor = factor
        self.max_delay = max_delay
        self.retry_after_cap = retry_after_cap
        self._rng = rng if rng is not None else random.Random()

    def ceiling(self, attempt: int) -> float:
        """Upper bound of the jittered delay for retry number ``attempt`` (0-based)."""
        if attempt < 0:
            raise ValueError("attempt must be >= 0")
        try:
            raw = self.base * self.factor**attempt
        except OverflowError:  # huge attempt counts: the cap applies anyway
            raw = math.inf
        return min(raw, self.max_delay)

    def delay(self, attempt: int, retry_after: float | None = None) -> float | None:
        """Seconds to sleep before retry ``attempt`` (0 = first retry); None = fail over."""
        if retry_after is not None:
            if math.isnan(retry_after) or retry_after > self.retry_after_cap:
                return None
            return max(retry_after, 0.0)
        return self._rng.uniform(0.0, self.ceiling(attempt))
