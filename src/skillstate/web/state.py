"""``/state``: the operator's view of sessions (list, read with history, patch, delete).
Errors are OpenAI error objects: these routes belong to no dialect."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..errors import ProxyError
from ..http import JSONResponse, error_response, read_json_object
from ..session import is_valid_session_id
from ..store import StoreError, TransitionRecord
from .runtime import Runtime, runtime


async def state(request: Request) -> Response:
    """GET/PATCH/DELETE ``/state`` (``?session=ID``; without it, GET lists sessions)."""
    try:
        return await _state(request, runtime(request))
    except ProxyError as e:
        return error_response(e, "openai")
    except StoreError as e:
        return error_response(e.for_client("the store failed"), "openai")


async def _state(request: Request, rt: Runtime) -> Response:
    session = request.query_params.get("session")
    if session is None:
        if request.method != "GET":
            raise ProxyError("invalid_request", "?session=ID is required", param="session")
        return JSONResponse({"sessions": await rt.store.list_sessions()})
    if not is_valid_session_id(session):
        raise ProxyError("invalid_request", "invalid session id: must match ^[A-Za-z0-9_-]{1,128}$")
    handler = _BY_METHOD[request.method]
    return await handler(request, rt, session)


async def _read(request: Request, rt: Runtime, session: str) -> Response:
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
        out["history"] = [_transition(t) for t in await rt.store.history(session)]
    return JSONResponse(out)


def _transition(t: TransitionRecord) -> dict[str, Any]:
    return {
        "step": t.step,
        "status": t.status,
        "patch": t.patch,
        "action": t.action,
        "errors": t.errors,
        "ts": t.ts,
    }


async def _delete(request: Request, rt: Runtime, session: str) -> Response:
    if not await rt.pipeline.delete_session(session):
        raise ProxyError("not_found", f"unknown session {session}")
    return Response(status_code=204)


async def _patch(request: Request, rt: Runtime, session: str) -> Response:
    patch = await read_json_object(request, rt.settings.max_body_bytes)
    done = await rt.pipeline.operator_patch(session, patch)
    return JSONResponse(
        {"session": session, "step": done.step, "state": done.state, "warnings": done.warnings}
    )


_BY_METHOD: dict[str, Callable[[Request, Runtime, str], Awaitable[Response]]] = {
    "GET": _read,
    "DELETE": _delete,
    "PATCH": _patch,
}
