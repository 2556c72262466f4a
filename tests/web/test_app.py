"""The app in-process, with stores that misbehave on purpose: slow ledger writes (passthrough
turns meter off the critical path, yet `/cost` right after a reply counts it and shutdown drops
no row) and failing commits (a stream says so in-band)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from skillstate.app import create_app
from skillstate.config import Settings, Upstream
from skillstate.store import SessionCommit, StepConflict, StoreError
from skillstate.store.records import LedgerRow
from skillstate.store.sqlite import SQLiteStore
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER

LOCAL = "http://localhost"  # TestClient's default Host, "testserver", is not a loopback name
SLOW_WRITE = 0.3  # seconds; the reply returns long before the row is written


class SlowLedgerStore(SQLiteStore):
    async def add_ledger_rows(self, rows: list[LedgerRow]) -> None:
        await asyncio.sleep(SLOW_WRITE)
        await super().add_ledger_rows(rows)


def passthrough(c: TestClient, session: str) -> None:
    r = c.post(
        "/v1/chat/completions",
        json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-skillstate-mode": "passthrough", SESSION_HEADER: session},
    )
    assert r.status_code == 200, r.text


def settings(fake: FakeProvider, tmp_path: Path) -> Settings:
    return Settings(
        upstreams=[Upstream(name="fake", url=fake.url + "/v1", api_key="k")], data_dir=tmp_path
    )


def test_cost_counts_a_passthrough_reply_whose_row_is_still_being_written(
    fake: FakeProvider, tmp_path: Path
) -> None:
    s = settings(fake, tmp_path)
    with TestClient(create_app(s, SlowLedgerStore(s.db_path)), base_url=LOCAL) as c:
        passthrough(c, "pt")
        totals = c.get("/cost", params={"session": "pt"}).json()["totals"]
    assert totals["requests"] == 1 and totals["input_tokens"] > 0


def test_shutdown_writes_pending_ledger_rows(fake: FakeProvider, tmp_path: Path) -> None:
    s = settings(fake, tmp_path)
    with TestClient(create_app(s, SlowLedgerStore(s.db_path)), base_url=LOCAL) as c:
        passthrough(c, "pt")
    # A new process on the same store sees the row the old one was writing when it stopped.
    with TestClient(create_app(s), base_url=LOCAL) as c:
        totals = c.get("/cost", params={"session": "pt"}).json()["totals"]
    assert totals["requests"] == 1


class FailingCommitStore(SQLiteStore):
    async def commit(self, c: SessionCommit) -> int:
        raise StoreError("disk full")

    def commit_at_once(self, c: SessionCommit) -> int | None:
        return None  # every commit through commit()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_a_stream_whose_commit_fails_ends_with_an_error_event(
    fake: FakeProvider, tmp_path: Path, path: str
) -> None:
    s = settings(fake, tmp_path)
    fake.enqueue(Reply(text='```json\n{"state_patch": {}, "action": "a"}\n```'))
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    if path == "/v1/messages":
        body["max_tokens"] = 16
    app = create_app(s, FailingCommitStore(s.db_path))
    with TestClient(app, base_url=LOCAL) as c, c.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        events = b"".join(r.iter_bytes())
    *_, last = [e for e in events.split(b"\n\n") if e.strip()]
    assert b"could not commit the turn: disk full" in last
    assert (b"event: error" in last) == (path == "/v1/messages")  # each dialect's error event
    assert b"[DONE]" not in events and b"message_stop" not in events


class ConcurrentWriterStore(SQLiteStore):
    """Another process committed the session's next step first (scale-out)."""

    async def commit(self, c: SessionCommit) -> int:
        raise StepConflict(f"session {c.session} moved from step 0 to 1")

    def commit_at_once(self, c: SessionCommit) -> int | None:
        return None  # every commit through commit()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_a_step_conflict_is_a_409_in_the_clients_dialect(
    fake: FakeProvider, tmp_path: Path, path: str
) -> None:
    s = settings(fake, tmp_path)
    fake.enqueue(Reply(text='```json\n{"state_patch": {}, "action": "a"}\n```'))
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(create_app(s, ConcurrentWriterStore(s.db_path)), base_url=LOCAL) as c:
        r = c.post(path, json=body, headers={SESSION_HEADER: "sc"})
        assert r.status_code == 409, r.text
        doc = r.json()
        if path == "/v1/messages":
            assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"
            assert "moved from step 0 to 1" in doc["error"]["message"]
        else:
            assert doc["error"]["code"] == "conflict"
            assert "moved from step 0 to 1" in doc["error"]["message"]
        assert c.get("/state", params={"session": "sc"}).status_code == 404  # nothing committed
        # The attempt is still metered, once.
        attempts = c.get("/cost", params={"session": "sc"}).json()["totals"]["attempts"]
        assert attempts["generation"] == 1


class AtOnceRecordingStore(SQLiteStore):
    """Records what each commit offered to ``commit_at_once`` answered (None: declined)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.at_once: list[int | None] = []

    def commit_at_once(self, c: SessionCommit) -> int | None:
        step = super().commit_at_once(c)
        self.at_once.append(step)
        return step


def test_a_lone_turn_is_offered_to_the_store_to_commit_at_once(
    fake: FakeProvider, tmp_path: Path
) -> None:
    s = settings(fake, tmp_path)
    store = AtOnceRecordingStore(s.db_path)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(create_app(s, store), base_url=LOCAL) as c:
        for step in (1, 2):
            fake.enqueue(
                Reply(text=f'```json\n{{"state_patch": {{"k": {step}}}, "action": "a"}}\n```')
            )
            r = c.post("/v1/chat/completions", json=body, headers={SESSION_HEADER: "lone"})
            assert r.status_code == 200, r.text
            assert r.headers["x-skillstate-step"] == str(step)
        state = c.get("/state", params={"session": "lone"}).json()
    # Both turns were offered (no other turn in flight); whichever way each committed, the
    # session is at step 2 with the second turn's state.
    assert len(store.at_once) == 2 and set(store.at_once) <= {None, 1, 2}
    assert state["step"] == 2 and state["state"]["k"] == 2


def test_turn_routes_direct_entry_keeps_the_router_answers(
    fake: FakeProvider, tmp_path: Path
) -> None:
    """The turn paths' direct entry (web/fastpath) answers exactly what the router would: every
    dialect's turn path is served with and without /v1, other methods are a 405, other paths
    fall through to the router (a 404 in the caller's dialect), and a missing body is the
    dialect's 400, not a crash."""
    from skillstate.dialects.registry import DIALECTS
    from skillstate.web.routes import TURN_HANDLERS

    assert set(TURN_HANDLERS) == {
        prefix + d.client_path for d in DIALECTS.values() for prefix in ("/v1", "")
    }
    s = settings(fake, tmp_path)
    with TestClient(create_app(s), base_url=LOCAL) as c:
        passthrough(c, "direct")
        assert c.get("/v1/chat/completions").status_code == 405
        assert c.put("/chat/completions").status_code == 405
        missing = c.post("/v1/chat/completions/extra", json={})
        assert missing.status_code == 404 and missing.json()["error"]
        embeddings = c.post("/v1/embeddings", json={"model": "m", "input": "x"})
        said = embeddings.json()["error"]["message"]
        assert embeddings.status_code == 404 and "call the provider directly" in said
        for path in TURN_HANDLERS:
            r = c.post(path, content=b"", headers={"content-type": "application/json"})
            assert r.status_code == 400, (path, r.text)
