"""A budget holds across a proxy killed with calls out: each budgeted call is in the ledger
(a pending row, ``cost.pending``) before it is sent, and a restart charges the calls its
predecessor was killed with at their worst case, marked ``interrupted``. The real proxy
process, SIGKILLed while the fake provider holds two calls, restarted on its SQLite data
dir; the openai SDK and ``skillstate cost`` read what it kept. tests/scale runs the same
kill on the PostgreSQL store."""

from __future__ import annotations

import contextlib
import io
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import openai
import pytest

from skillstate.cli.main import main
from tests.conftest import ProxyProcess, StartProxyProcess
from tests.fakeprovider import FakeProvider, RecordedRequest, Reply
from tests.helpers import SESSION_HEADER, oai

# $0.001 per output token, input free: max_tokens 100 is a worst case of $0.10.
PRICES = {"m": {"input_per_mtok": 0, "output_per_mtok": 1_000}}
HEADERS = {SESSION_HEADER: "run", "x-skillstate-budget-usd": "0.25"}
SIGNAL_WAIT = 60.0  # a liveness bound only


def call(proxy: ProxyProcess, label: str) -> None:
    """One call of the session with max_tokens 100 ($0.10 worst case)."""
    oai(proxy, "sk", timeout=SIGNAL_WAIT).chat.completions.create(
        model="m",
        max_tokens=100,
        messages=[{"role": "user", "content": label}],
        extra_headers=HEADERS,
    )


def kill_with_two_calls_out(proxy: ProxyProcess, fake: FakeProvider) -> None:
    """Two calls of the session held by the provider, and the proxy SIGKILLed."""
    held = threading.Event()
    fake.enqueue(Reply(text="word " * 100, hold=held), Reply(text="word " * 100, hold=held))

    def cut(label: str) -> None:
        with contextlib.suppress(openai.APIError):
            call(proxy, label)

    calls = [threading.Thread(target=cut, args=(f"call {i}",)) for i in (1, 2)]
    for t in calls:
        t.start()

    def both_out(requests: list[RecordedRequest]) -> bool:
        return len(requests) == 2

    fake.wait_for(both_out, timeout=SIGNAL_WAIT)
    proxy.kill9()
    held.set()
    for t in calls:
        t.join(SIGNAL_WAIT)


def assert_a_third_call_is_refused(proxy: ProxyProcess, fake: FakeProvider) -> None:
    """$0.20 of cut calls plus $0.10 is more than the session's $0.25: nothing is sent."""
    fake.enqueue(Reply(text="word " * 100))
    with pytest.raises(openai.RateLimitError) as refused:
        call(proxy, "call 3")
    assert "spent $0.200000" in refused.value.message
    assert len(fake.requests) == 2


def ledger(data: Path, first: str = "pricing") -> list[tuple[Any, ...]]:
    """The ledger's rows in order: ``first`` (a column), the cost and the estimate."""
    with contextlib.closing(sqlite3.connect(data / "skillstate.db")) as db:
        sql = f"SELECT {first}, cost_usd, estimated_cost_usd FROM ledger ORDER BY rowid"
        return db.execute(sql).fetchall()


def test_calls_cut_by_a_kill_are_charged_their_worst_case_after_the_restart(
    fake: FakeProvider, start_proxy_process: StartProxyProcess, tmp_path: Path
) -> None:
    """A session with a $0.25 budget has two calls out ($0.10 worst case each) when the proxy
    is killed. Without their rows the restarted proxy saw $0 spent and let two more calls
    through: $0.40 of calls the provider may bill against $0.25. Now both are in the ledger at
    $0.10 (interrupted), a third call is refused, and /cost and ``skillstate cost`` count them
    as estimated."""
    proxy = start_proxy_process(
        fake.url + "/v1", "--mode", "passthrough", config={"prices": PRICES}
    )
    kill_with_two_calls_out(proxy, fake)
    assert [r[0] for r in ledger(tmp_path / "data")] == ["pending", "pending"]

    proxy.start()
    interrupted = ("interrupted", None, pytest.approx(0.10))
    assert ledger(tmp_path / "data") == [interrupted, interrupted]
    assert_a_third_call_is_refused(proxy, fake)
    totals = proxy.get("/cost", params={"session": "run"}).json()["totals"]
    assert totals["estimated_cost_usd"] == pytest.approx(0.20)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["cost", "--data-dir", str(tmp_path / "data"), "--json"]) == 0
    assert json.loads(out.getvalue())["totals"]["estimated_cost_usd"] == pytest.approx(0.20)
    assert "2 call(s) cut by a proxy that stopped with them out" in proxy.stop()


def test_a_streamed_call_cut_by_a_kill_stays_a_stream_row(
    fake: FakeProvider, start_proxy_process: StartProxyProcess, tmp_path: Path
) -> None:
    """The pending row of a streamed call is of the kind its own row would have been: it
    was a `generation` row, so `/cost` counted a streamed turn cut by a kill as a
    non-streamed one."""
    proxy = start_proxy_process(
        fake.url + "/v1", "--mode", "passthrough", config={"prices": PRICES}
    )
    held = threading.Event()
    fake.enqueue(Reply(text="word " * 100, hold=held))

    def cut() -> None:
        with contextlib.suppress(openai.APIError):
            for _ in oai(proxy, "sk", timeout=SIGNAL_WAIT).chat.completions.create(
                model="m",
                max_tokens=100,
                messages=[{"role": "user", "content": "streamed"}],
                extra_headers=HEADERS,
                stream=True,
            ):
                pass

    out = threading.Thread(target=cut)
    out.start()
    fake.wait_for(lambda requests: len(requests) == 1, timeout=SIGNAL_WAIT)
    proxy.kill9()
    held.set()
    out.join(SIGNAL_WAIT)
    assert ledger(tmp_path / "data", "kind") == [("stream", None, pytest.approx(0.10))]
    proxy.start()
    totals = proxy.get("/cost", params={"session": "run"}).json()["totals"]
    assert totals["requests"] == 1 and totals["attempts"]["stream"] == 1
    assert totals["estimated_cost_usd"] == pytest.approx(0.10)
    assert "1 call(s) cut by a proxy that stopped with them out" in proxy.stop()


