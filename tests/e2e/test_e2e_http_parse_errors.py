"""Requests the proxy cannot read at the HTTP level, sent as raw bytes to the real proxy
process: what uvicorn's parser (httptools) refuses, a request target past max_header_bytes,
and heads asking for what the proxy does not do. Each is answered with an error object the
real SDKs parse (their own status-error construction, fed the proxy's bytes), in the dialect
of the request's path, with ``connection: close``; nothing reaches the upstream; and the next
connection is served. uvicorn alone answers the parser's refusals with a plain-text
``400 Invalid HTTP request received.`` and serves the unsupported heads."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import anthropic
import httpx
import openai
import pytest
import websockets
import websockets.sync.client

from tests.conftest import ProxyProcess, proxy_argv, proxy_env
from tests.e2e.test_e2e_http_limits import (
    body_for,
    connect,
    exchange,
    head,
    parse_head,
    read_response,
    read_until_closed,
)
from tests.fakeprovider import FakeProvider

PATHS = ["/v1/chat/completions", "/v1/messages", "/v1/responses"]
MAX_HEADER_BYTES = 4096


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeProvider, ProxyProcess]]:
    """One proxy process for the module: every case closes its own connection."""
    fake = FakeProvider().start()
    tmp = tmp_path_factory.mktemp("parse-errors")
    config = {"mode": "passthrough", "max_header_bytes": MAX_HEADER_BYTES}
    argv = proxy_argv(tmp, fake.url + "/v1", (), config)
    proxy = ProxyProcess(argv, proxy_env(SKILLSTATE_API_KEY="sk-upstream"), tmp)
    try:
        yield fake, proxy
    finally:
        proxy.stop()
        fake.stop()


def sdk_error(raw: bytes, path: str) -> openai.APIStatusError | anthropic.APIStatusError:
    """The proxy's answer as the error the client's SDK raises for it."""
    raw_head, _, body = raw.partition(b"\r\n\r\n")
    status, headers = parse_head(raw_head)
    request = httpx.Request("POST", "http://proxy" + path)
    response = httpx.Response(status, headers=headers, content=body, request=request)
    if path == "/v1/messages":
        return anthropic.Anthropic(api_key="x")._make_status_error_from_response(response)
    return openai.OpenAI(api_key="x")._make_status_error_from_response(response)


def assert_refused_json(raw: bytes, path: str, status: int, code: str, words: str) -> None:
    """``status``, ``connection: close``, and an error object the SDK of ``path`` reads:
    Anthropic's for /v1/messages (its type), OpenAI's otherwise (its code)."""
    raw_head, _, _ = raw.partition(b"\r\n\r\n")
    got, headers = parse_head(raw_head)
    assert got == status, raw[:400]
    assert headers["content-type"] == "application/json", raw[:400]
    assert headers["connection"] == "close"
    err = sdk_error(raw, path)
    assert err.status_code == status
    assert isinstance(err.body, dict), raw[:400]
    if isinstance(err, anthropic.APIStatusError):
        too_large = status in (413, 414)
        assert err.type == ("request_too_large" if too_large else "invalid_request_error")
        assert words in err.body["error"]["message"], err.body
    else:
        assert (err.type, err.code) == ("invalid_request_error", code), err.body
        assert words in err.message, err.body


def assert_still_served(fake: FakeProvider, proxy: ProxyProcess, path: str) -> None:
    """A request on a new connection is answered, and reaches the upstream."""
    sent = len(fake.requests)
    with connect(proxy) as sock:
        sock.sendall(head(path, body_for_path(path)) + body_for_path(path))
        status, _, _ = read_response(sock)
    assert status == 200
    assert len(fake.requests) == sent + 1


def body_for_path(path: str) -> bytes:
    return b'{"model": "m", "input": "hi"}' if path == "/v1/responses" else body_for(path)


def chunked(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


def request(
    path: str, *extra: str, body: bytes = b"{}", length: bool = True, line: str = ""
) -> bytes:
    """A request with ``extra`` header lines; ``line``: its request line instead."""
    lines = [line or f"POST {path} HTTP/1.1", "host: 127.0.0.1", "content-type: application/json"]
    lines += [f"content-length: {len(body)}"] if length else []
    return ("\r\n".join([*lines, *extra]) + "\r\n\r\n").encode("latin-1") + body


Case = tuple[Callable[[str], bytes], int, str, str]  # bytes for a path, status, code, words
BAD = "invalid_http_request"
CASES: dict[str, Case] = {
    "control character in a header value": (
        lambda p: request(p, "x-note: a\x01b"),
        400,
        BAD,
        "Invalid header value char",
    ),
    "bad chunk size": (
        lambda p: request(
            p, "transfer-encoding: chunked", body=b"zz\r\n{}\r\n0\r\n\r\n", length=False
        ),
        400,
        BAD,
        "Invalid character in chunk size",
    ),
    "chunk size past any limit": (
        lambda p: request(p, "transfer-encoding: chunked", body=b"f" * 24 + b"\r\n", length=False),
        413,
        "request_too_large",
        "Chunk size overflow",
    ),
    "bad content-length": (
        lambda p: request(p, "content-length: 12a", length=False),
        400,
        BAD,
        "Invalid character in Content-Length",
    ),
    "content-length past any limit": (
        lambda p: request(p, "content-length: " + "9" * 30, length=False),
        413,
        "request_too_large",
        "Content-Length overflow",
    ),
    "content-length twice": (
        lambda p: request(p, "content-length: 2"),
        400,
        BAD,
        "Duplicate Content-Length",
    ),
    "content-length with transfer-encoding": (
        lambda p: request(p, "transfer-encoding: chunked"),
        400,
        BAD,
        "Transfer-Encoding can't be present with Content-Length",
    ),
    "invalid method": (
        lambda p: request(p, line=f"FETCH {p} HTTP/1.1"),
        400,
        BAD,
        "Invalid method encountered",
    ),
    "non-ASCII in the target": (
        lambda p: request(p, line=f"POST {p}?q=caf\xe9 HTTP/1.1"),
        400,
        BAD,
        "Invalid char in url query",
    ),
    "folded header": (
        lambda p: request(p, "x-note: a\r\n  b"),
        400,
        BAD,
        "Unexpected whitespace after header value",
    ),
    "request target past max_header_bytes": (
        lambda p: request(p, line=f"POST {p}?{'a' * MAX_HEADER_BYTES} HTTP/1.1"),
        414,
        "uri_too_long",
        f"request target exceeds max_header_bytes ({MAX_HEADER_BYTES})",
    ),
    "HTTP/0.9": (
        lambda p: f"GET {p}\r\n\r\n".encode(),
        505,
        "http_version_not_supported",
        "HTTP/0.9",
    ),
    "HTTP/2.0 request line": (
        lambda p: request(p, line=f"POST {p} HTTP/2.0"),
        505,
        "http_version_not_supported",
        "HTTP/2.0 is not supported",
    ),
    "unsupported expect": (
        lambda p: request(p, "expect: 200-ok"),
        417,
        "expectation_failed",
        "expect '200-ok' is not supported",
    ),
    "unknown transfer-encoding": (
        lambda p: request(p, "transfer-encoding: gzip, chunked", body=chunked(b"{}"), length=False),
        501,
        "not_implemented",
        "transfer-encoding 'gzip, chunked' is not supported",
    ),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", list(CASES))
def test_a_request_the_proxy_cannot_read_is_a_json_error_in_the_paths_dialect(
    served: tuple[FakeProvider, ProxyProcess], case: str, path: str
) -> None:
    fake, proxy = served
    build, status, code, words = CASES[case]
    sent = len(fake.requests)
    assert_refused_json(exchange(proxy, build(path)), path, status, code, words)
    assert len(fake.requests) == sent  # nothing reached the upstream
    assert_still_served(fake, proxy, path)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "HTTP/2 is not served here"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40), "Invalid method"),  # TLS
        (b"SSH-2.0-OpenSSH_9.6\r\n", "Invalid method"),
        (b"CONNECT example.com:443 HTTP/1.1\r\nhost: example.com\r\n\r\n", "not a path"),
    ],
    ids=["http2-preface", "tls-hello", "ssh", "connect"],
)
def test_bytes_that_are_not_an_http_request_to_the_proxy_are_an_openai_error(
    served: tuple[FakeProvider, ProxyProcess], data: bytes, words: str
) -> None:
    fake, proxy = served
    raw = exchange(proxy, data)
    # No route to read a dialect from: OpenAI's, as for every other unrouted error.
    assert_refused_json(raw, "/", 400, BAD, words)
    assert_still_served(fake, proxy, PATHS[0])


@pytest.mark.parametrize("path", PATHS)
def test_bytes_after_a_body_are_refused_after_its_answer(
    served: tuple[FakeProvider, ProxyProcess], path: str
) -> None:
    """A body longer than its content-length: the rest is read as the next request. The
    request is answered first (uvicorn cut its answer with its 400), then the rest refused
    in the dialect of the connection's request."""
    fake, proxy = served
    body = body_for_path(path)
    sent = len(fake.requests)
    with connect(proxy) as sock:
        sock.sendall(head(path, body) + body + b"GARBAGE\r\n\r\n")
        raw = read_until_closed(sock)
    answer_head, _, rest = raw.partition(b"\r\n\r\n")
    status, headers = parse_head(answer_head)
    assert status == 200, raw[:400]
    answer, refusal = rest[: int(headers["content-length"])], rest[int(headers["content-length"]) :]
    assert json.loads(answer)["id"]  # the whole answer, then the refusal
    assert len(fake.requests) == sent + 1
    assert_refused_json(refusal, path, 400, BAD, "Invalid method encountered")


