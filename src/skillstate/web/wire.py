"""HTTP plumbing for the handlers: bounded body reading, dialect-shaped error responses,
and responses that notice a client going away (and then cancel the upstream work)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..dialects.registry import dialect_for_path, get_dialect
from ..errors import Dialect, ProxyError
from ..jsondepth import MAX_JSON_DEPTH, nesting_exceeds
from ..numbertext import whole_number
from .bodycoding import codings, decode, too_large

T = TypeVar("T")


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def dialect_for(path: str, anthropic_version: bool) -> Dialect:
    """The dialect of an error answered outside the turn handlers: the one whose routes serve
    ``path``, else by the header every Anthropic SDK request carries (``anthropic-version``)."""
    return dialect_for_path(path) or ("anthropic" if anthropic_version else "openai")


def error_response(
    err: ProxyError, dialect: Dialect, headers: Mapping[str, str] | None = None
) -> Response:
    """``err`` as the error object of ``dialect`` (a registry name), with its status."""
    d = get_dialect(dialect)
    return JSONResponse(
        d.error_body(err),
        status_code=d.error_status(err),
        headers={**(headers or {}), **err.headers()},
    )


async def read_json_object(request: Request, max_bytes: int) -> dict[str, Any]:
    """The request body as a JSON object; 415 unless it is declared as JSON (compressed with
    a coding of ``bodycoding.SUPPORTED`` or not), 413 as soon as it is known to be too big
    (without buffering the rest; decoded, too), 400 for anything that is not a JSON object or
    nests deeper than ``MAX_JSON_DEPTH``."""
    body, raw = await read_json_body(request, max_bytes)
    check_nesting(body, raw)
    return body


async def read_optional_json_body(
    request: Request, max_bytes: int
) -> tuple[dict[str, Any], bytes] | None:
    """As :func:`read_json_object`, with the body's (decoded) bytes, where a body that is
    empty or only blanks is None (and needs no content-type): a request whose headers can say
    it all (``PATCH /state`` with a budget). The body is read once: the ASGI messages cannot
    be read again."""
    raw = await _body_bytes(request, max_bytes, blank_ok=True)
    if not raw.strip():
        return None
    body = _json_object(raw)
    check_nesting(body, raw)
    return body, raw


async def read_json_body(
    request: Request,
    max_bytes: int,
    known: Callable[[bytes], dict[str, Any] | None] | None = None,
) -> tuple[dict[str, Any], bytes]:
    """As :func:`read_json_object`, with the body's (decoded) bytes, and without the nesting
    check: the caller runs :func:`check_nesting` (on what it has not checked before) before
    anything walks the body. ``known``: what the bytes parse to, when it can tell without
    parsing them all (``SessionTranscripts.parsed``; None: it cannot)."""
    raw = await _body_bytes(request, max_bytes)
    if not raw:
        raise ProxyError("invalid_request", "request body is empty; expected a JSON object")
    body = known(raw) if known is not None else None
    if body is not None:
        return body, raw
    return _json_object(raw), raw


async def _body_bytes(request: Request, max_bytes: int, blank_ok: bool = False) -> bytes:
    """The body's (decoded) bytes, 415 unless declared as JSON (``blank_ok``: unless it is
    blank), 413 past ``max_bytes``."""
    content_type, encoding, declared = _body_headers(request.scope["headers"])
    json_declared = is_json_media_type(content_type)
    if not json_declared and not blank_ok:
        raise _not_json()
    applied = codings(encoding)
    size = None if declared is None else whole_number(declared)
    if size is not None and size > max_bytes:
        raise too_large(max_bytes)
    raw = await _read_body(request.receive, max_bytes)
    if applied and raw:  # no content has nothing to decode: an empty body stays empty
        raw = decode(raw, applied, max_bytes)
    if not json_declared and raw.strip():
        raise _not_json()
    return raw


def _not_json() -> ProxyError:
    # text/plain and form bodies are CORS "simple" requests: any web page could send them.
    return ProxyError(
        "invalid_request",
        "content-type must be application/json",
        status=415,
        code="unsupported_media_type",
    )


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ProxyError("invalid_request", f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ProxyError("invalid_request", "request body must be a JSON object")
    return body


def _body_headers(raw: list[tuple[bytes, bytes]]) -> tuple[str, str, str | None]:
    """The request's ``content-type`` and ``content-encoding`` ("" when absent) and
    ``content-length`` (None), each its first value as Starlette's ``Headers.get`` has it, in
    one pass over the headers instead of one per name."""
    found: dict[bytes, bytes] = {}
    for name, value in raw:
        if name in _BODY_HEADERS and name not in found:
            found[name] = value
    content_type = found.get(b"content-type", b"").decode("latin-1")
    encoding = found.get(b"content-encoding", b"").decode("latin-1")
    length = found.get(b"content-length")
    return content_type, encoding, None if length is None else length.decode("latin-1")


_BODY_HEADERS = frozenset({b"content-type", b"content-encoding", b"content-length"})


def check_nesting(body: dict[str, Any], raw: bytes, skip: tuple[str, int] | None = None) -> None:
    """400 when ``body`` nests JSON deeper than ``MAX_JSON_DEPTH``. ``skip``: (a list member,
    n): its first n items were checked before (the same items, at the same depth)."""
    if skip is not None and skip[1]:
        key, n = skip
        body = {**body, key: body[key][n:]}
    if nesting_exceeds(body, MAX_JSON_DEPTH, raw):
        raise ProxyError(
            "invalid_request", f"request body nests JSON more than {MAX_JSON_DEPTH} levels deep"
        )


async def _read_body(receive: Receive, max_bytes: int) -> bytes:
    """The body's bytes straight from the ASGI messages (Starlette's ``request.stream()`` is
    an async generator: a per-request object the event loop tracks, on the hot path)."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # http.disconnect
            # Nobody reads the answer; this only ends the request without an internal error.
            raise ProxyError("invalid_request", "the client left before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise too_large(max_bytes)
        parts.append(chunk)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


def method_of(request: Request) -> str:
    """The request's method, a ``HEAD`` read as the ``GET`` it asks about: Starlette routes
    a GET route's HEAD to the GET handler, and the server sends its answer without the body."""
    return "GET" if request.method == "HEAD" else request.method


def is_json_media_type(content_type: str) -> bool:
    """``application/json`` or an ``application/*+json`` type, parameters ignored."""
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


# The scope key under which the proxy's HTTP protocol (``app.httplimits``) puts a future
# done once the request's connection is lost.
CONNECTION_LOST = "skillstate.connection_lost"


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def on_disconnect(
    scope: Scope, receive: Receive, wake: Callable[[Any], None]
) -> Callable[[], object]:
    """Call ``wake`` once the client is gone; returns what stops watching. Under the proxy's
    own server the connection's future says so; under any other ASGI server a task waits
    for ``http.disconnect`` (a task, a coroutine and an event wait a request more)."""
    lost = scope.get(CONNECTION_LOST)
    if isinstance(lost, asyncio.Future):
        lost.add_done_callback(wake)
        return lambda: lost.remove_done_callback(wake)
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    watcher.add_done_callback(wake)
    return watcher.cancel


async def _finished_or_gone(task: asyncio.Future[Any], scope: Scope, receive: Receive) -> None:
    """Wait for ``task``, or until the client is gone and then cancel it."""
    # What asyncio.wait(FIRST_COMPLETED) does, without its per-call sets and bookkeeping.
    either: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake(_: object) -> None:
        if not either.done():
            either.set_result(None)

    task.add_done_callback(wake)
    stop_watching = on_disconnect(scope, receive, wake)
    try:
        await either
    finally:
        stop_watching()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """Run `work`; if the client disconnects first, cancel it and return None."""
    task = asyncio.ensure_future(work)
    await _finished_or_gone(task, request.scope, request.receive)
    return None if task.cancelled() else task.result()


class StreamingProxyResponse(Response):
    """Streams an async iterator; a client disconnect cancels the iterator at once, even
    while it is waiting on a stalled upstream (Starlette's own response only notices on
    the next send under ASGI 2.4)."""

    media_type = "text/event-stream"

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        headers: Mapping[str, str],
        on_close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.chunks = chunks
        self.on_close = on_close
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache", **headers})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._respond(scope, receive, send)
        finally:
            if self.on_close is not None:
                done = asyncio.ensure_future(self.on_close())
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(done)

    async def _respond(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        pump = asyncio.ensure_future(self._pump(send))
        await _finished_or_gone(pump, scope, receive)
        if pump.done() and not pump.cancelled():
            exc = pump.exception()
            if exc is not None and not isinstance(exc, OSError):
                raise exc

    async def _pump(self, send: Send) -> None:
        chunks = self.chunks
        try:
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
