"""The `real` tier: the real `skillstate` process in front of a real llama.cpp `llama-server`
running SmolLM2-135M-Instruct (built and cached by `scripts/real-upstream`).

Run it with `make test-real`. The server is started once per test session and stopped by
its PID at the end (only if this session started it). `SKILLSTATE_REAL_UPSTREAM=http://...`
uses an already running llama-server instead.

Between the proxy and llama-server sits a recording tap (`Tap`): a plain HTTP forwarder that
keeps every request body and the exact response bytes, so the tests can compare what
llama.cpp sent with what the client received, and see what the proxy sent upstream.

The assertions are about structure (formats, pairing, headers, counts), never about the
wording of a 135M model's replies.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import Proxy

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "real-upstream"
MODEL = "smollm2"

# Small, deterministic generations: the server does 6-47 tokens/s on this kind of machine.
MAX_TOKENS = 64
SEED = 42

# The session state the tier's proxies use. The state_schema bounds every value, so that
# under constrained decoding (response_format json_schema) the grammar cannot let a 135M
# model nest objects or run a string to the token cap.
INITIAL_STATE: dict[str, Any] = {"step": 0, "notes": ""}
STATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "step": {"type": "integer", "minimum": 0, "maximum": 100000},
        "notes": {"type": "string", "maxLength": 60},
    },
}


# -- llama-server ------------------------------------------------------------------------------


@dataclass
class Llama:
    url: str  # http://127.0.0.1:PORT (no /v1)
    pid: int | None  # the server this session started, else None
    info: dict[str, Any] = field(default_factory=dict)


def _script(*args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _is_llama_server(pid: int) -> bool:
    if not Path("/proc").is_dir():  # macOS: no cmdline to check, trust the PID
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    try:
        return b"llama-server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.fixture(scope="session")
def llama() -> Iterator[Llama]:
    external = os.environ.get("SKILLSTATE_REAL_UPSTREAM")
    if external:
        yield Llama(external.rstrip("/").removesuffix("/v1"), None)
        return
    t0 = time.monotonic()
    built = _script("build")  # cached: seconds once READY.json exists
    if built.returncode != 0:
        pytest.fail(f"scripts/real-upstream build failed:\n{built.stderr[-3000:]}")
    before = json.loads(_script("status").stdout or "{}").get("server")
    started = _script("start", "--json", timeout=300)
    if started.returncode != 0:
        pytest.fail(f"scripts/real-upstream start failed:\n{started.stderr[-3000:]}")
    info = json.loads(started.stdout)
    ours = before is None or int(before.get("pid", -1)) != int(info["pid"])
    sys.stderr.write(
        f"\n[real] llama-server {info['url']} pid {info['pid']} "
        f"({'started' if ours else 'already running'}; {time.monotonic() - t0:.1f}s)\n"
    )
    try:
        yield Llama(info["url"], int(info["pid"]) if ours else None, info)
    finally:
        if ours:
            _stop(int(info["pid"]))


def _stop(pid: int) -> None:
    """Stop the server this session started, by its PID."""
    if not _is_llama_server(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _is_llama_server(pid):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    if _is_llama_server(pid):
        os.kill(pid, signal.SIGKILL)
    # Drop the script's record of it, if it is still ours (`start` ignores a dead PID anyway).
    record = Path(json.loads(_script("paths").stdout)["server_json"])
    with contextlib.suppress(OSError, ValueError):
        if int(json.loads(record.read_text()).get("pid", -1)) == pid:
            record.unlink()


# -- the recording tap -------------------------------------------------------------------------


@dataclass
class Exchange:
    method: str
    path: str
    request: dict[str, Any] | None  # the JSON body the proxy sent upstream
    status: int = 0
    content_type: str = ""
    body: bytes = b""  # the exact response body bytes llama-server sent (de-chunked)
    # Set once the response is fully forwarded. The client can see the last byte before the
    # forwarding thread finishes its bookkeeping, so readers wait on this, not on the list.
    done: threading.Event = field(default_factory=threading.Event)


_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "te"}


class Tap(ThreadingHTTPServer):
    """An HTTP/1.1 forwarder to llama-server that records each exchange.

    SSE responses are forwarded read by read (chunked), so streaming stays streaming.
    """

    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.exchanges: list[Exchange] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _TapHandler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def since(self, mark: int) -> list[Exchange]:
        with self.lock:
            found = self.exchanges[mark:]
        for ex in found:
            if not ex.done.wait(60):
                raise AssertionError(f"tap: {ex.method} {ex.path} never finished forwarding")
        return found

    def mark(self) -> int:
        with self.lock:
            return len(self.exchanges)

    def generations(self, mark: int) -> list[Exchange]:
        gen = ("/v1/chat/completions", "/v1/messages")
        return [e for e in self.since(mark) if e.path in gen]


class _TapHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Tap

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()

    def _forward(self) -> None:
        n = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        ex = Exchange(self.command, self.path.split("?")[0], parsed)
        # Listed before anything is forwarded: once the proxy has its answer, the tap has it too.
        with self.server.lock:
            self.server.exchanges.append(ex)
        try:
            self._relay(raw, ex)
        finally:
            ex.done.set()

    def _relay(self, raw: bytes, ex: Exchange) -> None:
        up = self.server.upstream
        conn = http.client.HTTPConnection(up.hostname or "127.0.0.1", up.port, timeout=600)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        conn.request(self.command, self.path, body=raw or None, headers=headers)
        resp = conn.getresponse()
        ex.status = resp.status
        ex.content_type = resp.getheader("content-type", "")
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in _HOP:
                self.send_header(k, v)
        body = bytearray()
        if ex.content_type.startswith("text/event-stream"):
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            while True:
                chunk = resp.read1(65536)
                if not chunk:
                    break
                body += chunk
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        else:
            data = resp.read()
            body += data
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        self.wfile.flush()
        conn.close()
        ex.body = bytes(body)


@pytest.fixture(scope="session")
def tap(llama: Llama) -> Iterator[Tap]:
    t = Tap(llama.url)
    t.thread.start()
    try:
        yield t
    finally:
        t.shutdown()
        t.server_close()


# -- the proxy in front of it ------------------------------------------------------------------


def proxy_config(tap: Tap, *, kind: str = "openai", **extra: Any) -> dict[str, Any]:
    url = tap.url if kind == "anthropic" else tap.url + "/v1"
    cfg: dict[str, Any] = {
        "upstreams": [{"name": "llama", "url": url, "kind": kind}],
        "initial_state": INITIAL_STATE,
        "state_schema": STATE_SCHEMA,
        "schema": list(INITIAL_STATE),
        "prices": {MODEL: {"local_zero": True}},
        "max_retries": 0,  # one upstream call per turn: the tier's runtime stays bounded
        "first_byte_timeout": 300,
        # The tier checks that llama.cpp's own bytes reach the client (and what was committed
        # from them), so the envelope is kept in the reply; strip is covered by the main suite
        # with the real SDKs (tests/test_e2e_strip.py).
        "reply_envelope": "keep",
    }
    cfg.update(extra)
    return cfg


@pytest.fixture
def real_proxy(tap: Tap, start_proxy: Callable[..., Proxy]) -> Callable[..., Proxy]:
    """real_proxy(kind="openai"|"anthropic", **config overrides) -> a started proxy process."""

    def start(kind: str = "openai", **extra: Any) -> Proxy:
        return start_proxy(None, config=proxy_config(tap, kind=kind, **extra))

    return start


# -- a client transport that keeps the raw bytes the SDKs parse ---------------------------------


class Tee:
    """Client-side tap: `bodies[i]` is the i-th response's raw bytes, exactly as the SDK read
    them. `client(module)` builds an `httpx`-style client around it; the openai SDK wants
    `httpx`, this anthropic SDK wants its fork `httpx2` (same API)."""

    def __init__(self) -> None:
        self.bodies: list[bytearray] = []
        self._clients: list[Any] = []

    def client(self, module: Any = httpx) -> Any:
        tee = self
        inner = module.HTTPTransport()

        class Stream(module.SyncByteStream):  # type: ignore[misc,name-defined]
            def __init__(self, stream: Any, sink: bytearray) -> None:
                self._stream, self._sink = stream, sink

            def __iter__(self) -> Iterator[bytes]:
                for chunk in self._stream:
                    self._sink.extend(chunk)
                    yield chunk

            def close(self) -> None:
                self._stream.close()

        class Transport(module.BaseTransport):  # type: ignore[misc,name-defined]
            def handle_request(self, request: Any) -> Any:
                resp = inner.handle_request(request)
                sink = bytearray()
                tee.bodies.append(sink)
                return module.Response(
                    resp.status_code,
                    headers=resp.headers,
                    stream=Stream(resp.stream, sink),
                    extensions=resp.extensions,
                    request=request,
                )

            def close(self) -> None:
                inner.close()

        c = module.Client(transport=Transport(), timeout=module.Timeout(300.0, connect=10.0))
        self._clients.append(c)
        return c

    def close(self) -> None:
        for c in self._clients:
            c.close()


@pytest.fixture
def tee() -> Iterator[Tee]:
    t = Tee()
    yield t
    t.close()
