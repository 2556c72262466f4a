"""HTTP/1.1 clients on raw sockets with httptools parsing: a blocking one for the
sequential rounds, an asyncio protocol for the concurrency phase."""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import time
from collections.abc import Sequence
from typing import Any, cast

import httptools

from .workload import Endpoint


class ResponseError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300]!r}")
        self.status = status
        self.body = body


class _Resp:
    """httptools callbacks for one response at a time."""

    __slots__ = ("body", "done", "got_bytes", "keep_alive", "parser", "status")

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.body: list[bytes] = []
        self.done = False
        self.got_bytes = False
        self.status = 0
        self.keep_alive = True

    def on_message_begin(self) -> None:
        self.body = []
        self.done = False

    def on_body(self, b: bytes) -> None:
        self.body.append(b)

    def on_message_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        self.done = True


class SyncConn:
    """One persistent HTTP/1.1 connection; blocking sockets, httptools parsing."""

    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep
        self.sock: socket.socket | None = None
        self.resp = _Resp()
        self.reconnects = -1

    def _connect(self) -> socket.socket:
        s = socket.create_connection((self.ep.host, self.ep.port), timeout=60)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = s
        self.resp = _Resp()
        self.reconnects += 1
        return s

    def fresh(self) -> None:
        """Reconnect now if the server closed the idle connection (keep-alive timeout), so
        that the next timed request does not pay for it. Call outside the timed region."""
        s = self.sock
        if s is None:
            self._connect()
            return
        try:
            readable, _, _ = select.select([s], [], [], 0)
            if readable and not s.recv(1, socket.MSG_PEEK):
                self.close()
                self._connect()
        except OSError:
            self.close()
            self._connect()

    def request(self, data: bytes) -> tuple[int, bytes]:
        try:
            return self._request(data)
        except ConnectionError:
            if self.resp.got_bytes:
                raise
            self.close()  # a stale keep-alive connection: one retry on a new one
            return self._request(data)

    def _request(self, data: bytes) -> tuple[int, bytes]:
        s = self.sock or self._connect()
        r = self.resp
        r.done = False
        r.got_bytes = False
        s.sendall(data)
        recv = s.recv
        feed = r.parser.feed_data
        while not r.done:
            chunk = recv(262144)
            if not chunk:
                self.close()
                raise ConnectionError("server closed the connection")
            r.got_bytes = True
            feed(chunk)
        if not r.keep_alive:
            self.close()
        return r.status, b"".join(r.body)

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
        self.sock = None


class AsyncConn(asyncio.Protocol):
    __slots__ = ("closed", "fut", "resp", "transport")

    def __init__(self) -> None:
        self.resp = _Resp()
        self.fut: asyncio.Future[int] | None = None
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        r = self.resp
        try:
            r.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(e)
            return
        if r.done:
            r.done = False
            fut, self.fut = self.fut, None
            if fut is not None and not fut.done():
                fut.set_result(r.status)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(exc or ConnectionError("server closed the connection"))

    def _fail(self, exc: BaseException) -> None:
        fut, self.fut = self.fut, None
        if fut is not None and not fut.done():
            fut.set_exception(exc)


async def open_conn(ep: Endpoint) -> AsyncConn:
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_connection(AsyncConn, ep.host, ep.port)
    return proto


async def conc_segment(
    eps: Sequence[Endpoint], conns: list[AsyncConn], reqs: list[list[bytes]], seconds: float
) -> dict[str, Any]:
    """Every connection sends back-to-back requests for ``seconds``; connection ``i`` goes
    to ``eps[i]`` (replicas: the endpoints differ)."""
    loop = asyncio.get_running_loop()
    lat: list[float] = []
    errors = 0
    first_error: list[str] = []
    pc = time.perf_counter_ns
    start = pc()
    deadline = start + int(seconds * 1e9)

    async def worker(i: int) -> None:
        nonlocal errors
        conn = conns[i]
        mine = reqs[i]
        k = 0
        while pc() < deadline:
            if conn.closed or conn.transport is None:
                conn = conns[i] = await open_conn(eps[i])
            data = mine[k % len(mine)]
            k += 1
            fut: asyncio.Future[int] = loop.create_future()
            conn.fut = fut
            t0 = pc()
            conn.transport.write(data)  # type: ignore[union-attr]
            try:
                status = await fut
            except Exception as e:
                errors += 1
                if not first_error:
                    first_error.append(repr(e))
                conn.closed = True
                continue
            t1 = pc()
            if status != 200:
                errors += 1
                if not first_error:
                    first_error.append(f"HTTP {status}: {b''.join(conn.resp.body)[:300]!r}")
            else:
                lat.append((t1 - t0) / 1e6)
            if not conn.resp.keep_alive:
                conn.closed = True

    await asyncio.gather(*(worker(i) for i in range(len(conns))))
    elapsed = (pc() - start) / 1e9
    return {"lat": lat, "errors": errors, "elapsed": elapsed, "first_error": first_error}
