"""Pricing of one upstream call: user overrides first, then genai-prices' BUNDLED data.

Token semantics (ours and genai-prices' agree)
----------------------------------------------
``Usage.input_tokens`` (``skillstate.cost.usage.Usage``) is ALL input tokens, cache reads and
cache writes included. genai-prices (checked against its source, v0.2.x: ``data_units.py`` and
``decompose.compute_leaf_values``) defines ``input_tokens`` the same way: ``cache_read_tokens``
and ``cache_write_tokens`` are *descendant* units of ``input_tokens`` and are subtracted from it
before the plain input price is applied, i.e. for a model with all its prices::

    cost = (input - cache_read - cache_write) * input_price
         + cache_read * cache_read_price
         + (cache_write - cache_write_1h) * cache_write_price
         + cache_write_1h * cache_write_1h_price
         + output * output_price                    (prices per million tokens / 1e6)

so a cached token is never also billed as plain input. A model without a cache price bills
those tokens at the plain input price (they simply stay in the input leaf); our overrides do
the same (see ``PriceOverride``). ``cache_write_1h`` (Anthropic's one-hour writes, part of
``cache_write``; genai-prices' ``cache_write_1h_tokens`` under ``cache_write_tokens``) is
billed at the model's ``cache_write_1h_mtok``; a model or override without that price bills
them at twice the input price, Anthropic's published rate (five-minute writes are 1.25x, so
this is also 1.6x their price wherever the model has Anthropic's ratios).

Offline only
------------
genai-prices can fetch fresh prices from GitHub, but only through ``genai_prices.UpdatePrices``
(a background thread that then installs a "custom snapshot" read by ``genai_prices.calc_price``).
This module never imports or starts ``UpdatePrices`` and does not call ``calc_price``/
``get_snapshot`` at all: it builds its own ``DataSnapshot`` from the bundled
``genai_prices.data.providers`` with ``from_auto_update=False``, so even if some other code in
the process started the updater, our prices stay the bundled, reproducible ones. There is no
environment variable or flag that makes genai-prices fetch on its own.

Lookup order for ``PriceBook.price``
------------------------------------
1. ``usage is None`` -> ``Priced("usage-unavailable", None)``; inconsistent usage (negative
   counts, cache tokens exceeding input) is treated the same way.
2. Overrides, most specific first: the model override (exact, case-insensitive name; then
   glob patterns such as ``"qwen*"`` in insertion order), then the upstream override (by
   upstream name). ``local_zero=True`` means every price is 0. Fields are layered
   field-by-field: model override > upstream override > genai-prices' rates for the model.
   If any override applies the status is ``"override"``; the cost is then computed with the
   flat formula above. Unset cache prices default to the input price (the one-hour write
   price to twice the input price). If input or output
   price is still unknown the result is ``"unknown"`` / ``None``.
3. Otherwise genai-prices (bundled): provider ``provider_hint`` (a provider id such as
   ``"anthropic"``, or an ``http(s)://`` API URL) if given, falling back to matching on the
   model name alone. Found -> ``"known"`` with genai-prices' own calculation (which also
   handles tiered and date-conditional prices and per-request fees). Not found ->
   ``"unknown"`` and cost ``None``; never 0.

Model -> (provider, model info) resolution, hits and misses alike, is cached per
``(model, provider_hint)`` in an ``lru_cache`` (``_lookup_one``); the per-call price arithmetic
is genai-prices' own (~0.3 ms). The bundled data is imported lazily on first use (~0.4 s).

A provider *id* hint must be a genai-prices provider id (``"openai"``, ``"anthropic"``,
``"groq"``...). A wire dialect is not a provider: an OpenAI-compatible upstream is better
described by its URL, which genai-prices matches against each provider's API pattern
(``https://api.groq.com/openai/v1`` -> groq; a localhost URL matches nothing and falls back to
the model name).

Note that genai-prices matches model names of hosted offerings: a local server that reports
a hosted model's name is priced like the hosted model unless you add ``local_zero``.
"""

