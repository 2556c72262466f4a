"""The HTTP face of the proxy: module-level handlers that find the shared ``Runtime`` on
``request.app.state``, a route table, and ``create_app`` that puts them together."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException

from ..auth.gate import KeyGate
from ..config import Settings
from ..guards import BrowserGuard
from ..store import Store
from .failures import crashed, not_found
from .fastpath import TurnFastPath
from .requestlog import RequestLog
from .routes import ROUTES, TURN_HANDLERS
from .runtime import Runtime, lifespan

__all__ = ["RequestLog", "Runtime", "create_app"]


def create_app(
    settings: Settings,
    store: Store | None = None,
    *,
    tracer_provider: Any = None,
    clock: Callable[[], float] = time.time,
) -> Starlette:
    """The ASGI app for ``settings`` (``store`` defaults to the SQLite store in the data dir;
    ``tracer_provider``, an OpenTelemetry one, to the OTLP exporter when tracing is on;
    ``clock``, the wall clock of per-key daily budgets, to the real one)."""
    app = Starlette(
        routes=ROUTES,
        lifespan=lifespan,
        exception_handlers={HTTPException: not_found, Exception: crashed},
    )
    app.state.runtime = rt = Runtime(settings, store, tracer_provider, clock)
    # Innermost: the turn routes' direct entry, behind the key gate and the guards.
    app.add_middleware(TurnFastPath, handlers=TURN_HANDLERS)
    app.add_middleware(KeyGate, keys=rt.keys)  # inside the guard: a refused Host costs no HMAC
    app.add_middleware(BrowserGuard, settings=settings)
    if settings.verbose:
        app.add_middleware(RequestLog)
    return app
