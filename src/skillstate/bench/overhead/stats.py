"""Latency statistics: percentiles and the summary every path reports."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); q in [0, 100]."""
    if not sorted_values:
        return math.nan
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    k = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo))


def round3(x: float) -> float | None:
    return None if x is None or math.isnan(x) else round(x, 3)


def summarize(lat_ms: Sequence[float]) -> dict[str, Any]:
    s = sorted(lat_ms)
    n = len(s)
    return {
        "n": n,
        "p50_ms": round3(percentile(s, 50)),
        "p90_ms": round3(percentile(s, 90)),
        "p99_ms": round3(percentile(s, 99)),
        "mean_ms": round3(sum(s) / n) if n else None,
        "min_ms": round3(s[0]) if n else None,
        "max_ms": round3(s[-1]) if n else None,
    }


def round_diff(a: Any, b: Any) -> float | None:
    return None if a is None or b is None else round(a - b, 3)