from __future__ import annotations

import bisect
import fnmatch
import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from skillstate.cost.usage import Usage

__all__ = [
    "PriceBook",
    "PriceOverride",
    "PriceStatus",
    "Priced",
    "Prices",
    "cost_from_prices",
]

PriceStatus = Literal["known", "unknown", "override", "usage-unavailable"]

_MTOK = 1_000_000.0
_FIELDS = (
    "input_per_mtok",
    "output_per_mtok",
    "cache_read_per_mtok",
    "cache_write_per_mtok",
    "cache_write_1h_per_mtok",
)
# genai-prices' price keys for the same rates.
_GENAI_KEYS = {
    "input_per_mtok": "input_mtok",
    "output_per_mtok": "output_mtok",
    "cache_read_per_mtok": "cache_read_mtok",
    "cache_write_per_mtok": "cache_write_mtok",
    "cache_write_1h_per_mtok": "cache_write_1h_mtok",
}
# Anthropic bills a one-hour cache write at twice the base input price (a five-minute one at
# 1.25x): the one-hour write price of a model or override that declares none.
ONE_HOUR_WRITE_INPUT_RATIO = 2.0


@dataclass(frozen=True)
class Prices:
    """USD per million tokens. ``cache_*`` prices apply to the cache part of the input;
    ``cache_write_1h_per_mtok`` to the one-hour writes among the cache writes (None: not
    known, ``ONE_HOUR_WRITE_INPUT_RATIO`` times the input price; see ``one_hour_write``)."""

    input_per_mtok: float
    output_per_mtok: float
    cache_read_per_mtok: float
    cache_write_per_mtok: float
    cache_write_1h_per_mtok: float | None = None

    @property
    def one_hour_write(self) -> float:
        """The price of a one-hour cache write, per million tokens."""
        if self.cache_write_1h_per_mtok is not None:
            return self.cache_write_1h_per_mtok
        return self.input_per_mtok * ONE_HOUR_WRITE_INPUT_RATIO


