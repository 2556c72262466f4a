"""A call the provider may bill but whose usage the proxy never saw (the client went away
with the call out, a stream cut before its usage event, an answer without usage, an upstream
that timed out or closed the connection once it had the request) is never
free: its ledger row keeps ``pricing: usage-unavailable`` and no measured cost, and carries
an estimate (the call's worst case, as its budget hold had it) that every budget counts and
``/cost`` shows apart from the measured cost. The real proxy (in-process uvicorn) in front
of the fake provider, driven by the openai SDK and httpx."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import InProcessProxy, StartProxy
from tests.e2e.test_exactly_once import wait_until
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, ant, envelope

# $0.001 per output token, input free: a call with max_tokens 100 has a worst case of $0.10.
PRICES = {"m": {"input_per_mtok": 0, "output_per_mtok": 1_000}}
BUDGET = "0.25"  # two unmeasured calls' worst cases ($0.20) fit, a third call's does not
CHAT = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
NO_USAGE = (  # a chat completion without its usage
    b'{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":'
    + httpx.Response(200, json=envelope({"notes": "x"})).content
    + b'},"finish_reason":"stop"}]}'
)
UNMEASURED = ("usage-unavailable", None, pytest.approx(0.1))  # a row's pricing, cost, estimate


def rows(data: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(data / "skillstate.db") as db:
        sql = "SELECT status, pricing, cost_usd, estimated_cost_usd FROM ledger ORDER BY rowid"
        return db.execute(sql).fetchall()


def calls_done(data: Path, n: int) -> bool:
    """``n`` calls are in the ledger and none is in flight (a budgeted call's pending row,
    ``cost.pending``, is gone once its own row is written)."""
    got = rows(data)
    return len(got) == n and all(pricing != "pending" for _, pricing, _, _ in got)


def start(start_proxy: StartProxy, upstream: str | None, **config: Any) -> InProcessProxy:
    config = {"prices": PRICES, "auth_cache_ttl": 0, **config}
    return start_proxy(upstream, "--schema", "notes", config=config)


def client(proxy: InProcessProxy, timeout: float) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.v1, api_key="sk", max_retries=0, timeout=timeout)


def chat_args(session: str, **extra: Any) -> dict[str, Any]:
    headers = {SESSION_HEADER: session, "x-skillstate-budget-usd": BUDGET}
    return {**CHAT, "extra_headers": headers, **extra}


def post_chat(proxy: InProcessProxy, session: str, **headers: str) -> httpx.Response:
    """CHAT in ``session`` with httpx (with the BUDGET unless ``headers`` say otherwise)."""
    headers = {SESSION_HEADER: session, "x-skillstate-budget-usd": BUDGET, **headers}
    return proxy.http.post(proxy.v1 + "/chat/completions", json=CHAT, headers=headers)


def refused_by_budget(proxy: InProcessProxy, session: str) -> httpx.Response:
    """The session's next call, refused by the budget its earlier calls set."""
    r = proxy.http.post(
        proxy.v1 + "/chat/completions", json=CHAT, headers={SESSION_HEADER: session}
    )
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "session_budget_exceeded"
    return r


def leave_before_the_answer(
    proxy: InProcessProxy, fake: FakeProvider, session: str, never: threading.Event
) -> None:
    """A call the client gives up on (after 1 s) while the upstream holds its answer."""
    fake.enqueue(Reply(text=envelope({"notes": "x"}), hold=never))
    with pytest.raises(openai.APITimeoutError):
        client(proxy, 1.0).chat.completions.create(**chat_args(session))


def cut_a_stream(proxy: InProcessProxy, fake: FakeProvider, session: str) -> None:
    """A stream the client closes after its first chunk: three events out, then the
    upstream stalls, so no usage event ever comes."""
    fake.enqueue(Reply(text=envelope({"notes": "x"}) + " and more", stall_after=3))
    stream = client(proxy, 30).chat.completions.create(**chat_args(session, stream=True))
    next(iter(stream))  # the first chunk is here: the client has had enough
    stream.close()


