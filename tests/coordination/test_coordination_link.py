"""The coordination link's failure policy, without a Redis server: an address where nothing
listens is an unreachable Redis. (Against a real redis-server: tests/scale/.)"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from skillstate.choices import CoordinationDown
from skillstate.coordination.link import LOCAL, CoordinationLink
from skillstate.errors import ProxyError
from skillstate.urltext import redacted
from tests.conftest import StartProxy
from tests.fakeprovider import FakeProvider


def _dead_url(refused_url: str) -> str:
    """A Redis URL on a loopback port that refuses connections (the refused_url fixture)."""
    return refused_url.replace("http://", "redis://", 1) + "/0"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Ping:
    """An operation on Redis (a ping) that counts the times the link tried it."""

    def __init__(self) -> None:
        self.tried = 0

    async def __call__(self, client: Any) -> Any:
        self.tried += 1
        return await client.ping()


async def test_not_configured_runs_everything_locally() -> None:
    link = CoordinationLink(None)
    calls: list[Any] = []

    async def op(client: Any) -> str:
        calls.append(client)
        return "redis"

    assert not link.configured
    assert await link.call(op) is LOCAL
    assert calls == []
    assert await link.check(1.0) == {"redis": "not configured", "degraded": False}


async def test_refuse_gives_a_503_with_retry_after_and_tries_again_later(refused_url: str) -> None:
    clock = _Clock()
    link = CoordinationLink(_dead_url(refused_url), CoordinationDown.REFUSE, clock=clock)
    ping = _Ping()
    try:
        with pytest.raises(ProxyError) as err:
            await link.call(ping)
        e = err.value
        assert (e.status, e.code) == (503, "coordination_unavailable")
        assert e.headers()["retry-after"] == "1"
        assert "Redis" in e.message and "unreachable" in e.message
        assert not link.degraded  # refusing is not running degraded
        # Within retry_every, the dead server is not tried again: straight to the policy.
        with pytest.raises(ProxyError):
            await link.call(ping)
        assert ping.tried == 1
        clock.now += link.retry_every
        with pytest.raises(ProxyError):
            await link.call(ping)
        assert ping.tried == 2
    finally:
        await link.close()


async def test_local_runs_degraded_and_says_so_once(
    caplog: pytest.LogCaptureFixture, refused_url: str
) -> None:
    clock = _Clock()
    link = CoordinationLink(_dead_url(refused_url), CoordinationDown.LOCAL, clock=clock)

    async def ping(client: Any) -> Any:
        return await client.ping()

    try:
        with caplog.at_level(logging.WARNING, logger="skillstate"):
            assert await link.call(ping) is LOCAL
            clock.now += 5
            assert await link.call(ping) is LOCAL
            health = await link.check(1.0)
        assert link.degraded
        assert health["degraded"] is True
        assert health["redis"].startswith("down: ")
        warnings = [r for r in caplog.records if "unreachable" in r.getMessage()]
        assert len(warnings) == 1  # one line per transition, not per failed call
        assert "DEGRADED" in warnings[0].getMessage()
        assert link.outages == 1
        # A success (e.g. the next call after Redis came back) ends the degradation.
        link.succeeded()
        assert not link.degraded and link.up
    finally:
        await link.close()


async def test_redis_errors_that_are_not_outages_propagate(refused_url: str) -> None:
    link = CoordinationLink(_dead_url(refused_url), CoordinationDown.LOCAL)

    async def buggy(client: Any) -> Any:
        raise ValueError("a bug in the caller")

    try:
        with pytest.raises(ValueError):
            await link.call(buggy)
        assert link.up
    finally:
        await link.close()


def test_logs_and_health_never_show_the_password() -> None:
    assert redacted("redis://:s3cret@host:6380/1") == "redis://***@host:6380/1"
    assert redacted("rediss://user:s3cret@host/0") == "rediss://user:***@host/0"
    assert redacted("redis://host:6379/0") == "redis://host:6379/0"
    assert redacted("postgresql://u:s3cret@[::1]:5432/db") == "postgresql://u:***@[::1]:5432/db"


def test_health_says_coordination_is_not_configured_by_default(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start_proxy(fake.url + "/v1")
    h = p.get("/health")
    assert h.status_code == 200
    assert h.json()["coordination"] == {"redis": "not configured", "degraded": False}


async def test_attempt_never_refuses_and_keeps_to_the_retry_pace(refused_url: str) -> None:
    """``attempt`` (a settle, a verdict, a release after the turn's call): None while Redis
    is unreachable, even under ``refuse``, and like ``call`` it tries the dead server once
    per ``retry_every`` only."""
    clock = _Clock()
    link = CoordinationLink(_dead_url(refused_url), CoordinationDown.REFUSE, clock=clock)
    ping = _Ping()
    try:
        assert await link.attempt(ping) is None
        assert ping.tried == 1 and not link.up
        assert await link.attempt(ping) is None  # within retry_every: not tried
        assert ping.tried == 1
        clock.now += link.retry_every
        assert await link.attempt(ping) is None
        assert ping.tried == 2
    finally:
        await link.close()
    assert await CoordinationLink(None).attempt(ping) is None  # not configured


async def test_coordination_timeout_setting_bounds_every_redis_wait(refused_url: str) -> None:
    from skillstate.config import Settings

    settings = Settings(coordination=_dead_url(refused_url), coordination_timeout=4.5)
    link = CoordinationLink.from_settings(settings)
    try:
        pool = link.client.connection_pool
        assert pool.connection_kwargs["socket_timeout"] == 4.5
        assert pool.connection_kwargs["socket_connect_timeout"] == 4.5
        assert pool.timeout == 4.5  # the wait for a free pooled connection
    finally:
        await link.close()
    with pytest.raises(ValueError, match="coordination_timeout"):
        Settings(coordination_timeout=0)
