"""The floor: the thinnest Python forwarder we know how to write (aiohttp + uvloop).

``skillstate bench overhead --floor`` runs it in its own process beside the proxy and
measures it in the same interleaved run, so the proxy's cost is stated as a ratio to what
any Python forwarder pays on this machine, at this moment (a noisy machine shifts both).

It does only what every forwarder must: read the request, send it upstream on a pooled
keep-alive connection, and copy the answer back as it arrives. No parsing, no state.

``--server uvicorn`` serves the same forwarder as a bare ASGI app on the proxy's own server
(uvicorn with uvloop and httptools, no Starlette): a second floor, so a run can tell the
proxy's server from the rest of its cost.

Standalone: ``python -m skillstate.bench.overhead.floor --upstream URL [--port N]
[--server aiohttp|uvicorn]`` prints ``floor listening on http://127.0.0.1:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import socket

import aiohttp
from aiohttp import web
from starlette.types import Receive, Scope, Send
from yarl import URL

from .servers import FLOOR_SERVERS

_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "host", "content-length", "upgrade"}
)
_HOP_BYTES = frozenset(h.encode() for h in _HOP)


def _client_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)


def make_app(upstream: str) -> web.Application:
    base = upstream.rstrip("/")

    async def forward(request: web.Request) -> web.StreamResponse:
        session: aiohttp.ClientSession = request.app["session"]
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with session.request(
            request.method, URL(base + request.raw_path, encoded=True), data=body, headers=headers
        ) as up:
            out = web.StreamResponse(status=up.status)
            for k, v in up.headers.items():
                if k.lower() not in _HOP:
                    out.headers[k] = v
            await out.prepare(request)
            async for chunk in up.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    async def open_session(app: web.Application) -> None:
        app["session"] = _client_session()

    async def close_session(app: web.Application) -> None:
        await app["session"].close()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)
    return app


class AsgiForwarder:
    """The same forwarder as ``make_app``'s, as a bare ASGI app (for ``--server uvicorn``)."""

    def __init__(self, upstream: str) -> None:
        self.base = upstream.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._forward(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.session = _client_session()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.session is not None:
                    await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self.session is not None  # lifespan="on": startup ran first
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        headers = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in scope["headers"]
            if k not in _HOP_BYTES
        }
        url = self.base + scope["raw_path"].decode("latin-1")
        query = scope.get("query_string")
        if query:
            url += "?" + query.decode("latin-1")
        up_url = URL(url, encoded=True)
        async with self.session.request(scope["method"], up_url, data=body, headers=headers) as up:
            out = [
                (k.encode("latin-1"), v.encode("latin-1"))
                for k, v in up.headers.items()
                if k.lower() not in _HOP
            ]
            await send({"type": "http.response.start", "status": up.status, "headers": out})
            async for chunk in up.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})


def _serve_uvicorn(upstream: str, sock: socket.socket) -> None:
    import uvicorn

    config = uvicorn.Config(
        AsgiForwarder(upstream),
        loop="uvloop",
        http="httptools",
        ws="none",
        proxy_headers=False,
        lifespan="on",
        access_log=False,
        log_level="warning",
    )
    uvicorn.Server(config).run(sockets=[sock])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m skillstate.bench.overhead.floor")
    p.add_argument("--upstream", required=True, help="base URL to forward to")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--server", choices=FLOOR_SERVERS, default=FLOOR_SERVERS[0])
    a = p.parse_args(argv)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", a.port))
    print(f"floor listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    if a.server == "uvicorn":
        _serve_uvicorn(a.upstream, sock)
        return
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        pass
    else:
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    web.run_app(make_app(a.upstream), sock=sock, print=None, access_log=None)


if __name__ == "__main__":
    main()
