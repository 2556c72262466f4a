"""Every billed upstream call is in the ledger exactly once, whichever way its turn ends
(cancelled by its client with the call out, re-asked, the process killed during a re-ask),
and the state's commit rules stay as they are (a cancelled turn commits nothing). The real
proxy (in-process uvicorn, or a process for kill -9) in front of the fake provider, driven
by the openai SDK and httpx; the ledger read from /cost and from the SQLite file."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import InProcessProxy, StartProxy, StartProxyProcess
from tests.e2e.test_budgets import make_key
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, envelope, oai

# $0.001 per output token, input free: a row's cost says which answer it is.
PRICES = {"m": {"input_per_mtok": 0, "output_per_mtok": 1_000}}
ROW = "kind, status, output_tokens, cost_usd"


def ledger(data: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(data / "skillstate.db") as db:
        return db.execute(f"SELECT {ROW} FROM ledger ORDER BY rowid").fetchall()


def wait_until(check: Callable[[], bool], limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def session_cost(proxy: InProcessProxy, session: str) -> dict[str, Any]:
    r = proxy.get("/cost", params={"session": session})
    assert r.status_code == 200, r.text
    return dict(r.json())


def chat(proxy: InProcessProxy, session: str, timeout: float) -> Any:
    client = openai.OpenAI(base_url=proxy.v1, api_key="sk", max_retries=0, timeout=timeout)
    return client.chat.completions.create(
        model="m",
        max_tokens=100,
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={SESSION_HEADER: session},
    )


@pytest.mark.parametrize("where", ["waiting for the headers", "reading the body"])
def test_a_turn_cancelled_with_its_call_out_leaves_its_row_and_commits_nothing(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path, where: str
) -> None:
    proxy = start_proxy(fake.url + "/v1", config={"prices": PRICES})
    release = threading.Event()
    if where == "waiting for the headers":  # the upstream is generating when the client goes
        cut = Reply(text=envelope({"notes": "x"}), hold=release)
    else:  # the upstream answered: its headers and 10 bytes of the body are out
        cut = Reply(text=envelope({"notes": "x"}), stall_after=10)
    fake.enqueue(cut)
    with pytest.raises(openai.APITimeoutError):
        chat(proxy, "s1", timeout=1.0)  # the client gives up: the proxy cancels the turn
    wait_until(lambda: len(ledger(tmp_path / "data")) == 1)
    release.set()
    assert ledger(tmp_path / "data") == [("generation", 499, None, None)]
    assert fake.requests[0].disconnected or not fake.requests[0].completed
    cost = session_cost(proxy, "s1")
    assert cost["totals"]["requests"] == 1 and cost["totals"]["attempts"]["generation"] == 1
    state = proxy.get("/state", params={"session": "s1"})
    assert state.status_code == 404  # nothing committed: the session was never made
    # The session's next turn runs as usual and is metered once.
    fake.enqueue(Reply(text=envelope({"notes": "y"}), usage={"completion_tokens": 7}))
    assert chat(proxy, "s1", timeout=30).choices[0].message.content is not None
    wait_until(lambda: len(ledger(tmp_path / "data")) == 2)
    assert ledger(tmp_path / "data")[1] == ("generation", 200, 7, pytest.approx(0.007))


def test_a_process_killed_during_a_re_ask_keeps_the_first_answers_row(
    fake: FakeProvider, start_proxy_process: StartProxyProcess, tmp_path: Path
) -> None:
    proxy = start_proxy_process(fake.url + "/v1", "--schema", "notes", config={"prices": PRICES})
    never = threading.Event()
    fake.enqueue(
        Reply(text="no envelope at all", usage={"completion_tokens": 40}),  # invalid: re-asked
        Reply(text=envelope({"notes": "x"}), hold=never),  # the re-ask, in flight at the kill
    )
    body = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}

    def turn() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the proxy dies under it
            httpx.post(proxy.v1 + "/chat/completions", json=body, timeout=30)

    client = threading.Thread(target=turn)
    client.start()
    wait_until(lambda: len(fake.requests) == 2)  # the re-ask is out
    assert proxy.proc is not None
    proxy.proc.send_signal(signal.SIGKILL)
    proxy.proc.wait(timeout=10)
    client.join(timeout=30)
    never.set()
    # The first answer was billed (40 output tokens): its row is in the ledger, once.
    assert ledger(tmp_path / "data") == [("rollback-retry", 200, 40, pytest.approx(0.04))]


def test_a_re_ask_is_one_row_per_call_and_the_turns_budget_holds_end_with_the_first_row(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    proxy = start_proxy(
        fake.url + "/v1", "--schema", "notes", config={"prices": PRICES, "auth_cache_ttl": 0}
    )
    # Room for two calls' worst case ($0.10 each) and no more: the re-ask fits only if the
    # first call's hold ended when its row ($0.04) reached the ledger.
    budget = {"x-skillstate-budget-usd": "0.19", SESSION_HEADER: "b1"}
    fake.enqueue(
        Reply(text="no envelope at all", usage={"completion_tokens": 40}),
        Reply(text=envelope({"notes": "x"}), usage={"completion_tokens": 30}),
    )
    r = proxy.http.post(
        proxy.v1 + "/chat/completions",
        json={"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]},
        headers=budget,
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-skillstate-retries"] == "1" and len(fake.requests) == 2
    assert r.headers["x-skillstate-session-spent-usd"] == "0.07000000"
    rows = ledger(tmp_path / "data")
    assert rows == [
        ("rollback-retry", 200, 40, pytest.approx(0.04)),
        ("generation", 200, 30, pytest.approx(0.03)),
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_a_process_killed_right_after_a_responses_commit_keeps_the_stored_response(
    fake: FakeProvider, start_proxy_process: StartProxyProcess, tmp_path: Path, stream: bool
) -> None:
    """``store: true`` and ``previous_response_id``: the response is written in the turn's
    commit, so a proxy killed right after it (the test hook: SIGKILL at ``after-commit``)
    leaves the committed turn with its response, and the retry's replay chains on it."""
    env = {"SKILLSTATE_TEST_KILL": "after-commit:r1"}
    proxy = start_proxy_process(fake.url + "/v1", "--schema", "notes", env=env)
    fake.enqueue(Reply(text=envelope({"notes": "one"})))
    body = {"model": "m", "input": "one", "stream": stream}
    sent = {"Idempotency-Key": "r1", SESSION_HEADER: "s1"}
    with pytest.raises(httpx.HTTPError):  # the process died under the request
        proxy.http.post(proxy.v1 + "/responses", json=body, headers=sent, timeout=30)
    assert proxy.proc is not None
    assert proxy.proc.wait(timeout=30) == -signal.SIGKILL
    with sqlite3.connect(tmp_path / "data" / "skillstate.db") as db:
        steps = db.execute("SELECT count(*) FROM transitions").fetchone()[0]
        stored = db.execute("SELECT id FROM responses").fetchall()
    assert steps == 1 and len(stored) == 1  # the turn and its response: both or neither
    proxy.env = {k: v for k, v in proxy.env.items() if k != "SKILLSTATE_TEST_KILL"}
    proxy.start()
    client = oai(proxy, "sk")
    got = client.responses.retrieve(stored[0][0])
    assert got.id == stored[0][0]
    fake.enqueue(Reply(text=envelope({"notes": "two"})))
    nxt = client.responses.create(model="m", input="two", previous_response_id=got.id)
    assert nxt.previous_response_id == got.id
    sent_upstream = fake.requests[-1].json
    assert "one" in str(sent_upstream)  # the chain was rebuilt from the stored response


