"""The TTL purge and a turn in flight: an expired session whose turn is running is left to
that turn (its commit makes it fresh again), instead of being deleted under it (a 409)."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from tests.conftest import StartProxy
from tests.fakeprovider import FakeProvider, RecordedRequest, Reply
from tests.helpers import SESSION_HEADER


def _turn(url: str, session: str) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    return httpx.post(
        url + "/v1/chat/completions",
        json=body,
        headers={SESSION_HEADER: session},
        timeout=60,
    )


def test_purge_leaves_a_session_with_a_turn_in_flight(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    # session_ttl is the slack the held turn has to reach its upstream call after the first
    # turn's commit: with 1 s a loaded machine (load 24, pytest -n auto) sometimes let "busy"
    # expire and be purged before that turn began, which then started a new session (step 1),
    # as it should. 5 s keeps the precondition without slowing the test by more than the wait.
    p = start_proxy(fake.url + "/v1", config={"session_ttl": 5, "purge_interval": 0.1})
    assert _turn(p.url, "busy").status_code == 200
    assert _turn(p.url, "other").status_code == 200  # younger: once it is purged, so is "busy"

    # The next upstream call of "busy" is held until the test releases it.
    release = threading.Event()

    def held(rec: RecordedRequest) -> Reply:
        release.wait(60)
        return Reply(text="done")

    fake.responder = held
    result: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: result.update(r=_turn(p.url, "busy")))
    worker.start()
    try:
        fake.wait_for(lambda reqs: len(reqs) == 3)
        # Both expire and a purge runs while the turn of "busy" waits for its upstream.
        deadline = time.monotonic() + 30
        while p.get("/state", params={"session": "other"}).status_code != 404:
            assert time.monotonic() < deadline, "the purge never ran"
            time.sleep(0.05)
    finally:
        release.set()
        worker.join(60)
    r = result["r"]
    assert r.status_code == 200, r.text
    assert r.headers["x-skillstate-step"] == "2"
    assert p.state("busy")["step"] == 2
