"""Routes only: parse, call the pipeline, render."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import __version__
from .catalog import catalog_dialect, fetch_models
from .config import Settings
from .counting import count_tokens
from .dialects.translate import validate_anthropic_request, validate_count_tokens_request
from .dialects.validate import validate_openai_request
from .errors import Dialect, ProxyError
from .http import (
    JSONResponse,
    StreamingProxyResponse,
    error_response,
    read_json_object,
    unless_disconnected,
)
from .ledger import parse_since, summarize
from .pipeline import CONSTRAIN_VALUES, MODES, Pipeline, Reply, Turn
from .pricing import PriceBook, PriceOverride
from .session import SESSION_HEADER, is_valid_session_id, resolve_session_id
from .store import Store, StoreError, TransitionRecord
from .store.sqlite import SQLiteStore
from .ui import ui_routes
from .upstream.client import UpstreamPool

log = logging.getLogger("skillstate")


class Runtime:
    """Everything the routes share, created and closed by the app's lifespan."""

    def __init__(self, settings: Settings, store: Store | None = None) -> None:
        self.settings = settings
        self.store: Store = store or SQLiteStore(settings.db_path, exclusive=True)
        self.pool = UpstreamPool(settings)
        prices = PriceBook(
            overrides_by_upstream={
                u.name: PriceOverride.coerce(u.prices.model_dump())
                for u in settings.upstreams
                if u.prices
            },
            overrides_by_model={
                m: PriceOverride.coerce(p.model_dump()) for m, p in settings.prices.items()
            },
        )
        self.pipeline = Pipeline(settings, self.store, self.pool, prices)

    async def purge_forever(self) -> None:
        s = self.settings
        while True:
            now = time.time()
            with contextlib.suppress(StoreError):
                if s.session_ttl > 0:
                    await self.store.purge_sessions(now - s.session_ttl)
                if s.ledger_retention > 0:
                    await self.store.purge_ledger(now - s.ledger_retention)
            await asyncio.sleep(s.purge_interval)


def _dialect_of(request: Request) -> Dialect:
    """The dialect of an error outside the turn routes: by path, else by the Anthropic SDK's
    own header."""
    if request.url.path.rstrip("/").endswith(("/messages", "/messages/count_tokens")):
        return "anthropic"
    return catalog_dialect(request.headers)


