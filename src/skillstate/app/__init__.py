"""Running the proxy: the ASGI app (``factory.create_app``), its server, and the HTTP guards and
limits in front of every route.

``create_app``, ``Runtime`` and ``RequestLog`` are this package's public entry. They load on first
use (PEP 562), so that importing a submodule such as ``skillstate.app.guards`` from the web
handlers does not import the whole app back (an import cycle)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..web.requestlog import RequestLog
    from ..web.runtime import Runtime
    from .factory import create_app

__all__ = ["RequestLog", "Runtime", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .factory import create_app

        return create_app
    if name == "Runtime":
        from ..web.runtime import Runtime

        return Runtime
    if name == "RequestLog":
        from ..web.requestlog import RequestLog

        return RequestLog
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
