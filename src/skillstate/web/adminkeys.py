"""``/admin/keys``: the client keys over HTTP, for an admin key only (403 for any other key,
and with client keys off). The operations are ``skillstate keys``'s (``auth.admin``), with
the same audit lines:

- ``GET /admin/keys``: every key (names, limits, status; never a secret or a digest);
- ``POST /admin/keys`` ``{"name", "admin", "rpm", "tpm", "budget_usd_per_day", "expires",
  "max_session_budget_usd", "allow_unpriced"}``:
  a new key, 201; its secret is in this answer (``"key"``) and nowhere else, ever;
- ``POST /admin/keys/{name}/rotate``: a new secret for the key (shown once), the old one
  refused from now on;
- ``DELETE /admin/keys/{name}``: revoke the key; 409 for the last active admin key (no
  key could manage the keys over HTTP after it; the CLI on the host may revoke it).

A key revoked or rotated here is refused by this replica at once, by others within
``auth_cache_ttl``.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..auth.admin import LIMITS, KeyAdmin, KeyChange, KeyRefused, KeySpec, shown
from ..auth.gate import principal_of
from ..errors import ProxyError
from ..store import StoreError
from .catalog import catalog_dialect
from .runtime import runtime
from .wire import JSONResponse, error_response, method_of, read_json_object

_FIELDS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "admin": (bool,),
    "rpm": (int,),
    "tpm": (int,),
    "budget_usd_per_day": (int, float),
    "expires": (str,),
    "max_session_budget_usd": (int, float),
    "allow_unpriced": (bool,),
}


def _admin(request: Request) -> KeyAdmin:
    """The operations, done by the caller's key; a 403 unless it is an admin's."""
    caller = principal_of(request.scope)
    if caller is None or not caller.admin:
        raise ProxyError("permission", "/admin/keys needs an admin key", code="admin_key_required")
    rt = runtime(request)
    address = request.client.host if request.client else "?"
    return KeyAdmin(rt.store, rt.keys.hasher, by=f"key:{caller.name} from {address}")


def _spec(body: dict[str, Any]) -> KeySpec:
    """A create request's body as a KeySpec: known fields of the right types only."""
    for field, value in body.items():
        kinds = _FIELDS.get(field)
        if kinds is None:
            raise ProxyError("invalid_request", f"unknown field {field!r}", param=field)
        wrong_bool = isinstance(value, bool) and bool not in kinds
        if value is not None and (wrong_bool or not isinstance(value, kinds)):
            raise ProxyError("invalid_request", f"{field} has the wrong type", param=field)
    if not isinstance(body.get("name"), str):
        raise ProxyError("invalid_request", "name is required", param="name")
    limits = {k: body.get(k) for k in LIMITS}
    return KeySpec(
        body["name"],
        bool(body.get("admin")),
        expires=body.get("expires"),
        allow_unpriced=bool(body.get("allow_unpriced")),
        **limits,
    )


def _answer(change: KeyChange, status: int = 200) -> Response:
    doc = shown(change.record)
    if change.secret is not None:
        doc["key"] = change.secret  # shown once: never stored, never shown again
    return JSONResponse(doc, status_code=status, headers={"cache-control": "no-store"})


async def admin_keys(request: Request) -> Response:
    """``GET`` (list) and ``POST`` (create) ``/admin/keys``."""
    try:
        admin = _admin(request)
        if method_of(request) == "GET":
            data = [shown(r) for r in await admin.list()]
            return JSONResponse({"object": "list", "data": data})
        body = await read_json_object(request, runtime(request).settings.max_body_bytes)
        return _answer(await admin.create(_spec(body)), 201)
    except (KeyRefused, StoreError, ProxyError) as e:
        return error_response(_client_error(e), catalog_dialect(request.headers))


async def admin_key(request: Request) -> Response:
    """``DELETE /admin/keys/{name}`` (revoke) and ``POST /admin/keys/{name}/rotate``."""
    try:
        admin = _admin(request)
        name = request.path_params["name"]
        if request.method == "DELETE":
            change = await admin.revoke(name, keep_an_admin=True)
        else:
            change = await admin.rotate(name)
        runtime(request).keys.forget(name)  # refused here at once, not after auth_cache_ttl
        return _answer(change)
    except (KeyRefused, StoreError, ProxyError) as e:
        return error_response(_client_error(e), catalog_dialect(request.headers))


def _client_error(e: KeyRefused | StoreError | ProxyError) -> ProxyError:
    if isinstance(e, ProxyError):
        return e
    if isinstance(e, StoreError):
        return e.for_client("could not change the keys")
    kind = {404: "not_found", 409: "conflict"}.get(e.status, "invalid_request")
    return ProxyError(kind, str(e))
