"""``/state``: the operator's view of sessions (list, read with history, patch, delete).
Errors are OpenAI error objects: these routes belong to no dialect.

With client keys on, a caller sees only its own key's sessions (``skillstate.auth.tenancy``);
an admin key sees every key's, and ``?key=NAME`` picks one. Another key's session is a 404
to anyone else: it reveals nothing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..auth.gate import principal_of
from ..auth.tenancy import View, view_of
from ..cost.budgets import BUDGET_HEADER, audit_session_budget, parse_budget, session_budget
from ..errors import ProxyError
from ..sessions.ids import is_valid_session_id
from ..store import StoreError, TransitionRecord
from .catalog import catalog_dialect
from .paging import HISTORY_PAGE, SESSIONS_PAGE, decode_cursor, encode_cursor, parse_limit
from .runtime import Runtime, runtime
from .wire import (
    JSONResponse,
    check_nesting,
    error_response,
    method_of,
    read_json_body,
    read_optional_json_body,
)


async def state(request: Request) -> Response:
    """GET/PATCH/DELETE ``/state`` (``?session=ID``; without it, GET lists sessions)."""
    try:
        return await _state(request, runtime(request))
    except ProxyError as e:
        return error_response(e, catalog_dialect(request.headers))
    except StoreError as e:
        return error_response(e.for_client("the store failed"), catalog_dialect(request.headers))


async def _state(request: Request, rt: Runtime) -> Response:
    session = request.query_params.get("session")
    view = view_of(principal_of(request.scope), request.query_params.get("key"))
    method = method_of(request)
    if session is None:
        if method != "GET":
            raise ProxyError("invalid_request", "?session=ID is required", param="session")
        return await _list(request, rt, view)
    if not is_valid_session_id(session):
        raise ProxyError("invalid_request", "invalid session id: must match ^[A-Za-z0-9_-]{1,128}$")
    handler = _BY_METHOD[method]
    return await handler(request, rt, _Target(session, view.store_id(session)))


@dataclass(frozen=True, slots=True)
class _Target:
    """A session as the client names it and as the store does."""

    shown: str
    stored: str


async def _read(request: Request, rt: Runtime, target: _Target) -> Response:
    """The session's state and budget. A session with no state row that the proxy knows by
    its budget (its turns commit no state: passthrough, mask, an auto turn sent untouched;
    or PATCH gave it a budget before its first turn) answers in the same shape, with
    ``state``, ``step``, ``schema``, ``created`` and ``updated`` null: an operator reads its
    budget and spend back. Ledger rows alone do not make a session known (they outlive it:
    ``DELETE``, ``session_ttl``); a session with neither is a 404."""
    session = target.stored
    record = await rt.sessions.load_current(session)
    budget = await rt.store.session_budget(session)
    if record is None and budget is None:
        raise ProxyError("not_found", f"unknown session {target.shown}")
    out: dict[str, Any] = {
        "session": target.shown,
        "step": None if record is None else record.step,
        "schema": None if record is None else record.schema,
        "state": None if record is None else record.state,
        "created": None if record is None else record.created,
        "updated": None if record is None else record.updated,
        # The session's own budget (x-skillstate-budget-usd), and what its ledger rows cost.
        "budget_usd": budget,
        "spent_usd": await rt.budgets.spent(session_budget(session, 0.0)),
    }
    if request.query_params.get("history") in ("1", "true", "yes"):
        history, out["next_cursor"] = await _history_page(request, rt, session)
        out["history"] = [_transition(t) for t in history]
    return JSONResponse(out)


async def _list(request: Request, rt: Runtime, view: View) -> Response:
    """One page of sessions, most recently updated first; ``next_cursor`` is null on the
    last page. A session updated during a walk moves to the front (a new walk sees it)."""
    q = request.query_params
    limit = parse_limit(q.get("limit"), SESSIONS_PAGE)
    after: tuple[float, str] | None = None
    if q.get("cursor") is not None:
        position = decode_cursor(q["cursor"], "sessions")
        if (
            len(position) != 2
            or not isinstance(position[0], (int, float))
            or not isinstance(position[1], str)
        ):
            raise ProxyError("invalid_request", "invalid cursor for this listing", param="cursor")
        after = (float(position[0]), position[1])
    rows = await rt.store.sessions_page(limit + 1, after, view.prefix)
    page, more = rows[:limit], len(rows) > limit
    last = page[-1] if page else None
    cursor = (
        encode_cursor("sessions", [last["updated"], last["session"]]) if more and last else None
    )
    shown = [{**row, **view.shown(row["session"])} for row in page]
    return JSONResponse({"sessions": shown, "next_cursor": cursor})


async def _history_page(
    request: Request, rt: Runtime, session: str
) -> tuple[list[TransitionRecord], str | None]:
    """One page of a session's transitions in step order, and the cursor of the next."""
    q = request.query_params
    limit = parse_limit(q.get("limit"), HISTORY_PAGE)
    after_step = 0
    if q.get("cursor") is not None:
        position = decode_cursor(q["cursor"], "history")
        if len(position) != 2 or position[0] != session or type(position[1]) is not int:
            raise ProxyError("invalid_request", "invalid cursor for this listing", param="cursor")
        after_step = position[1]
    rows = await rt.store.history_page(session, limit + 1, after_step)
    page, more = rows[:limit], len(rows) > limit
    cursor = encode_cursor("history", [session, page[-1].step]) if more and page else None
    return page, cursor


