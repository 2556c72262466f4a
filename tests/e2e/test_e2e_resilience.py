"""Upstream resilience and local limits: retries, Retry-After, failover, breakers, rate
windows, timeouts and client disconnects, through the real proxy against fake providers with
injected faults.

Timing: config values are small (retry_base_delay 0.01, cooldowns of a second or two) and
nothing asserts that something was fast. The only time comparisons are lower bounds that
are correctness properties (an upstream saw the retry no earlier than Retry-After said).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from email.utils import formatdate, parsedate_to_datetime
from typing import Any

import httpx
import pytest

from tests.conftest import InProcessProxy, StartProxy, launch_in_process
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, envelope

# Event-loop timers (uvloop/libuv) have millisecond granularity and may fire up to about a
# millisecond early; this is the only slack allowed in the Retry-After lower bounds.
TIMER_SLACK = 0.005
DEAD = "http://127.0.0.1:9"  # the discard port: connection refused


def upstream(name: str, url: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "url": url, "api_key": f"key-{name}", **kw}


def config(*upstreams: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {
        "schema": ["facts", "notes", "step"],
        "retry_base_delay": 0.01,
        "retry_max_delay": 0.05,
        **kw,
        "upstreams": list(upstreams),
    }


# Most tests share one of two module-scoped in-process proxies (one per config). Upstreams
# are told apart by model (`models` patterns); every test uses its own sessions and models,
# so the breakers and windows it touches are its own.
class FaultyProvider(FakeProvider):
    """The fake provider, plus one fault it lacks: an OpenAI stream that sends
    `error_after` events and then an in-band error event instead of the rest."""

    error_after: int | None = None

    def _openai(self, req: dict[str, Any], reply: Reply, stream: bool) -> Any:
        out = super()._openai(req, reply, stream)
        if stream and self.error_after is not None:
            err = {"error": {"message": "upstream overloaded mid-stream", "type": "server_error"}}
            out = [*out[: self.error_after], b"data: " + json.dumps(err).encode() + b"\n\n"]
        return out


@pytest.fixture(scope="module")
def fakes() -> Iterator[tuple[FaultyProvider, FakeProvider]]:
    f1, f2 = FaultyProvider(), FakeProvider()
    with f1, f2:
        yield f1, f2


@pytest.fixture
def f1(fakes: tuple[FaultyProvider, FakeProvider]) -> FaultyProvider:
    fakes[0].reset()
    fakes[0].error_after = None
    fakes[1].reset()
    return fakes[0]


@pytest.fixture
def f2(f1: FakeProvider, fakes: tuple[FaultyProvider, FakeProvider]) -> FakeProvider:
    return fakes[1]


@pytest.fixture(scope="module")
def main(
    fakes: tuple[FaultyProvider, FakeProvider], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcessProxy]:
    a, b = fakes[0].url, fakes[1].url
    cfg = config(
        upstream("a", a, models=["m"]),
        upstream("rpm", a, models=["rpm-*"], rpm=3),
        upstream("tpm", a, models=["tpm-*"], tpm=200),
        upstream("k1", a, models=["auth-*"]),
        upstream("k2", b, models=["auth-*"], priority=1),
        upstream("f1", a, models=["fail-*"]),
        upstream("f2", b, models=["fail-*"], priority=1),
        upstream("dead", DEAD, models=["dead-*"]),
        upstream("d2", b, models=["dead-*"], priority=1),
        retry_after_cap=3,
        first_byte_timeout=5,
        failure_threshold=1000,  # breakers are tested on their own proxy
    )
    p = launch_in_process(tmp_path_factory.mktemp("main"), config=cfg)
    yield p
    p.stop()


@pytest.fixture(scope="module")
def timeouts(
    fakes: tuple[FaultyProvider, FakeProvider], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcessProxy]:
    a = fakes[0].url
    cfg = config(
        upstream("a", a, models=["m"]),
        upstream("anth", a, models=["claude-*"], kind="anthropic"),
        retry_max_attempts=1,
        first_byte_timeout=1.0,  # 0.3 was missed by a loaded worker (pytest -n auto)
        total_timeout=1.5,
        failure_threshold=1000,
    )
    p = launch_in_process(tmp_path_factory.mktemp("timeouts"), config=cfg)
    yield p
    p.stop()


def chat(
    proxy: InProcessProxy,
    session: str,
    content: str = "go",
    timeout: float = 20,
    model: str = "m",
    **kw: Any,
) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], **kw}
    return proxy.http.post(
        proxy.v1 + "/chat/completions",
        json=body,
        headers={SESSION_HEADER: session},
        timeout=timeout,
    )


def messages(proxy: InProcessProxy, session: str, model: str = "m", **kw: Any) -> httpx.Response:
    body = {"model": model, "max_tokens": 256, "messages": [{"role": "user", "content": "go"}]}
    return proxy.http.post(
        proxy.v1 + "/messages",
        json={**body, **kw},
        headers={SESSION_HEADER: session},
        timeout=20,
    )


def stream_lines(proxy: InProcessProxy, path: str, body: dict[str, Any], session: str) -> list[str]:
    with proxy.http.stream(
        "POST",
        proxy.v1 + path,
        json={**body, "stream": True},
        headers={SESSION_HEADER: session},
        timeout=20,
    ) as r:
        assert r.status_code == 200, r.read()
        return [line for line in r.iter_lines() if line]


CHAT = {"model": "m", "messages": [{"role": "user", "content": "go"}]}


def data_events(lines: list[str]) -> list[Any]:
    return [json.loads(x[6:]) for x in lines if x.startswith("data: ") and x != "data: [DONE]"]


def step(proxy: InProcessProxy, session: str) -> int | None:
    r = proxy.get("/state", params={"session": session})
    return r.json()["step"] if r.status_code == 200 else None


def health_of(proxy: InProcessProxy, name: str) -> dict[str, Any]:
    return next(u for u in proxy.get("/health").json()["upstreams"] if u["name"] == name)


def commit_one_turn(fake: FakeProvider, proxy: InProcessProxy, session: str) -> None:
    fake.enqueue(Reply(text=envelope({"notes": "first"})))
    assert chat(proxy, session).status_code == 200
    assert step(proxy, session) == 1


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition never became true")
        time.sleep(0.02)


# --- retries (main proxy) ---------------------------------------------------------------------


def test_5xx_then_success_commits_once(f1: FakeProvider, main: InProcessProxy) -> None:
    f1.enqueue(Reply(status=500), Reply(status=503), Reply(text=envelope({"notes": "n"})))
    r = chat(main, "r5xx")
    assert r.status_code == 200, r.text
    assert r.headers["x-skillstate-upstream"] == "a"
    assert r.headers["x-skillstate-step"] == "1"
    assert [q.status for q in f1.requests] == [500, 503, 200]
    assert main.state("r5xx")["state"] == {"notes": "n"}
    assert health_of(main, "a")["consecutive_failures"] == 0


def test_429_retry_after_seconds_is_honoured(f1: FakeProvider, main: InProcessProxy) -> None:
    f1.enqueue(Reply(status=429, retry_after=1), Reply())
    assert chat(main, "r429s").status_code == 200
    first, second = f1.requests
    assert second.started_at - first.started_at >= 1.0 - TIMER_SLACK


def test_429_retry_after_http_date_is_honoured(f1: FakeProvider, main: InProcessProxy) -> None:
    date = formatdate(time.time() + 2, usegmt=True)  # whole seconds: 1 to 2 s from now
    not_before = parsedate_to_datetime(date).timestamp()
    f1.enqueue(Reply(status=429, retry_after=date), Reply())
    assert chat(main, "r429d").status_code == 200
    wall_minus_mono = time.time() - time.monotonic()
    assert f1.requests[1].started_at + wall_minus_mono >= not_before - TIMER_SLACK


def test_retry_after_beyond_the_cap_is_relayed_not_waited(
    f1: FakeProvider, main: InProcessProxy
) -> None:
    f1.enqueue(Reply(status=429, retry_after=120, error_body="slow down"))  # cap is 3 s
    r = chat(main, "rcap")
    assert r.status_code == 429
    assert r.headers["retry-after"] == "120"  # the upstream's own, passed through
    assert r.headers["x-skillstate-upstream"] == "a"
    assert r.json()["error"]["message"] == "slow down"
    assert len(f1.requests) == 1
    assert step(main, "rcap") is None  # nothing committed


def test_dropped_connections_are_retried(f1: FakeProvider, main: InProcessProxy) -> None:
    # No response at all; then headers and a few bytes of the JSON body; then a real answer.
    f1.enqueue(Reply(drop=True), Reply(drop_after=15), Reply(text=envelope({"step": 1})))
    r = chat(main, "rdrop")
    assert r.status_code == 200, r.text
    assert [q.dropped for q in f1.requests] == [True, True, False]
    assert step(main, "rdrop") == 1


def test_stream_dropped_before_its_first_event_is_retried(
    f1: FakeProvider, main: InProcessProxy
) -> None:
    f1.enqueue(Reply(drop_after=0), Reply(text=envelope({"notes": "s"})))
    lines = stream_lines(main, "/chat/completions", CHAT, "rsdrop")
    assert lines[-1] == "data: [DONE]"
    assert not any("error" in e for e in data_events(lines))
    assert len(f1.requests) == 2 and f1.requests[0].dropped
    assert main.state("rsdrop")["state"] == {"notes": "s"}


def test_all_connections_dropping_is_502_in_each_dialect(
    f1: FakeProvider, main: InProcessProxy
) -> None:
    f1.enqueue(*[Reply(drop=True) for _ in range(6)])
    r = chat(main, "rall")
    assert r.status_code == 502
    assert r.json()["error"]["type"] == "api_error"
    r = messages(main, "rall")
    assert r.status_code == 502
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "api_error"
    assert len(f1.requests) == 6  # 3 attempts each
    assert step(main, "rall") is None


def test_connection_lost_mid_stream_is_an_error_event(
    f1: FakeProvider, main: InProcessProxy
) -> None:
    commit_one_turn(f1, main, "rmid")
    f1.enqueue(Reply(text=envelope({"notes": "never"}), drop_after=4))
    lines = stream_lines(main, "/chat/completions", CHAT, "rmid")
    assert "mid-stream" in data_events(lines)[-1]["error"]["message"]
    assert "data: [DONE]" not in lines
    assert step(main, "rmid") == 1
    assert len(f1.requests) == 2  # mid-stream: never retried


def test_upstream_error_event_mid_stream_ends_the_stream_and_commits_nothing(
    f1: FaultyProvider, main: InProcessProxy
) -> None:
    commit_one_turn(f1, main, "rerr")
    f1.error_after = 3
    f1.enqueue(Reply(text=envelope({"notes": "never"})))
    lines = stream_lines(main, "/chat/completions", CHAT, "rerr")
    events = data_events(lines)
    assert "error" not in events[0]
    assert events[-1]["error"]["message"] == "upstream overloaded mid-stream"
    assert "data: [DONE]" not in lines
    assert step(main, "rerr") == 1
    assert len(f1.requests) == 2  # mid-stream: never retried


# --- failover (main proxy) ------------------------------------------------------------------------


def test_401_fails_over_to_the_next_upstream_each_with_its_own_key(
    f1: FakeProvider, f2: FakeProvider, main: InProcessProxy
) -> None:
    f1.enqueue(Reply(status=401, error_body="invalid key"))
    f2.enqueue(Reply(text=envelope({"notes": "from k2"})))
    r = chat(main, "fauth", model="auth-m")
    assert r.status_code == 200, r.text
    assert r.headers["x-skillstate-upstream"] == "k2"
    assert len(f1.requests) == 1  # 401 is not retried on the same upstream
    assert f1.requests[0].headers["authorization"] == "Bearer key-k1"
    assert f2.requests[0].headers["authorization"] == "Bearer key-k2"
    assert main.state("fauth")["state"] == {"notes": "from k2"}


def test_when_everything_fails_the_last_status_comes_back_in_the_clients_dialect(
    f1: FakeProvider, f2: FakeProvider, main: InProcessProxy
) -> None:
    f1.responder = lambda req: Reply(status=503, error_body="f1 is down")
    f2.responder = lambda req: Reply(status=500, error_body="f2 broke")
    r = chat(main, "fall", model="fail-m")
    assert r.status_code == 500
    assert r.headers["x-skillstate-upstream"] == "f2"
    assert r.json()["error"]["message"] == "f2 broke"
    assert (len(f1.requests), len(f2.requests)) == (3, 3)

    r = messages(main, "fall", model="fail-m")  # Anthropic client, OpenAI upstreams: translated
    assert r.status_code == 500
    assert r.json() == {"type": "error", "error": {"type": "api_error", "message": "f2 broke"}}
    assert step(main, "fall") is None


def test_connection_errors_count_and_the_next_upstream_serves(
    f1: FakeProvider, f2: FakeProvider, main: InProcessProxy
) -> None:
    before = health_of(main, "dead")["consecutive_failures"]
    r = chat(main, "fdead", model="dead-m")
    assert r.status_code == 200 and r.headers["x-skillstate-upstream"] == "d2"
    assert f2.requests[0].headers["authorization"] == "Bearer key-d2"
    assert health_of(main, "dead")["consecutive_failures"] == before + 3  # 3 attempts


# --- local limits (main proxy) ------------------------------------------------------------------


def test_rpm_4th_request_gets_429_with_retry_after(f1: FakeProvider, main: InProcessProxy) -> None:
    for i in range(3):
        assert chat(main, f"lrpm{i}", model="rpm-m").status_code == 200
    r = chat(main, "lrpm3", model="rpm-m")
    assert r.status_code == 429
    assert 1 <= int(r.headers["retry-after"]) <= 60
    assert r.json()["error"]["code"] == "local_rate_limit"
    r = messages(main, "lrpm3", model="rpm-m")
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
    assert 1 <= int(r.headers["retry-after"]) <= 60
    assert len(f1.requests) == 3
    assert health_of(main, "rpm")["limits"]["rpm"] == {"limit": 3, "used": 3}
    assert step(main, "lrpm3") is None


def test_request_that_can_never_fit_tpm_is_413_without_retry_after(
    f1: FakeProvider, main: InProcessProxy
) -> None:
    r = chat(main, "ltpm", content="x" * 4000, model="tpm-m")
    assert r.status_code == 413
    assert "retry-after" not in r.headers
    err = r.json()["error"]
    assert err["code"] == "tpm_exceeded" and "never fit" in err["message"]
    assert f1.requests == []
    assert chat(main, "ltpm", content="small", model="tpm-m").status_code == 200
    used = health_of(main, "tpm")["limits"]["tpm"]
    assert used["limit"] == 200 and 0 < used["used"] <= 200  # reconciled with real usage


# --- cancellation (main proxy) ------------------------------------------------------------------


def test_client_disconnect_mid_stream_cancels_upstream_and_commits_nothing(
    f1: FakeProvider, main: InProcessProxy
) -> None:
    commit_one_turn(f1, main, "cmid")
    before = main.state("cmid")
    f1.enqueue(Reply(text="word " * 100 + envelope({"notes": "never"}), chunk_delay=0.05))
    with httpx.stream(
        "POST",
        main.v1 + "/chat/completions",
        json={**CHAT, "stream": True},
        headers={SESSION_HEADER: "cmid"},
        timeout=20,
    ) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(4)]  # a few events, then hang up
    assert any(x.startswith("data: ") for x in got)
    rec = f1.wait_for(lambda reqs: reqs[-1] if reqs[-1].ended_at else None)
    assert rec.disconnected and not rec.completed  # in the fake provider's own log
    assert main.state("cmid") == before


def test_client_disconnect_while_waiting_for_headers_commits_nothing(
    f1: FakeProvider, main: InProcessProxy
) -> None:
    commit_one_turn(f1, main, "chdr")
    f1.enqueue(Reply(text=envelope({"notes": "never"}), delay=30))
    with pytest.raises(httpx.ReadTimeout):
        chat(main, "chdr", timeout=0.5)
    f1.wait_for(lambda reqs: reqs[-1].disconnected)
    assert step(main, "chdr") == 1
    # The session lock was released: the next turn goes through.
    f1.enqueue(Reply(text=envelope({"notes": "second"})))
    assert chat(main, "chdr").status_code == 200 and step(main, "chdr") == 2


def test_client_disconnect_while_sleeping_between_retries_stops_retrying(
    f1: FakeProvider, main: InProcessProxy
) -> None:
    f1.enqueue(Reply(status=503, retry_after=1), Reply(text=envelope({"notes": "never"})))
    with pytest.raises(httpx.ReadTimeout):
        chat(main, "csleep", timeout=0.4)  # gone while the proxy waits out the Retry-After
    time.sleep(1.2)  # past the point the retry would have gone out
    assert len(f1.requests) == 1 and f1.pending == 1
    assert step(main, "csleep") is None


# --- timeouts (timeouts proxy: first_byte_timeout 1.0, total_timeout 1.5, 1 attempt) ----------


def test_slow_first_byte_is_504_and_cancels_the_upstream(
    f1: FakeProvider, timeouts: InProcessProxy
) -> None:
    commit_one_turn(f1, timeouts, "tslow")
    f1.enqueue(Reply(text=envelope({"notes": "late"}), delay=30))
    r = chat(timeouts, "tslow")
    assert r.status_code == 504
    err = r.json()["error"]
    assert err["type"] == "timeout_error" and "timed out" in err["message"]
    f1.wait_for(lambda reqs: reqs[-1].disconnected)
    assert step(timeouts, "tslow") == 1

    f1.enqueue(Reply(delay=30))
    r = messages(timeouts, "tslow", stream=True)  # no byte sent yet: a plain 504, Anthropic-shaped
    assert r.status_code == 504
    assert r.json()["type"] == "error"
    f1.wait_for(lambda reqs: len(reqs) == 3 and reqs[-1].disconnected)
    assert step(timeouts, "tslow") == 1


def test_stall_mid_stream_ends_with_an_openai_error_event_and_commits_nothing(
    f1: FakeProvider, timeouts: InProcessProxy
) -> None:
    commit_one_turn(f1, timeouts, "tstall")
    before = timeouts.state("tstall")
    f1.enqueue(Reply(text=envelope({"notes": "never"}), stall_after=3))
    lines = stream_lines(timeouts, "/chat/completions", CHAT, "tstall")
    events = data_events(lines)
    assert len(events) >= 2 and "error" not in events[0]  # some content got through first
    assert events[-1]["error"]["message"] == "upstream timed out"
    assert "data: [DONE]" not in lines
    assert not any(x.startswith(": skillstate") for x in lines)
    f1.wait_for(lambda reqs: reqs[-1].disconnected)
    assert timeouts.state("tstall") == before


def test_stall_mid_stream_ends_with_an_anthropic_error_event(
    f1: FakeProvider, timeouts: InProcessProxy
) -> None:
    f1.enqueue(Reply(text=envelope({"notes": "never"}), stall_after=3))
    body = {"model": "claude-x", "max_tokens": 256, "messages": [{"role": "user", "content": "go"}]}
    lines = stream_lines(timeouts, "/messages", body, "tstall2")
    assert f1.requests[0].dialect == "anthropic"
    assert lines[0] == "event: message_start"
    assert lines[-2] == "event: error"
    err = json.loads(lines[-1][6:])
    assert err["type"] == "error" and err["error"]["message"] == "upstream timed out"
    assert "event: message_stop" not in lines
    f1.wait_for(lambda reqs: reqs[-1].disconnected)
    assert step(timeouts, "tstall2") is None


def test_total_timeout_covers_the_whole_stream(f1: FakeProvider, timeouts: InProcessProxy) -> None:
    # Every gap (0.1 s) is well below first_byte_timeout; the whole stream is not.
    f1.enqueue(Reply(text="word " * 80 + envelope({"notes": "late"}), chunk_delay=0.1))
    lines = stream_lines(timeouts, "/chat/completions", CHAT, "ttotal")
    events = data_events(lines)
    assert len(events) > 3 and events[-1]["error"]["message"] == "upstream timed out"
    f1.wait_for(lambda reqs: reqs[-1].disconnected)
    assert step(timeouts, "ttotal") is None


# --- circuit breaker (its own proxy) -------------------------------------------------------------


def test_an_anthropic_upstreams_529_reaches_an_openai_client_as_503(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    cfg = config(upstream("a", fake.url, kind="anthropic"), retry_max_attempts=1)
    proxy = start_proxy(config=cfg)
    fake.enqueue(Reply(status=529, error_body="Overloaded"))
    r = chat(proxy, "o1")
    assert r.status_code == 503  # OpenAI clients know 503; 529 is Anthropic's own
    assert r.json()["error"]["message"] == "Overloaded"
    assert r.json()["error"]["type"] == "overloaded_error"
    fake.enqueue(Reply(status=529, error_body="Overloaded"))
    assert messages(proxy, "o2").status_code == 529  # native: untouched


def test_a_529_from_an_openai_format_gateway_is_a_503_for_openai_clients(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(config=config(upstream("a", fake.url + "/v1"), retry_max_attempts=1))
    fake.enqueue(Reply(status=529, error_body="Overloaded"))
    r = chat(proxy, "g1")
    assert r.status_code == 503 and r.json()["error"]["message"] == "Overloaded"


@pytest.mark.parametrize("stream", [False, True])
def test_an_html_error_page_reaches_each_client_as_its_own_error_object(
    fake: FakeProvider, start_proxy: StartProxy, stream: bool
) -> None:
    page = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
    proxy = start_proxy(config=config(upstream("a", fake.url + "/v1"), retry_max_attempts=1))
    fake.enqueue(Reply(status=502, error_body=page))
    r = chat(proxy, "h1", stream=stream)
    assert r.status_code == 502 and r.headers["content-type"] == "application/json"
    assert "502 Bad Gateway" in r.json()["error"]["message"]
    fake.enqueue(Reply(status=502, error_body=page))
    r = messages(proxy, "h2", stream=stream)
    assert r.status_code == 502
    body = r.json()
    assert body["type"] == "error" and "502 Bad Gateway" in body["error"]["message"]
    fake.enqueue(Reply(status=400, error_body="context too long"))
    r = chat(proxy, "h3")  # an error object of the client's own dialect stays untouched
    assert r.json()["error"] == {
        "message": "context too long", "type": "invalid_request_error", "param": None,
        "code": None,
    }  # fmt: skip


def test_breaker_opens_stays_open_probes_once_and_closes(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    cfg = config(
        upstream("a", fake.url), failure_threshold=2, open_cooldown=1.5, retry_max_attempts=1
    )
    proxy = start_proxy(config=cfg)
    fake.enqueue(Reply(status=500), Reply(status=500))
    assert chat(proxy, "x1").status_code == 500
    assert health_of(proxy, "a")["circuit"] == "closed"
    assert chat(proxy, "x2").status_code == 500

    health = proxy.get("/health").json()
    a = health["upstreams"][0]
    assert (a["circuit"], a["consecutive_failures"]) == ("open", 2)
    assert a["next_probe_at"] > time.time() and a["next_probe_in_s"] > 0
    assert health["ok"] is False

    r = chat(proxy, "x3")  # open: refused without calling the upstream
    assert r.status_code == 503
    assert r.json()["error"]["type"] == "overloaded_error"
    r = messages(proxy, "x3")
    assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"
    assert len(fake.requests) == 2
    assert step(proxy, "x3") is None

    wait_until(lambda: health_of(proxy, "a")["circuit"] == "half_open")
    assert proxy.get("/health").json()["ok"] is True
    fake.enqueue(Reply(text=envelope({"notes": "probe"}), delay=1.0))

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=20) as c:
            return await asyncio.gather(
                *(
                    c.post(
                        proxy.v1 + "/chat/completions",
                        json=CHAT,
                        headers={SESSION_HEADER: f"burst{i}"},
                    )
                    for i in range(5)
                )
            )

    statuses = sorted(r.status_code for r in asyncio.run(burst()))
    assert statuses == [200, 503, 503, 503, 503]
    assert len(fake.requests) == 3  # exactly one probe reached the upstream
    a = health_of(proxy, "a")
    assert (a["circuit"], a["consecutive_failures"], a["next_probe_at"]) == ("closed", 0, None)
    assert chat(proxy, "after").status_code == 200


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_a_2xx_that_is_no_usable_reply_counts_against_the_breaker(
    fake: FakeProvider, start_proxy: StartProxy, stream: bool
) -> None:
    """An upstream that answers 200 with nothing usable is failing, streamed (closed before
    any data) or not (an HTML page under 200): each such answer counts against its breaker
    as a 5xx does, and ``failure_threshold`` of them open it. Before, the non-streamed one
    counted as a success: the breaker stayed closed however many came."""
    cfg = config(
        upstream("a", fake.url + "/v1"), failure_threshold=2, open_cooldown=60,
        retry_max_attempts=1,
    )  # fmt: skip
    proxy = start_proxy(config=cfg)
    for _ in range(2):
        fake.enqueue(Reply(drop_after=0) if stream else Reply(raw_body=b"<html>ok</html>"))
    assert [chat(proxy, s, stream=stream).status_code for s in ("u1", "u2")] == [502, 502]
    a = health_of(proxy, "a")
    assert (a["circuit"], a["consecutive_failures"]) == ("open", 2)
    assert chat(proxy, "u3", stream=stream).status_code == 503  # not sent: the circuit is open
    assert len(fake.requests) == 2


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"[1, 2]", "not a JSON object"),
        (b"null", "not a JSON object"),
        (b"<html>ok</html>", "not a JSON object"),
    ],
)
def test_a_2xx_body_that_is_no_reply_object_is_a_502(
    fake: FakeProvider, start_proxy: StartProxy, raw: bytes, needle: str
) -> None:
    proxy = start_proxy(config=config(upstream("a", fake.url + "/v1"), retry_max_attempts=1))
    fake.enqueue(Reply(raw_body=raw))
    r = chat(proxy, "w1")
    assert r.status_code == 502 and needle in r.json()["error"]["message"]
    assert step(proxy, "w1") is None
    # The call reached the upstream and may be billed: it is metered, as the turn's answer.
    totals = proxy.get("/cost", params={"session": "w1", "since": "all"}).json()["totals"]
    assert totals["requests"] == 1 and totals["attempts"]["generation"] == 1
    assert totals["usage_unavailable_rows"] == 1


def test_a_non_json_2xx_reply_to_a_re_ask_keeps_the_first_answer_and_meters_both(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    cfg = config(upstream("a", fake.url + "/v1"), retry_max_attempts=1, max_retries=1)
    proxy = start_proxy(config=cfg)
    fake.enqueue(Reply(text="no envelope here"), Reply(raw_body=b"<html>ok</html>"))
    r = chat(proxy, "w4")
    assert r.status_code == 200 and r.headers["x-skillstate-transition"] == "invalid"
    assert r.json()["choices"][0]["message"]["content"] == "no envelope here"
    assert step(proxy, "w4") == 1 and len(fake.requests) == 2
    totals = proxy.get("/cost", params={"session": "w4", "since": "all"}).json()["totals"]
    assert totals["requests"] == 1
    assert totals["attempts"]["generation"] == 1
    assert totals["attempts"]["rollback-retry"] + totals["attempts"]["transport-retry"] == 1


def test_odd_but_json_replies_do_not_crash_the_turn(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    cfg = config(upstream("a", fake.url + "/v1"), retry_max_attempts=1, max_retries=0)
    proxy = start_proxy(config=cfg)
    odd = {
        "id": "c", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "5"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1e300, "total_tokens": 4},
    }  # fmt: skip
    # (A content that is not text at all is no reply: test_e2e_malformed_upstream.)
    fake.enqueue(Reply(raw_body=json.dumps(odd).encode()))
    r = chat(proxy, "w2")  # OpenAI client: relayed as is; no envelope in "5"
    assert r.status_code == 200 and r.headers["x-skillstate-transition"] == "invalid"
    assert r.headers["x-skillstate-pricing"] == "usage-unavailable"
    fake.enqueue(Reply(raw_body=json.dumps(odd).encode()))
    r = messages(proxy, "w3")  # Anthropic client: translated, with a sane usage
    assert r.status_code == 200 and r.json()["usage"]["output_tokens"] == 0


def test_an_upstream_header_with_non_latin1_text_does_not_lose_the_committed_reply(
    fake: FakeProvider, start_proxy: StartProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Starlette cannot encode "€" in a header: the step was saved and the client got a 500.
    from aiohttp import web

    real_init = web.StreamResponse.__init__

    def hostile_init(self: web.StreamResponse, *a: Any, headers: Any = None, **kw: Any) -> None:
        real_init(self, *a, headers={**(headers or {}), "x-request-id": "id-\u20ac"}, **kw)

    monkeypatch.setattr(web.StreamResponse, "__init__", hostile_init)
    proxy = start_proxy(config=config(upstream("a", fake.url + "/v1"), retry_max_attempts=1))
    fake.enqueue(Reply(text=envelope({"notes": "n"})))
    r = chat(proxy, "hh1")
    assert r.status_code == 200 and r.headers["x-skillstate-transition"] == "valid"
    assert r.headers["x-request-id"] == "id-%E2%82%AC"
    assert step(proxy, "hh1") == 1
