"""The floor: the thinnest Python forwarder we know how to write (aiohttp + uvloop).

``skillstate bench overhead --floor`` runs it in its own process beside the proxy and
measures it in the same interleaved run, so the proxy's cost is stated as a ratio to what
any Python forwarder pays on this machine, at this moment (a noisy machine shifts both).

It does only what every forwarder must: read the request, send it upstream on a pooled
keep-alive connection, and copy the answer back as it arrives. No parsing, no state.

Standalone: ``python -m skillstate.bench.overhead.floor --upstream URL [--port N]``
prints ``floor listening on http://127.0.0.1:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import socket

import aiohttp
from aiohttp import web

_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "host", "content-length", "upgrade"}
)


def make_app(upstream: str) -> web.Application:
    base = upstream.rstrip("/")

    async def forward(request: web.Request) -> web.StreamResponse:
        session: aiohttp.ClientSession = request.app["session"]
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with session.request(
            request.method, base + request.path_qs, data=body, headers=headers
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
        app["session"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
        )

    async def close_session(app: web.Application) -> None:
        await app["session"].close()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)
    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m skillstate.bench.overhead.floor")
    p.add_argument("--upstream", required=True, help="base URL to forward to")
    p.add_argument("--port", type=int, default=0)
    a = p.parse_args(argv)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", a.port))
    print(f"floor listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        pass
    else:
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    web.run_app(make_app(a.upstream), sock=sock, print=None, access_log=None)


if __name__ == "__main__":
    main()
