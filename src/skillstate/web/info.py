"""The routes around the turns: ``/v1/models``, ``/health``, ``/cost`` and ``/metrics``."""

from __future__ import annotations

import hmac
import time
from dataclasses import replace

from starlette.requests import Request
from starlette.responses import Response

from .. import __version__
from ..auth.gate import principal_of
from ..auth.tenancy import split_session, view_of
from ..choices import GroupBy
from ..cost.ledger import check_group_by, parse_window, summarize_sums
from ..errors import ProxyError
from ..observability.metrics import CONTENT_TYPE
from ..sessions.ids import is_valid_session_id
from .catalog import catalog_dialect, fetch_models
from .runtime import Runtime, runtime
from .wire import JSONResponse, error_response


async def models(request: Request) -> Response:
    """The upstreams' model list (or one model), in the caller's dialect."""
    rt = runtime(request)
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
    """Liveness plus the store's, Redis's and each upstream's condition: 503 when the store
    cannot write or Redis is down under ``coordination_down: refuse``, found out within
    ``health_timeout`` (a wedged or locked store is not waited on). ``coordination``:
    ``redis`` ok / down / not configured, and ``degraded`` while this replica runs on
    local locks and limits (Redis down under ``local``)."""
    rt = runtime(request)
    store_problem = await rt.store.check(rt.settings.health_timeout)
    await rt.pool.refresh()  # shared breakers and windows: as Redis has them now
    coordination = await rt.coordination.check(rt.settings.health_timeout)
    # Redis down under ``refuse``: turns are refused, as with a store that cannot write.
    refusing = rt.coordination.configured and not rt.coordination.up and rt.coordination.refuses
    status = 200 if store_problem is None and not refusing else 503
    ok = status == 200 and rt.pool.usable()
    caller = principal_of(request.scope)
    if rt.keys.on and (caller is None or not caller.admin):
        return JSONResponse({"ok": ok, "auth": "on"}, status_code=status)  # liveness only
    return JSONResponse(
        {
            "ok": ok,
            "version": __version__,
            "auth": auth_condition(rt),
            "upstreams": rt.pool.health(),
            "store": "ok" if store_problem is None else f"error: {store_problem}",
            "coordination": coordination,
            "active_sessions": rt.sessions.active_sessions,
        },
        status_code=status,
    )


def auth_condition(rt: Runtime) -> str:
    """``on``, ``off`` (loopback without keys), or the --insecure-no-auth warning."""
    if rt.keys.on:
        return "on"
    if rt.settings.insecure_no_auth:
        return "OFF (--insecure-no-auth): anyone who reaches this port can use it"
    return "off"


async def cost(request: Request) -> Response:
    """The ledger summary for a time window (and optionally one session or a grouping).
    With client keys on: the caller's key's rows only (an admin's: every key's, or
    ``?key=NAME``'s), sessions by the ids their clients use."""
    rt = runtime(request)
    q = request.query_params
    now = time.time()
    try:
        session = q.get("session")
        view = view_of(principal_of(request.scope), q.get("key"))
        until_text = q.get("until")
        if until_text is not None and until_text.strip().lower() == "all":
            until_text = None  # no upper bound: up to now (cost.ledger reads `all` as 0)
        since, until = parse_window(q.get("since"), until_text, now)
        if session is not None and not is_valid_session_id(session):
            raise ValueError("invalid session id")
        group_by = q.get("group_by")
        check_group_by(group_by)
        await rt.pipeline.settle()
        stored = None if session is None else view.store_id(session)
        sums = await rt.store.ledger_sums(since, until, stored, view.prefix, group_by)
        if view.prefix is not None and group_by == GroupBy.SESSION:
            # one key's sessions: by the ids its clients know
            sums = [replace(s, key=split_session(s.key)[1]) if s.key else s for s in sums]
        summary = summarize_sums(sums, group_by)
    except ValueError as e:
        return error_response(
            ProxyError("invalid_request", str(e)), catalog_dialect(request.headers)
        )
    except ProxyError as e:
        return error_response(e, catalog_dialect(request.headers))
    summary.update({"since": since, "until": until, "session": session})
    return JSONResponse(summary)


async def metrics(request: Request) -> Response:
    """The Prometheus text format. With ``metrics_token`` set, only for a bearer of it or
    of an admin key; with client keys on, an admin key is needed without a token."""
    rt = runtime(request)
    token = rt.settings.metrics_token
    caller = principal_of(request.scope)
    admin = caller is not None and caller.admin
    bearer = request.headers.get("authorization", "")
    if (
        not admin
        and (token is not None or rt.keys.on)
        and not (token and _bearer_is(bearer, token))
    ):
        err = ProxyError(
            "authentication",
            "GET /metrics needs Authorization: Bearer <metrics_token or an admin key>",
        )
        return error_response(err, "openai", {"www-authenticate": "Bearer"})
    await rt.pool.refresh()
    body = rt.telemetry.metrics.render(rt.pool.upstreams)
    return Response(body, headers={"content-type": CONTENT_TYPE})


def _bearer_is(header: str, token: str) -> bool:
    scheme, _, value = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        value.strip().encode(), token.encode()
    )
