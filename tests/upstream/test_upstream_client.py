"""UpstreamPool.dispatch driven directly against the fake provider, with an injected clock
for the breaker and the local limits (so window arithmetic is exact and nothing sleeps 60 s)."""

from __future__ import annotations

import asyncio
import math
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from skillstate.config import Settings, Upstream
from skillstate.errors import ProxyError
from skillstate.upstream.client import Exchange, Outbound, UpstreamPool
from tests.fakeprovider import FakeProvider, Reply


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def up(name: str, url: str, **kw: Any) -> Upstream:
    return Upstream(name=name, url=url, api_key=f"key-{name}", **kw)


def settings(*upstreams: Upstream, **kw: Any) -> Settings:
    base: dict[str, Any] = {
        "retry_base_delay": 0.0,
        "retry_max_delay": 0.0,
        "first_byte_timeout": 5.0,
        "total_timeout": 10.0,
    }
    return Settings(upstreams=list(upstreams), **{**base, **kw})


def outbound(est_tokens: int = 10, *, stream: bool = False, model: str = "m") -> Outbound:
    return Outbound(
        client_dialect="openai",
        body={"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]},
        stream=stream,
        est_tokens=est_tokens,
        client_headers={},
    )


PoolFactory = Callable[..., UpstreamPool]


@pytest.fixture
async def make_pool() -> AsyncIterator[PoolFactory]:
    pools: list[UpstreamPool] = []

    def make(s: Settings, clock: FakeClock) -> UpstreamPool:
        pool = UpstreamPool(s, now=clock)
        pools.append(pool)
        return pool

    yield make
    for p in pools:
        await p.close()


async def ok(pool: UpstreamPool, out: Outbound | None = None) -> Exchange:
    ex = await pool.dispatch(out or outbound())
    body = await ex.read()
    ex.release()
    assert ex.ok, body
    return ex


async def fails(pool: UpstreamPool, out: Outbound | None = None) -> ProxyError:
    with pytest.raises(ProxyError) as e:
        await pool.dispatch(out or outbound())
    return e.value


def health(pool: UpstreamPool, name: str) -> dict[str, Any]:
    return next(h for h in pool.health() if h["name"] == name)


# --- local limits: rpm ---------------------------------------------------------------------


async def test_rpm_is_exact_at_the_window_boundary(
    fake: FakeProvider, make_pool: PoolFactory
) -> None:
    clock = FakeClock(1000.0)
    pool = make_pool(settings(up("a", fake.url, rpm=3)), clock)
    await pool.open()
    for t in (1000.0, 1010.0, 1020.0):
        clock.t = t
        await ok(pool)
    assert health(pool, "a")["limits"]["rpm"] == {"limit": 3, "used": 3}

    clock.t = 1059.5
    err = await fails(pool)
    assert (err.status, err.kind, err.code) == (429, "rate_limit", "local_rate_limit")
    assert err.retry_after == 0.5  # the t=1000 request leaves the window at exactly 1060
    # Whole seconds rounded up, plus the exact wait in milliseconds.
    assert err.headers() == {"retry-after": "1", "retry-after-ms": "500"}
    clock.t = math.nextafter(1060.0, 0.0)  # one ulp before: still inside the window
    assert (await fails(pool)).retry_after is not None
    assert len(fake.requests) == 3  # refused locally: the upstream never saw them

    clock.t = 1060.0  # exactly t + 60: gone
    await ok(pool)
    assert len(fake.requests) == 4
    err = await fails(pool)
    assert err.retry_after == 10.0  # now the t=1010 request is the oldest
    assert err.headers() == {"retry-after": "10", "retry-after-ms": "10000"}
    assert health(pool, "a")["limits"]["rpm"] == {"limit": 3, "used": 3}


async def test_retried_attempts_each_count_as_a_request(
    fake: FakeProvider, make_pool: PoolFactory
) -> None:
    clock = FakeClock()
    pool = make_pool(settings(up("a", fake.url, rpm=5)), clock)
    await pool.open()
    fake.enqueue(Reply(status=500), Reply(status=503), Reply())
    await ok(pool)
    assert health(pool, "a")["limits"]["rpm"]["used"] == 3


async def test_local_limit_fails_over_and_waits_for_the_earliest_upstream(
    fake: FakeProvider, make_pool: PoolFactory
) -> None:
    clock = FakeClock(0.0)
    pool = make_pool(settings(up("a", fake.url, rpm=1), up("b", fake.url, rpm=1)), clock)
    await pool.open()
    assert (await ok(pool)).upstream.name == "a"
    clock.t = 30.0
    assert (await ok(pool)).upstream.name == "b"  # a is full: the next one serves
    clock.t = 40.0
    err = await fails(pool)
    assert err.retry_after == 20.0  # a frees up at 60, b only at 90


# --- local limits: tpm ---------------------------------------------------------------------


async def test_tpm_retry_after_is_the_exact_time_until_the_request_fits(
    fake: FakeProvider, make_pool: PoolFactory
) -> None:
    clock = FakeClock(0.0)
    pool = make_pool(settings(up("a", fake.url, tpm=100)), clock)
    await pool.open()
    limits = pool.upstreams[0].limits

    ex = await ok(pool, outbound(40))  # estimated 40 at t=0 ...
    assert ex.ticket is not None
    await limits.settle(ex.ticket, 30)  # ... the real usage was 30 (what the pipeline does)
    clock.t = 10.0
    await ok(pool, outbound(50))  # 30 + 50 = 80 used
    assert health(pool, "a")["limits"]["tpm"] == {"limit": 100, "used": 80}

    clock.t = 20.0
    err = await fails(pool, outbound(30))  # 110 > 100: 10 must expire -> the t=0 entry (30)
    assert err.retry_after == 40.0  # 0 + 60 - 20
    err = await fails(pool, outbound(55))  # 135 > 100: 35 must expire -> both entries
    assert err.retry_after == 50.0  # 10 + 60 - 20
    assert err.headers()["retry-after"] == "50"
    assert len(fake.requests) == 2

    clock.t = 60.0  # the reconciled 30 is gone: 50 used, 50 more fit exactly
    await ok(pool, outbound(50))
    assert health(pool, "a")["limits"]["tpm"]["used"] == 100


async def test_error_answers_cost_no_tokens(fake: FakeProvider, make_pool: PoolFactory) -> None:
    clock = FakeClock()
    pool = make_pool(settings(up("a", fake.url, tpm=100), retry_max_attempts=1), clock)
    await pool.open()
    fake.enqueue(Reply(status=400, error_body="bad"))
    ex = await pool.dispatch(outbound(60))
    assert ex.status == 400
    ex.release()
    assert health(pool, "a")["limits"]["tpm"]["used"] == 0
    assert health(pool, "a")["limits"]["rpm"] is None  # disabled counters are null


async def test_a_request_larger_than_tpm_is_413_without_retry_after(
    fake: FakeProvider, make_pool: PoolFactory
) -> None:
    clock = FakeClock()
    pool = make_pool(settings(up("a", fake.url, tpm=100), up("b", fake.url, tpm=50)), clock)
    await pool.open()
    err = await fails(pool, outbound(101))
    assert (err.status, err.code) == (413, "tpm_exceeded")
    assert err.retry_after is None and err.headers() == {}
    assert "never fit" in err.message
    assert fake.requests == []
    # Fits a (alone), not b: an ordinary request, served by a.
    assert (await ok(pool, outbound(100))).upstream.name == "a"


# --- retries, failover -----------------------------------------------------------------------


async def test_retries_5xx_then_succeeds_and_records_the_failures(
    fake: FakeProvider, make_pool: PoolFactory
) -> None:
    pool = make_pool(settings(up("a", fake.url)), FakeClock())
    await pool.open()
    fake.enqueue(Reply(status=500), Reply(status=503), Reply(text="fine"))
    ex = await ok(pool)
    assert [(f.upstream, f.status) for f in ex.failed_attempts] == [("a", 500), ("a", 503)]
    assert len(fake.requests) == 3
    assert health(pool, "a")["consecutive_failures"] == 0  # the success reset it


async def test_body_read_failure_before_the_client_sees_anything_is_retried(
    fake: FakeProvider, make_pool: PoolFactory
) -> None:
    pool = make_pool(settings(up("a", fake.url)), FakeClock())
    await pool.open()
    fake.enqueue(Reply(drop_after=20), Reply(text="second"))  # headers, then 20 bytes, gone
    ex = await pool.dispatch(outbound())
    assert ex.ok and b"second" in await ex.read()
    ex.release()
    assert [(f.status, f.billed) for f in ex.failed_attempts] == [(0, True)]  # it had the call
    assert fake.requests[0].dropped


async def test_stream_that_dies_before_its_first_chunk_is_retried(
    fake: FakeProvider, make_pool: PoolFactory
) -> None:
    pool = make_pool(settings(up("a", fake.url)), FakeClock())
    await pool.open()
    fake.enqueue(Reply(drop_after=0), Reply(text="streamed"))
    ex = await pool.dispatch(outbound(stream=True))
    assert ex.ok and ex.first_chunk.startswith(b"data: ")
    ex.close()
    assert len(fake.requests) == 2 and fake.requests[0].dropped


async def test_401_is_not_retried_and_fails_over_with_each_upstreams_key(
    make_pool: PoolFactory,
) -> None:
    with FakeProvider() as fa, FakeProvider() as fb:
        pool = make_pool(settings(up("a", fa.url), up("b", fb.url, priority=1)), FakeClock())
        await pool.open()
        fa.enqueue(Reply(status=401, error_body="bad key"))
        ex = await ok(pool)
        assert ex.upstream.name == "b"
        assert [(f.upstream, f.status) for f in ex.failed_attempts] == [("a", 401)]
        assert len(fa.requests) == 1
        assert fa.requests[0].headers["authorization"] == "Bearer key-a"
        assert fb.requests[0].headers["authorization"] == "Bearer key-b"


async def test_priority_orders_the_upstreams(make_pool: PoolFactory) -> None:
    with FakeProvider() as fa, FakeProvider() as fb:
        s = settings(up("a", fa.url, priority=5), up("b", fb.url, priority=1))
        pool = make_pool(s, FakeClock())
        await pool.open()
        assert (await ok(pool)).upstream.name == "b"
        assert fa.requests == []


async def test_everything_failing_returns_the_last_meaningful_answer(
    make_pool: PoolFactory,
    refused_url: str,
) -> None:
    with FakeProvider() as fa:
        s = settings(up("a", fa.url), up("b", refused_url, priority=1), retry_max_attempts=2)
        pool = make_pool(s, FakeClock())
        await pool.open()
        fa.enqueue(Reply(status=503, error_body="busy"), Reply(status=502, error_body="still"))
        ex = await pool.dispatch(outbound())
        # b only gave connection errors, so a's last HTTP answer is what the client gets.
        assert (ex.upstream.name, ex.status) == ("a", 502)
        assert b"still" in await ex.read()
        ex.release()
        assert [(f.upstream, f.status) for f in ex.failed_attempts] == [
            ("a", 503),
            ("b", 0),
            ("b", 0),
        ]


async def test_only_connection_errors_is_502_and_timeouts_504(
    fake: FakeProvider,
    make_pool: PoolFactory,
    refused_url: str,
) -> None:
    pool = make_pool(settings(up("dead", refused_url), retry_max_attempts=2), FakeClock())
    await pool.open()
    err = await fails(pool)
    assert (err.status, err.kind) == (502, "upstream_unreachable")
    assert [(a.status, a.billed) for a in err.attempts] == [(0, False), (0, False)]  # never sent

    s = settings(up("slow", fake.url), retry_max_attempts=1, first_byte_timeout=0.2)
    pool = make_pool(s, FakeClock())
    await pool.open()
    fake.enqueue(Reply(delay=5))
    err = await fails(pool)
    assert (err.status, err.kind) == (504, "timeout")
    assert [a.billed for a in err.attempts] == [True]  # timed out with the request out
    await fake.wait_for_async(lambda r: r[-1].disconnected)  # the timeout cancelled the call


async def test_a_connection_broken_after_the_request_is_not_called_unreachable(
    fake: FakeProvider, make_pool: PoolFactory
) -> None:
    """The upstream took the request and closed the connection without a whole answer, on
    every attempt: it may bill each, so the 502 says so and tells the SDKs not to retry
    (their two retries each would be billed and held again)."""
    pool = make_pool(settings(up("cut", fake.url), retry_max_attempts=2), FakeClock())
    await pool.open()
    fake.enqueue(Reply(drop=True), Reply(drop=True))
    err = await fails(pool)
    assert (err.status, err.kind, err.code) == (
        502,
        "upstream_unreachable",
        "upstream_answer_lost",
    )
    assert "no upstream could be reached" not in err.message
    assert "took the request but no whole answer came back: cut: " in err.message
    assert "tried 2 times" in err.message
    assert err.headers()["x-should-retry"] == "false"
    assert [a.billed for a in err.attempts] == [True, True]


async def test_total_timeout_is_one_deadline_across_retries_and_failover(
    fake: FakeProvider, make_pool: PoolFactory
) -> None:
    s = settings(
        up("a", fake.url), up("b", fake.url, priority=1),
        retry_max_attempts=3, total_timeout=1.0, first_byte_timeout=5.0,
    )  # fmt: skip
    pool = make_pool(s, time.monotonic)  # the deadline runs on the real clock here
    await pool.open()
    # 0.6 s per 500: the second attempt gets the 0.4 s left and is cut off; nothing after it
    fake.enqueue(*[Reply(status=500, delay=0.6, error_body="busy") for _ in range(6)])
    ex = await pool.dispatch(outbound())
    assert ex.status == 500  # the last answer that arrived in time is relayed
    ex.release()
    await fake.wait_for_async(lambda r: len(r) == 2 and r[-1].disconnected)
    assert [r.path for r in fake.requests] == ["/v1/chat/completions"] * 2  # not 6

    fake.reset()
    s = settings(up("a", fake.url), up("b", fake.url), retry_max_attempts=3, total_timeout=0.5)
    pool = make_pool(s, time.monotonic)
    await pool.open()
    fake.enqueue(*[Reply(delay=5) for _ in range(6)])
    err = await fails(pool)
    assert (err.status, err.kind) == (504, "timeout")
    assert "total_timeout" in str(err)
    assert len(fake.requests) == 1


async def test_connect_timeout_is_504_and_counts_as_a_failure(make_pool: PoolFactory) -> None:
    # A listener whose accept queue is full: the kernel drops further SYNs, so connecting
    # hangs (no network needed).
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(0)
        fillers = []
        for _ in range(3):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(srv.getsockname())
            fillers.append(c)
        try:
            url = f"http://127.0.0.1:{srv.getsockname()[1]}"
            s = settings(up("blackhole", url), retry_max_attempts=2, connect_timeout=0.2)
            pool = make_pool(s, FakeClock())
            await pool.open()
            err = await fails(pool)
            assert (err.status, err.kind) == (504, "timeout")
            assert [a.error for a in err.attempts] == ["timeout", "timeout"]
            assert [a.billed for a in err.attempts] == [False, False]  # never connected
            assert health(pool, "blackhole")["consecutive_failures"] == 2
        finally:
            for c in fillers:
                c.close()


# --- circuit breaker ---------------------------------------------------------------------------


async def test_breaker_opens_skips_probes_once_and_closes(
    fake: FakeProvider, make_pool: PoolFactory
) -> None:
    clock = FakeClock(500.0)
    s = settings(up("a", fake.url), failure_threshold=2, open_cooldown=30, retry_max_attempts=1)
    pool = make_pool(s, clock)
    await pool.open()
    fake.enqueue(Reply(status=500), Reply(status=500))
    for _ in range(2):
        ex = await pool.dispatch(outbound())
        assert ex.status == 500
        ex.release()
    h = health(pool, "a")
    assert (h["circuit"], h["consecutive_failures"], h["next_probe_in_s"]) == ("open", 2, 30.0)
    assert not pool.usable()

    clock.t = 529.0
    err = await fails(pool)  # open: skipped without calling the upstream
    assert err.kind == "overloaded" and err.attempts == []
    assert len(fake.requests) == 2
    assert health(pool, "a")["next_probe_in_s"] == 1.0

    clock.t = 530.0
    assert health(pool, "a")["circuit"] == "half_open" and pool.usable()
    fake.enqueue(Reply(text="probe", delay=0.3))
    results = await asyncio.gather(
        *(pool.dispatch(outbound()) for _ in range(5)), return_exceptions=True
    )
    served = [r for r in results if isinstance(r, Exchange)]
    refused = [r for r in results if isinstance(r, ProxyError)]
    assert len(served) == 1 and len(refused) == 4
    assert all(r.kind == "overloaded" for r in refused)
    served[0].release()
    assert len(fake.requests) == 3  # exactly one probe reached the upstream
    h = health(pool, "a")
    assert (h["circuit"], h["consecutive_failures"], h["next_probe_in_s"]) == ("closed", 0, None)


async def test_failed_probe_reopens_for_another_cooldown(
    fake: FakeProvider, make_pool: PoolFactory
) -> None:
    clock = FakeClock(0.0)
    s = settings(up("a", fake.url), failure_threshold=1, open_cooldown=10, retry_max_attempts=3)
    pool = make_pool(s, clock)
    await pool.open()
    fake.enqueue(Reply(status=503), Reply(status=503))
    ex = await pool.dispatch(outbound())  # trips on the first 503; no retry on an open circuit
    assert ex.status == 503
    ex.release()
    assert len(fake.requests) == 1
    clock.t = 10.0
    ex = await pool.dispatch(outbound())  # the probe fails
    ex.release()
    assert len(fake.requests) == 2
    assert health(pool, "a")["circuit"] == "open"
    assert health(pool, "a")["next_probe_in_s"] == 10.0


async def test_connection_errors_count_towards_the_breaker(
    make_pool: PoolFactory, refused_url: str
) -> None:
    s = settings(
        up("dead", refused_url), failure_threshold=2, open_cooldown=30, retry_max_attempts=3
    )
    pool = make_pool(s, FakeClock())
    await pool.open()
    err = await fails(pool)
    assert len(err.attempts) == 2  # the third attempt found the circuit open
    assert err.status == 502
    h = health(pool, "dead")
    assert (h["circuit"], h["consecutive_failures"]) == ("open", 2)


async def test_open_circuit_fails_over_and_is_not_a_recorded_attempt(
    make_pool: PoolFactory,
) -> None:
    with FakeProvider() as fa, FakeProvider() as fb:
        s = settings(up("a", fa.url), up("b", fb.url, priority=1), failure_threshold=1)
        s = s.model_copy(update={"retry_max_attempts": 1})
        pool = make_pool(s, FakeClock())
        await pool.open()
        fa.enqueue(Reply(status=500))
        fb.enqueue(Reply(), Reply())
        ex = await ok(pool)  # a fails and opens, b serves
        assert ex.upstream.name == "b"
        ex = await ok(pool)
        assert ex.upstream.name == "b" and ex.failed_attempts == []
        assert len(fa.requests) == 1


# --- cancellation ------------------------------------------------------------------------------


async def test_cancelled_probe_frees_the_half_open_slot(
    fake: FakeProvider, make_pool: PoolFactory
) -> None:
    clock = FakeClock(0.0)
    s = settings(up("a", fake.url), failure_threshold=1, open_cooldown=5, retry_max_attempts=1)
    pool = make_pool(s, clock)
    await pool.open()
    fake.enqueue(Reply(status=500), Reply(delay=30))
    (await pool.dispatch(outbound())).release()
    clock.t = 5.0
    task = asyncio.ensure_future(pool.dispatch(outbound()))
    await fake.wait_for_async(lambda r: len(r) == 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await fake.wait_for_async(lambda r: r[1].disconnected)
    assert health(pool, "a")["circuit"] == "half_open"  # no verdict; the slot is free again
    await ok(pool)
    assert health(pool, "a")["circuit"] == "closed"


async def test_cancel_while_sleeping_between_retries_sends_nothing_more(
    fake: FakeProvider, make_pool: PoolFactory
) -> None:
    pool = make_pool(settings(up("a", fake.url), total_timeout=60.0), FakeClock())
    await pool.open()
    fake.enqueue(Reply(status=503, retry_after=20))
    task = asyncio.ensure_future(pool.dispatch(outbound()))
    await fake.wait_for_async(lambda r: len(r) == 1 and r[0].completed)
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(fake.requests) == 1


async def test_retry_after_beyond_the_cap_fails_over_at_once(make_pool: PoolFactory) -> None:
    with FakeProvider() as fa, FakeProvider() as fb:
        s = settings(up("a", fa.url), up("b", fb.url, priority=1), retry_after_cap=5)
        pool = make_pool(s, FakeClock())
        await pool.open()
        fa.enqueue(Reply(status=429, retry_after=3600))
        assert (await ok(pool)).upstream.name == "b"
        assert len(fa.requests) == 1


async def test_models_get_skips_a_failing_upstream(
    make_pool: PoolFactory, refused_url: str
) -> None:
    with FakeProvider() as fb:
        pool = make_pool(settings(up("a", refused_url), up("b", fb.url, priority=1)), FakeClock())
        await pool.open()
        ex = await pool.fetch("/models", {})
        assert ex.upstream.name == "b" and ex.status == 200
        assert b"gpt-4o" in await ex.read()
        ex.release()
        assert health(pool, "a")["consecutive_failures"] == 1


async def test_cookies_an_upstream_sets_are_never_sent_on_anyone_elses_request(
    make_pool: PoolFactory,
) -> None:
    """A provider's Set-Cookie (a CDN's session cookie, say) in one client's reply must not go
    out with every other client's requests: the pool keeps no cookie jar. The upstream is
    named ``localhost``, as aiohttp's jar keeps no cookies of IP-address hosts."""
    from aiohttp import web

    seen: list[str | None] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Cookie"))
        reply = web.json_response(
            {
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "ok"},
                     "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )  # fmt: skip
        reply.set_cookie("cdn_session", f"client-{len(seen)}", path="/")
        return reply

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "localhost", 0)
    await site.start()
    try:
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        pool = make_pool(settings(up("a", f"http://localhost:{port}/v1")), FakeClock())
        await pool.open()
        for _ in range(3):
            await ok(pool)
    finally:
        await runner.cleanup()
    assert seen == [None, None, None]