@pytest.mark.parametrize("path", PATHS)
def test_what_the_head_checks_let_through_is_served(
    served: tuple[FakeProvider, ProxyProcess], path: str
) -> None:
    """The checks refuse only what the proxy cannot serve: a chunked body (the coding's name
    in any case), ``expect: 100-continue`` and HTTP/1.0 are answered."""
    fake, proxy = served
    body = body_for_path(path)
    sent = len(fake.requests)
    close = "connection: close"
    te = "transfer-encoding: Chunked"
    raw = exchange(proxy, request(path, te, close, body=chunked(body), length=False))
    assert raw.startswith(b"HTTP/1.1 200 "), raw[:300]
    raw = exchange(proxy, request(path, "expect: 100-continue", close, body=body))
    assert raw.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 "), raw[:300]
    raw = exchange(proxy, request(path, body=body, line=f"POST {path} HTTP/1.0"))
    assert raw.startswith(b"HTTP/1.1 200 "), raw[:300]
    assert len(fake.requests) == sent + 3


def handshake(path: str, *extra: str) -> bytes:
    """A WebSocket opening handshake (RFC 6455 4.1) for ``path``."""
    lines = [
        f"GET {path} HTTP/1.1",
        "host: 127.0.0.1",
        "upgrade: websocket",
        "connection: Upgrade",
        "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==",
        "sec-websocket-version: 13",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.parametrize("path", PATHS)
def test_a_websocket_handshake_is_a_426_that_says_so_in_the_paths_dialect(
    served: tuple[FakeProvider, ProxyProcess], path: str
) -> None:
    """Codex's Responses WebSocket transport (and any WebSocket client) gets an error object
    saying the proxy serves HTTP only, not uvicorn's empty 403; nothing reaches the upstream.
    The real ``websockets`` client sees the same 426 and its JSON body."""
    fake, proxy = served
    sent = len(fake.requests)
    words = "WebSocket is not supported by this proxy"
    extra = ("anthropic-version: 2023-06-01",) if path == "/v1/messages" else ()
    raw = exchange(proxy, handshake(path, *extra))
    assert_refused_json(raw, path, 426, "websocket_not_supported", words)
    url = proxy.url.replace("http://", "ws://") + path
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        websockets.sync.client.connect(url, open_timeout=10).close()
    assert refused.value.response.status_code == 426
    assert words in json.loads(refused.value.response.body)["error"]["message"]
    assert len(fake.requests) == sent
    assert_still_served(fake, proxy, path)


def test_another_upgrade_is_served_over_http_1_1(
    served: tuple[FakeProvider, ProxyProcess],
) -> None:
    """``upgrade: h2c`` is not a WebSocket handshake: the request is answered over HTTP/1.1
    (RFC 9110 7.8 lets a server ignore the upgrade)."""
    _, proxy = served
    lines = ["GET /v1/models HTTP/1.1", "host: 127.0.0.1", "connection: Upgrade, close"]
    raw = exchange(proxy, ("\r\n".join([*lines, "upgrade: h2c"]) + "\r\n\r\n").encode())
    assert raw.startswith(b"HTTP/1.1 200 "), raw[:300]


@pytest.mark.parametrize("split", [False, True], ids=["one-write", "body-after-head"])
def test_a_post_with_another_upgrade_keeps_its_body(
    served: tuple[FakeProvider, ProxyProcess], split: bool
) -> None:
    """``upgrade: h2c`` on a POST (curl --http2 on http://): the request is served over
    HTTP/1.1 with its body, which reaches the upstream whole, whether it came with the head
    or after it."""
    fake, proxy = served
    fake.reset()
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "h2c body"}]})
    request_head = "\r\n".join([
        "POST /v1/chat/completions HTTP/1.1", "host: 127.0.0.1",
        "connection: Upgrade, HTTP2-Settings, close", "upgrade: h2c",
        "http2-settings: AAMAAABkAAQAAP__", "content-type: application/json",
        "authorization: Bearer sk", f"content-length: {len(body)}",
    ]) + "\r\n\r\n"  # fmt: skip
    with connect(proxy) as sock:
        sock.sendall(request_head.encode() if split else (request_head + body).encode())
        if split:
            sock.sendall(body.encode())
        raw = read_until_closed(sock)
    assert raw.startswith(b"HTTP/1.1 200 "), raw[:300]
    (sent,) = fake.requests
    assert sent.json["messages"] == [{"role": "user", "content": "h2c body"}]


