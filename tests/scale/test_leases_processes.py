"""Session leases between real proxy processes sharing one Redis (each with its own SQLite
store here: what is tested is who may run a session's turn, not the shared store)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import httpx
import redis

from skillstate.coordination.leases import _keys
from tests.fakeprovider import FakeProvider, Reply

from .replicas import ReplicaSet
from .turns import check_history, mark, marked_reply, replay


def envelope(patch: dict[str, Any]) -> str:
    return f"ok\n```json\n{json.dumps({'state_patch': patch, 'action': 'a'})}\n```"


def _turns(fake: FakeProvider) -> int:
    """Chat turns the fake received (a replica may also ask it for its model list)."""
    return sum(r.path.endswith("/chat/completions") for r in fake.requests)


def _in_thread(call: Callable[[], httpx.Response]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as e:
            out.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_a_turn_queued_behind_another_replicas_turn_gets_a_409_after_lease_wait(
    start_replicas: Callable[..., ReplicaSet], fake: FakeProvider, redis_url: str
) -> None:
    reps = start_replicas(fake.url + "/v1", None, redis_url, n=2, config={"lease_wait": 0.5})
    held = threading.Event()
    fake.enqueue(Reply(text=envelope({"facts": {"a": 1}}), hold=held))
    t, out = _in_thread(lambda: reps[0].chat("busy", "first"))
    try:
        fake.wait_for(lambda _: _turns(fake) == 1, timeout=30)  # r0 holds the lease, upstream
        r = reps[1].chat("busy", "second")
        assert r.status_code == 409, r.text
        err = r.json()["error"]
        assert err["code"] == "session_busy" and "lease_wait" in err["message"]
        assert _turns(fake) == 1  # the refused turn was never sent upstream
    finally:
        held.set()
        t.join(60)
    assert out[0].status_code == 200, out[0].text


def test_a_replica_paused_past_its_lease_is_fenced_when_it_resumes(
    start_replicas: Callable[..., ReplicaSet], fake: FakeProvider, redis_url: str
) -> None:
    reps = start_replicas(fake.url + "/v1", None, redis_url, n=2, config={"lease_ttl": 3.0})
    held = threading.Event()
    fake.enqueue(Reply(text=envelope({"facts": {"paused": 1}}), hold=held))
    t, out = _in_thread(lambda: reps[0].chat("fenced", "first"))
    r = redis.Redis.from_url(redis_url)
    try:
        fake.wait_for(lambda _: _turns(fake) == 1, timeout=30)  # r0 holds the lease, upstream
        reps[0].pause()  # SIGSTOP mid-turn: no renewal
        while r.exists(_keys("fenced")[0]):  # until its lease expired in Redis
            threading.Event().wait(0.05)
        fake.enqueue(Reply(text=envelope({"facts": {"other": 1}})))
        other = reps[1].chat("fenced", "meanwhile")  # another replica gets the session
        assert other.status_code == 200, other.text
    finally:
        r.close()
        if reps[0].paused:
            reps[0].resume()
        held.set()
        t.join(60)
    fenced = out[0]
    assert fenced.status_code == 409, fenced.text
    assert fenced.json()["error"]["code"] == "lease_lost"
    # Nothing of the fenced turn was committed on its replica; its call is in the ledger.
    assert reps[0].http.get(reps[0].url + "/state", params={"session": "fenced"}).status_code == 404
    assert reps[0].cost(session="fenced")["totals"]["attempts"]["generation"] == 1


def test_concurrent_turns_of_one_session_on_two_replicas_run_one_after_the_other(
    start_replicas: Callable[..., ReplicaSet], fake: FakeProvider, pg_url: str, redis_url: str
) -> None:
    """Two replicas sharing PostgreSQL and Redis: every turn of a session sent at once to
    either replica commits (the lease queues it; none is a 409), each exactly once, on the
    state the one before it committed."""
    fake.responder = marked_reply
    reps = start_replicas(fake.url + "/v1", pg_url, redis_url, n=2)
    n = 12
    threads = [
        _in_thread(lambda k=k: reps[k % 2].chat("shared", mark("shared", f"r{k}")))
        for k in range(n)
    ]
    for t, _ in threads:
        t.join(120)
    statuses = [out[0].status_code for _, out in threads]
    assert statuses == [200] * n, [out[0].text for _, out in threads]
    history = reps[1].history("shared")
    by_step = check_history("shared", history)
    assert sorted(by_step.values()) == sorted(f"r{k}" for k in range(n))
    for r in reps:  # both replicas read the same, latest state
        assert r.state("shared")["state"] == replay(history)
