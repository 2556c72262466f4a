"""What the proxy answers for a request it cannot or will not read at the HTTP level: bytes
uvicorn's parser (httptools, i.e. llhttp) refuses, and heads that ask for what the proxy does
not do. uvicorn answers the first with ``400 Invalid HTTP request received.`` in plain text,
which neither SDK can read, and serves the second as if the ask were not there. Here each is a
:class:`ProxyError` that ``LimitedHttpToolsProtocol`` writes as an error object in the
dialect of the request's path (``httplimits``), then closes the connection."""

from __future__ import annotations

import asyncio
import logging
import operator
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import httptools

from ..errors import ProxyError

__all__ = [
    "RefusalLog",
    "parse_refusal",
    "request_line_hints",
    "unsupported_head",
    "uvicorn_log",
    "versionless_request_line",
    "websocket_refusal",
]

log = logging.getLogger("skillstate")

# llhttp's reasons (httptools' HttpParserError text) that name a size past any limit.
_TOO_LARGE = frozenset({"Content-Length overflow", "Chunk size overflow"})
# llhttp's reason for "PRI * HTTP/2.0", the preface of HTTP/2 with prior knowledge.
_HTTP2_PREFACE = "Pause on PRI/Upgrade"
_HTTP_VERSIONS = frozenset({"1.1", "1.0"})
# The headers unsupported_head reads.
_ASKING = frozenset({b"expect", b"transfer-encoding", b"upgrade"})
_NAME = operator.itemgetter(0)
# A target's path as far as it can be read: up to its query, or a byte no target may hold.
_PATH_PREFIX = re.compile(rb"[\x21-\x3e\x40-\x7e]*")


def parse_refusal(exc: BaseException | None) -> ProxyError:
    """The answer to a request httptools refused with ``exc``: llhttp's reason, which names
    what is wrong ("Invalid header value char", "Duplicate Content-Length", "Transfer-Encoding
    can't be present with Content-Length", "Invalid method encountered", ...)."""
    reason = str(exc) if isinstance(exc, httptools.HttpParserError) else ""
    if isinstance(exc, httptools.HttpParserCallbackError):
        # uvicorn's own reading of the head failed; the one client error that does this is a
        # target that is no path (CONNECT's host:port).
        bad_target = isinstance(exc.__context__, httptools.HttpParserInvalidURLError)
        reason = "the request target is not a path" if bad_target else ""
    if reason in _TOO_LARGE:
        return ProxyError("request_too_large", f"request too large: {reason}")
    if reason == _HTTP2_PREFACE:
        reason = "HTTP/2 is not served here; send HTTP/1.1"
    message = f"invalid HTTP request: {reason}" if reason else "invalid HTTP request"
    return ProxyError("invalid_request", message, code="invalid_http_request")


def unsupported_head(
    http_version: str, headers: Sequence[tuple[bytes, bytes]]
) -> ProxyError | None:
    """A parsed head that asks for what the proxy does not do, or None: an HTTP version other
    than 1.0 and 1.1 (llhttp reads "HTTP/2.0" and HTTP/0.9 request lines as heads), an
    ``expect`` other than ``100-continue`` (RFC 9110 10.1.1: 417), a transfer coding other
    than one ``chunked`` (RFC 9112 6.1: 501; llhttp refuses one that does not end in
    ``chunked``, and would decode ``gzip, chunked`` as chunked only), a WebSocket handshake
    (``upgrade: websocket``; 426: the proxy serves HTTP only). Another upgrade (``h2c``) is
    not refused: the request is served over HTTP/1.1, as RFC 9110 7.8 lets a server do."""
    if http_version not in _HTTP_VERSIONS:
        return ProxyError(
            "invalid_request",
            f"HTTP/{http_version} is not supported; send HTTP/1.1",
            status=505,
            code="http_version_not_supported",
        )
    if _ASKING.isdisjoint(map(_NAME, headers)):
        return None  # nearly every request, at C speed (a loop in Python took 1.5x as long)
    codings: list[bytes] = []
    for name, value in headers:
        if name == b"expect" and value.lower() != b"100-continue":
            return ProxyError(
                "invalid_request",
                f"expect {_text(value)!r} is not supported (only 100-continue)",
                status=417,
                code="expectation_failed",
            )
        if name == b"transfer-encoding":
            codings += (c.strip().lower() for c in value.split(b","))
        if name == b"upgrade" and b"websocket" in value.lower():
            return websocket_refusal()
    if codings and codings != [b"chunked"]:
        return ProxyError(
            "invalid_request",
            f"transfer-encoding {_text(b', '.join(codings))!r} is not supported (only chunked)",
            status=501,
            code="not_implemented",
        )
    return None