@pytest.mark.parametrize(
    ("data", "path"),
    [
        (b"GET /\r\n", "/"),
        (b"GET /v1/messages\n", "/v1/messages"),
        (b"\r\nGET /v1/responses\r\n", "/v1/responses"),
        (b"POST /v1/chat/completions\r\nhost: 127.0.0.1\r\n", "/v1/chat/completions"),
    ],
    ids=["http-0.9", "bare-newline", "leading-empty-line", "header-after-no-version"],
)
def test_a_request_line_without_a_version_is_a_505_without_waiting_for_headers(
    served: tuple[FakeProvider, ProxyProcess], data: bytes, path: str
) -> None:
    """HTTP/0.9's request line has no version and no headers follow it: llhttp reads it as a
    head still being sent, which waited out header_timeout (10 s) for a 408. It is answered
    as soon as the line ends, in the path's dialect, and the connection is closed."""
    fake, proxy = served
    raw = exchange(proxy, data)
    words = "HTTP/0.9 is not supported"
    assert_refused_json(raw, path, 505, "http_version_not_supported", words)
    assert_still_served(fake, proxy, PATHS[0])


def test_a_flood_of_refused_requests_is_a_line_and_a_count_in_the_log(
    fake: FakeProvider, start_proxy_process: Callable[..., ProxyProcess]
) -> None:
    """uvicorn wrote "Invalid HTTP request received." for every request its parser refused
    (and, for an upgrade it did not do, a hint to install a WebSocket library): 40 bad
    requests were 40 lines. The first refusal is a line that says what was refused; the
    others are counted into one line a minute, and what the last minute counted is written
    when the proxy stops (before, a stop within the minute lost the count)."""
    proxy = start_proxy_process(fake.url + "/v1", config={"mode": "passthrough"})
    for _ in range(40):
        raw = exchange(proxy, request(PATHS[0], "x-note: a\x01b"))
        assert raw.startswith(b"HTTP/1.1 400 "), raw[:200]
    assert exchange(proxy, handshake(PATHS[2])).startswith(b"HTTP/1.1 426 ")
    log = proxy.stop()
    refused = [line for line in log.splitlines() if "refused" in line.lower()]
    first = "HTTP request refused: 400 invalid_http_request: invalid HTTP request:"
    assert len(refused) == 2 and first in refused[0], log
    counted = "40 more before shutdown (39 x 400 invalid_http_request, 1 x 426 websocket"
    assert refused[1].startswith("HTTP requests refused: " + counted), log
    for misleading in ("Invalid HTTP request received", "pip install", "Unsupported upgrade"):
        assert misleading not in log
