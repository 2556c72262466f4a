"""What ``GET /metrics`` shows: counters and histograms of the proxy's work, in the Prometheus
text format (rendered by ``prometheus-client``).

The numbers are kept as plain dicts keyed by label tuples and turned into metric families only
when scraped. Every update happens on the event loop and so does the scrape, so no lock is
needed, and a turn's dozen updates cost a few microseconds (``prometheus_client``'s own
``Counter.labels(...).inc()`` takes a lock per value and costs several times that).

Cardinality is bounded by construction: labels are routes, dialects, modes and statuses from
closed sets, and upstream names from the configuration; never a session, a key or a model a
client names. Breaker states and rate-limit windows are read from the upstreams at scrape time.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

if TYPE_CHECKING:
    from ..store.records import LedgerRow

__all__ = ["CONTENT_TYPE", "Metrics", "attempt_outcome"]


class _Breaker(Protocol):
    @property
    def state(self) -> str: ...


class _Limits(Protocol):
    def snapshot(self) -> Mapping[str, Any]: ...


class UpstreamView(Protocol):
    """What a scrape reads of an upstream (``upstream.client.UpstreamRuntime``): a protocol,
    so that the upstream layer, which reports to the metrics, is not imported by them."""

    name: str

    @property
    def breaker(self) -> _Breaker: ...

    @property
    def limits(self) -> _Limits: ...


CONTENT_TYPE = CONTENT_TYPE_LATEST
PREFIX = "skillstate_"
# Seconds. Model calls take from milliseconds (a cached local model) to minutes.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
BREAKER_STATES = ("closed", "open", "half_open")

Key = tuple[str, ...]


class _Counter:
    """Sums by label values."""

    __slots__ = ("doc", "labels", "name", "values")

    def __init__(self, name: str, doc: str, labels: Sequence[str]) -> None:
        self.name, self.doc, self.labels = PREFIX + name, doc, list(labels)
        self.values: dict[Key, float] = {}

    def inc(self, key: Key, amount: float = 1.0) -> None:
        values = self.values
        values[key] = values.get(key, 0.0) + amount

    def family(self) -> Metric:
        fam = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        for key, value in sorted(self.values.items()):
            fam.add_metric(key, value)
        return fam


class _Gauge(_Counter):
    """A running sum that may go down (e.g. savings: a retry spends without a baseline)."""

    def family(self) -> Metric:
        fam = GaugeMetricFamily(self.name, self.doc, labels=self.labels)
        for key, value in sorted(self.values.items()):
            fam.add_metric(key, value)
        return fam


class _Histogram:
    """Observations by label values: a count per bucket (not cumulative until rendered),
    the sum last."""

    __slots__ = ("bounds", "doc", "labels", "name", "values")

    def __init__(self, name: str, doc: str, labels: Sequence[str], bounds: Sequence[float]) -> None:
        self.name, self.doc, self.labels = PREFIX + name, doc, list(labels)
        self.bounds = tuple(bounds)
        self.values: dict[Key, list[float]] = {}

    def observe(self, key: Key, value: float) -> None:
        row = self.values.get(key)
        if row is None:
            row = self.values[key] = [0.0] * (len(self.bounds) + 2)
        row[bisect_left(self.bounds, value)] += 1  # le: value <= bound
        row[-1] += value

    def family(self) -> Metric:
        fam = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        edges = [*(_le(b) for b in self.bounds), "+Inf"]
        for key, row in sorted(self.values.items()):
            running, buckets = 0.0, []
            for edge, n in zip(edges, row[:-1], strict=True):
                running += n
                buckets.append((edge, running))
            fam.add_metric(list(key), buckets, row[-1])
        return fam


def _le(bound: float) -> str:
    return repr(float(bound))


def attempt_outcome(status: int, error: str = "") -> str:
    """An upstream attempt's outcome label, from its HTTP status (0: no response)."""
    if status == 0:
        return "timeout" if error == "timeout" else "connection_error"
    if 200 <= status < 300:
        return "ok"
    if status == 429:
        return "rate_limited"
    if status in (401, 403):
        return "key_rejected"
    return "server_error" if status >= 500 else "client_error"