def test_a_client_that_leaves_before_the_answer_spends_its_budget(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    proxy = start(start_proxy, fake.url + "/v1")
    never = threading.Event()
    for n in (1, 2):
        leave_before_the_answer(proxy, fake, "s1", never)
        wait_until(lambda n=n: calls_done(tmp_path / "data", n))
    assert rows(tmp_path / "data") == [(499, *UNMEASURED)] * 2
    r = refused_by_budget(proxy, "s1")
    assert "spent $0.200000" in r.json()["error"]["message"]
    assert len(fake.requests) == 2  # the third call never went out
    never.set()
    totals = proxy.get("/cost", params={"session": "s1"}).json()["totals"]
    assert totals["cost_usd"] is None  # nothing measured
    assert totals["usage_unavailable_rows"] == 2
    assert totals["estimated_cost_usd"] == pytest.approx(0.2)


def test_a_client_that_cuts_each_stream_before_its_usage_spends_its_budget(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    proxy = start(start_proxy, fake.url + "/v1")
    for n in (1, 2):
        cut_a_stream(proxy, fake, "s2")
        wait_until(lambda n=n: calls_done(tmp_path / "data", n))
    assert rows(tmp_path / "data") == [(499, *UNMEASURED)] * 2
    refused_by_budget(proxy, "s2")
    assert len(fake.requests) == 2


def test_an_answer_without_usage_is_charged_its_estimate_and_says_so(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    proxy = start(start_proxy, fake.url + "/v1")
    fake.enqueue(Reply(raw_body=NO_USAGE))
    r = post_chat(proxy, "s3")
    assert r.status_code == 200, r.text
    assert r.headers["x-skillstate-pricing"] == "usage-unavailable"
    assert "x-skillstate-cost-usd" not in r.headers  # nothing measured
    assert r.headers["x-skillstate-estimated-cost-usd"] == "0.10000000"
    assert r.headers["x-skillstate-session-spent-usd"] == "0.10000000"
    assert rows(tmp_path / "data") == [(200, *UNMEASURED)]


@pytest.mark.parametrize("cut_by", ["client", "upstream"])
def test_a_messages_stream_cut_after_its_first_usage_spends_its_budget(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path, cut_by: str
) -> None:
    """Anthropic reports the input in ``message_start`` and the output only at the end: a
    stream cut in between, by the client or by the upstream closing the connection, has
    partial usage, which is not the bill either (the output was being generated)."""
    up = {"name": "up", "url": fake.url, "kind": "anthropic", "api_key": "sk-upstream"}
    proxy = start(start_proxy, None, upstreams=[up])
    import anthropic

    session = f"s-{cut_by}"
    cut = {"stall_after": 3} if cut_by == "client" else {"drop_after": 3}
    for n in (1, 2):
        fake.enqueue(Reply(text=envelope({"notes": "x"}) + " and more", **cut))
        client = ant(proxy, "sk")
        with contextlib.ExitStack() as stack:
            if cut_by == "upstream":
                stack.enter_context(pytest.raises(anthropic.APIError))
            stream = stack.enter_context(client.messages.stream(**chat_args(session)))
            if cut_by == "client":
                next(iter(stream))  # message_start is here: the client has had enough
            else:
                stream.get_final_message()  # the upstream closes after message_start
        wait_until(lambda n=n: calls_done(tmp_path / "data", n))
    assert [r[3] for r in rows(tmp_path / "data")] == [pytest.approx(0.1)] * 2
    refused_by_budget(proxy, session)


def spend(proxy: InProcessProxy) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The measured and estimated cost counters of ``/metrics``, by their labels."""
    from prometheus_client.parser import text_string_to_metric_families

    r = proxy.get("/metrics")
    assert r.status_code == 200, r.text
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    names = ("skillstate_cost_usd_total", "skillstate_estimated_cost_usd_total")
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            if s.name in names:
                out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_metrics_count_each_unmeasured_calls_estimate_once_apart_from_measured_cost(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    """A dashboard of spend sees the calls without usage: each cut call's estimate is in
    ``skillstate_estimated_cost_usd_total`` once (as in its one ledger row and ``/cost``),
    under the labels of the measured counter, which the cut calls leave as it was."""
    proxy = start(start_proxy, fake.url + "/v1")
    # A measured call: 10 output tokens at $0.001.
    fake.enqueue(Reply(text=envelope({"notes": "a"}), usage={"completion_tokens": 10}))
    answered = client(proxy, 30).chat.completions.create(**chat_args("s5"))
    assert answered.usage is not None and answered.usage.completion_tokens == 10
    before = spend(proxy)
    assert list(before["skillstate_cost_usd_total"].values()) == [pytest.approx(0.01)]
    assert before.get("skillstate_estimated_cost_usd_total", {}) == {}
    # A call the client gave up on (a 499 row), then a stream it cut before its usage.
    never = threading.Event()
    leave_before_the_answer(proxy, fake, "s5", never)
    wait_until(lambda: len(rows(tmp_path / "data")) == 2)
    cut_a_stream(proxy, fake, "s5")
    wait_until(lambda: len(rows(tmp_path / "data")) == 3)
    never.set()
    estimates = [r[3] for r in rows(tmp_path / "data")]
    assert estimates == [None, pytest.approx(0.1), pytest.approx(0.1)]
    after = spend(proxy)
    assert after["skillstate_cost_usd_total"] == before["skillstate_cost_usd_total"]
    estimated = after["skillstate_estimated_cost_usd_total"]
    assert estimated.keys() == before["skillstate_cost_usd_total"].keys()  # same labels
    assert list(estimated.values()) == [pytest.approx(0.2)]  # two rows of $0.10, once each
    totals = proxy.get("/cost", params={"session": "s5"}).json()["totals"]
    assert sum(estimated.values()) == pytest.approx(totals["estimated_cost_usd"])


def test_metrics_by_key_name_count_an_answer_without_usage_as_estimated(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    """With ``metrics_key_label``, a key's estimated spend is its own counter, as its
    budget counts it; its measured spend has nothing of the call."""
    from tests.e2e.test_e2e_metrics import _make_key

    key = _make_key(tmp_path / "data", "alice")
    proxy = start(start_proxy, fake.url + "/v1", metrics_key_label=True)
    fake.enqueue(Reply(raw_body=NO_USAGE))
    r = post_chat(proxy, "s6", authorization=f"Bearer {key}")
    assert r.status_code == 200, r.text
    assert r.headers["x-skillstate-estimated-cost-usd"] == "0.10000000"
    admin = _make_key(tmp_path / "data", "ops", "--admin")
    page = proxy.get("/metrics", headers={"authorization": f"Bearer {admin}"}).text
    assert 'skillstate_key_estimated_cost_usd_total{key="alice"} 0.1\n' in page
    assert "skillstate_key_cost_usd_total{" not in page
    assert "skillstate_estimated_cost_usd_total{" in page


def start_failing(start_proxy: StartProxy, upstream: str) -> InProcessProxy:
    """One attempt per call (no retry), and a short wait for the answer's headers."""
    return start(start_proxy, upstream, retry_max_attempts=1, first_byte_timeout=1)


@pytest.mark.parametrize(
    ("way", "status"), [("timeout", 504), ("drop", 502)], ids=["read-timeout", "dropped"]
)
def test_an_upstream_that_fails_after_reading_the_request_spends_the_budget(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path, way: str, status: int
) -> None:
    """The upstream had the request (it may generate and bill it) and then timed out or
    closed the connection without an answer: each such call is charged its worst case."""
    proxy = start_failing(start_proxy, fake.url + "/v1")
    never = threading.Event()
    for _ in (1, 2):
        reply = Reply(text="x", hold=never) if way == "timeout" else Reply(drop=True)
        fake.enqueue(reply)
        r = post_chat(proxy, "s6")
        assert r.status_code == status, r.text
    never.set()
    assert len(fake.requests) == 2  # both reached the upstream
    assert rows(tmp_path / "data") == [(0, *UNMEASURED)] * 2
    refused_by_budget(proxy, "s6")
    totals = proxy.get("/cost", params={"session": "s6"}).json()["totals"]
    assert totals["estimated_cost_usd"] == pytest.approx(0.2)
    assert list(spend(proxy)["skillstate_estimated_cost_usd_total"].values()) == [
        pytest.approx(0.2)
    ]


def test_an_upstream_that_cannot_be_reached_costs_nothing(
    start_proxy: StartProxy, tmp_path: Path, refused_url: str
) -> None:
    """Connection refused: the request never reached the provider, so it is never billed."""
    proxy = start_failing(start_proxy, refused_url + "/v1")
    for _ in (1, 2, 3):  # three worst cases would be over the budget if they counted
        r = post_chat(proxy, "s7")
        assert r.status_code == 502, r.text
        assert r.json()["error"]["code"] != "session_budget_exceeded"
    assert rows(tmp_path / "data") == [(0, "usage-unavailable", None, None)] * 3
    totals = proxy.get("/cost", params={"session": "s7"}).json()["totals"]
    assert not totals["estimated_cost_usd"]


@pytest.mark.parametrize("upstreams", [1, 2], ids=["retried", "failed-over"])
def test_each_retried_attempt_that_may_be_billed_is_held_against_the_budget(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path, upstreams: int
) -> None:
    """One turn whose upstream drops the connection after reading each request: the pool
    retries (three attempts on one upstream, or one on each of three upstreams after a
    failover), and each attempt may be billed ($0.10). The session's $0.25 holds two: the
    third attempt is not sent, and the turn is refused by the budget."""
    attempts = 3 if upstreams == 1 else 1
    config: dict[str, Any] = {
        "prices": PRICES,
        "auth_cache_ttl": 0,
        "retry_max_attempts": attempts,
        "retry_base_delay": 0,
    }
    if upstreams > 1:
        config["upstreams"] = [
            {"name": f"u{i}", "url": fake.url + "/v1", "api_key": "sk", "priority": i}
            for i in range(3)
        ]
    proxy = start_proxy(None if upstreams > 1 else fake.url + "/v1", config=config)
    fake.enqueue(*[Reply(drop=True) for _ in range(3)])
    r = proxy.http.post(
        proxy.v1 + "/chat/completions",
        json={"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]},
        headers={SESSION_HEADER: "s8", "x-skillstate-budget-usd": BUDGET},
    )
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "session_budget_exceeded"
    assert len(fake.requests) == 2  # the third attempt was never sent
    assert rows(tmp_path / "data") == [(0, "usage-unavailable", None, pytest.approx(0.1))] * 2
    totals = proxy.get("/cost", params={"session": "s8"}).json()["totals"]
    assert totals["estimated_cost_usd"] == pytest.approx(0.2)
