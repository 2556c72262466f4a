"""Issue 26's idempotency acceptance with three real replicas sharing one PostgreSQL and one
Redis: a key sent twice (to two replicas) or at once to all three is one upstream call, one
ledger row and one step, and every client gets the same bytes; a key reused with another
body is a 422; a replica killed (kill -9) between the upstream's reply and the commit, or
right after the commit, never leaves two committed steps behind its retries.

The kill is deterministic: the replica runs with ``SKILLSTATE_TEST_KILL=<point>:<key>``
(skillstate.turn.idempotency), so the turn with that key SIGKILLs its own process exactly
at ``before-commit`` or ``after-commit``."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from tests.fakeprovider import FakeProvider, Reply

from .replicas import Replica, ReplicaSet
from .turns import envelope

StartReplicas = Callable[..., ReplicaSet]
KEY = "Idempotency-Key"
FAST_LEASES = {
    "lease_ttl": 3.0,
    "lease_wait": 60,
}  # 3 s: a loaded machine can stall a renewal past 1 s


def turn(
    rep: Replica, key: str, content: str = "go", *, stream: bool = False, session: str = "s"
) -> httpx.Response:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": content}]}
    if stream:
        body["stream"] = True
    return rep.http.post(
        rep.v1 + "/chat/completions",
        json=body,
        headers={"x-skillstate-session": session, KEY: key},
        timeout=120,
    )


def ledger_rows(rep: Replica, session: str = "s") -> int:
    return int(rep.cost(since="all", session=session)["totals"]["requests"])


@pytest.mark.parametrize("stream", [False, True])
def test_the_same_key_on_two_replicas_is_one_call_one_row_one_step(
    fake: FakeProvider,
    start_replicas: StartReplicas,
    pg_url: str,
    redis_url: str,
    stream: bool,
) -> None:
    reps = start_replicas(fake.url + "/v1", pg_url, redis_url, n=3)
    fake.enqueue(Reply(text=envelope({"facts": ["a"]})), Reply(text="never"))
    first = turn(reps[0], "k1", stream=stream)
    again = turn(reps[1], "k1", stream=stream)
    assert first.status_code == again.status_code == 200
    assert again.content == first.content and again.headers["x-skillstate-replayed"] == "true"
    assert len(fake.requests) == 1
    assert ledger_rows(reps[2]) == 1 and len(reps[2].history("s")) == 1
    # The SDK reads the replay like the first reply.
    client = openai.OpenAI(base_url=reps[2].v1, api_key="sk-client", max_retries=0)
    if not stream:
        done = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "go"}],
            extra_headers={"x-skillstate-session": "s", KEY: "k1"},
        )
        assert done.choices[0].message.content == "ok"
    assert len(fake.requests) == 1


def test_the_same_key_sent_at_once_to_three_replicas_is_one_call(
    fake: FakeProvider, start_replicas: StartReplicas, pg_url: str, redis_url: str
) -> None:
    reps = start_replicas(fake.url + "/v1", pg_url, redis_url, n=3)
    gate = threading.Event()
    fake.enqueue(Reply(text=envelope({"facts": ["once"]}), hold=gate), Reply(text="never"))
    with ThreadPoolExecutor(6) as pool:
        calls = [pool.submit(turn, reps[i % 3], "together") for i in range(6)]
        fake.wait_for(lambda rs: len(rs) == 1, timeout=60)
        gate.set()
        replies = [c.result() for c in calls]
    assert {r.status_code for r in replies} == {200}
    assert len({r.content for r in replies}) == 1  # every client, the same bytes
    assert sorted(r.headers.get("x-skillstate-replayed", "-") for r in replies) == [
        "-", *["true"] * 5
    ]  # fmt: skip
    assert len(fake.requests) == 1
    assert ledger_rows(reps[0]) == 1 and len(reps[0].history("s")) == 1


def test_a_key_reused_with_another_body_is_a_422(
    fake: FakeProvider, start_replicas: StartReplicas, pg_url: str, redis_url: str
) -> None:
    reps = start_replicas(fake.url + "/v1", pg_url, redis_url, n=2)
    fake.enqueue(Reply(text=envelope({})))
    assert turn(reps[0], "k", "one question").status_code == 200
    r = turn(reps[1], "k", "another question")
    assert r.status_code == 422 and r.json()["error"]["code"] == "idempotency_key_reused"
    assert len(fake.requests) == 1 and len(reps[1].history("s")) == 1


def armed(reps: ReplicaSet, point: str, key: str) -> Replica:
    """Replica 0, restarted with the kill hook armed for ``key`` at ``point``."""
    victim = reps[0]
    victim.stop()
    victim.env = {**victim.env, "SKILLSTATE_TEST_KILL": f"{point}:{key}"}
    return victim.start()


@pytest.mark.parametrize("stream", [False, True])
def test_killed_before_the_commit_a_retry_is_a_fresh_turn_committed_once(
    fake: FakeProvider,
    start_replicas: StartReplicas,
    pg_url: str,
    redis_url: str,
    stream: bool,
) -> None:
    reps = start_replicas(fake.url + "/v1", pg_url, redis_url, n=2, config=FAST_LEASES)
    victim = armed(reps, "before-commit", "doomed")
    fake.enqueue(Reply(text=envelope({"facts": ["first try"]})))
    fake.enqueue(Reply(text=envelope({"facts": ["retry"]})), Reply(text="never"))
    with pytest.raises(httpx.HTTPError):  # the process died under the request
        turn(victim, "doomed", stream=stream)
    victim.proc.wait(30)  # type: ignore[union-attr]
    assert victim.proc.returncode == -9  # type: ignore[union-attr]
    # Its key's lease expires (lease_ttl); the retry runs the turn, once.
    retried = turn(reps[1], "doomed", stream=stream)
    assert retried.status_code == 200 and "x-skillstate-replayed" not in retried.headers
    again = turn(reps[1], "doomed", stream=stream)
    assert again.content == retried.content and again.headers["x-skillstate-replayed"] == "true"
    history = reps[1].history("s")
    assert len(history) == 1 and history[0]["patch"] == {"facts": ["retry"]}
    assert len(fake.requests) == 2  # the killed try's call, and the retry's


def test_killed_after_the_commit_a_retry_gets_the_committed_reply(
    fake: FakeProvider, start_replicas: StartReplicas, pg_url: str, redis_url: str
) -> None:
    reps = start_replicas(fake.url + "/v1", pg_url, redis_url, n=2, config=FAST_LEASES)
    victim = armed(reps, "after-commit", "landed")
    fake.enqueue(Reply(text=envelope({"facts": ["committed"]})), Reply(text="never"))
    with pytest.raises(httpx.HTTPError):
        turn(victim, "landed")
    victim.proc.wait(30)  # type: ignore[union-attr]
    retried = turn(reps[1], "landed")
    assert retried.status_code == 200 and retried.headers["x-skillstate-replayed"] == "true"
    assert retried.headers["x-skillstate-step"] == "1"
    history = reps[1].history("s")
    assert len(history) == 1 and history[0]["patch"] == {"facts": ["committed"]}
    assert len(fake.requests) == 1 and ledger_rows(reps[1]) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_responses_turn_killed_after_the_commit_has_its_stored_response(
    fake: FakeProvider, start_replicas: StartReplicas, pg_url: str, redis_url: str, stream: bool
) -> None:
    """``store: true``: the response is written in the commit's statement, so the replica
    killed right after it leaves it for the other one to chain on."""
    reps = start_replicas(fake.url + "/v1", pg_url, redis_url, n=2, config=FAST_LEASES)
    victim = armed(reps, "after-commit", "stored")
    fake.enqueue(Reply(text=envelope({"facts": ["one"]})))
    body = {"model": "m", "input": "one", "stream": stream}
    sent = {"x-skillstate-session": "s", KEY: "stored"}
    with pytest.raises(httpx.HTTPError):
        victim.http.post(victim.v1 + "/responses", json=body, headers=sent, timeout=120)
    victim.proc.wait(30)  # type: ignore[union-attr]
    assert victim.proc.returncode == -9  # type: ignore[union-attr]
    replay = reps[1].http.post(reps[1].v1 + "/responses", json=body, headers=sent, timeout=120)
    assert replay.status_code == 200 and replay.headers["x-skillstate-replayed"] == "true"
    # Retries: a 409 for a lease not renewed within FAST_LEASES' lease_ttl on a loaded machine.
    client = openai.OpenAI(base_url=reps[1].v1, api_key="sk", max_retries=3)
    found = re.search(r'"id":\s*"(resp_[^"]+)"', replay.text)
    assert found is not None, replay.text[:300]
    rid = found.group(1)
    assert client.responses.retrieve(rid).id == rid
    fake.enqueue(Reply(text=envelope({"facts": ["two"]})))
    nxt = client.responses.create(
        model="m",
        input="two",
        previous_response_id=rid,
        extra_headers={"x-skillstate-session": "s"},
    )
    assert nxt.previous_response_id == rid and "one" in str(fake.requests[-1].json)
