"""Token counts as the dialects' usage parsers read them: sane non-negative integers or None."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..ledger import MAX_TOKEN_COUNT


def token_count(v: Any) -> int | None:
    """A non-negative token count, or None for anything else (bools, strings, NaN, -1...)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if 0 <= v <= MAX_TOKEN_COUNT else None
    if isinstance(v, float) and v.is_integer() and 0 <= v <= MAX_TOKEN_COUNT:
        return int(v)
    return None


def optional_token_count(u: Mapping[str, Any], key: str) -> int | None:
    """0 when absent/null, the count when valid, None (= garbage) otherwise."""
    v = u.get(key)
    return 0 if v is None else token_count(v)