class PriceOverride(BaseModel):
    """User-declared prices; ``None`` = not declared here (fall through to the next layer).

    ``local_zero=True`` declares the calls free (e.g. a local llama-server): every price 0.
    The one definition: the config's ``prices`` and ``upstreams[].prices`` are validated as
    this model, so pricing needs no bridge from a config type.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)  # "3" is no price
    input_per_mtok: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    output_per_mtok: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    cache_read_per_mtok: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    cache_write_per_mtok: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    cache_write_1h_per_mtok: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    local_zero: bool = False

    @classmethod
    def coerce(cls, obj: Any) -> PriceOverride:
        """Build from a ``PriceOverride``, a mapping, or any object with the same attributes;
        a price that is not a finite number >= 0 is a ``ValueError`` naming the field."""
        if isinstance(obj, PriceOverride):
            return obj
        if isinstance(obj, Mapping):
            return cls.model_validate(dict(obj))
        return cls.model_validate(obj, from_attributes=True)

    def layer(self) -> dict[str, float]:
        """The fields this override declares (all of them, as 0.0, for ``local_zero``)."""
        if self.local_zero:
            return dict.fromkeys(_FIELDS, 0.0)
        return {k: float(v) for k in _FIELDS if (v := getattr(self, k)) is not None}


@dataclass(frozen=True)
class Priced:
    """Result of pricing one call.

    ``prices`` are the effective flat rates used (for genai-prices: the rates that applied to
    this call, tier included), used to price the savings baseline; ``None`` when unknown.
    ``source`` says where they came from, e.g. ``"genai-prices:anthropic/claude-sonnet-4-0"``,
    ``"override:model=qwen*"``.
    """

    status: PriceStatus
    cost_usd: float | None
    prices: Prices | None = None
    source: str | None = None


def cost_from_prices(usage: Usage, prices: Prices) -> float:
    """The flat, cache-aware formula of the module docstring, in USD."""
    plain = usage.input_tokens - usage.cache_read_tokens - usage.cache_write_tokens
    five_minute_writes = usage.cache_write_tokens - usage.cache_write_1h_tokens
    return (
        plain * prices.input_per_mtok
        + usage.cache_read_tokens * prices.cache_read_per_mtok
        + five_minute_writes * prices.cache_write_per_mtok
        + usage.cache_write_1h_tokens * prices.one_hour_write
        + usage.output_tokens * prices.output_per_mtok
    ) / _MTOK


def _usage_ok(usage: Usage) -> bool:
    counts = (
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_tokens,
        usage.cache_write_tokens,
        usage.cache_write_1h_tokens,
    )
    for v in counts:
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            return False
    if usage.cache_write_1h_tokens > usage.cache_write_tokens:
        return False
    return usage.cache_read_tokens + usage.cache_write_tokens <= usage.input_tokens


# The answers that carry nothing of the call (Priced is frozen: one instance each serves all).
_UNAVAILABLE = Priced("usage-unavailable", None)
_UNKNOWN = Priced("unknown", None)


# --- genai-prices, bundled data only -------------------------------------------------------


@functools.cache
def _snapshot() -> Any:
    # Imported lazily: the bundled data module takes ~0.4 s to import.
    from genai_prices.data import providers
    from genai_prices.data_snapshot import DataSnapshot

    return DataSnapshot(providers=providers, from_auto_update=False)


@functools.lru_cache(maxsize=2048)
def _lookup_one(model: str, hint: str | None) -> tuple[Any, Any] | None:
    provider_id = provider_api_url = None
    if hint is not None:
        if hint.startswith(("http://", "https://")):
            provider_api_url = hint
        else:
            provider_id = hint
    try:
        provider, info = _snapshot().find_provider_model(model, None, provider_id, provider_api_url)
    except LookupError:
        return None
    return provider, info


def _lookup(model: str, hint: str | None) -> tuple[Any, Any] | None:
    """(genai Provider, ModelInfo) for a model, trying the provider hint first; cached."""
    found = _lookup_one(model, hint) if hint else None
    return found if found is not None else _lookup_one(model, None)


@dataclass(frozen=True)
class _HourPrices:
    """A model's genai-prices rates for one hour, as the hot path reads them: its
    ModelPrice, whether it has a per-request fee (then genai-prices' own calc_price
    prices the call), and the flat Prices of each span of input sizes between its rates'
    tier starts (``bounds``, sorted; one span and no bound when no rate is tiered)."""

    model_price: Any
    per_request: bool
    bounds: tuple[int, ...]
    spans: tuple[Prices | None, ...]

    def flat(self, total_input: int) -> Prices | None:
        """The flat rates of a call of ``total_input`` input tokens: those of the span it
        falls in (a tier applies above its start, as in ``_resolve``)."""
        return self.spans[bisect.bisect_left(self.bounds, total_input) if self.bounds else 0]


def _hour_prices(model_price: Any) -> _HourPrices:
    bounds = sorted(
        {
            int(tier.start)
            for theirs in _GENAI_KEYS.values()
            for tier in getattr(getattr(model_price, theirs, None), "tiers", None) or ()
        }
    )
    # A span's rates at one input size inside it: 0 for the first (at or below every start),
    # one past the start that opens each later one.
    sizes = [0, *(start + 1 for start in bounds)]
    spans = tuple(_complete(_genai_rates(model_price, n)) for n in sizes)
    per_request = getattr(model_price, "requests_kcount", None) is not None
    return _HourPrices(model_price, per_request, tuple(bounds), spans)


_PRICES_AT: dict[tuple[int, int, str | None, str | None], _HourPrices] = {}


def _prices_at(info: Any, when: datetime | None, usage: Usage) -> _HourPrices:
    """info.get_prices(hour, the call's price context: ``Usage.price_context``) as
    ``_HourPrices``, memoised per hour and context (``when``: now when None). ModelInfo is
    not hashable; `_lookup` keeps each one alive, so its id is stable."""
    hour = int((time.time() if when is None else when.timestamp()) // 3600)
    key = (id(info), hour, usage.service_tier, usage.speed)
    found = _PRICES_AT.get(key)
    if found is None:
        if len(_PRICES_AT) > 4096:
            _PRICES_AT.clear()
        start = datetime.fromtimestamp(hour * 3600, timezone.utc)
        found = _hour_prices(info.get_prices(start, usage.price_context))
        _PRICES_AT[key] = found
    return found


def _resolve(price: Any, total_input: int) -> float | None:
    """A genai-prices price (Decimal, TieredPrices or None) -> flat rate for this call."""
    if price is None:
        return None
    if isinstance(price, Decimal):
        return float(price)
    base = getattr(price, "base", None)
    tiers = getattr(price, "tiers", None)
    if base is None or tiers is None:
        return None
    rate = base
    for tier in reversed(tiers):  # same rule as genai_prices.types.calc_unit_price
        if total_input > tier.start:
            rate = tier.price
            break
    return float(rate)


def _genai_rates(model_price: Any, total_input: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for ours, theirs in _GENAI_KEYS.items():
        rate = _resolve(getattr(model_price, theirs, None), total_input)
        if rate is not None:
            out[ours] = rate
    return out


def _complete(layers: dict[str, float]) -> Prices | None:
    if "input_per_mtok" not in layers or "output_per_mtok" not in layers:
        return None
    inp = layers["input_per_mtok"]
    return Prices(
        input_per_mtok=inp,
        output_per_mtok=layers["output_per_mtok"],
        cache_read_per_mtok=layers.get("cache_read_per_mtok", inp),
        cache_write_per_mtok=layers.get("cache_write_per_mtok", inp),
        cache_write_1h_per_mtok=layers.get("cache_write_1h_per_mtok"),
    )


def _is_glob(key: str) -> bool:
    return any(c in key for c in "*?[")


@dataclass
class PriceBook:
    """Prices calls; see the module docstring for the lookup order."""

    overrides_by_upstream: dict[str, PriceOverride] = field(default_factory=dict)
    overrides_by_model: dict[str, PriceOverride] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.overrides_by_upstream = {
            k: PriceOverride.coerce(v) for k, v in self.overrides_by_upstream.items()
        }
        self.overrides_by_model = {
            k: PriceOverride.coerce(v) for k, v in self.overrides_by_model.items()
        }
        self._model_exact = {
            k.lower(): (k, v) for k, v in self.overrides_by_model.items() if not _is_glob(k)
        }
        self._model_globs = [
            (k.lower(), k, v) for k, v in self.overrides_by_model.items() if _is_glob(k)
        ]

    @classmethod
    def from_config(cls, model_prices: Mapping[str, Any] | None, upstreams: Any = ()) -> PriceBook:
        """From ``Settings.prices`` and ``Settings.upstreams`` (objects with ``name`` and
        ``prices`` attributes); accepts any objects ``PriceOverride.coerce`` accepts."""
        by_upstream = {
            u.name: PriceOverride.coerce(u.prices)
            for u in upstreams
            if getattr(u, "prices", None) is not None
        }
        by_model = {k: PriceOverride.coerce(v) for k, v in (model_prices or {}).items()}
        return cls(overrides_by_upstream=by_upstream, overrides_by_model=by_model)

    def _model_override(self, model: str | None) -> tuple[str, PriceOverride] | None:
        if not model:
            return None
        low = model.lower()
        if low in self._model_exact:
            return self._model_exact[low]
        for pattern, key, ov in self._model_globs:
            if fnmatch.fnmatchcase(low, pattern):
                return key, ov
        return None

    def rates(
        self,
        *,
        model: str | None,
        upstream: str | None,
        provider_hint: str | None = None,
        at: datetime | None = None,
        input_tokens: int = 0,
        service_tier: str | None = None,
        speed: str | None = None,
    ) -> Prices | None:
        """The flat rates (input, output, cache read, cache write) that :meth:`price` would
        use for a call of ``input_tokens`` (the price tier; default a small call) served at
        ``service_tier`` and ``speed`` (``Usage``'s; default: standard), without a call to
        price: for estimating what a call WOULD cost (the cache-aware baseline, the
        cost-aware ``auto``, a budget's worst case). None when unknown."""
        probe = Usage(input_tokens, 0, service_tier=service_tier, speed=speed)
        return self.price(
            probe, model=model, upstream=upstream, provider_hint=provider_hint, at=at
        ).prices

    def context_window(self, model: str | None, provider_hint: str | None = None) -> int | None:
        """The model's context limit in tokens, as genai-prices' bundled data has it (the
        same lookup as its prices); None for a model it does not know or lists without one
        (local models, most often)."""
        found = _lookup(model, provider_hint) if model else None
        window = getattr(found[1], "context_window", None) if found is not None else None
        return window if isinstance(window, int) and window > 0 else None

    def price(
        self,
        usage: Usage | None,
        *,
        model: str | None,
        upstream: str | None,
        provider_hint: str | None = None,
        at: datetime | None = None,
    ) -> Priced:
        """Price one call. ``at`` (default now) selects date-conditional genai-prices rates."""
        if usage is None or not _usage_ok(usage):
            return _UNAVAILABLE

        layers: dict[str, float] = {}
        sources: list[str] = []
        if (mo := self._model_override(model)) is not None:
            layers = mo[1].layer()
            sources.append(f"model={mo[0]}")
        if upstream is not None and (uo := self.overrides_by_upstream.get(upstream)) is not None:
            layers = {**uo.layer(), **layers}
            sources.append(f"upstream={upstream}")

        if sources:
            when = at or datetime.now(tz=timezone.utc)
            if model and len(layers) < len(_FIELDS):  # fill the gaps from genai-prices
                found = _lookup(model, provider_hint)
                if found is not None:
                    model_price = found[1].get_prices(when, usage.price_context)
                    layers = {**_genai_rates(model_price, usage.input_tokens), **layers}
            prices = _complete(layers)
            source = "override:" + ",".join(sources)
            if prices is None:
                return Priced("unknown", None, None, source)
            return Priced("override", cost_from_prices(usage, prices), prices, source)

        found = _lookup(model, provider_hint) if model else None
        if found is None:
            return _UNKNOWN
        provider, info = found
        # Hot path: per-call genai calc_price costs ~0.3 ms; token prices only change with
        # the date, so the hour's rates are cached, each tier's, and the flat formula applied.
        hour = _prices_at(info, at, usage)
        prices = hour.flat(usage.input_tokens)
        if prices is not None and not hour.per_request:
            source = f"genai-prices:{provider.id}/{info.id}"
            return Priced("known", cost_from_prices(usage, prices), prices, source)
        when = at or datetime.now(tz=timezone.utc)
        from genai_prices import Usage as GenaiUsage

        g_usage = GenaiUsage(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cache_read_tokens,
            cache_write_tokens=usage.cache_write_tokens,
            cache_write_1h_tokens=usage.cache_write_1h_tokens,
        )
        try:
            calc = info.calc_price(
                g_usage,
                provider,
                genai_request_timestamp=when,
                price_context=usage.price_context,
            )
        except (ValueError, ArithmeticError):
            return Priced("unknown", None, None, f"genai-prices:{provider.id}/{info.id}")
        prices = _complete(_genai_rates(calc.model_price, usage.input_tokens))
        return Priced(
            "known", float(calc.total_price), prices, f"genai-prices:{provider.id}/{info.id}"
        )
