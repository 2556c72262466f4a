"""read_json_object against ASGI message sequences: a body in several messages, a client that
leaves half-way, a body that grows past the limit only in its later messages."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request

from skillstate.errors import ProxyError
from skillstate.web.wire import read_json_object


def request_of(messages: list[dict[str, Any]]) -> Request:
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        return queue.pop(0)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(b"content-type", b"application/json")],
    }
    return Request(scope, receive)


def body(chunk: bytes, more: bool) -> dict[str, Any]:
    return {"type": "http.request", "body": chunk, "more_body": more}


def test_a_body_in_several_messages_is_read_whole() -> None:
    req = request_of([body(b'{"model": ', True), body(b"", True), body(b'"m"}', False)])
    assert asyncio.run(read_json_object(req, 1000)) == {"model": "m"}


def test_a_client_leaving_mid_body_is_a_clear_400() -> None:
    req = request_of([body(b'{"model": ', True), {"type": "http.disconnect"}])
    with pytest.raises(ProxyError) as e:
        asyncio.run(read_json_object(req, 1000))
    assert e.value.status == 400 and "left before sending the whole body" in e.value.message


def test_a_body_past_the_limit_in_a_later_message_is_413() -> None:
    req = request_of([body(b"{" + b" " * 8, True), body(b" " * 8, True), body(b"}", False)])
    with pytest.raises(ProxyError) as e:
        asyncio.run(read_json_object(req, 12))
    assert e.value.status == 413 and e.value.code == "request_too_large"
