"""tests/e2e/test_crash_budget.py on the PostgreSQL store: a proxy process SIGKILLed with two
budgeted calls out, restarted on the same database. A shared store cannot tell a dead
process's pending rows from a live replica's until their holds could have expired
(``cost.pending``), but without coordination (no Redis holds) a budget counts every other
process's pending row at once: the cut calls hold the session's budget right away."""

from __future__ import annotations

from tests.conftest import StartProxyProcess
from tests.e2e.test_crash_budget import (
    KILL_AFTER_COMMIT,
    PRICES,
    assert_a_third_call_is_refused,
    assert_the_call_counts_once,
    kill_right_after_a_budgeted_commit,
    kill_with_two_calls_out,
)
from tests.fakeprovider import FakeProvider


def test_calls_cut_by_a_kill_hold_the_budget_on_postgresql(
    fake: FakeProvider, start_proxy_process: StartProxyProcess, pg_url: str
) -> None:
    config = {"prices": PRICES, "store": pg_url}
    proxy = start_proxy_process(fake.url + "/v1", "--mode", "passthrough", config=config)
    kill_with_two_calls_out(proxy, fake)
    proxy.start()
    assert_a_third_call_is_refused(proxy, fake)
    assert "Traceback" not in proxy.stop()


def test_a_kill_after_a_calls_row_is_written_charges_it_once_on_postgresql(
    fake: FakeProvider, start_proxy_process: StartProxyProcess, pg_url: str
) -> None:
    config = {"prices": PRICES, "store": pg_url}
    proxy = start_proxy_process(
        fake.url + "/v1", "--mode", "passthrough", config=config, env=KILL_AFTER_COMMIT
    )
    kill_right_after_a_budgeted_commit(proxy, fake)
    assert_the_call_counts_once(proxy, fake)
