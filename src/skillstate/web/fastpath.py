"""A direct ASGI entry for the turn routes, in front of Starlette's router.

Every turn passes through here, so it skips what the router costs per request (matching each
route's regex in turn, the exception-handler wrappers): an exact ``POST`` to a turn path goes
straight to its handler. Anything else, including those paths under another method or a
``root_path``, goes on to the router unchanged. It sits inside the guards and the key gate,
and an exception still reaches the app's error handler.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

Handler = Callable[[Request], Awaitable[Response]]


class TurnFastPath:
    """ASGI middleware: ``POST`` to an exact turn path calls its handler without routing."""

    def __init__(self, app: ASGIApp, handlers: dict[str, Handler]) -> None:
        self.app = app
        self.handlers = handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            handler = self.handlers.get(scope["path"])
            if handler is not None:
                response = await handler(Request(scope, receive, send))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
