"""The Responses route's stream tap (a compaction's stream, whose reply is made after its
turns): the final response is stored before the terminal event is passed on, and a malformed
terminal event is relayed without storing anything. A plain turn's, read from its stream's
last bytes (``StoredLink.from_stream``), goes into its commit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from skillstate.store import StoredResponse
from skillstate.turn.stored import StoredLink
from skillstate.web.responses import _keep_stream


class Recorder:
    def __init__(self) -> None:
        self.kept: list[StoredResponse] = []

    async def put_response(self, record: StoredResponse) -> None:
        self.kept.append(record)


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def test_the_terminal_response_is_kept_before_it_is_passed_on() -> None:
    store: Any = Recorder()
    link = StoredLink("s1", "resp_prev", [{"type": "message", "role": "user", "content": "x"}])
    data = b'{"type":"response.completed","response":{"id":"resp_1","output":[]}}'
    done = b"event: response.completed\ndata: " + data + b"\n\n"
    seen = []
    async for chunk in _keep_stream(
        store, link, chunks(b"event: response.created\ndata: {}\n\n", done)
    ):
        seen.append((chunk, len(store.kept)))
    assert seen[-1] == (done, 1)  # stored before the client got the terminal event
    (kept,) = store.kept
    assert (kept.id, kept.session, kept.previous) == ("resp_1", "s1", "resp_prev")


async def test_a_malformed_terminal_event_is_relayed_and_not_kept() -> None:
    store: Any = Recorder()
    link = StoredLink("s1", None, [])
    bad = b"event: response.completed\ndata: {not json\n\n"
    out = [c async for c in _keep_stream(store, link, chunks(bad))]
    assert out == [bad] and store.kept == []
    assert link.from_stream(bad) is None


def test_a_streams_last_bytes_give_the_response_to_commit() -> None:
    link = StoredLink("s1", "resp_prev", [])
    data = b'{"type":"response.completed","response":{"id":"resp_1","output":[]}}'
    stored = link.from_stream(
        b": skillstate transition=valid\n\nevent: response.completed\ndata: " + data + b"\n\n"
    )
    assert stored is not None and (stored.id, stored.previous) == ("resp_1", "resp_prev")