class Metrics:
    """The proxy's counters, one instance per app (its own registry, so several proxies in
    one process, as in the tests, never mix their numbers)."""

    def __init__(self) -> None:
        self._requests()
        self._upstreams()
        self._turns()
        self._usage()
        self._keys()
        self._families = [v for v in vars(self).values() if isinstance(v, (_Counter, _Histogram))]

    def _requests(self) -> None:
        route = ("route", "dialect", "mode")
        self.requests = _Counter(
            "requests", "Client requests on the turn routes, by final HTTP status.",
            (*route, "status"),
        )  # fmt: skip
        self.duration = _Histogram(
            "request_duration_seconds",
            "From the request's arrival to its last byte (a stream: to its end).",
            (*route, "status"),
            LATENCY_BUCKETS,
        )
        self.first_byte = _Histogram(
            "stream_first_byte_seconds",
            "Streamed turns: from the request's arrival to the first bytes ready for the client.",
            route,
            LATENCY_BUCKETS,
        )

    def _upstreams(self) -> None:
        self.attempts = _Counter(
            "upstream_attempts",
            "Requests sent to an upstream, by outcome.",
            ("upstream", "outcome"),
        )
        self.retries = _Counter(
            "upstream_retries", "Attempts that repeated a failed one on the same upstream.",
            ("upstream",),
        )  # fmt: skip
        self.failovers = _Counter(
            "upstream_failovers", "Requests moved on from this upstream to the next candidate.",
            ("upstream",),
        )  # fmt: skip
        self.skipped = _Counter(
            "upstream_skipped",
            "Upstreams passed over without a call: circuit open or local rate limit reached.",
            ("upstream", "reason"),
        )
        self.breaker_transitions = _Counter(
            "breaker_transitions", "Circuit breaker state changes, by the state entered.",
            ("upstream", "state"),
        )  # fmt: skip

    def _turns(self) -> None:
        self.transitions = _Counter(
            "transitions", "Committed turns, by transition status.", ("mode", "status")
        )
        self.reasks = _Counter(
            "reasks", "Re-asks after an invalid state patch (rollback-retries).", ("mode",)
        )
        self.contexts = _Counter(
            "context", "Turns by the context form sent upstream.", ("mode", "form")
        )

    def _usage(self) -> None:
        usage = ("upstream", "mode")
        self.tokens = _Counter(
            "tokens",
            "Tokens the upstreams reported: input (cache reads included), cached (the part of "
            "input read from the prompt cache), output.",
            (*usage, "type"),
        )
        self.cost = _Counter("cost_usd", "Estimated spend in USD (priced rows only).", usage)
        self.estimated_cost = _Counter(
            "estimated_cost_usd",
            "Calls the provider reported no usage for (cut by the client, or answered without "
            "usage), charged their worst case in USD; not in cost_usd, counted by budgets.",
            usage,
        )
        self.baseline_tokens = _Counter(
            "baseline_input_tokens",
            "Input tokens the client's own transcript would have cost (turn rows; retries 0).",
            usage,
        )
        self.baseline_cost = _Counter(
            "baseline_cost_usd", "What the client's own transcript would have cost, USD.", usage
        )
        self.saved_tokens = _Gauge(
            "saved_input_tokens",
            "Baseline minus actual input tokens since start (negative when the proxy cost more).",
            usage,
        )
        self.saved_cost = _Gauge(
            "saved_cost_usd", "Baseline minus actual cost in USD since start (may be negative).",
            usage,
        )  # fmt: skip

    def _keys(self) -> None:
        # Only with metrics_key_label: by the caller's key name (operator-made, so bounded).
        self.key_requests = _Counter(
            "key_requests", "Requests on the turn routes by client key name and status.",
            ("key", "status"),
        )  # fmt: skip
        self.key_tokens = _Counter(
            "key_tokens", "Reported tokens by client key name (input, cached, output).",
            ("key", "type"),
        )  # fmt: skip
        self.key_cost = _Counter(
            "key_cost_usd", "Estimated spend in USD by client key name.", ("key",)
        )
        self.key_estimated_cost = _Counter(
            "key_estimated_cost_usd",
            "Calls without reported usage, at their worst case in USD, by client key name.",
            ("key",),
        )

    # -- updates (the turn path) ---------------------------------------------------------

    def ledger_rows(self, mode: str, rows: Iterable[LedgerRow]) -> None:
        """Tokens, cost, baseline and savings of one turn's rows (the meter's, so the numbers
        add up to ``/cost``), and its re-asks. Called once per turn with its final rows: a
        row the turn writes twice (same ``row_id``, ``TurnMeter.restore``) is one row here,
        so neither its measured nor its estimated cost counts twice."""
        for r in rows:
            key = (r.upstream or "none", mode)
            if r.kind == "rollback-retry":
                self.reasks.inc((mode,))
            if r.input_tokens is not None:
                self.tokens.inc((*key, "input"), r.input_tokens)
                self.tokens.inc((*key, "cached"), r.cache_read_tokens or 0)
            if r.output_tokens is not None:
                self.tokens.inc((*key, "output"), r.output_tokens)
            if r.cost_usd is not None:
                self.cost.inc(key, r.cost_usd)
            if r.estimated_cost_usd is not None:
                self.estimated_cost.inc(key, r.estimated_cost_usd)
            if r.baseline_input_tokens is not None and r.input_tokens is not None:
                self.baseline_tokens.inc(key, r.baseline_input_tokens)
                self.saved_tokens.inc(key, r.baseline_input_tokens - r.input_tokens)
            if r.baseline_cost_usd is not None and r.cost_usd is not None:
                self.baseline_cost.inc(key, r.baseline_cost_usd)
                self.saved_cost.inc(key, r.baseline_cost_usd - r.cost_usd)

    def key_rows(self, key: str, rows: Iterable[LedgerRow]) -> None:
        """One turn's tokens, cost and estimated cost under its client key's name."""
        for r in rows:
            if r.input_tokens is not None:
                self.key_tokens.inc((key, "input"), r.input_tokens)
                self.key_tokens.inc((key, "cached"), r.cache_read_tokens or 0)
            if r.output_tokens is not None:
                self.key_tokens.inc((key, "output"), r.output_tokens)
            if r.cost_usd is not None:
                self.key_cost.inc((key,), r.cost_usd)
            if r.estimated_cost_usd is not None:
                self.key_estimated_cost.inc((key,), r.estimated_cost_usd)

    # -- the scrape ----------------------------------------------------------------------

    def render(self, upstreams: Sequence[UpstreamView]) -> bytes:
        """Everything in the Prometheus text format, with the upstreams' breaker states and
        rate-limit windows as they are now."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Snapshot(self, upstreams))
        return generate_latest(registry)

    def families(self, upstreams: Sequence[UpstreamView]) -> Iterator[Metric]:
        for f in self._families:
            yield f.family()
        yield from _upstream_gauges(upstreams)


class _Snapshot(Collector):
    def __init__(self, metrics: Metrics, upstreams: Sequence[UpstreamView]) -> None:
        self._metrics, self._upstreams = metrics, upstreams

    def collect(self) -> Iterator[Metric]:
        return self._metrics.families(self._upstreams)


def _upstream_gauges(upstreams: Sequence[UpstreamView]) -> Iterator[Metric]:
    state = GaugeMetricFamily(
        PREFIX + "breaker_state",
        "1 for the state each upstream's circuit breaker is in now, 0 for the others.",
        labels=["upstream", "state"],
    )
    used = GaugeMetricFamily(
        PREFIX + "upstream_window_used",
        "Requests (rpm) or tokens (tpm) counted in the last minute, for upstreams with a limit.",
        labels=["upstream", "window"],
    )
    limit = GaugeMetricFamily(
        PREFIX + "upstream_window_limit",
        "The configured rpm / tpm limit of each upstream that has one.",
        labels=["upstream", "window"],
    )
    for up in upstreams:
        now = up.breaker.state
        for s in BREAKER_STATES:
            state.add_metric([up.name, s], 1.0 if s == now else 0.0)
        for window, snap in up.limits.snapshot().items():
            if snap is not None:
                used.add_metric([up.name, window], snap["used"])
                limit.add_metric([up.name, window], snap["limit"])
    return iter((state, used, limit))
