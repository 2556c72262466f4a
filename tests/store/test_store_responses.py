"""The store's Responses API table: chains followed in one query, each link stored once,
expiry with the session TTL and deletion with the session."""

from __future__ import annotations

from pathlib import Path

from skillstate.store import StoredResponse
from skillstate.store.sqlite import SQLiteStore


def link(
    rid: str, previous: str | None, created: float = 100.0, session: str = "s"
) -> StoredResponse:
    item = {"type": "message", "role": "user", "content": rid}
    out = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": rid}],
    }
    return StoredResponse(rid, session, created, previous, [item], {"id": rid, "output": [out]})


async def test_a_chain_is_followed_oldest_first_and_bounded(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "skillstate.db")
    await store.open()
    try:
        for i in range(5):
            await store.put_response(link(f"r{i}", f"r{i - 1}" if i else None))
        chain = await store.response_chain("r4", 100)
        assert [r.id for r in chain] == ["r0", "r1", "r2", "r3", "r4"]
        assert all(len(r.input) == 1 for r in chain)  # each link holds its own items only
        assert [r.id for r in await store.response_chain("r4", 2)] == ["r3", "r4"]
        assert await store.response_chain("nope", 10) == []
        assert await store.delete_response("r2") and not await store.delete_response("r2")
        # a deleted link ends the chain there
        assert [r.id for r in await store.response_chain("r4", 100)] == ["r3", "r4"]
    finally:
        await store.close()


async def test_responses_expire_and_go_with_their_session(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "skillstate.db")
    await store.open()
    try:
        await store.put_response(link("old", None, created=10.0, session="a"))
        await store.put_response(link("new", None, created=1000.0, session="a"))
        await store.put_response(link("other", None, created=1000.0, session="b"))
        await store.purge_sessions(older_than=500.0)
        assert await store.response_chain("old", 1) == []
        assert [r.id for r in await store.response_chain("new", 1)] == ["new"]
        await store.delete("a")
        assert await store.response_chain("new", 1) == []
        assert [r.id for r in await store.response_chain("other", 1)] == ["other"]
    finally:
        await store.close()
