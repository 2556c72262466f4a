"""HTTP/1.1 limits uvicorn does not enforce: header bytes, header and body read time, and the
number of open connections.

uvicorn's httptools protocol buffers a request head of any size (1 MB and 8 MB headers were
forwarded upstream), never times out a connection that is sending its head or body (1,100
half-sent requests stayed open), and has no connection cap: ``limit_concurrency`` only
answers 503 (text/plain, and counting the asking connection against the limit) while any
number of connections stay open. Its h11 protocol bounds a head (``h11_max_incomplete_event
_size``, answered 400, not 431) but has no read timeouts either, and parses in pure Python on
every request. So this is uvicorn's httptools protocol with the missing limits added, where
the bytes arrive, before httptools buffers them:

* **Header bytes** (``max_header_bytes``): bytes fed to the parser while a head is
  incomplete are counted; a head still incomplete once the budget is spent is answered
  ``431`` and the connection closed. The budget restarts when a request's message ends, so
  a pipelined head that starts in the same read as the previous request's end may exceed it
  by at most that one read.
* **Header read time** (``header_timeout``): from the connection's start, and from the first
  byte of each later request, to the end of its head; else ``408`` and close. (Idle time
  between requests is uvicorn's keep-alive timeout.)
* **Body read time** (``body_timeout``): from the end of the head to the end of the body;
  else ``408`` and close. The handler waiting for the body then sees the client gone.
* **Connections** (``max_connections``): a connection beyond the cap is served one answer,
  ``503`` (Anthropic clients: ``529``) with ``retry-after``, and closed.
* **Requests it cannot read** (``httprefusals``): what httptools refuses (``400``, or
  ``413`` for a size past any limit), a request target past ``max_header_bytes`` (``414``),
  and a head asking for what the proxy does not do (``505``, ``417``, ``501``, and ``426``
  for a WebSocket handshake), instead of uvicorn's plain-text ``400 Invalid HTTP request
  received.`` (and, for a handshake, the empty ``403`` its WebSocket protocol answers when
  no route takes it).

An upgrade other than WebSocket (``upgrade: h2c``, as curl's ``--http2`` sends on ``http://``)
is ignored, as RFC 9110 7.8 allows: httptools takes such a request as having no body and stops
at its head, so the head is parsed again without its ``upgrade`` header (``without_upgrade``)
and the request served over HTTP/1.1 with its body.

A request line without an HTTP version (HTTP/0.9's ``GET /``), which llhttp reads as a head
whose headers are still to come, is answered ``505`` as soon as the line ends, not after
``header_timeout``. Refusals are logged by ``httprefusals.RefusalLog`` (the first, then one
line a minute counting the others), instead of uvicorn's warning line per refused request.

Answers are error objects in the dialect of the request's path, and close the connection. A
request refused while an earlier one on the connection is still being answered (bytes past a
body's ``content-length``, pipelined) is refused after that answer, which it used to cut. Cost
on the common path, where a request arrives in one read: a few comparisons per read, one timer
per connection, one look at the head's version and headers per request.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from ..errors import ProxyError
from ..web.wire import CONNECTION_LOST, dialect_for, error_response
from .httprefusals import (
    RefusalLog,
    parse_refusal,
    request_line_hints,
    unsupported_head,
    uvicorn_log,
    versionless_request_line,
)

__all__ = ["HttpLimits", "limited_protocol"]


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_header_bytes: int
    header_timeout: float
    body_timeout: float
    max_connections: int


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with ``limits`` enforced (see the module docstring)."""

    limits: ClassVar[HttpLimits]
    refusals: ClassVar[RefusalLog]  # the server's log of what its connections refused

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.logger = uvicorn_log  # type: ignore[assignment]  # without a line per refusal
        self.head_left: int | None = self.limits.max_header_bytes  # None: not reading a head
        self.body_done = True  # the last request's body has been read to its end
        self.read_timer: asyncio.TimerHandle | None = None
        # The answer to a request refused while an earlier one is still being answered.
        self.refusal: bytes | None = None
        self.head_refusal: ProxyError | None = None  # a parsed head's (unsupported_head)
        self.read = b""  # the read being parsed, for a refusal's dialect (_dialect)
        # The reads of the head being parsed (a list: no copy on the common path), to parse
        # it again without an upgrade it asks for (``_parse_without_upgrade``).
        self.head_reads: list[bytes] = []
        self.unupgraded: bytes | None = None  # a head to parse again so (on_headers_complete)
        # Done when the connection is lost: every request's scope carries it
        # (``web.wire.CONNECTION_LOST``), so a handler learns of a client gone without a
        # task of its own waiting on ``receive``.
        self.lost: asyncio.Future[None] = self.loop.create_future()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self.app = _over_capacity  # this connection gets one answer, then closes
        self._arm(self.limits.header_timeout, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
        if not self.lost.done():
            self.lost.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.refusal is not None:
            return  # what follows a refused request is not read
        left = self.head_left
        if left is not None:
            if len(data) > left:
                self._feed_past_head_budget(data, left)
                return
            self.head_left = left - len(data)
            self.head_reads.append(data)
        self.read = data
        super().data_received(data)
        if self.head_left is not None and self.head_left < self.limits.max_header_bytes:
            self._refuse_a_versionless_head()  # a head begun and not ended: rare
        self.read = b""
        self._arm_for_what_is_missing()

    def _refuse_a_versionless_head(self) -> None:
        """An HTTP/0.9 request line (``GET /``) is answered now, not after header_timeout."""
        version, url = self.parser.get_http_version(), getattr(self, "url", b"")
        began = self.head_left == self.limits.max_header_bytes - len(self.read)
        if versionless_request_line(version, url, self.read, began):
            refusal = unsupported_head("0.9", ())
            assert refusal is not None
            self._refuse(refusal)

    def _feed_past_head_budget(self, data: bytes, left: int) -> None:
        # Feed what the budget allows: if the head ends within it, the rest is body (or the
        # next request) and goes on; otherwise the head is too large.
        if left:
            self.head_reads.append(data[:left])
            super().data_received(data[:left])
        if self._refused():
            return
        if self.head_left is not None:
            self._refuse(self._head_too_large())
            return
        super().data_received(data[left:])
        self._arm_for_what_is_missing()

    def _head_too_large(self) -> ProxyError:
        limit = self.limits.max_header_bytes
        if not self.headers and self.parser.get_http_version() == "0.0":  # no version yet
            return ProxyError(
                "request_too_large",
                f"request target exceeds max_header_bytes ({limit})",
                status=414,
                code="uri_too_long",
            )
        return ProxyError(
            "request_too_large",
            f"request headers exceed max_header_bytes ({limit})",
            status=431,
            code="request_header_fields_too_large",
        )

    def on_headers_complete(self) -> None:
        self.head_left = None
        self._disarm()
        refusal = unsupported_head(self.parser.get_http_version(), self.headers)
        if refusal is not None:
            # Raising stops the parser before the body; uvicorn answers the parser error
            # through send_400_response, which answers this instead.
            self.head_refusal = refusal
            raise refusal
        reads, self.head_reads = self.head_reads, []
        if self.parser.should_upgrade() and self.parser.get_method() != b"CONNECT":
            # An upgrade the proxy does not do (h2c; a WebSocket handshake was refused
            # above): httptools would take the request as having no body and drop the
            # bytes after the head. Raising stops the parser here; send_400_response then
            # parses the head again without its upgrade, and the request is served over
            # HTTP/1.1 with its body (RFC 9110 7.8 lets a server ignore an upgrade).
            self.unupgraded = without_upgrade(b"".join(reads), self.parser.get_method(), self.url)
            if self.unupgraded is not None:
                raise _Reparse
        self.body_done = False
        self.scope[CONNECTION_LOST] = self.lost  # type: ignore[literal-required]
        super().on_headers_complete()

    def _unsupported_upgrade_warning(self) -> None:
        # uvicorn's, for an upgrade it does not do: "Unsupported upgrade request." and, the
        # proxy running without a WebSocket protocol (``ws="none"``), a hint to install one.
        # A WebSocket handshake never gets here (``unsupported_head`` refuses it: 426), and
        # another upgrade (h2c) is served over HTTP/1.1: nothing to warn about.
        return

    def send_400_response(self, msg: str) -> None:
        # uvicorn calls this in its ``except httptools.HttpParserError`` around the parser
        # (0.29 to 0.55), so the error being handled is the parser's.
        if self.unupgraded is not None:
            self._parse_without_upgrade(self.unupgraded)
            return
        self._refuse(self.head_refusal or parse_refusal(sys.exc_info()[1]))

    def _parse_without_upgrade(self, data: bytes) -> None:
        """Parse the request again from its head, its ``upgrade`` header left out, with a
        new parser (the old one stopped in error), and what followed the head."""
        self.unupgraded = None
        self.parser = httptools.HttpRequestParser(self)
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)  # as uvicorn's
        self.head_left = self.limits.max_header_bytes
        HttpToolsProtocol.data_received(self, data)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.refusal is not None and self.cycle.response_complete:
            self._send_and_close(self.refusal)

    def on_message_complete(self) -> None:
        self.head_reads = []
        self.head_left = self.limits.max_header_bytes
        self.body_done = True
        self._disarm()
        super().on_message_complete()

    # ---- read timers ---------------------------------------------------------------------

    def _arm_for_what_is_missing(self) -> None:
        """After a read: time the head or the body still being read (one timer at a time)."""
        if self.read_timer is not None or self._refused():
            return
        if self.head_left is not None:
            if self.head_left < self.limits.max_header_bytes:  # a head has begun
                self._arm(self.limits.header_timeout, self._head_timed_out)
        elif not self.body_done:
            self._arm(self.limits.body_timeout, self._body_timed_out)

    def _arm(self, delay: float, callback: Any) -> None:
        self._disarm()
        self.read_timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self.read_timer is not None:
            self.read_timer.cancel()
            self.read_timer = None

    def _head_timed_out(self) -> None:
        self.read_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False  # an answer is still being sent: close after it
            return
        self._refuse(
            ProxyError(
                "timeout",
                f"request headers not received within header_timeout "
                f"({self.limits.header_timeout:g} s)",
                status=408,
                code="request_timeout",
            ),
        )

    def _body_timed_out(self) -> None:
        self.read_timer = None
        err = ProxyError(
            "timeout",
            f"request body not received within body_timeout ({self.limits.body_timeout:g} s)",
            status=408,
            code="request_timeout",
        )
        if self.cycle is not None and self.cycle.response_started:
            self.transport.close()  # too late for an answer of our own
        else:
            self._refuse(err)

    # ---- answers written before (or instead of) the app's ----------------------------------

    def _refused(self) -> bool:
        return self.refusal is not None or self.transport.is_closing()

    def _refuse(self, err: ProxyError) -> None:
        """Answer ``err`` in the dialect of the request's path and close the connection; once
        the answers in progress are out when the refused request came after them."""
        if self._refused():
            return
        self.refusals.note(err, self.loop)
        response = error_response(err, self._dialect())
        status, body = response.status_code, bytes(response.body)
        answer = b"".join(
            [
                STATUS_LINE[status],
                b"content-type: application/json\r\n",
                b"content-length: %d\r\n" % len(body),
                b"connection: close\r\n\r\n",
                body,
            ]
        )
        if self.body_done and self.cycle is not None and not self.cycle.response_complete:
            self.refusal = answer  # on_response_complete sends it after the last answer
            self._disarm()
            return
        self._send_and_close(answer)

    def _send_and_close(self, answer: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(answer)
            self.transport.close()

    def _dialect(self) -> str:
        """The refused request's dialect, from what the parser read of its target and
        headers; before its target, from the request line in the read that began it; else
        the connection's last request's."""
        # The head may be partial, or not begun (no url attribute before the first byte).
        url: bytes = getattr(self, "url", b"")
        if url:
            path = url.partition(b"?")[0].decode("latin-1")
            anthropic_version = any(name == b"anthropic-version" for name, _ in self.headers)
        elif self.read and self.head_left == self.limits.max_header_bytes - len(self.read):
            path, anthropic_version = request_line_hints(self.read)
        elif self.cycle is not None:
            scope = self.cycle.scope
            path = scope["path"]
            anthropic_version = any(name == b"anthropic-version" for name, _ in scope["headers"])
        else:
            path, anthropic_version = "", False
        return dialect_for(path, anthropic_version)


async def _over_capacity(scope: Any, receive: Any, send: Any) -> None:
    err = ProxyError(
        "overloaded", "the proxy is at max_connections; retry shortly", retry_after=1.0
    )
    anthropic_version = any(name == b"anthropic-version" for name, _ in scope["headers"])
    response = error_response(
        err, dialect_for(scope["path"], anthropic_version), {"connection": "close"}
    )
    await response(scope, receive, send)


class _Reparse(Exception):
    """Stops the parser at a head to parse again without its upgrade."""


def without_upgrade(read: bytes, method: bytes, url: bytes) -> bytes | None:
    """``read`` (a request's head and what followed it) with the head's ``upgrade`` header
    left out, so that no parser takes it for an upgrade; None when ``read`` does not hold the
    request's head from its request line (a pipelined head that began in the read that
    ended the previous request: its reads were not kept)."""
    head, sep, rest = read.lstrip(b"\r\n").partition(b"\r\n\r\n")
    if not sep or not head.startswith(method + b" " + url + b" "):
        return None
    lines = [line for line in head.split(b"\r\n") if line[:8].lower() != b"upgrade:"]
    return b"\r\n".join(lines) + sep + rest


def limited_protocol(limits: HttpLimits) -> type[LimitedHttpToolsProtocol]:
    """The protocol class for uvicorn's ``http`` setting, bound to ``limits``."""
    bound = {"limits": limits, "refusals": RefusalLog()}
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), bound)
