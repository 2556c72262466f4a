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

Answers are error objects in the dialect of the request's path. Cost on the common path,
where a request arrives in one read: two integer comparisons per read, one timer per
connection.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from ..errors import ProxyError
from ..web.wire import dialect_for, error_response

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

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.head_left: int | None = self.limits.max_header_bytes  # None: not reading a head
        self.body_done = True  # the last request's body has been read to its end
        self.read_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self.app = _over_capacity  # this connection gets one answer, then closes
        self._arm(self.limits.header_timeout, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        left = self.head_left
        if left is not None:
            if len(data) > left:
                self._feed_past_head_budget(data, left)
                return
            self.head_left = left - len(data)
        super().data_received(data)
        self._arm_for_what_is_missing()

    def _feed_past_head_budget(self, data: bytes, left: int) -> None:
        # Feed what the budget allows: if the head ends within it, the rest is body (or the
        # next request) and goes on; otherwise the head is too large.
        if left:
            super().data_received(data[:left])
        if self.transport.is_closing():
            return
        if self.head_left is not None:
            self._refuse(
                ProxyError(
                    "request_too_large",
                    f"request headers exceed max_header_bytes ({self.limits.max_header_bytes})",
                    status=431,
                    code="request_header_fields_too_large",
                ),
            )
            return
        super().data_received(data[left:])
        self._arm_for_what_is_missing()

    def on_headers_complete(self) -> None:
        self.head_left = None
        self.body_done = False
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self.head_left = self.limits.max_header_bytes
        self.body_done = True
        self._disarm()
        super().on_message_complete()

    # ---- read timers ---------------------------------------------------------------------

    def _arm_for_what_is_missing(self) -> None:
        """After a read: time the head or the body still being read (one timer at a time)."""
        if self.read_timer is not None or self.transport.is_closing():
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

    def _refuse(self, err: ProxyError) -> None:
        """Write ``err`` in the dialect of the request's path and close the connection."""
        if self.transport.is_closing():
            return
        # The head may be partial, or not begun (no url attribute before the first byte).
        path = getattr(self, "url", b"").partition(b"?")[0].decode("latin-1")
        anthropic_version = any(name == b"anthropic-version" for name, _ in self.headers or ())
        response = error_response(err, dialect_for(path, anthropic_version))
        status, body = response.status_code, bytes(response.body)
        self.transport.write(
            b"".join(
                [
                    STATUS_LINE[status],
                    b"content-type: application/json\r\n",
                    b"content-length: %d\r\n" % len(body),
                    b"connection: close\r\n\r\n",
                    body,
                ]
            )
        )
        self.transport.close()


async def _over_capacity(scope: Any, receive: Any, send: Any) -> None:
    err = ProxyError(
        "overloaded", "the proxy is at max_connections; retry shortly", retry_after=1.0
    )
    anthropic_version = any(name == b"anthropic-version" for name, _ in scope["headers"])
    response = error_response(
        err, dialect_for(scope["path"], anthropic_version), {"connection": "close"}
    )
    await response(scope, receive, send)


def limited_protocol(limits: HttpLimits) -> type[LimitedHttpToolsProtocol]:
    """The protocol class for uvicorn's ``http`` setting, bound to ``limits``."""
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), {"limits": limits})
