"""HTTP limits through the real proxy process, with raw sockets (an SDK would never send what
an attacker does): header bytes (431), header and body read timeouts (408) and the connection
cap (503, Anthropic 529). Each answer is an error object in the dialect of the request's path,
and the connection is closed. No timing thresholds: a read timeout is set short and the test
only checks that the connection is answered and closed, with a generous outer bound."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ProxyProcess, StartProxyProcess, proxy_argv, proxy_env
from tests.fakeprovider import FakeProvider

OUTER_BOUND = 30.0  # seconds a socket read may block before the test gives up
PATHS = ["/v1/chat/completions", "/v1/messages"]


def body_for(path: str) -> bytes:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if path == "/v1/messages":
        body["max_tokens"] = 8
    return json.dumps(body).encode()


def head(path: str, body: bytes, *extra: str, length: int | None = None) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        "host: 127.0.0.1",
        "content-type: application/json",
        f"content-length: {len(body) if length is None else length}",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@contextlib.contextmanager
def connect(proxy: ProxyProcess) -> Iterator[socket.socket]:
    host, port = proxy.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=OUTER_BOUND) as sock:
        yield sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the proxy sends until it closes; fails the test if it never does."""
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            pytest.fail(f"the proxy kept the connection open; got {b''.join(chunks)!r}")
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response on a kept-alive connection (content-length framed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    raw_head, _, rest = data.partition(b"\r\n\r\n")
    status, headers = parse_head(raw_head)
    while len(rest) < int(headers["content-length"]):
        rest += sock.recv(65536)
    return status, headers, rest


def parse_head(raw_head: bytes) -> tuple[int, dict[str, str]]:
    lines = raw_head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers


def assert_refused(raw: bytes, path: str, status: int, words: str) -> dict[str, str]:
    """A whole response: ``status``, an error object in ``path``'s dialect naming ``words``,
    and ``connection: close``."""
    raw_head, _, body = raw.partition(b"\r\n\r\n")
    got, headers = parse_head(raw_head)
    assert got == status, raw[:300]
    assert headers["connection"] == "close"
    err = json.loads(body)
    if path.endswith("/messages"):
        assert err["type"] == "error" and err["error"]["type"], err
    else:
        assert set(err["error"]) == {"message", "type", "param", "code"}, err
    assert words in err["error"]["message"], err
    return headers


def exchange(proxy: ProxyProcess, data: bytes) -> bytes:
    with connect(proxy) as sock:
        sock.sendall(data)
        return read_until_closed(sock)


# One process per configuration for the module's raw-socket tests (a start costs about a
# second of CPU): each test opens its own connections and keeps no state in the proxy, and
# ``fake`` is the module's upstream, emptied before each test, so "nothing reached the
# upstream" is still per test. A test that stops its proxy starts its own.
SHORT_TIMEOUTS = {"header_timeout": 0.3, "body_timeout": 0.3}


@pytest.fixture(scope="module")
def _upstream() -> Iterator[FakeProvider]:
    fp = FakeProvider().start()
    try:
        yield fp
    finally:
        fp.stop()


@pytest.fixture
def fake(_upstream: FakeProvider) -> FakeProvider:
    _upstream.reset()
    return _upstream


def shared_process(
    upstream: FakeProvider, tmp: Path, config: dict[str, Any] | None = None
) -> Iterator[ProxyProcess]:
    """A proxy process for the whole module; at the end, nothing any test did to it made it
    log a traceback."""
    argv = proxy_argv(tmp, upstream.url + "/v1", (), config)
    p = ProxyProcess(argv, proxy_env(SKILLSTATE_API_KEY="sk-upstream"), tmp)
    try:
        yield p
    finally:
        assert "Traceback" not in p.stop()


@pytest.fixture(scope="module")
def proxy(
    _upstream: FakeProvider, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    yield from shared_process(_upstream, tmp_path_factory.mktemp("proxy"))


@pytest.fixture(scope="module")
def short_timeouts(
    _upstream: FakeProvider, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    yield from shared_process(_upstream, tmp_path_factory.mktemp("short"), SHORT_TIMEOUTS)


# ---- header bytes -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_headers_past_the_default_64_kib_are_a_431(
    fake: FakeProvider, proxy: ProxyProcess, path: str
) -> None:
    body = body_for(path)
    raw = exchange(proxy, head(path, body, "x-pad: " + "a" * 70_000) + body)
    assert_refused(raw, path, 431, "max_header_bytes")
    # Many small headers count the same as one large one.
    many = [f"x-pad-{i}: " + "b" * 90 for i in range(800)]
    raw = exchange(proxy, head(path, body, *many) + body)
    assert_refused(raw, path, 431, "max_header_bytes")
    assert fake.requests == []  # 1 MB headers used to be forwarded upstream


def test_a_megabyte_header_is_refused_without_reaching_the_upstream(
    fake: FakeProvider, proxy: ProxyProcess
) -> None:
    path = PATHS[0]
    with connect(proxy) as sock:
        with contextlib.suppress(OSError):  # the proxy may close before all of it is sent
            sock.sendall(head(path, b"", "x-pad: " + "c" * 1_000_000))
        with contextlib.suppress(ConnectionResetError):
            raw = read_until_closed(sock)
            if raw:
                assert_refused(raw, path, 431, "max_header_bytes")
    assert proxy.get("/health").json()["ok"] is True
    assert fake.requests == []


def test_max_header_bytes_is_configurable(
    fake: FakeProvider, start_proxy_process: StartProxyProcess
) -> None:
    proxy = start_proxy_process(fake.url + "/v1", config={"max_header_bytes": 4096})
    path = PATHS[1]
    body = body_for(path)
    raw = exchange(proxy, head(path, body, "x-pad: " + "d" * 5000) + body)
    assert_refused(raw, path, 431, "max_header_bytes (4096)")
    # Under the limit, with the body arriving in the same read as the head, all is served.
    with connect(proxy) as sock:
        sock.sendall(head(path, body, "x-pad: " + "d" * 3000) + body)
        status, _, _ = read_response(sock)
    assert status == 200
    assert fake.last.headers["x-pad"] == "d" * 3000


# ---- read timeouts ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_a_head_never_finished_is_a_408_and_closed(
    fake: FakeProvider, short_timeouts: ProxyProcess, path: str
) -> None:
    partial = head(path, body_for(path)).partition(b"\r\n\r\n")[0]  # no blank line
    raw = exchange(short_timeouts, partial)
    assert_refused(raw, path, 408, "header_timeout")
    assert fake.requests == []


def test_a_connection_that_sends_nothing_is_closed(short_timeouts: ProxyProcess) -> None:
    raw = exchange(short_timeouts, b"")
    assert_refused(raw, "/", 408, "header_timeout")


def test_a_kept_alive_connection_times_out_a_slow_second_head(
    fake: FakeProvider, short_timeouts: ProxyProcess
) -> None:
    path = PATHS[0]
    with connect(short_timeouts) as sock:
        sock.sendall(head(path, body_for(path)) + body_for(path))
        assert read_response(sock)[0] == 200
        sock.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\n")
        raw = read_until_closed(sock)
    assert_refused(raw, "/v1/messages", 408, "header_timeout")


@pytest.mark.parametrize("path", PATHS)
def test_a_body_never_finished_is_a_408_and_closed(
    fake: FakeProvider, start_proxy_process: StartProxyProcess, path: str
) -> None:
    short_timeouts = start_proxy_process(fake.url + "/v1", config=SHORT_TIMEOUTS)
    body = body_for(path)
    raw = exchange(short_timeouts, head(path, body) + body[:10])
    assert_refused(raw, path, 408, "body_timeout")
    assert fake.requests == []
    assert short_timeouts.get("/health").json()["ok"] is True
    assert "Traceback" not in short_timeouts.stop()


def test_half_sent_requests_do_not_pile_up(
    fake: FakeProvider, short_timeouts: ProxyProcess
) -> None:
    path = PATHS[0]
    body = body_for(path)
    socks = []
    try:
        for i in range(50):
            host, port = short_timeouts.url.removeprefix("http://").split(":")
            sock = socket.create_connection((host, int(port)), timeout=OUTER_BOUND)
            socks.append(sock)
            sock.sendall(head(path, body) + body[:5] if i % 2 else b"POST / HTTP/1.1\r\n")
        for sock in socks:
            assert read_until_closed(sock).startswith(b"HTTP/1.1 408 ")
    finally:
        for sock in socks:
            sock.close()


# ---- connection cap ---------------------------------------------------------------------------


def test_connections_past_max_connections_get_one_answer(
    fake: FakeProvider, start_proxy_process: StartProxyProcess
) -> None:
    proxy = start_proxy_process(
        fake.url + "/v1", config={"max_connections": 2, "header_timeout": 300}
    )
    health = b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
    with connect(proxy) as first, connect(proxy) as second:
        for sock in (first, second):  # both served, and kept open
            sock.sendall(health)
            assert read_response(sock)[0] == 200
        for path, status in (("/v1/chat/completions", 503), ("/v1/messages", 529)):
            body = body_for(path)
            raw = exchange(proxy, head(path, body) + body)
            headers = assert_refused(raw, path, status, "max_connections")
            assert int(headers["retry-after"]) >= 1
        assert fake.requests == []
    # Once those two are gone, a new connection is served again.
    deadline = time.monotonic() + OUTER_BOUND
    while True:
        path = PATHS[0]
        with connect(proxy) as sock:
            sock.sendall(head(path, body_for(path)) + body_for(path))
            if read_response(sock)[0] == 200:
                break
        assert time.monotonic() < deadline, "the closed connections were never released"