def create_app(settings: Settings, store: Store | None = None) -> Starlette:
    rt = Runtime(settings, store)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await rt.store.open()
        await rt.pool.open()
        purge = asyncio.ensure_future(rt.purge_forever())
        try:
            yield
        finally:
            purge.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await purge
            await rt.pool.close()
            await rt.pipeline.settle()
            await rt.store.close()

    def header_choice(request: Request, name: str, default: str, allowed: tuple[str, ...]) -> str:
        value = request.headers.get(name, default).strip().lower()
        if value not in allowed:
            raise ProxyError(
                "invalid_request", f"{name} must be one of {', '.join(allowed)}", param=name
            )
        return value

    async def parse_turn(
        request: Request, dialect: Dialect, validate: Callable[[Any], None], session: str
    ) -> Turn:
        body = await read_json_object(request, settings.max_body_bytes)
        validate(body)
        mode = header_choice(request, "x-skillstate-mode", settings.mode, MODES)
        constrain = header_choice(
            request, "x-skillstate-constrain", settings.constrain, CONSTRAIN_VALUES
        )
        return Turn(
            dialect=dialect,
            body=body,
            headers={k.lower(): v for k, v in request.headers.items()},
            session=session,
            mode=mode,
            constrain=constrain != "off",
        )

    def turn_route(dialect: Dialect) -> Callable[[Request], Any]:
        validate = validate_anthropic_request if dialect == "anthropic" else validate_openai_request

        async def handle(request: Request) -> Response:
            session_hdr: dict[str, str] = {}
            try:
                session = resolve_session_id(request.headers.get(SESSION_HEADER))
                session_hdr = {SESSION_HEADER: session}
                turn = await parse_turn(request, dialect, validate, session)
                result = await unless_disconnected(request, rt.pipeline.run(turn))
            except ProxyError as e:
                return error_response(e, dialect, session_hdr)
            if result is None:
                return Response(status_code=499)  # the client is gone; nobody reads this
            if isinstance(result, Reply):
                return Response(result.body, status_code=result.status, headers=result.headers)
            return StreamingProxyResponse(result.chunks, result.headers, result.abort)

        return handle

    async def messages_count_tokens(request: Request) -> Response:
        session_hdr: dict[str, str] = {}
        try:
            session = resolve_session_id(request.headers.get(SESSION_HEADER))
            session_hdr = {SESSION_HEADER: session}
            turn = await parse_turn(request, "anthropic", validate_count_tokens_request, session)
            result = await count_tokens(rt.pipeline, rt.pool, turn)
        except ProxyError as e:
            return error_response(e, "anthropic", session_hdr)
        return Response(result.body, status_code=result.status, headers=result.headers)

    async def models(request: Request) -> Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        dialect = catalog_dialect(headers)
        try:
            r = await fetch_models(
                rt.pool, headers, dialect, request.path_params.get("model_id"), request.url.query
            )
        except ProxyError as e:
            return error_response(e, dialect)
        return Response(r.body, r.status, r.headers)

    async def health(request: Request) -> Response:
        store_ok = await rt.store.ping()
        return JSONResponse(
            {
                "ok": store_ok and rt.pool.usable(),
                "version": __version__,
                "upstreams": rt.pool.health(),
                "store": "ok" if store_ok else "error",
                "active_sessions": len(rt.pipeline.locks),
            }
        )

    async def state(request: Request) -> Response:
        try:
            return await _state(request)
        except ProxyError as e:
            return error_response(e, "openai")
        except StoreError as e:
            return error_response(ProxyError("api_error", str(e)), "openai")

    async def _state(request: Request) -> Response:
        session = request.query_params.get("session")
        if session is None:
            if request.method != "GET":
                raise ProxyError("invalid_request", "?session=ID is required", param="session")
            return JSONResponse({"sessions": await rt.store.list_sessions()})
        if not is_valid_session_id(session):
            raise ProxyError(
                "invalid_request", "invalid session id: must match ^[A-Za-z0-9_-]{1,128}$"
            )
        if request.method == "DELETE":
            async with rt.pipeline.locks.hold(session):
                if not await rt.store.delete(session):
                    raise ProxyError("not_found", f"unknown session {session}")
            return Response(status_code=204)
        if request.method == "PATCH":
            return await _operator_patch(request, session)
        record = await rt.store.load(session)
        if record is None:
            raise ProxyError("not_found", f"unknown session {session}")
        out: dict[str, Any] = {
            "session": record.session,
            "step": record.step,
            "schema": record.schema,
            "state": record.state,
            "created": record.created,
            "updated": record.updated,
        }
        if request.query_params.get("history") in ("1", "true", "yes"):
            out["history"] = [
                {
                    "step": t.step,
                    "status": t.status,
                    "patch": t.patch,
                    "action": t.action,
                    "errors": t.errors,
                    "ts": t.ts,
                }
                for t in await rt.store.history(session)
            ]
        return JSONResponse(out)

    async def _operator_patch(request: Request, session: str) -> Response:
        patch = await read_json_object(request, settings.max_body_bytes)
        async with rt.pipeline.locks.hold(session):
            record = await rt.store.load(session)
            if record is None:
                raise ProxyError("not_found", f"unknown session {session}")
            tr = rt.pipeline.check_patch(record.state, patch, record.schema)
            if not tr.ok or tr.new_state is None:
                raise ProxyError("invalid_request", "; ".join(tr.errors) or "invalid patch")
            now = time.time()
            step = await rt.store.commit(
                session,
                expected_step=record.step,
                state=tr.new_state,
                schema=record.schema,
                transition=TransitionRecord(
                    record.step + 1, "operator", tr.applied_patch, "operator", tr.warnings, now
                ),
                now=now,
            )
        return JSONResponse(
            {"session": session, "step": step, "state": tr.new_state, "warnings": tr.warnings}
        )

    async def cost(request: Request) -> Response:
        q = request.query_params
        now = time.time()
        try:
            since = parse_since(q.get("since"), now, name="since")
            until = parse_since(q.get("until"), now, name="until") if q.get("until") else now
            session = q.get("session")
            if session is not None and not is_valid_session_id(session):
                raise ValueError("invalid session id")
            await rt.pipeline.settle()
            rows = await rt.store.ledger_rows(since, until, session)
            summary = summarize(rows, q.get("group_by"))
        except ValueError as e:
            return error_response(ProxyError("invalid_request", str(e)), "openai")
        summary.update({"since": since, "until": until, "session": session})
        return JSONResponse(summary)

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        kind = "not_found" if status == 404 else "invalid_request"
        msg = (
            f"no route {request.method} {request.url.path}"
            if status == 404
            else f"method {request.method} not allowed on {request.url.path}"
        )
        return error_response(ProxyError(kind, msg, status=status), _dialect_of(request))

    async def crashed(request: Request, exc: Exception) -> Response:
        log.exception("internal error on %s %s", request.method, request.url.path)
        err = ProxyError("api_error", f"internal proxy error ({type(exc).__name__})")
        return error_response(err, _dialect_of(request))

    chat = turn_route("openai")
    messages = turn_route("anthropic")
    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/chat/completions", chat, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", messages_count_tokens, methods=["POST"]),
        Route("/messages/count_tokens", messages_count_tokens, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/models", models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", models, methods=["GET"]),
        Route("/models/{model_id:path}", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/state", state, methods=["GET", "DELETE", "PATCH"]),
        Route("/cost", cost, methods=["GET"]),
        *ui_routes(),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: not_found, Exception: crashed},
    )
    app.state.runtime = rt
    if settings.verbose:
        app.add_middleware(RequestLog)
    return app


class RequestLog:
    """--verbose: one line per request. Never bodies or keys."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        seen: dict[str, str] = {"status": "-", "session": "-", "upstream": "-"}

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = str(message["status"])
                for k, v in message.get("headers", []):
                    if k == SESSION_HEADER.encode():
                        seen["session"] = v.decode("latin-1")
                    elif k == b"x-skillstate-upstream":
                        seen["upstream"] = v.decode("latin-1")
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            ms = (time.perf_counter() - start) * 1000
            log.info(
                "%s %s session=%s status=%s upstream=%s ms=%.1f",
                scope["method"], scope["path"], seen["session"], seen["status"],
                seen["upstream"], ms,
            )  # fmt: skip
