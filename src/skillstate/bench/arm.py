"""One benchmark arm: its configuration, its client and the record of each call.

``Arm.call`` sends one chat-completions request (through the client ``BenchConfig.client``
names, or as an Anthropic Messages request under the ``anthropic`` cache regime, see
:mod:`skillstate.bench.wire`) and turns the reply into a ``CallRecord``: tokens as
reported to the client, latency, HTTP requests, the proxy's ``x-skillstate-*`` headers and,
offline, what the simulated model saw. A call whose response has no usage FAILS (we refuse a
silent 0).

Billing (:func:`regime_prices`): offline, a call is priced as ``--price-as MODEL`` (its input
and output rates from the price book) under the cache regime's multipliers of the input rate
(``REGIME_FACTORS``: cache reads 1.0/0.5/0.1, cache writes 1.0/1.0/1.25 for
none/openai/anthropic; ``openai@0.1``: the cache read at another fraction of the input
rate), so every regime prices one model the same way but for its cache.
``own_read=True`` (``skillstate replay``'s default regime and a log's own bill): the cache
read at the model's own price where the price book has one (gpt-5: 0.1x input, not the
regime's 0.5x), and the one-hour cache write at the model's own one-hour price.
Live, the model's own rates (cache prices included) apply.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from skillstate.bench.wire import (
    AnthropicChatClient,
    ChatCallError,
    ChatClient,
    ChatReply,
    PlainChatClient,
    SdkChatClient,
)

if TYPE_CHECKING:
    from skillstate.bench.simmodel import SimModel
    from skillstate.bench.workloads import ConversationWorkload, ToolsWorkload
    from skillstate.cost.pricing import Prices

Progress = Callable[[str, int, int], None]  # (arm, calls done, calls expected)

# baseline: the full transcript, no proxy; the others go through a proxy in that mode
# (``state``: the bench's --mode, state by default).
ARMS = ("baseline", "mask", "state", "window", "auto")
DEFAULT_ARMS = ("baseline", "state")
CLIENTS = ("openai", "plain")  # the openai SDK (the benches) | http.client (the demo)
CACHE_REGIMES = ("none", "openai", "anthropic")
# regime -> (cache read, cache write) as multiples of the input rate
REGIME_FACTORS: dict[str, tuple[float, float]] = {
    "none": (1.0, 1.0),
    "openai": (0.5, 1.0),
    "anthropic": (0.1, 1.25),
}


class BenchError(Exception):
    """A usage or setup problem, reported as one line."""


def split_regime(label: str) -> tuple[str, float | None]:
    """A cache regime label: one of ``CACHE_REGIMES``, optionally with its cache read priced
    at another fraction of the input rate (``openai@0.1``): (regime, read fraction or None)."""
    base, at, read = label.partition("@")
    factor: float | None = None
    if at:
        try:
            factor = float(read)
        except ValueError:
            factor = -1.0
        if not 0.0 <= factor <= 1.0:
            raise BenchError(f"cache regime {label!r}: the read price after @ is 0..1")
    if base not in CACHE_REGIMES:
        raise BenchError(
            f"cache regime {label!r}: one of {', '.join(CACHE_REGIMES)} (optionally @READ, "
            "e.g. openai@0.1)"
        )
    return base, factor


@dataclass
class BenchConfig:
    workload: str = "conversation"  # conversation | tools
    turns: int = 50  # conversation turns
    steps: int = 20  # tools: expected model calls
    seed: int = 7
    distractor_bytes: int = 1500
    mode: str = "state"  # the proxy mode of the state arm: state | auto
    constrain: str = "off"  # the proxy's `constrain` setting for the state arm: off | json_schema
    upstream: str | None = None  # None = offline (simulated model)
    model: str | None = None
    api_key: str | None = None
    stream: bool = False
    max_tokens: int = 512
    temperature: float = 0.0
    price_as: str | None = None  # price the token counts as this model (offline: hypothetical)
    inject_failure: tuple[str, int] | None = None  # (arm, turn): that call fails (offline)
    timeout: float = 120.0
    client: str = "openai"  # one of CLIENTS
    cache_regime: str = "openai"  # the simulated provider's prompt cache (one of CACHE_REGIMES)
    arms: tuple[str, ...] = DEFAULT_ARMS
    cache_read: float | None = None  # the cache read's fraction of the input rate (@READ)
    auto_compact: bool = False  # the proxies' auto_compact setting (auto may go compact)
    config: str | None = None  # the proxies' config file (--config), read before the bench's

    @property
    def regime_label(self) -> str:
        """The regime as ``--cache-regime`` spells it (``openai@0.1``)."""
        if self.cache_read is None:
            return self.cache_regime
        return f"{self.cache_regime}@{self.cache_read:g}"

    @property
    def offline(self) -> bool:
        return self.upstream is None


@dataclass
class CallRecord:
    turn: int
    status: str = "ok"  # ok | error
    error: str | None = None
    prompt_tokens: int | None = None  # as reported to the client
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # cache reads, included in prompt_tokens
    cache_write_tokens: int | None = None  # cache writes, included in prompt_tokens
    latency_ms: float = 0.0
    retries: int | None = None  # proxy re-asks (x-skillstate-retries), None when not reported
    http_requests: int = 0  # requests the client sent (the openai client's own retries included)
    upstream_requests: int | None = None  # offline: requests the simulated model answered
    upstream_prompt_tokens: int | None = None  # offline: prompt tokens of all those requests
    injected_tokens: int | None = None  # offline: tokens of the proxy's contract/state text
    context: str | None = None  # the proxy's x-skillstate-context (compact | full)
    transition: str | None = None  # the proxy's x-skillstate-transition (valid | invalid | ...)
    validation: str | None = None  # the proxy's x-skillstate-validation (why it was invalid)
    model: str | None = None  # the model the response names
    cost_usd: float | None = None


@dataclass
class ArmResult:
    name: str
    calls: list[CallRecord] = field(default_factory=list)
    quality: dict[str, Any] = field(default_factory=dict)
    final_state: Any = None
    ledger: Any = None  # the proxy's /cost summary for the session (state arm)
    session: str | None = None
    seconds: float = 0.0


@dataclass
class BenchRun:
    config: BenchConfig
    workload: ConversationWorkload | ToolsWorkload
    model: str
    arms: dict[str, ArmResult]


# -- pricing ---------------------------------------------------------------------------------


def regime_prices(
    model: str | None, regime: str, read: float | None = None, *, own_read: bool = False
) -> Prices | None:
    """``model``'s input and output rates with the regime's cache multipliers (see the module
    docstring; ``read``: the cache read's own fraction of the input rate; ``own_read``: the
    model's own cache-read and one-hour write prices where the price book has them); None
    when the model or its rates are unknown."""
    from skillstate.cost.pricing import Prices

    if model is None:
        return None
    rates = _price_book().rates(model=model, upstream=None)
    if rates is None:
        return None
    factor, write = REGIME_FACTORS[regime]
    base = rates.input_per_mtok
    one_hour = None
    if own_read and read is None:
        # The book fills a missing cache-read price with the input price: only a lower one
        # is the model's own (a model without one keeps the regime's factor).
        if base > 0 and rates.cache_read_per_mtok < base:
            factor = rates.cache_read_per_mtok / base
        one_hour = rates.cache_write_1h_per_mtok
    read = factor if read is None else read
    return Prices(base, rates.output_per_mtok, base * read, base * write, one_hour)


def bench_prices(cfg: BenchConfig) -> Prices | None:
    """The rates a run's calls are billed at: offline, ``--price-as`` under the regime."""
    if cfg.offline:
        return regime_prices(cfg.price_as, cfg.cache_regime, cfg.cache_read)
    return None


def call_usage(rec: CallRecord) -> Any:
    """The call's ``Usage`` (None without a reported prompt count)."""
    from skillstate.cost.usage import Usage

    if rec.prompt_tokens is None or rec.completion_tokens is None:
        return None
    read = min(rec.cached_tokens or 0, rec.prompt_tokens)
    write = min(rec.cache_write_tokens or 0, rec.prompt_tokens - read)
    return Usage(rec.prompt_tokens, rec.completion_tokens, read, write)


def _price(cfg: BenchConfig, rec: CallRecord) -> float | None:
    from skillstate.cost.pricing import cost_from_prices

    usage = call_usage(rec)
    if usage is None:
        return None
    if cfg.offline:
        prices = bench_prices(cfg)
        return None if prices is None else cost_from_prices(usage, prices)
    model = cfg.price_as or cfg.model
    priced = _price_book().price(usage, model=model, upstream=None, provider_hint=cfg.upstream)
    return priced.cost_usd


_BOOK: Any = None


def _price_book() -> Any:
    global _BOOK
    if _BOOK is None:
        from skillstate.cost.pricing import PriceBook

        _BOOK = PriceBook()
    return _BOOK


# -- one call --------------------------------------------------------------------------------


def _header_int(headers: Any, name: str) -> int | None:
    value = headers.get(name) if headers is not None else None
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def open_client(
    cfg: BenchConfig, base_url: str, api_key: str, headers: dict[str, str]
) -> ChatClient:
    if cfg.cache_regime == "anthropic":
        return AnthropicChatClient(base_url, api_key, headers, cfg.timeout)
    if cfg.client == "plain":
        return PlainChatClient(base_url, api_key, headers, cfg.timeout)
    if cfg.client != "openai":
        raise BenchError(f"unknown client {cfg.client!r} (one of {', '.join(CLIENTS)})")
    return SdkChatClient(base_url, api_key, headers, cfg.timeout)


class Arm:
    """One arm's client plus the bookkeeping around each call."""

    def __init__(
        self,
        name: str,
        cfg: BenchConfig,
        base_url: str,
        api_key: str,
        model: str,
        headers: dict[str, str],
        sim: SimModel | None,
    ) -> None:
        self.name = name
        self.cfg = cfg
        self.model = model
        self.sim = sim
        self.client = open_client(cfg, base_url, api_key, headers)

    def close(self) -> None:
        self.client.close()

    def call(
        self, turn: int, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[dict[str, Any] | None, CallRecord]:
        cfg = self.cfg
        rec = CallRecord(turn=turn)
        if cfg.inject_failure == (self.name, turn):
            if self.sim is None:
                raise BenchError("--inject-failure needs the simulated model (--offline)")
            self.sim.fail_next(1, status=400)
        log_start = len(self.sim.requests) if self.sim is not None else 0
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": cfg.temperature,
            "max_tokens": cfg.max_tokens,
        }
        if tools:
            kwargs["tools"] = tools
        if cfg.stream:
            kwargs["stream"] = True
            kwargs["stream_options"] = {"include_usage": True}
        t0 = time.perf_counter()
        reply: ChatReply | None = None
        try:
            reply = self.client.complete(kwargs)
        except ChatCallError as e:
            rec.status, rec.error = "error", str(e)
        rec.latency_ms = round((time.perf_counter() - t0) * 1000, 1)
        rec.http_requests = self.client.requests
        if reply is not None:
            _record_reply(rec, reply)
        if self.sim is not None:
            seen = self.sim.requests[log_start:]
            rec.upstream_requests = len(seen)
            rec.upstream_prompt_tokens = sum(r.prompt_tokens for r in seen if r.status == 200)
            rec.injected_tokens = sum(r.injected_tokens for r in seen if r.status == 200)
        rec.cost_usd = _price(cfg, rec) if rec.status == "ok" else None
        return (reply.message if reply is not None else None), rec


def _record_reply(rec: CallRecord, reply: ChatReply) -> None:
    rec.model = reply.model
    if reply.message is None:
        rec.status, rec.error = "error", "the response has no choices"
    headers = reply.headers
    rec.retries = _header_int(headers, "x-skillstate-retries")
    rec.context = headers.get("x-skillstate-context")
    rec.transition = headers.get("x-skillstate-transition")
    rec.validation = headers.get("x-skillstate-validation")
    if rec.status != "ok":
        return
    if reply.prompt_tokens is None:
        rec.status = "error"
        rec.error = "the response carries no usage (refusing silent 0)"
    else:
        rec.prompt_tokens = reply.prompt_tokens
        rec.completion_tokens = reply.completion_tokens
        rec.cached_tokens = reply.cached_tokens
        rec.cache_write_tokens = reply.cache_write_tokens
