"""#17's acceptance: limits and the circuit breaker hold across three real replicas that
share one Redis, end to end (the windows' and breaker's own semantics are tested in
their own files)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx

from tests.fakeprovider import FakeProvider, Reply

from .replicas import ReplicaSet

StartReplicas = Callable[..., ReplicaSet]
BURST = 90
SETTLE_TIMEOUT = 120.0  # a hang's bound, not a measurement


def _upstream(fake: FakeProvider, **limits: int) -> dict[str, Any]:
    return {"name": "fake", "url": fake.url + "/v1", "api_key": "sk-upstream", **limits}


def _burst(reps: ReplicaSet, pool: ThreadPoolExecutor, prefix: str, content: str) -> list[Future]:
    """BURST turns at once, each its own session, spread evenly over the replicas."""
    return [
        pool.submit(reps[i % len(reps)].chat, f"{prefix}{i}", content, http=httpx.Client())
        for i in range(BURST)
    ]


def _await_answered_or_upstream(
    fake: FakeProvider, before: int, futures: list[Future]
) -> list[Any]:
    """Until every request of the burst has either been answered or reached the (holding)
    fake provider; returns the fake's requests of the burst."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while time.monotonic() < deadline:
        arrived = fake.requests[before:]
        if sum(f.done() for f in futures) + len(arrived) >= len(futures):
            return arrived
        time.sleep(0.02)
    raise AssertionError("the burst neither answered nor reached the upstream")


def _assert_refused_with_retry_after(responses: list[httpx.Response]) -> None:
    for r in responses:
        assert r.status_code == 429, r.text
        assert float(r.headers["retry-after"]) > 0, r.headers
        assert r.json()["error"]["type"], r.text


def test_rpm_30_across_three_replicas_admits_exactly_30_of_90(
    fake: FakeProvider, start_replicas: StartReplicas, pg_url: str, redis_url: str
) -> None:
    reps = start_replicas(
        fake.url, pg_url, redis_url, config={"upstreams": [_upstream(fake, rpm=30)]}
    )
    with ThreadPoolExecutor(BURST) as pool:
        responses = [f.result() for f in _burst(reps, pool, "rpm", "hello")]
    admitted = [r for r in responses if r.status_code == 200]
    assert len(admitted) == 30, sorted(r.status_code for r in responses)
    assert len(fake.requests) == 30
    _assert_refused_with_retry_after([r for r in responses if r.status_code != 200])
    for rep in reps:  # every replica reads the one shared window
        assert rep.upstream()["limits"]["rpm"] == {"limit": 30, "used": 30}


def _tpm_used(rep: Any) -> int:
    return int(rep.upstream()["limits"]["tpm"]["used"])


def test_tpm_across_three_replicas_reserves_the_estimate_and_settles_the_usage(
    fake: FakeProvider, start_replicas: StartReplicas, pg_url: str, redis_url: str
) -> None:
    tpm = 6000
    usage = {"prompt_tokens": 3, "completion_tokens": 2}  # what each admitted call costs
    reps = start_replicas(
        fake.url, pg_url, redis_url, config={"upstreams": [_upstream(fake, tpm=tpm)]}
    )
    content = "Summarise the warehouse migration plan. " * 10
    gate = threading.Event()
    fake.responder = lambda _req: Reply(usage=usage, hold=gate)

    with ThreadPoolExecutor(BURST) as pool:
        # One turn in flight on r0: every replica sees its reservation (the estimate).
        first = pool.submit(reps[0].chat, "tpm-first", content)
        fake.wait_for(lambda rs: len(rs) == 1, timeout=SETTLE_TIMEOUT)
        estimate = _tpm_used(reps[1])
        assert estimate > sum(usage.values())
        assert _tpm_used(reps[2]) == estimate
        gate.set()
        assert first.result().status_code == 200
        settled = sum(usage.values())
        assert [_tpm_used(r) for r in reps] == [settled] * 3  # the estimate was replaced

        # 90 at once, held at the upstream: exactly what the window has room for by estimate.
        for round_ in range(2):
            gate.clear()
            room = (tpm - _tpm_used(reps[0])) // estimate
            assert 0 < room < BURST, (estimate, room, "pick another tpm for this prompt size")
            before = len(fake.requests)
            futures = _burst(reps, pool, f"tpm{round_}-", content)
            arrived = _await_answered_or_upstream(fake, before, futures)
            assert len(arrived) == room, (len(arrived), room, estimate)
            assert _tpm_used(reps[round_ + 1]) == settled + room * estimate
            gate.set()
            responses = [f.result() for f in futures]
            assert sum(r.status_code == 200 for r in responses) == room
            _assert_refused_with_retry_after([r for r in responses if r.status_code != 200])
            settled += room * sum(usage.values())
            # Settled: each admitted call now counts its real usage, on every replica.
            assert [_tpm_used(r) for r in reps] == [settled] * 3


def test_the_breaker_is_shared_and_one_replica_probes_in_half_open(
    fake: FakeProvider, start_replicas: StartReplicas, pg_url: str, redis_url: str
) -> None:
    config = {"failure_threshold": 5, "open_cooldown": 5, "retry_max_attempts": 1}
    reps = start_replicas(fake.url + "/v1", pg_url, redis_url, config=config)
    fake.responder = lambda _req: Reply(status=500, error_body="down")
    for i in range(5):  # 2, 2 and 1 failures per replica: only their sum reaches 5
        r = reps[i % 3].chat(f"b{i}", "hello")
        assert r.status_code >= 500, r.text
    assert len(fake.requests) == 5
    for rep in reps:
        assert rep.upstream()["circuit"] == "open"
        refused = rep.chat(f"refused-{rep.name}", "hello")
        assert refused.status_code == 503, refused.text
    assert len(fake.requests) == 5  # open everywhere: nothing reached the upstream

    # The cooldown is over for every replica at once: half open.
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while reps[0].upstream()["circuit"] != "half_open":
        assert time.monotonic() < deadline, reps[0].upstream()
        time.sleep(0.1)
    gate = threading.Event()
    fake.responder = lambda _req: Reply(hold=gate)
    with ThreadPoolExecutor(9) as pool:
        futures = [
            pool.submit(reps[i % 3].chat, f"probe{i}", "hello", http=httpx.Client())
            for i in range(9)
        ]
        arrived = _await_answered_or_upstream(fake, 5, futures)
        assert len(arrived) == 1  # exactly one probe, from one replica
        gate.set()
        statuses = sorted(f.result().status_code for f in futures)
    assert statuses == [200] + [503] * 8, statuses
    for rep in reps:  # the probe's success closed it for everyone
        assert rep.upstream()["circuit"] == "closed"
        assert rep.chat(f"after-{rep.name}", "hello").status_code == 200
