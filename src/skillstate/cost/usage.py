"""Token usage of one upstream call, in the proxy's own convention.

Its own module so that pricing (which prices a ``Usage``) and the ledger (which prices rows
through pricing) both depend on it without depending on each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Far beyond any real count, and safe everywhere a count goes (SQLite INTEGER, JSON, floats).
MAX_TOKEN_COUNT = 2**53


@dataclass(frozen=True)
class Usage:
    """Token usage of one call. ``input_tokens`` INCLUDES cache reads and cache writes;
    ``cache_write_1h_tokens`` is the part of ``cache_write_tokens`` written for one hour
    (Anthropic's ``"ttl": "1h"``, billed above the five-minute writes). ``service_tier`` and
    ``speed``: how the reply says the call was served, where that is billed at other rates
    (OpenAI's ``service_tier``: ``flex`` about half the standard rates, ``priority`` about
    twice; Anthropic's ``usage.speed``: ``fast``, several times); None: the standard rates."""

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0
    service_tier: str | None = None
    speed: str | None = None

    @property
    def price_context(self) -> dict[str, str] | None:
        """genai-prices' price context of this call (its price variants' keys), or None."""
        if self.service_tier is None and self.speed is None:
            return None
        context = {"service_tier": self.service_tier, "speed": self.speed}
        return {k: v for k, v in context.items() if v is not None}

    @property
    def uncached_input_tokens(self) -> int:
        """Input tokens that were neither read from nor written to the prompt cache."""
        return self.input_tokens - self.cache_read_tokens - self.cache_write_tokens


# The tiers that price a call otherwise than the standard rates (genai-prices' price variants
# by ``service_tier``); any other value a reply names is priced at the standard rates.
PRICED_TIERS = frozenset({"flex", "priority", "fast"})


def service_tier(value: Any) -> str | None:
    """A reply's ``service_tier`` as ``Usage.service_tier``: one of ``PRICED_TIERS``, else
    None (``default``, ``auto``, ``scale``, absent, or no string)."""
    return value if isinstance(value, str) and value in PRICED_TIERS else None


def speed(value: Any) -> str | None:
    """Anthropic's ``speed`` (a reply's ``usage.speed``, a request's ``speed``) as
    ``Usage.speed``: ``fast``, else None (``standard``, absent)."""
    return "fast" if value == "fast" else None


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