def _transition(t: TransitionRecord) -> dict[str, Any]:
    return {
        "step": t.step,
        "status": t.status,
        "patch": t.patch,
        "action": t.action,
        "errors": t.errors,
        "ts": t.ts,
        "context": t.context,
        "estimate": t.estimate,
    }


async def _delete(request: Request, rt: Runtime, target: _Target) -> Response:
    """Forget the session: its state and history, budget, stored responses and kept replies
    (not its ledger rows). A 404 when it had neither a state nor a budget, as ``GET``
    answers (the store drops its stored responses and kept replies all the same)."""
    had_budget = await rt.store.session_budget(target.stored) is not None
    if not await rt.sessions.delete_session(target.stored) and not had_budget:
        raise ProxyError("not_found", f"unknown session {target.shown}")
    return Response(status_code=204)


async def _patch(request: Request, rt: Runtime, target: _Target) -> Response:
    """A patch of the session's state (the body), and/or a new budget for it (the
    ``x-skillstate-budget-usd`` header; ``none`` removes it). With the header, the body may
    be empty: then only the budget changes (a session may get one before its first turn).
    The budget is set once the patch is in: a refused request changes neither. The body's
    bytes go with the patch: an integer beyond 64 bits in it is a 400 (``validate_and_merge``),
    where the parsed body alone holds it as a float."""
    caller = principal_of(request.scope)
    asked = request.headers.get(BUDGET_HEADER)
    usd: float | None = None
    read: tuple[dict[str, Any], bytes] | None
    if asked is not None:
        cap = caller.record.max_session_budget_usd if caller is not None else None
        usd = None if asked.strip().lower() == "none" else parse_budget(asked, cap)
        read = await read_optional_json_body(request, rt.settings.max_body_bytes)
    else:
        read = await read_json_body(request, rt.settings.max_body_bytes)
        check_nesting(*read)
    out: dict[str, Any] = {"session": target.shown}
    if read is not None:
        patch, raw = read
        try:
            done = await rt.sessions.operator_patch(
                target.stored, patch, by=caller.name if caller else None, source=raw
            )
        except ProxyError as e:
            if e.kind != "not_found":
                raise
            if await rt.store.session_budget(target.stored) is None:
                raise ProxyError("not_found", f"unknown session {target.shown}") from None
            raise ProxyError(
                "conflict",
                f"session {target.shown} has no state to patch (no turn of it committed one: "
                "passthrough or mask mode, or no turn yet); only its budget can be set: "
                "the x-skillstate-budget-usd header with an empty body",
            ) from None
        out.update(step=done.step, state=done.state, warnings=done.warnings)
    if asked is not None:
        out["budget_usd"] = await rt.store.set_session_budget(target.stored, usd, replace=True)
        audit_session_budget(target.stored, usd, f"key:{caller.name}" if caller else "operator")
    return JSONResponse(out)


_BY_METHOD: dict[str, Callable[[Request, Runtime, _Target], Awaitable[Response]]] = {
    "GET": _read,
    "DELETE": _delete,
    "PATCH": _patch,
}
