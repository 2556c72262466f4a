"""``web.wire.unless_disconnected``: a turn's work cancelled when its client goes, under the
proxy's own server (the connection's future in the scope) and under any other ASGI server
(a watcher waiting for ``http.disconnect``). The end-to-end cases (a real proxy, a client
that hangs up) are in tests/e2e/test_e2e_resilience.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request

from skillstate.web.wire import CONNECTION_LOST, unless_disconnected


def request(lost: asyncio.Future[None] | None, receive: Any = None) -> Request:
    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": "/", "headers": []}
    if lost is not None:
        scope[CONNECTION_LOST] = lost
    return Request(scope, receive)


async def slow(log: list[str]) -> str:
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        log.append("cancelled")
        raise
    return "done"


def test_the_connections_loss_cancels_the_work() -> None:
    async def main() -> tuple[str | None, list[str]]:
        lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        log: list[str] = []
        asyncio.get_running_loop().call_later(0.01, lost.set_result, None)
        return await unless_disconnected(request(lost), slow(log)), log

    assert asyncio.run(main()) == (None, ["cancelled"])


def test_work_that_ends_first_is_its_answer_and_a_later_loss_cancels_nothing() -> None:
    async def main() -> tuple[str | None, bool]:
        lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def quick() -> str:
            lost.set_result(None)  # lost while the work ends: its callback runs after
            return "answer"

        got = await unless_disconnected(request(lost), quick())
        await asyncio.sleep(0)  # the loss's callback runs now
        await asyncio.sleep(0)  # and this task is not cancelled by it
        return got, True

    assert asyncio.run(main()) == ("answer", True)


def test_a_cancellation_from_elsewhere_is_not_swallowed() -> None:
    async def main() -> None:
        lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        log: list[str] = []
        task = asyncio.ensure_future(unless_disconnected(request(lost), slow(log)))
        await asyncio.sleep(0.01)
        task.cancel()  # a server shutting down, say
        with pytest.raises(asyncio.CancelledError):
            await task
        assert log == ["cancelled"] and not lost.done()

    asyncio.run(main())


def test_under_another_server_a_watcher_waits_for_the_disconnect() -> None:
    async def main() -> tuple[str | None, list[str]]:
        async def receive() -> dict[str, Any]:
            await asyncio.sleep(0.01)
            return {"type": "http.disconnect"}

        log: list[str] = []
        return await unless_disconnected(request(None, receive), slow(log)), log

    assert asyncio.run(main()) == (None, ["cancelled"])
