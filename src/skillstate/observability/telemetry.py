"""What the turn path reports about itself: ``/metrics`` counters and, when on, OpenTelemetry
spans, behind one narrow interface.

``Telemetry`` is one per app. The web handler asks it for a ``TurnTelemetry`` per request
and the pipeline calls that at a few points (context chosen, load, commit, ledger rows);
the upstream pool calls ``Telemetry`` for each attempt, retry, failover and breaker change.
Nothing here decides anything, and nothing here can fail a turn.

Spans (GenAI semantic conventions where they apply): the turn, ``chat {model}`` (server),
with children ``load state``, ``upstream {name}`` (client; one per attempt) and
``commit state``. Message content is recorded only with ``otel_capture_content``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from . import tracing
from .metrics import Metrics, attempt_outcome

if TYPE_CHECKING:
    from ..config import Settings
    from ..store.records import LedgerRow

__all__ = ["NO_TELEMETRY", "Telemetry", "TurnTelemetry"]


class TurnView(Protocol):
    """What a turn's telemetry reads of it (``turn.types.Turn``): a protocol, so that the
    pipeline, which reports here, is not imported back."""

    @property
    def mode(self) -> object: ...
    @property
    def model(self) -> str: ...
    @property
    def session(self) -> str: ...
    @property
    def stream(self) -> bool: ...
    @property
    def body(self) -> Mapping[str, Any]: ...


class TurnTelemetry:
    """What one turn reports. This base reports nothing (a ``Turn`` made outside the web
    handlers, e.g. by a bench, carries it); ``Telemetry.turn`` hands out the recording one."""

    __slots__ = ()

    def begin(self, turn: TurnView) -> None:
        """The request is parsed: its mode and model are known."""

    def context(self, form: str) -> None:
        """The context form sent upstream (compact, full, passthrough, ...)."""

    def span(self, name: str) -> AbstractContextManager[None]:
        """A child span of the turn around a stage (``load state``, ``commit state``)."""
        return _NOTHING

    def transition(self, status: str, patch: Any = None, action: str | None = None) -> None:
        """The judged turn is being committed with this transition status."""

    def metered(self, rows: Iterable[LedgerRow]) -> None:
        """The turn's ledger rows, complete (once per turn, where the meter is flushed)."""

    def first_byte(self) -> None:
        """A stream's headers and first bytes are ready for the client."""

    def finished(self, status: int) -> None:
        """The response is done (a stream: its last byte) with this HTTP status."""

    def active(self) -> AbstractContextManager[None]:
        """The turn's span is current inside (so the upstream attempts nest under it)."""
        return _NOTHING


_NOTHING: AbstractContextManager[None] = contextlib.nullcontext()
NO_TELEMETRY = TurnTelemetry()


class Telemetry:
    """The app's metrics and optional tracer; hands out one ``TurnTelemetry`` per turn."""

    def __init__(self, settings: Settings, tracer_provider: Any = None) -> None:
        self.metrics = Metrics()
        self.capture_content = settings.otel_capture_content
        self.key_label = settings.metrics_key_label
        self.tracer: tracing.Tracer | None = None
        if tracer_provider is None and tracing.enabled(settings):
            tracer_provider = tracing.otlp_provider(settings)
        if tracer_provider is not None:
            self.tracer = tracing.Tracer(tracer_provider)
        self.upstream_kinds = {u.name: u.kind for u in settings.upstreams}

    def turn(self, route: str, dialect: str, key: str | None = None) -> TurnTelemetry:
        """A recorder for one request on a turn route, started now (``key``: the caller's key
        name, counted only with ``metrics_key_label``)."""
        return _TurnRecorder(self, route, dialect, key if self.key_label else None)

    def close(self) -> None:
        """Flush and stop the tracer (on shutdown)."""
        if self.tracer is not None:
            self.tracer.shutdown()

    # -- the upstream pool ---------------------------------------------------------------

    def attempt_started(self, upstream: str, kind: str, model: str | None) -> Any:
        """An attempt is about to be sent: its span (None without tracing)."""
        if self.tracer is None:
            return None
        attrs = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": kind,
            "gen_ai.system": kind,
            "skillstate.upstream": upstream,
        }
        if model:
            attrs["gen_ai.request.model"] = model
        return self.tracer.client(f"upstream {upstream}", attrs)

    def attempt_done(self, upstream: str, status: int, error: str = "", span: Any = None) -> None:
        """An attempt ended: with an HTTP status, or 0 and what went wrong."""
        outcome = "cancelled" if error == "cancelled" else attempt_outcome(status, error)
        self.metrics.attempts.inc((upstream, outcome))
        if span is not None and self.tracer is not None:
            if status:
                span.set_attribute("http.response.status_code", status)
            if outcome != "ok":
                self.tracer.failed(span, outcome)
            span.end()

    def retry(self, upstream: str) -> None:
        self.metrics.retries.inc((upstream,))

    def failover(self, upstream: str) -> None:
        self.metrics.failovers.inc((upstream,))

    def skipped(self, upstream: str, reason: str) -> None:
        self.metrics.skipped.inc((upstream, reason))

    def breaker_changed(self, upstream: str, state: str) -> None:
        self.metrics.breaker_transitions.inc((upstream, state))


