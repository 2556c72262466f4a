"""The worst-case cost of one upstream call: what a budget reserves before the call is sent
(``cost.budgets``).

* Input: the body the proxy is about to send, estimated by ``cost.tokens.estimate_tokens``
  (UTF-8 bytes / 4), times ``INPUT_MARGIN``, at the higher of the model's input and
  cache-write prices (a cache write is the dearest way to read a token); when the body
  marks a one-hour cache write (Anthropic's ``"ttl": "1h"``), at the highest of those and
  the one-hour write price (twice the input price, unless the model has its own).
* Output: the request's own limit (``max_tokens``, ``max_completion_tokens`` or
  ``max_output_tokens``; the largest, when it sets more than one), else the
  ``budget_max_tokens`` setting (the call then goes upstream with that limit:
  ``Outbound.limit_output``), at the output price; times chat completions' ``n``, the
  choices asked for (each written up to the limit, and all billed). The limit is the one
  sent: when an upstream that may serve the call is of kind ``openai-responses``, a limit
  of 1 to 15 is held at 16, what the translation sends that API (its least
  ``max_output_tokens``: ``dialects.responses.from_chat.at_least_the_apis_minimum``).
  A call that can go with no output limit at all (the Responses API's native
  ``/responses/compact``, which refuses one) is held at ``UNLIMITED_OUTPUT``, the most any
  model of that API writes, since nothing bounds it below that.

``INPUT_MARGIN`` covers the estimator's error: on the 2,366 requests of the 40 SWE-bench
agent runs in shared/data (``scripts/estimator-error``), the real input (o200k_base and
cl100k_base tokenizers) was at most 1.20 times the estimate. Text that tokenizes denser than
that (CJK, long runs of digits or symbols) can still cost more than it reserved.

Prices that rise with the call's input (long-context tiers: Claude Sonnet 4.5 past 200,000
input tokens, Gemini 2.5 Pro past 200,000) are taken at the tier of the margined input.

A request that asks for a service tier (OpenAI's ``service_tier``: ``priority``, ``flex``) or
Anthropic's fast mode (``speed: "fast"``) is reserved at those rates (priority about twice
the standard ones, fast mode several times); ``auto`` or none at the standard rates (a
project whose default tier is priority is not known to the proxy).

A model served by several upstreams (failover) is reserved at the highest of their rates:
each may carry its own ``prices`` override. A model with no price anywhere is ``None``
here; ``UNPRICED`` is what an ``allow_unpriced`` key's calls to it are counted at: the rates
of the most expensive model genai-prices knows (the highest output price, then input price,
at today's bundled prices; o1-pro, $150/$600 per million tokens, as of genai-prices 0.2.3).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from ..dialects.responses import RESPONSES
from ..dialects.responses.from_chat import at_least_the_apis_minimum
from .cachehints import marks_one_hour_cache
from .pricing import PriceBook, Prices
from .usage import service_tier, speed

if TYPE_CHECKING:
    from ..config import Settings

__all__ = [
    "INPUT_MARGIN",
    "MAX_TOKEN_FIELDS",
    "UNLIMITED_OUTPUT",
    "Rates",
    "WorstCase",
    "most_expensive_known",
]

INPUT_MARGIN = 1.25
MAX_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
# The most output tokens a call sent without a limit can be billed: the largest output
# maximum of the Responses API's models (the gpt-5 family's 128,000), so a call that takes
# no limit (``/responses/compact``) cannot pass what a budget held for it.
UNLIMITED_OUTPUT = 128_000


@dataclass(frozen=True, slots=True)
class Rates:
    """USD per million tokens a reservation charges, and where they come from."""

    input_per_mtok: float
    output_per_mtok: float
    source: str  # "priced", or "unpriced: counted at <model>"
    # The input rate of a body that marks one-hour cache writes; None: ``input_per_mtok``.
    one_hour_input_per_mtok: float | None = None


@functools.cache
def most_expensive_known(day: str) -> tuple[str, Prices]:
    """(provider/model, its prices) of the bundled model with the highest output price
    (ties: input price, then the first listed) on ``day`` (YYYY-MM-DD, UTC)."""
    from genai_prices.data import providers

    when = datetime.fromisoformat(day).replace(tzinfo=timezone.utc)
    best: tuple[Decimal, Decimal] | None = None
    found = ("", Prices(0.0, 0.0, 0.0, 0.0))
    for provider in providers:
        for model in provider.models:
            price = model.get_prices(when)
            out, inp = price.output_mtok, price.input_mtok
            if not isinstance(out, Decimal) or not isinstance(inp, Decimal):
                continue  # tiered or missing: not a flat price to count at
            if best is None or (out, inp) > best:
                best = (out, inp)
                write = price.cache_write_mtok
                cache_write = float(write) if isinstance(write, Decimal) else float(inp)
                prices = Prices(float(inp), float(out), float(inp), cache_write)
                found = (f"{provider.id}/{model.id}", prices)
    return found


def unpriced_rates() -> Rates:
    """What a call to a model without a price is counted at (``allow_unpriced``)."""
    name, prices = most_expensive_known(datetime.now(timezone.utc).strftime("%Y-%m-%d"))
    return Rates(
        max(prices.input_per_mtok, prices.cache_write_per_mtok),
        prices.output_per_mtok,
        f"unpriced: counted at {name}",
    )


def output_limit(body: Mapping[str, Any], default: int) -> int:
    """The most output tokens the call may produce: its own limit, else ``default``. A body
    with two limits is held at the larger: which one an upstream reads is its own choice
    (the translation to Messages and vLLM take ``max_completion_tokens`` first)."""
    limits = [
        value
        for name in MAX_TOKEN_FIELDS
        if isinstance(value := body.get(name), int) and not isinstance(value, bool) and value >= 0
    ]
    return max(limits) if limits else default


def choices(body: Mapping[str, Any]) -> int:
    """How many answers the call asks for (chat completions' ``n``): each may write up to
    the output limit, and the provider bills them all."""
    n = body.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1


class WorstCase:
    """Prices calls at their worst case (see the module docstring)."""

    def __init__(
        self, prices: PriceBook, default_max_tokens: int, kinds: Mapping[str, str] | None = None
    ) -> None:
        self.prices = prices
        self.default_max_tokens = default_max_tokens
        # Each upstream's kind, by name: the output limit a call is sent with depends on it.
        self._responses = {name for name, kind in (kinds or {}).items() if kind == RESPONSES.name}

    @classmethod
    def of(cls, prices: PriceBook, settings: Settings) -> WorstCase:
        """The worst cases of the calls to ``settings``' upstreams."""
        kinds = {u.name: u.kind for u in settings.upstreams}
        return cls(prices, settings.budget_max_tokens, kinds)

    def rates(
        self,
        model: str,
        upstreams: Iterable[tuple[str, str | None]],
        input_tokens: int,
        body: Mapping[str, Any] | None = None,
    ) -> Rates | None:
        """The highest rates among the upstreams that may serve ``model`` (name, URL), at
        the price tier of a call of ``input_tokens`` (estimated) times ``INPUT_MARGIN``, and
        served as the request ``body`` asks (its ``service_tier``: ``priority`` about twice
        the standard rates; its ``speed``: ``fast``); None when any of them has no price."""
        body = body or {}
        level, fast = service_tier(body.get("service_tier")), speed(body.get("speed"))
        found: Rates | None = None
        candidates: list[tuple[str | None, str | None]] = [*upstreams] or [(None, None)]
        tier = math.ceil(input_tokens * INPUT_MARGIN)
        for name, url in candidates:
            p = self.prices.rates(
                model=model or None,
                upstream=name,
                provider_hint=url,
                input_tokens=tier,
                service_tier=level,
                speed=fast,
            )
            if p is None:
                return None
            inp = max(p.input_per_mtok, p.cache_write_per_mtok)
            hour = max(inp, p.one_hour_write)
            if found is None:
                found = Rates(inp, p.output_per_mtok, "priced", hour)
            else:
                found = Rates(
                    max(found.input_per_mtok, inp),
                    max(found.output_per_mtok, p.output_per_mtok),
                    "priced",
                    max(found.one_hour_input_per_mtok or 0.0, hour),
                )
        return found

    def cost(
        self,
        rates: Rates,
        input_tokens: int,
        body: Mapping[str, Any],
        upstreams: Iterable[str | None] = (),
        *,
        unlimited: bool = False,
    ) -> float:
        """USD of a call sending ``input_tokens`` (estimated) with ``body``'s output limit,
        as the upstreams named ``upstreams`` (those that may serve it) are sent it, for each
        of its choices. ``unlimited``: the call goes with no output limit, whatever
        ``body`` says (``UNLIMITED_OUTPUT`` is held)."""
        sent = UNLIMITED_OUTPUT if unlimited else self.output_sent(body, upstreams)
        out = sent * choices(body)
        inp = rates.input_per_mtok
        if rates.one_hour_input_per_mtok is not None and marks_one_hour_cache(body):
            inp = rates.one_hour_input_per_mtok
        return (input_tokens * INPUT_MARGIN * inp + out * rates.output_per_mtok) / 1e6

    def output_sent(self, body: Mapping[str, Any], upstreams: Iterable[str | None]) -> int:
        """The largest output limit any of ``upstreams`` is sent for ``body``."""
        limit = output_limit(body, self.default_max_tokens)
        if any(name in self._responses for name in upstreams):
            return max(limit, at_least_the_apis_minimum(limit))
        return limit
