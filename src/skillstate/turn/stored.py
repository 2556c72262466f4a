"""A Responses API turn's stored response (``store``, for ``previous_response_id`` and
``GET /v1/responses/{id}``): made from the reply the client gets and written in the turn's
commit, so that a committed turn always has its response and a response is never stored
for a turn that was not committed."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson

from ..dialects import sse
from ..dialects.responses.stream import TERMINAL_EVENTS
from ..store import StoredResponse


@dataclass
class StoredLink:
    """What a stored response records besides itself: its session, the response it chained
    on and the request's own input items (the chain's are stored once, in their links).
    ``done``: the turn wrote it (with its commit, or alone when it commits nothing).
    ``background``: the client asked for a background run, which the proxy served in the
    foreground (``web.responses``); the response says ``background: true`` as the API's does,
    which is what lets it be cancelled and streamed again later."""

    session: str
    previous: str | None
    items: list[Any]
    done: bool = False
    background: bool = False

    def record(self, resp: dict[str, Any]) -> StoredResponse | None:
        """The response to store (None when it has no id: nothing to chain on)."""
        if not isinstance(resp.get("id"), str):
            return None
        if self.background:
            resp = {**resp, "background": True}
        return StoredResponse(
            resp["id"], self.session, time.time(), self.previous, self.items, resp
        )

    def reply(self, raw: bytes) -> tuple[bytes, StoredResponse | None]:
        """A JSON reply as the client gets it (naming the previous response's id) and the
        response to store; ``raw`` and None when it is no response object."""
        try:
            resp = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw, None
        if not isinstance(resp, dict):
            return raw, None
        if self.previous is not None:
            resp["previous_response_id"] = self.previous
        if self.background:
            resp["background"] = True
        if self.previous is not None or self.background:
            raw = orjson.dumps(resp)
        return raw, self.record(resp)

    def from_stream(self, tail: bytes) -> StoredResponse | None:
        """The response of the terminal event in a stream's last bytes (None without one:
        an upstream's malformed event is relayed as it came, and nothing is stored)."""
        for event in sse.SSEParser().feed(tail):
            if event.event in TERMINAL_EVENTS and event.data:
                resp = response_of(event.data)
                if resp is not None:
                    return self.record(resp)
        return None


def response_of(data: str) -> dict[str, Any] | None:
    """The ``response`` object of a terminal event's data (None when it has none)."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    resp = parsed.get("response") if isinstance(parsed, dict) else None
    return resp if isinstance(resp, dict) else None