KILL_AFTER_COMMIT = {"SKILLSTATE_TEST_KILL": "after-commit:k1"}


def killed_under_a_budgeted_call(proxy: ProxyProcess, key: str) -> None:
    """A budgeted call (Idempotency-Key ``key``, which the test hook in the proxy's env
    names) during which the hook SIGKILLs the proxy; the hook then left out of its env."""
    with pytest.raises(openai.APIConnectionError):  # the process died under the request
        oai(proxy, "sk", timeout=SIGNAL_WAIT).chat.completions.create(
            model="m",
            max_tokens=100,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={**HEADERS, "Idempotency-Key": key},
        )
    assert proxy.proc is not None and proxy.proc.wait(timeout=SIGNAL_WAIT) == -9
    proxy.env = {k: v for k, v in proxy.env.items() if k != "SKILLSTATE_TEST_KILL"}


def kill_right_after_a_budgeted_commit(proxy: ProxyProcess, fake: FakeProvider) -> None:
    """A budgeted call answered ($0.006: 6 output tokens) and its row committed with the
    turn (an Idempotency-Key's kept reply), then the proxy SIGKILLed by the test hook
    before the turn's holds end; restarted without the hook."""
    fake.enqueue(Reply(text="one two three four five"))
    killed_under_a_budgeted_call(proxy, "k1")
    proxy.start()


def spent_after_a_call(proxy: ProxyProcess, fake: FakeProvider) -> float:
    """The session's spend that a next budgeted call ($0.006 itself) answers with."""
    fake.enqueue(Reply(text="one two three four five"))
    reply = oai(proxy, "sk", timeout=SIGNAL_WAIT).chat.completions.with_raw_response.create(
        model="m",
        max_tokens=100,
        messages=[{"role": "user", "content": "again"}],
        extra_headers=HEADERS,
    )
    return float(reply.headers["x-skillstate-session-spent-usd"])


def assert_the_call_counts_once(proxy: ProxyProcess, fake: FakeProvider) -> None:
    """The session's spend is the call's real cost alone, with no `interrupted` worst case
    of the same call on top: the next call's spend is $0.006 + its own $0.006 (before:
    $0.112, the cut call's $0.10 estimate too)."""
    assert spent_after_a_call(proxy, fake) == pytest.approx(0.012)
    totals = proxy.get("/cost", params={"session": "run"}).json()["totals"]
    assert totals["requests"] == 2
    assert totals["cost_usd"] == pytest.approx(0.012)
    assert not totals.get("estimated_cost_usd")
    assert "cut by a proxy" not in proxy.stop()


def test_a_kill_after_a_calls_row_is_written_charges_it_once(
    fake: FakeProvider, start_proxy_process: StartProxyProcess, tmp_path: Path
) -> None:
    """The call's row replaces its pending row in the same statement (it takes its id), so a
    kill between that write and the end of the turn's holds leaves the real row alone."""
    proxy = start_proxy_process(
        fake.url + "/v1", "--mode", "passthrough", config={"prices": PRICES}, env=KILL_AFTER_COMMIT
    )
    kill_right_after_a_budgeted_commit(proxy, fake)
    assert ledger(tmp_path / "data") == [("override", pytest.approx(0.006), None)]
    assert_the_call_counts_once(proxy, fake)


KILL_AFTER_LEDGER = {"SKILLSTATE_TEST_KILL": "after-ledger:k2"}


def test_a_kill_after_a_failed_calls_rows_charges_no_hold_it_did_not_use(
    fake: FakeProvider, start_proxy_process: StartProxyProcess, tmp_path: Path
) -> None:
    """The call's first attempt is cut (the provider closes the connection: it may bill
    it) and opens the breaker; its retry's worst case is held, then not sent (the circuit
    is open): the turn ends with one row and a hold no attempt used. The proxy is killed
    as soon as the turn's rows are written (test hook ``after-ledger``). Before, the unused
    hold's pending row was deleted after that write, and the restart charged it as a call
    cut by the kill: the session had spent $0.20 for one cut attempt, and a second call
    ($0.10 worst case) was refused against its $0.25. Now that row goes first."""
    config = {"prices": PRICES, "retry_max_attempts": 2, "failure_threshold": 1,
              "retry_base_delay": 0.01, "open_cooldown": 600}  # fmt: skip
    proxy = start_proxy_process(
        fake.url + "/v1", "--mode", "passthrough", config=config, env=KILL_AFTER_LEDGER
    )
    fake.enqueue(Reply(drop=True))
    killed_under_a_budgeted_call(proxy, "k2")
    assert len(fake.requests) == 1
    proxy.start()
    # The cut attempt, at its worst case; no attempt answered, so it is the turn's own row.
    cut = ("generation", None, pytest.approx(0.10))
    assert ledger(tmp_path / "data", "kind") == [cut]
    assert spent_after_a_call(proxy, fake) == pytest.approx(0.106)
    assert "cut by a proxy" not in proxy.stop()
