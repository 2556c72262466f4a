"""--verbose's line per request, and the internal-error line: a client's path cannot forge
a log line (``headertext.printable``)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from skillstate.headertext import printable
from skillstate.web.requestlog import RequestLog

FORGED = "/v1/x\naudit: key created name=evil admin=true by=cli\x1b[2J"


def test_printable_escapes_what_a_terminal_or_a_log_reader_would_act_on() -> None:
    assert printable("plain /v1/chat, é ✓") == "plain /v1/chat, é ✓"
    assert printable("a\nb\r\tc\x1b[31md\x00\u2028e") == "a\\nb\\r\\tc\\x1b[31md\\x00\\u2028e"


def test_a_path_with_a_new_line_is_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        return None

    scope = {"type": "http", "method": "GET", "path": FORGED, "headers": []}
    with caplog.at_level(logging.INFO, logger="skillstate"):
        asyncio.run(RequestLog(app)(scope, receive, send))
    (line,) = [r.getMessage() for r in caplog.records if r.name == "skillstate"]
    assert "\n" not in line and "\x1b" not in line
    assert line.startswith("GET /v1/x\\naudit: key created name=evil admin=true by=cli\\x1b[2J ")
    assert "status=404" in line
