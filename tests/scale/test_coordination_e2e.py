"""Leases, fencing, cache invalidation and Redis outages through the real proxy, with real
SDK clients, against the tier's real redis-server.

Two replicas sharing one store: until a shared store backend is used here, two apps in this
process open the same SQLite file (each store with its own session cache, which is exactly
what a replica has), and share one Redis."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import redis
from starlette.testclient import TestClient

from skillstate.app import create_app
from skillstate.config import Settings, Upstream
from skillstate.coordination.leases import _keys
from skillstate.store.sqlite import SQLiteStore
from tests.conftest import StartProxy
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, envelope

from .services import RedisServer

LOCAL = "http://localhost"


def _turn(c: TestClient, session: str) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}]}
    return c.post("/v1/chat/completions", json=body, headers={SESSION_HEADER: session})


@pytest.fixture
def two_replicas(
    fake: FakeProvider, tmp_path: Path, redis_url: str
) -> Iterator[tuple[TestClient, TestClient]]:
    s = Settings(
        upstreams=[Upstream(name="fake", url=fake.url + "/v1", api_key="k")],
        data_dir=tmp_path,
        schema=["facts"],
        coordination=redis_url,
    )
    a = TestClient(create_app(s, SQLiteStore(s.db_path)), base_url=LOCAL)
    b = TestClient(create_app(s, SQLiteStore(s.db_path)), base_url=LOCAL)
    with a, b:
        yield a, b


def test_a_replica_never_serves_its_stale_cached_state(
    fake: FakeProvider, two_replicas: tuple[TestClient, TestClient]
) -> None:
    a, b = two_replicas
    fake.enqueue(Reply(text=envelope({"facts": {"one": 1}})))
    assert _turn(a, "s").status_code == 200  # a caches the session at step 1
    fake.enqueue(Reply(text=envelope({"facts": {"two": 2}})))
    assert _turn(b, "s").status_code == 200  # b commits step 2
    got = a.get("/state", params={"session": "s"}).json()
    assert (got["step"], got["state"]["facts"]) == (2, {"one": 1, "two": 2})
    fake.enqueue(Reply(text=envelope({"facts": {"three": 3}})))
    r = _turn(a, "s")  # built on step 2, not on a's cached step 1 (which would be a 409)
    assert r.status_code == 200, r.text
    assert r.headers["x-skillstate-step"] == "3"
    assert '"two":2' in fake.last.json["messages"][-1]["content"]  # the state b committed
    # A session deleted by one replica is gone for the other.
    assert b.delete("/state", params={"session": "s"}).status_code in (200, 204)
    assert a.get("/state", params={"session": "s"}).status_code == 404


def test_a_turn_whose_lease_was_lost_gets_a_409_and_is_still_metered(
    fake: FakeProvider, start_proxy: StartProxy, redis_url: str
) -> None:
    p = start_proxy(
        fake.url + "/v1",
        "--schema",
        "facts",
        config={"coordination": redis_url, "lease_ttl": 0.6},
    )
    c = openai.OpenAI(base_url=p.v1, api_key="k", max_retries=0)
    hdr = {SESSION_HEADER: "fenced"}
    msgs: Any = [{"role": "user", "content": "go"}]
    fake.enqueue(Reply(text=envelope({"facts": {"one": 1}})))
    c.chat.completions.create(model="m", messages=msgs, extra_headers=hdr)
    fake.enqueue(Reply(text=envelope({"facts": {"two": 2}}), delay=3.0))
    outcome: list[BaseException | None] = []

    def slow_turn() -> None:
        try:
            c.chat.completions.create(model="m", messages=msgs, extra_headers=hdr)
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    t = threading.Thread(target=slow_turn)
    t.start()
    r = redis.Redis.from_url(redis_url)
    try:
        lease_key = _keys("fenced")[0]
        while r.get(lease_key) is None:  # the slow turn holds the lease
            time.sleep(0.01)
        # Meanwhile another replica got the session (this one looked dead past its TTL).
        r.set(lease_key, "another-replica", px=60_000)
        t.join(30)
        assert r.get(lease_key) == b"another-replica"  # its release left it alone
    finally:
        r.close()
    err = outcome[0]
    assert isinstance(err, openai.ConflictError), err
    assert err.status_code == 409 and err.code == "lease_lost"
    assert p.state("fenced")["step"] == 1  # nothing committed
    # The upstream answered (and bills) the fenced turn: its row is in the ledger.
    cost = p.get("/cost", params={"session": "fenced"}).json()["totals"]
    assert cost["attempts"]["generation"] == 2


def _health(p: Any) -> httpx.Response:
    return p.get("/health")


def _wait_healthy(p: Any) -> dict[str, Any]:
    for _ in range(300):
        h = _health(p)
        if h.status_code == 200 and h.json()["coordination"]["redis"] == "ok":
            return dict(h.json())
        time.sleep(0.05)
    raise AssertionError(f"never healthy again: {_health(p).text}")


def test_redis_down_refuses_turns_in_each_dialect_until_it_is_back(
    fake: FakeProvider, start_proxy: StartProxy, redis_url: str, redis_server: RedisServer
) -> None:
    p = start_proxy(fake.url + "/v1", "--schema", "facts", config={"coordination": redis_url})
    oai = openai.OpenAI(base_url=p.v1, api_key="k", max_retries=0)
    ant = anthropic.Anthropic(base_url=p.url, api_key="k", max_retries=0)
    hdr = {SESSION_HEADER: "down"}
    assert _health(p).json()["coordination"] == {
        "redis": "ok",
        "degraded": False,
        "when_down": "refuse",
    }
    redis_server.stop()
    try:
        with pytest.raises(openai.APIStatusError) as oe:
            oai.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "go"}], extra_headers=hdr
            )
        assert oe.value.status_code == 503
        assert oe.value.code == "coordination_unavailable"
        assert oe.value.response.headers["retry-after"] == "1"
        with pytest.raises(anthropic.APIStatusError) as ae:
            ant.messages.create(
                model="m",
                max_tokens=16,
                messages=[{"role": "user", "content": "go"}],
                extra_headers=hdr,
            )
        assert ae.value.status_code == 503
        assert "Redis" in ae.value.message and "unreachable" in ae.value.message
        assert fake.pending == 0 and not fake.requests  # nothing was sent upstream
        h = _health(p)
        assert h.status_code == 503
        assert h.json()["coordination"]["redis"].startswith("down: ")
        assert h.json()["coordination"]["degraded"] is False
    finally:
        redis_server.start()
    _wait_healthy(p)
    fake.enqueue(Reply(text=envelope({"facts": {"back": True}})))
    oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "go"}], extra_headers=hdr
    )
    assert p.state("down")["state"]["facts"] == {"back": True}


def test_redis_down_under_local_runs_degraded_then_recovers(
    fake: FakeProvider, start_proxy: StartProxy, redis_url: str, redis_server: RedisServer
) -> None:
    p = start_proxy(
        fake.url + "/v1",
        "--schema",
        "facts",
        config={"coordination": redis_url, "coordination_down": "local"},
    )
    oai = openai.OpenAI(base_url=p.v1, api_key="k", max_retries=0)
    hdr = {SESSION_HEADER: "degraded"}
    redis_server.stop()
    try:
        fake.enqueue(Reply(text=envelope({"facts": {"n": 1}})))
        oai.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "go"}], extra_headers=hdr
        )
        h = _health(p)
        assert h.status_code == 200
        assert h.json()["coordination"]["degraded"] is True
        assert h.json()["coordination"]["redis"].startswith("down: ")
    finally:
        redis_server.start()
    assert _wait_healthy(p)["coordination"]["degraded"] is False
    fake.enqueue(Reply(text=envelope({"facts": {"n": 2}})))
    oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "go"}], extra_headers=hdr
    )
    assert p.state("degraded")["step"] == 2
    # That turn held a Redis lease again: its release recorded the committed step.
    r = redis.Redis.from_url(p.settings.coordination or "")
    try:
        assert r.hget(_keys("degraded")[3], "step") == b"2"
    finally:
        r.close()