class _TurnRecorder(TurnTelemetry):
    """Counts one request and its turn; holds its span when tracing is on."""

    __slots__ = ("_dialect", "_key", "_mode", "_route", "_span", "_start", "_tel")

    def __init__(self, tel: Telemetry, route: str, dialect: str, key: str | None) -> None:
        self._tel = tel
        self._key = key
        self._route = route
        self._dialect = dialect
        self._mode = "none"  # until parsed: a request refused before that has no mode
        self._start = time.perf_counter()
        self._span: Any = None
        if tel.tracer is not None:
            self._span = tel.tracer.root("chat", {"gen_ai.operation.name": "chat"})

    def begin(self, turn: TurnView) -> None:
        self._mode = str(turn.mode)
        span = self._span
        if span is None:
            return
        if turn.model:
            span.update_name(f"chat {turn.model}")
            span.set_attribute("gen_ai.request.model", turn.model)
        span.set_attribute("gen_ai.conversation.id", turn.session)
        span.set_attribute("skillstate.mode", self._mode)
        span.set_attribute("skillstate.dialect", self._dialect)
        span.set_attribute("skillstate.stream", turn.stream)
        if self._tel.capture_content:
            messages = turn.body.get("messages")
            span.set_attribute("gen_ai.input.messages", orjson.dumps(messages).decode())

    def context(self, form: str) -> None:
        self._tel.metrics.contexts.inc((self._mode, form))
        if self._span is not None:
            self._span.set_attribute("skillstate.context", form)

    def span(self, name: str) -> AbstractContextManager[None]:
        if self._span is None:
            return _NOTHING  # no tracing: no generator-based context manager per stage
        return self._child(name)

    @contextlib.contextmanager
    def _child(self, name: str) -> Iterator[None]:
        tracer = self._tel.tracer
        assert tracer is not None
        child = tracer.child(self._span, name)
        try:
            yield
        except BaseException as e:
            tracer.failed(child, type(e).__name__)
            raise
        finally:
            child.end()

    def transition(self, status: str, patch: Any = None, action: str | None = None) -> None:
        self._tel.metrics.transitions.inc((self._mode, status))
        if self._span is not None:
            self._span.set_attribute("skillstate.transition", status)
            if self._tel.capture_content:
                self._span.set_attribute("skillstate.state_patch", orjson.dumps(patch).decode())
                if action:
                    self._span.set_attribute("skillstate.action", action)

    def metered(self, rows: Iterable[LedgerRow]) -> None:
        rows = list(rows)
        self._tel.metrics.ledger_rows(self._mode, rows)
        if self._key is not None:
            self._tel.metrics.key_rows(self._key, rows)
        if self._span is not None:
            self._usage_attributes(rows)

    def _usage_attributes(self, rows: list[LedgerRow]) -> None:
        span = self._span
        answer = next((r for r in reversed(rows) if r.kind in ("generation", "stream")), None)
        if answer is not None:
            if answer.model:
                span.set_attribute("gen_ai.response.model", answer.model)
            if answer.upstream:
                kind = self._tel.upstream_kinds.get(answer.upstream)
                span.set_attribute("skillstate.upstream", answer.upstream)
                if kind:
                    span.set_attribute("gen_ai.provider.name", kind)
                    span.set_attribute("gen_ai.system", kind)
        sums: Mapping[str, int | float | None] = {
            "gen_ai.usage.input_tokens": _total(r.input_tokens for r in rows),
            "gen_ai.usage.output_tokens": _total(r.output_tokens for r in rows),
            "gen_ai.usage.cache_read.input_tokens": _total(r.cache_read_tokens for r in rows),
            "skillstate.cost_usd": _total(r.cost_usd for r in rows),
            "skillstate.attempts": len(rows),
        }
        for k, v in sums.items():
            if v is not None:
                span.set_attribute(k, v)

    def first_byte(self) -> None:
        seconds = time.perf_counter() - self._start
        self._tel.metrics.first_byte.observe((self._route, self._dialect, self._mode), seconds)

    def finished(self, status: int) -> None:
        seconds = time.perf_counter() - self._start
        key = (self._route, self._dialect, self._mode, str(status))
        m = self._tel.metrics
        m.requests.inc(key)
        m.duration.observe(key, seconds)
        if self._key is not None:
            m.key_requests.inc((self._key, str(status)))
        span, tracer = self._span, self._tel.tracer
        if span is not None and tracer is not None:
            span.set_attribute("http.response.status_code", status)
            if status >= 400:
                tracer.failed(span, str(status))
            span.end()
            self._span = None  # ended once, even if called again

    def active(self) -> AbstractContextManager[None]:
        if self._span is None:
            return _NOTHING
        return self._activated()

    @contextlib.contextmanager
    def _activated(self) -> Iterator[None]:
        tracer = self._tel.tracer
        assert tracer is not None
        token = tracer.activate(self._span)
        try:
            yield
        finally:
            tracer.deactivate(token)


def _total(values: Iterable[int | float | None]) -> int | float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None
