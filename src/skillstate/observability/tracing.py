"""Optional OpenTelemetry traces: the tracer, when tracing is on.

On when ``otel_endpoint`` is set or one of the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` variables is; spans go out over OTLP/HTTP (protobuf)
in batches. Nothing of OpenTelemetry is imported when it is off, and it is installed with the
``otel`` extra (``pip install 'skillstate-proxy[otel]'``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..config import ConfigError, Settings

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
SERVICE_NAME = "skillstate-proxy"
INSTRUMENTATION = "skillstate"


def enabled(settings: Settings, env: Mapping[str, str] | None = None) -> bool:
    """Whether traces are to be exported: an endpoint is configured, or set the standard way."""
    env = os.environ if env is None else env
    return bool(settings.otel_endpoint) or any(env.get(v) for v in ENDPOINT_VARS)


def traces_url(endpoint: str) -> str:
    """``otel_endpoint`` is a base URL, like ``OTEL_EXPORTER_OTLP_ENDPOINT``: the traces
    path is added unless it is already there."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"


def otlp_provider(settings: Settings) -> Any:
    """A TracerProvider that batches spans to the OTLP endpoint (the SDK reads the standard
    ``OTEL_*`` variables for whatever ``settings`` leaves open: headers, service name, ...)."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise ConfigError(
            "otel_endpoint: tracing is on but OpenTelemetry is not installed; "
            "pip install 'skillstate-proxy[otel]' (or unset otel_endpoint / "
            "OTEL_EXPORTER_OTLP_ENDPOINT)"
        ) from None
    endpoint = traces_url(settings.otel_endpoint) if settings.otel_endpoint else None
    resource = Resource.create(
        {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": SERVICE_NAME}
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


class Tracer:
    """The few OpenTelemetry calls the turn path makes, imported only when tracing is on."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self._context, self._trace = context, trace
        self._server, self._client, self._internal = (
            SpanKind.SERVER, SpanKind.CLIENT, SpanKind.INTERNAL,
        )  # fmt: skip
        self._error = Status(StatusCode.ERROR)
        self.provider = provider
        self._tracer = provider.get_tracer(INSTRUMENTATION)

    def root(self, name: str, attributes: Mapping[str, Any]) -> Any:
        """The turn's span (a server span: the proxy serving a client's request)."""
        return self._tracer.start_span(name, kind=self._server, attributes=attributes)

    def child(self, parent: Any, name: str, attributes: Mapping[str, Any] | None = None) -> Any:
        """An internal span under ``parent`` (load, commit)."""
        ctx = self._trace.set_span_in_context(parent)
        return self._tracer.start_span(name, ctx, kind=self._internal, attributes=attributes)

    def client(self, name: str, attributes: Mapping[str, Any]) -> Any:
        """An upstream call, under whatever span is current (the turn's, see ``activate``)."""
        return self._tracer.start_span(name, kind=self._client, attributes=attributes)

    def activate(self, span: Any) -> Any:
        """Make ``span`` the current one for this task (and the tasks it starts)."""
        return self._context.attach(self._trace.set_span_in_context(span))

    def deactivate(self, token: Any) -> None:
        self._context.detach(token)

    def failed(self, span: Any, error_type: str) -> None:
        """Mark ``span`` as failed (``error.type`` as the semantic conventions name it)."""
        span.set_attribute("error.type", error_type)
        span.set_status(self._error)

    def shutdown(self) -> None:
        """Export what is pending, then stop."""
        self.provider.shutdown()