@pytest.mark.parametrize("stream", [False, True])
def test_a_replay_of_a_paid_turn_is_not_refused_by_a_spent_budget(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path, stream: bool
) -> None:
    """A replay (Idempotency-Key) costs nothing upstream: a budget spent since (the key's
    daily one and the session's) refuses the next call, never the paid turn's reply again;
    the key itself still has to be valid."""
    proxy = start_proxy(
        fake.url + "/v1", "--schema", "notes", config={"prices": PRICES, "auth_cache_ttl": 0}
    )
    key = make_key(tmp_path / "data", "create", "--name", "team", "--budget-usd-per-day", "0.15")
    fake.enqueue(Reply(text=envelope({"notes": "x"}), usage={"completion_tokens": 100}))
    body = {"model": "m", "max_tokens": 100, "stream": stream,
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    auth = {"authorization": f"Bearer {key}", SESSION_HEADER: "b2"}

    def send(idem: str, **extra: str) -> httpx.Response:
        headers = {**auth, "Idempotency-Key": idem, **extra}
        return proxy.http.post(proxy.v1 + "/chat/completions", json=body, headers=headers)

    first = send("paid", **{"x-skillstate-budget-usd": "0.15"})
    assert first.status_code == 200, first.text  # $0.10 of both budgets' $0.15 spent
    refused = send("another")
    assert refused.status_code == 429  # the next call's worst case ($0.10) does not fit
    assert refused.json()["error"]["code"] in ("budget_exceeded", "session_budget_exceeded")
    again = send("paid")
    assert again.status_code == 200 and again.headers["x-skillstate-replayed"] == "true"
    assert again.content == first.content and len(fake.requests) == 1
    stranger = proxy.http.post(
        proxy.v1 + "/chat/completions", json=body,
        headers={**auth, "authorization": "Bearer sk-ss-wrong", "Idempotency-Key": "paid"},
    )  # fmt: skip
    assert stranger.status_code == 401


def test_every_session_budget_change_writes_an_audit_line(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A budget is not a transition (it moves no step): its changes are in the audit log,
    who made each, as for client keys; ``GET /state`` shows the budget it has now."""
    proxy = start_proxy(
        fake.url + "/v1", "--schema", "notes", config={"prices": PRICES, "auth_cache_ttl": 0}
    )
    key = make_key(tmp_path / "data", "create", "--name", "team")
    auth = {"authorization": f"Bearer {key}"}
    fake.enqueue(Reply(text=envelope({"notes": "x"}), usage={"completion_tokens": 10}))
    caplog.set_level("INFO", logger="skillstate.audit")
    first = proxy.http.post(
        proxy.v1 + "/chat/completions",
        json={"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]},
        headers={**auth, SESSION_HEADER: "b3", "x-skillstate-budget-usd": "0.25"},
    )
    assert first.status_code == 200, first.text
    for value in ("0.35", "none"):
        r = proxy.http.patch(
            proxy.url + "/state",
            params={"session": "b3"},
            headers={**auth, "x-skillstate-budget-usd": value},
        )
        assert r.status_code == 200, r.text
    lines = [r.getMessage() for r in caplog.records if r.name == "skillstate.audit"]
    assert [line for line in lines if "session budget" in line] == [
        "audit: session budget set session=b3 usd=0.25 by=turn of key:team",
        "audit: session budget set session=b3 usd=0.35 by=key:team",
        "audit: session budget removed session=b3 by=key:team",
    ]
    shown = proxy.get("/state", params={"session": "b3", "history": "1"}, headers=auth).json()
    assert shown["budget_usd"] is None and shown["step"] == 1  # no step for a budget
