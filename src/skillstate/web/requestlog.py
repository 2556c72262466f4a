"""--verbose: one log line per request."""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..auth.gate import principal_of
from ..headertext import printable
from ..sessions.ids import SESSION_HEADER

log = logging.getLogger("skillstate")


class RequestLog:
    """--verbose: one line per request, naming the caller's key. Never bodies or keys."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        seen: dict[str, str] = {"status": "-", "session": "-", "upstream": "-"}

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = str(message["status"])
                for k, v in message.get("headers", []):
                    if k == SESSION_HEADER.encode():
                        seen["session"] = v.decode("latin-1")
                    elif k == b"x-skillstate-upstream":
                        seen["upstream"] = v.decode("latin-1")
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            ms = (time.perf_counter() - start) * 1000
            caller = principal_of(scope)  # the key's name, never the key
            log.info(
                "%s %s key=%s session=%s status=%s upstream=%s ms=%.1f",
                scope["method"], printable(scope["path"]), caller.name if caller else "-",
                seen["session"], seen["status"], seen["upstream"], ms,
            )  # fmt: skip
