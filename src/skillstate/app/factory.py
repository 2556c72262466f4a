"""``create_app``: the ASGI app, its route table, middleware and shared ``Runtime``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException

from ..auth.gate import KeyGate
from ..config import Settings
from ..store import Store
from ..web.failures import crashed, not_found
from ..web.fastpath import TurnFastPath
from ..web.requestlog import RequestLog
from ..web.routes import ROUTES, TURN_HANDLERS
from ..web.runtime import Runtime, lifespan
from .guards import BrowserGuard


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
