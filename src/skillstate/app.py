"""The public entry to the ASGI app (the handlers live in ``skillstate.web``)."""

from .web import RequestLog, Runtime, create_app

__all__ = ["RequestLog", "Runtime", "create_app"]
