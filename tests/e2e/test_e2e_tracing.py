"""OpenTelemetry traces end to end: the real proxy (in-process) with the SDK's in-memory
exporter in place of OTLP, turns driven by the openai and anthropic SDKs against the fake
provider; then the spans' names, GenAI attributes and parent links."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import skillstate
from skillstate.app.server import ProxyServer
from skillstate.config import load_settings
from skillstate.observability.tracing import enabled, traces_url
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, ant, envelope

USAGE = {"prompt_tokens": 120, "completion_tokens": 12}
SECRET = "the launch code is 0000"


class Traced:
    def __init__(self, url: str, exporter: InMemorySpanExporter) -> None:
        self.url, self.exporter = url, exporter

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())


def _start(
    tmp_path: Path, upstreams: list[dict[str, Any]], **extra: Any
) -> tuple[ProxyServer, InMemorySpanExporter]:
    config = {"schema": ["notes"], "upstreams": upstreams, "retry_base_delay": 0, **extra}
    (tmp_path / "skillstate.json").write_text(json.dumps(config))
    settings = load_settings({"port": 0, "data_dir": str(tmp_path / "data")}, {}, tmp_path)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return ProxyServer(settings, tracer_provider=provider).start(), exporter


@pytest.fixture
def traced(fake: FakeProvider, tmp_path: Path) -> Iterator[Traced]:
    up = [{"name": "main", "url": fake.url + "/v1", "api_key": "k"}]
    server, exporter = _start(tmp_path, up)
    try:
        yield Traced(server.url, exporter)
    finally:
        server.stop()


def by_name(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def test_a_turn_is_one_trace_with_load_attempt_and_commit(
    fake: FakeProvider, traced: Traced
) -> None:
    fake.enqueue(Reply(text=envelope({"notes": SECRET}), usage=USAGE))
    client = openai.OpenAI(base_url=traced.url + "/v1", api_key="sk-client", max_retries=0)
    client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": SECRET}],
        extra_headers={SESSION_HEADER: "traced-1"},
    )
    spans = traced.spans()
    [turn] = by_name(spans, "chat gpt-4o-mini")
    [load] = by_name(spans, "load state")
    [attempt] = by_name(spans, "upstream main")
    [commit] = by_name(spans, "commit state")
    assert turn.parent is None and turn.kind == SpanKind.SERVER
    for child in (load, attempt, commit):
        assert child.parent is not None and child.parent.span_id == turn.context.span_id
        assert child.context.trace_id == turn.context.trace_id
    assert attempt.kind == SpanKind.CLIENT
    a = dict(turn.attributes or {})
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "gpt-4o-mini"
    assert a["gen_ai.response.model"] == "gpt-4o-mini"
    assert a["gen_ai.provider.name"] == a["gen_ai.system"] == "openai"
    assert a["gen_ai.usage.input_tokens"] == 120
    assert a["gen_ai.usage.output_tokens"] == 12
    assert a["gen_ai.conversation.id"] == "traced-1"
    assert a["skillstate.mode"] == "state"
    assert a["skillstate.context"] == "compact"
    assert a["skillstate.transition"] == "valid"
    assert a["http.response.status_code"] == 200
    at = dict(attempt.attributes or {})
    assert at["gen_ai.provider.name"] == "openai"
    assert at["skillstate.upstream"] == "main"
    assert at["http.response.status_code"] == 200
    # No content unless otel_capture_content.
    assert not any(SECRET in str(v) for s in spans for v in (s.attributes or {}).values())


def test_retry_and_failover_are_sibling_attempt_spans(fake: FakeProvider, tmp_path: Path) -> None:
    other = FakeProvider().start()
    ups = [
        {"name": "a", "url": fake.url + "/v1", "api_key": "k", "priority": 0},
        {"name": "b", "url": other.url + "/v1", "api_key": "k", "priority": 1},
    ]
    server, exporter = _start(tmp_path, ups, retry_max_attempts=2)
    try:
        fake.enqueue(Reply(status=503), Reply(status=503))
        other.enqueue(Reply(text=envelope({"notes": "x"}), usage=USAGE))
        client = ant(server, "sk-client")
        client.messages.create(
            model="claude-haiku-4-5", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
        )
    finally:
        server.stop()
        other.stop()
    spans = list(exporter.get_finished_spans())
    [turn] = by_name(spans, "chat claude-haiku-4-5")
    a_spans, b_spans = by_name(spans, "upstream a"), by_name(spans, "upstream b")
    assert len(a_spans) == 2 and len(b_spans) == 1
    for s in (*a_spans, *b_spans):
        assert s.parent is not None and s.parent.span_id == turn.context.span_id
    for s in a_spans:
        assert s.status.status_code == StatusCode.ERROR
        assert dict(s.attributes or {})["error.type"] == "server_error"
    assert b_spans[0].status.status_code != StatusCode.ERROR
    assert dict(turn.attributes or {})["skillstate.upstream"] == "b"
    assert dict(turn.attributes or {})["skillstate.attempts"] == 3


def test_streamed_turn_and_captured_content(fake: FakeProvider, tmp_path: Path) -> None:
    up = [{"name": "main", "url": fake.url + "/v1", "api_key": "k"}]
    server, exporter = _start(tmp_path, up, otel_capture_content=True)
    try:
        fake.enqueue(Reply(text=envelope({"notes": "kept"}), usage=USAGE))
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-client", max_retries=0)
        stream = client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": SECRET}], stream=True
        )
        for _ in stream:
            pass
    finally:
        server.stop()
    spans = list(exporter.get_finished_spans())
    [turn] = by_name(spans, "chat gpt-4o-mini")
    [commit] = by_name(spans, "commit state")
    assert commit.parent is not None and commit.parent.span_id == turn.context.span_id
    a = dict(turn.attributes or {})
    assert a["skillstate.stream"] is True
    assert SECRET in str(a["gen_ai.input.messages"])
    assert json.loads(str(a["skillstate.state_patch"])) == {"notes": "kept"}
    assert a["skillstate.action"] == "next"


def test_tracing_is_on_only_when_configured(tmp_path: Path) -> None:
    base = load_settings({"data_dir": str(tmp_path)}, {}, tmp_path)
    assert not enabled(base, env={})
    assert enabled(base, env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert enabled(base.model_copy(update={"otel_endpoint": "http://c:4318"}), env={})
    assert traces_url("http://c:4318/") == "http://c:4318/v1/traces"
    assert traces_url("http://c:4318/v1/traces") == "http://c:4318/v1/traces"


def test_nothing_of_opentelemetry_is_imported_when_off(tmp_path: Path) -> None:
    # A fresh interpreter: the app made and a turn's telemetry used, tracing off.
    code = (
        "import sys\n"
        "from skillstate.config import Settings\n"
        "from skillstate.app.factory import create_app\n"
        f"create_app(Settings(data_dir={str(tmp_path)!r}))\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        # No OTEL_* variable may reach it; the path is the one under test (a worktree's src).
        env={"PYTHONPATH": str(Path(skillstate.__file__).parents[1])},
    )
    assert out.stdout.strip() == "[]"


class _Collector:
    """A minimal OTLP/HTTP trace receiver on loopback: keeps each export request."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, bytes]] = []
        self._done = threading.Event()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                collector.requests.append((self.path, self.headers["content-type"], body))
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def test_otel_endpoint_exports_over_otlp_http(fake: FakeProvider, tmp_path: Path) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    collector = _Collector()
    try:
        up = [{"name": "main", "url": fake.url + "/v1", "api_key": "k"}]
        config = {"schema": ["notes"], "upstreams": up, "otel_endpoint": collector.url}
        (tmp_path / "skillstate.json").write_text(json.dumps(config))
        cli = {"port": 0, "data_dir": str(tmp_path / "data")}
        settings = load_settings(cli, {}, tmp_path)
        server = ProxyServer(settings).start()  # the settings' own OTLP exporter
        try:
            fake.enqueue(Reply(text=envelope({"notes": "x"}), usage=USAGE))
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk", max_retries=0)
            client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
            )
        finally:
            server.stop()  # shutdown flushes the batch
    finally:
        collector.close()
    assert collector.requests, "nothing exported"
    names, services = [], set()
    for path, content_type, body in collector.requests:
        assert path == "/v1/traces" and content_type == "application/x-protobuf"
        export = ExportTraceServiceRequest.FromString(body)
        for rs in export.resource_spans:
            services |= {
                a.value.string_value for a in rs.resource.attributes if a.key == "service.name"
            }
            names += [s.name for ss in rs.scope_spans for s in ss.spans]
    assert sorted(names) == ["chat gpt-4o-mini", "commit state", "load state", "upstream main"]
    assert services == {"skillstate-proxy"}
