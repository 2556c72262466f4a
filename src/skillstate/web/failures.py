"""What the app answers when no handler does: unknown routes and methods, and crashes,
each as an error object in the dialect the caller most likely speaks."""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ..dialects.registry import dialect_for_path
from ..errors import Dialect, ProxyError
from ..headertext import printable
from .catalog import catalog_dialect
from .wire import error_response

log = logging.getLogger("skillstate")


def dialect_of(request: Request) -> Dialect:
    """The dialect of an error outside the turn routes: by path, else by the Anthropic SDK's
    own header."""
    return dialect_for_path(request.url.path) or catalog_dialect(request.headers)


# What a 404 says is served: a client pointed at the proxy for an API the proxy does not relay
# (embeddings, files, batches...) learns to call the provider for it.
_SERVED = (
    "the proxy serves model turns (POST /v1/chat/completions, /v1/messages, /v1/responses)"
    " and the routes `skillstate --help` lists; call the provider directly for other endpoints"
)


async def not_found(request: Request, exc: Exception) -> Response:
    """404 for an unknown route, 405 for a known route with another method."""
    status = getattr(exc, "status_code", 404)
    kind = "not_found" if status == 404 else "invalid_request"
    msg = (
        f"no route {request.method} {request.url.path}: {_SERVED}"
        if status == 404
        else f"method {request.method} not allowed on {request.url.path}"
    )
    # A 405 names the methods the route takes (``Allow``), as Starlette's own does.
    sent = getattr(exc, "headers", None) or {}
    allow = {k.lower(): v for k, v in sent.items() if k.lower() == "allow"}
    return error_response(ProxyError(kind, msg, status=status), dialect_of(request), allow)


async def post_only(request: Request) -> Response:
    """A POST-only path that a GET or DELETE route beside it would take otherwise
    (``/v1/responses/input_tokens`` is no response id): the 405 a POST-only route answers."""
    raise HTTPException(405, headers={"allow": "POST"})


async def crashed(request: Request, exc: Exception) -> Response:
    """A bug: logged with its traceback, answered as a 500 without one."""
    log.exception("internal error on %s %s", request.method, printable(request.url.path))
    err = ProxyError("api_error", f"internal proxy error ({type(exc).__name__})")
    return error_response(err, dialect_of(request))