def websocket_refusal() -> ProxyError:
    """The answer to a WebSocket handshake (such as the Responses API's WebSocket transport,
    ``OpenAI-Beta: responses_websockets=...``): 426, the request must be made over another
    protocol, here plain HTTP."""
    return ProxyError(
        "invalid_request",
        "WebSocket is not supported by this proxy: send the request over HTTP (POST, with"
        ' "stream": true for server-sent events)',
        status=426,
        code="websocket_not_supported",
    )


def versionless_request_line(version: str, url: bytes, read: bytes, began: bool) -> bool:
    """Whether a head still incomplete after ``read`` has a request line without an HTTP
    version (HTTP/0.9's ``GET /``, which has no headers): llhttp reads it as a request whose
    headers are still to come, and it would wait out ``header_timeout``. Its version reads
    "0.9" once a header line follows, "0.0" while none has, which a request line still being
    read also reads: that one has not ended (no newline after its target; ``began``: this read
    began the head, whose leading empty lines llhttp skips)."""
    if version == "0.9":
        return True
    if version != "0.0" or not url:
        return False
    return b"\n" in (read.lstrip(b"\r\n") if began else read)


def request_line_hints(head: bytes) -> tuple[str, bool]:
    """The path of the request line that starts ``head``, and whether an
    ``anthropic-version`` header follows: what a refusal's dialect is chosen by when the parser
    stopped before the target (an invalid method, a byte a target may not hold)."""
    parts = head.split(b" ", 2)
    target = parts[1] if len(parts) > 1 else b""
    path = _PATH_PREFIX.match(target)
    return _text(path[0] if path else b""), b"\nanthropic-version:" in head.lower()


def _text(raw: bytes) -> str:
    return raw.decode("latin-1")


# uvicorn's warning for each request its parser refuses (httptools_impl.data_received).
_PARSER_WARNING = "Invalid HTTP request received."


class _UvicornLog:
    """uvicorn's error logger without its line per refused request: ``RefusalLog`` says
    what was refused, a few lines a minute however many were."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)

    def warning(self, msg: object, *args: Any, **kwargs: Any) -> None:
        if msg != _PARSER_WARNING:
            self._logger.warning(msg, *args, **kwargs)


uvicorn_log = _UvicornLog(logging.getLogger("uvicorn.error"))


class RefusalLog:
    """The log of the requests refused at the HTTP level: the first one is a line of its
    own; those that follow within ``interval`` seconds are counted by status and code and
    written as one line when it ends (and the next interval counts on, while refusals keep
    coming), or when the server stops first (``flush``). A flood of bad requests is one line
    a minute, not one line per request."""

    def __init__(self, interval: float = 60.0) -> None:
        self.interval = interval
        self._counts: Counter[str] = Counter()
        self._timer: asyncio.TimerHandle | None = None

    def note(self, err: ProxyError, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._counts[f"{err.status} {err.code}"] += 1
            return
        log.warning("HTTP request refused: %d %s: %s", err.status, err.code, err.message)
        self._timer = loop.call_later(self.interval, self._summary, loop)

    def _summary(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        if not self._counts:
            return
        self._write(f"in the last {self.interval:g} s")
        self._timer = loop.call_later(self.interval, self._summary, loop)

    def flush(self) -> None:
        """The server stops: what was counted since the last line is written now (its
        line would have come at the end of the interval, which the stop cuts short)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._counts:
            self._write("before shutdown")

    def _write(self, when: str) -> None:
        total = sum(self._counts.values())
        kinds = ", ".join(f"{n} x {kind}" for kind, n in self._counts.most_common())
        log.warning("HTTP requests refused: %d more %s (%s)", total, when, kinds)
        self._counts.clear()
