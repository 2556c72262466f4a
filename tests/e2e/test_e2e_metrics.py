"""``GET /metrics`` end to end: a scripted run through the real proxy (in-process) against two
fake providers, driven by the openai SDK, then the page parsed with prometheus_client's own
parser. Every expected count is worked out from the script."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from skillstate.cli.main import main
from tests.conftest import InProcessProxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, envelope, oai

TOKEN = "metrics-token-0123456789"
USAGE = {"prompt_tokens": 100, "completion_tokens": 10, "cached_tokens": 40}
MODEL = "gpt-4o-mini"


def valid(i: int) -> Reply:
    return Reply(text=envelope({"notes": f"n{i}"}), usage=USAGE)


# Outside the schema (notes, step): rejected, so the turn is re-asked once and stays invalid.
INVALID = Reply(text=envelope({"bogus": 1}), usage=USAGE)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(p: InProcessProxy, token: str | None = TOKEN) -> Samples:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    r = p.get("/metrics", headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def two_fakes() -> Iterator[tuple[FakeProvider, FakeProvider]]:
    a, b = FakeProvider().start(), FakeProvider().start()
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def start(start_proxy: StartProxy, a: FakeProvider, b: FakeProvider) -> InProcessProxy:
    return start_proxy(
        None,
        config={
            "schema": ["notes", "step"],
            "max_retries": 1,
            "retry_base_delay": 0,
            "metrics_token": TOKEN,
            "upstreams": [
                {"name": "a", "url": a.url, "api_key": "k", "priority": 0},
                {"name": "b", "url": b.url, "api_key": "k", "priority": 1},
            ],
            "prices": {
                MODEL: {"input_per_mtok": 2.0, "output_per_mtok": 10.0, "cache_read_per_mtok": 0.2}
            },
        },
    )


def test_ten_turns_two_invalid_one_retry_one_failover(
    two_fakes: tuple[FakeProvider, FakeProvider], start_proxy: StartProxy
) -> None:
    a, b = two_fakes
    p = start(start_proxy, a, b)
    a.enqueue(*(valid(i) for i in range(6)))  # turns 1-6: valid
    a.enqueue(INVALID, INVALID, INVALID, INVALID)  # turns 7-8: invalid, re-asked once each
    a.enqueue(Reply(status=503), valid(9))  # turn 9: a retry on a
    a.enqueue(Reply(status=401))  # turn 10: a rejects the key: failover to b
    b.enqueue(valid(10))
    client = oai(p, "sk-client")
    statuses = []
    for i in range(10):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"turn {i}"}],
            extra_headers={SESSION_HEADER: f"s{i % 3}"},
        )
        statuses.append(raw.headers["x-skillstate-transition"])
    assert statuses == ["valid"] * 6 + ["invalid"] * 2 + ["valid"] * 2
    assert a.pending == 0 and b.pending == 0

    m = scrape(p)
    route = {"route": "/v1/chat/completions", "dialect": "openai", "mode": "state"}
    assert value(m, "skillstate_requests_total", **route, status="200") == 10
    assert value(m, "skillstate_request_duration_seconds_count", **route, status="200") == 10
    assert value(m, "skillstate_transitions_total", mode="state", status="valid") == 8
    assert value(m, "skillstate_transitions_total", mode="state", status="invalid") == 2
    assert value(m, "skillstate_reasks_total", mode="state") == 2
    assert value(m, "skillstate_context_total", mode="state", form="compact") == 10
    # a: 6 + 2x2 (invalid and its re-ask) + 1 after the 503 = 11 answers; b: turn 10.
    assert value(m, "skillstate_upstream_attempts_total", upstream="a", outcome="ok") == 11
    assert value(m, "skillstate_upstream_attempts_total", upstream="a", outcome="server_error") == 1
    assert value(m, "skillstate_upstream_attempts_total", upstream="a", outcome="key_rejected") == 1
    assert value(m, "skillstate_upstream_attempts_total", upstream="b", outcome="ok") == 1
    assert value(m, "skillstate_upstream_retries_total", upstream="a") == 1
    assert value(m, "skillstate_upstream_failovers_total", upstream="a") == 1
    assert value(m, "skillstate_upstream_failovers_total", upstream="b") == 0
    assert value(m, "skillstate_breaker_state", upstream="a", state="closed") == 1
    assert value(m, "skillstate_breaker_state", upstream="a", state="open") == 0
    # Tokens of the 12 answers (the error answers report none).
    for up, answers in (("a", 11), ("b", 1)):
        usage = {"upstream": up, "mode": "state"}
        assert value(m, "skillstate_tokens_total", **usage, type="input") == 100 * answers
        assert value(m, "skillstate_tokens_total", **usage, type="cached") == 40 * answers
        assert value(m, "skillstate_tokens_total", **usage, type="output") == 10 * answers
    # Cost and savings are the ledger's: they add up to /cost.
    cost = p.get("/cost").json()["totals"]
    per_answer = (60 * 2.0 + 40 * 0.2 + 10 * 10.0) / 1e6
    spent = sum(value(m, "skillstate_cost_usd_total", upstream=u, mode="state") for u in "ab")
    assert spent == pytest.approx(12 * per_answer)
    assert spent == pytest.approx(cost["cost_usd"])
    saved = sum(value(m, "skillstate_saved_input_tokens", upstream=u, mode="state") for u in "ab")
    assert saved == cost["saved_input_tokens"]
    saved_usd = sum(value(m, "skillstate_saved_cost_usd", upstream=u, mode="state") for u in "ab")
    assert saved_usd == pytest.approx(cost["baseline_cost_usd"] - cost["cost_usd"])
    # Never a label per session.
    assert not any(dict(labels).get("session") for _, labels in m)
    assert not any(v.startswith("s") and v[1:].isdigit() for _, ls in m for _, v in ls)


def test_errors_streams_and_the_breaker(
    two_fakes: tuple[FakeProvider, FakeProvider], start_proxy: StartProxy
) -> None:
    a, b = two_fakes
    p = start_proxy(
        None,
        config={
            "schema": ["notes"],
            "failure_threshold": 1,
            "retry_max_attempts": 1,
            "upstreams": [
                {"name": "a", "url": a.url, "api_key": "k", "priority": 0, "rpm": 100},
                {"name": "b", "url": b.url, "api_key": "k", "priority": 1},
            ],
        },
    )
    a.enqueue(Reply(status=500))  # opens a's breaker (threshold 1); b answers
    b.enqueue(Reply(text=envelope({"notes": "x"})), Reply(text=envelope({"notes": "y"})))
    client = oai(p, "sk-client")
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "1"}])
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "2"}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    bad = p.http.post(p.v1 + "/chat/completions", content=b"{", headers=_json())
    assert bad.status_code == 400

    m = scrape(p, token=None)  # no metrics_token: open
    route = {"route": "/v1/chat/completions", "dialect": "openai"}
    assert value(m, "skillstate_requests_total", **route, mode="state", status="200") == 2
    assert value(m, "skillstate_requests_total", **route, mode="none", status="400") == 1
    assert value(m, "skillstate_stream_first_byte_seconds_count", **route, mode="state") == 1
    assert value(m, "skillstate_breaker_transitions_total", upstream="a", state="open") == 1
    assert value(m, "skillstate_breaker_state", upstream="a", state="open") == 1
    # The second turn skipped a (circuit open) and failed over again.
    assert value(m, "skillstate_upstream_skipped_total", upstream="a", reason="circuit_open") == 1
    assert value(m, "skillstate_upstream_failovers_total", upstream="a") == 2
    assert value(m, "skillstate_upstream_window_used", upstream="a", window="rpm") == 1
    assert value(m, "skillstate_upstream_window_limit", upstream="a", window="rpm") == 100
    assert ("skillstate_upstream_window_used", (("upstream", "b"), ("window", "rpm"))) not in m


def _json() -> dict[str, str]:
    return {"content-type": "application/json"}


def test_metrics_token(fake: FakeProvider, start_proxy: StartProxy) -> None:
    p = start_proxy(fake.url + "/v1", config={"metrics_token": TOKEN})
    for headers in (
        {},
        {"authorization": "Bearer wrong-token-0123456789"},
        {"authorization": TOKEN},
    ):
        r = p.get("/metrics", headers=headers)
        assert r.status_code == 401, headers
        assert r.json()["error"]["type"] == "authentication_error"
        assert r.headers["www-authenticate"] == "Bearer"
    assert p.get("/metrics", headers={"authorization": f"bearer {TOKEN}"}).status_code == 200


def test_responses_route_is_counted(fake: FakeProvider, start_proxy: StartProxy) -> None:
    p = start_proxy(fake.url + "/v1", "--schema", "notes")
    fake.enqueue(Reply(text=envelope({"notes": "r"}), usage=USAGE))
    fake.enqueue(Reply(text=envelope({"notes": "s"}), usage=USAGE))
    client = oai(p, "sk-client")
    client.responses.create(model=MODEL, input="hello")
    for _ in client.responses.create(model=MODEL, input="again", stream=True):
        pass
    m = scrape(p, token=None)
    route = {"route": "/v1/responses", "dialect": "openai-responses", "mode": "state"}
    assert value(m, "skillstate_requests_total", **route, status="200") == 2
    assert value(m, "skillstate_stream_first_byte_seconds_count", **route) == 1
    assert value(m, "skillstate_transitions_total", mode="state", status="valid") == 2


def test_key_name_label_when_enabled(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    keys = {name: _make_key(data, name) for name in ("alice", "bob")}
    p = start_proxy(fake.url + "/v1", "--schema", "notes", config={"metrics_key_label": True})
    for name, n in (("alice", 2), ("bob", 1)):
        client = oai(p, keys[name])
        for i in range(n):
            fake.enqueue(Reply(text=envelope({"notes": f"{name}{i}"}), usage=USAGE))
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    admin = _make_key(data, "ops", "--admin")
    m = scrape(p, token=admin)
    assert value(m, "skillstate_key_requests_total", key="alice", status="200") == 2
    assert value(m, "skillstate_key_requests_total", key="bob", status="200") == 1
    assert value(m, "skillstate_key_tokens_total", key="alice", type="input") == 200
    assert value(m, "skillstate_key_tokens_total", key="bob", type="output") == 10
    # The keys themselves never appear, only their names.
    assert not any(k in p.get("/metrics", headers=_bearer(admin)).text for k in keys.values())


def test_no_key_label_by_default(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    key = _make_key(tmp_path / "data", "alice")
    p = start_proxy(fake.url + "/v1", "--schema", "notes")
    fake.enqueue(Reply(text=envelope({"notes": "a"}), usage=USAGE))
    client = oai(p, key)
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    m = scrape(p, token=_make_key(tmp_path / "data", "ops", "--admin"))
    assert not [s for s in m if s[0].startswith("skillstate_key_")]
    assert not any("alice" in v for _, labels in m for _, v in labels)


def _make_key(data: Path, name: str, *args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["keys", "--data-dir", str(data), "create", "--name", name, *args]) == 0
    return out.getvalue().strip()


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}
