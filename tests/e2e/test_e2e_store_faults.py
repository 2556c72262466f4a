"""A real proxy whose store cannot write, or is full (issue 13 items 5 and 10): the client
gets a prompt, clear error in its own dialect, /health tells the truth, and nothing is
committed twice."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path

import httpx
import pytest

from tests.conftest import Proxy, StartProxy, StartProxyProcess
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, envelope, locked_by_another_process


def chat(p: Proxy, session: str) -> httpx.Response:
    return p.http.post(
        p.v1 + "/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        headers={SESSION_HEADER: session},
        timeout=30,
    )


def messages(p: Proxy, session: str) -> httpx.Response:
    return p.http.post(
        p.v1 + "/messages",
        json={"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "x"}]},
        headers={SESSION_HEADER: session, "anthropic-version": "2023-06-01"},
        timeout=30,
    )


def test_a_database_locked_by_another_process_is_a_503_and_health_says_so(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    p = start_proxy(fake.url + "/v1", "--schema", "notes")
    fake.enqueue(Reply(text=envelope({"notes": "one"})))
    assert chat(p, "lk").status_code == 200
    with locked_by_another_process(tmp_path / "data" / "skillstate.db"):
        health = p.get("/health")
        assert health.status_code == 503, health.text
        assert health.json()["ok"] is False
        assert "locked by another process" in health.json()["store"]

        fake.enqueue(Reply(text=envelope({"notes": "lost"})))
        r = chat(p, "lk")
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert "could not commit the turn" in err["message"]
        assert "locked by another process" in err["message"]
        assert err["code"] == "store_unavailable" and r.headers["retry-after"]

        # Now known unable to write: refused before it is sent (test_e2e_store_preflight.py).
        r = messages(p, "lk")
        assert r.status_code == 503, r.text
        assert r.json()["type"] == "error" and "locked" in r.json()["error"]["message"]
    assert p.get("/health").status_code == 200
    fake.enqueue(Reply(text=envelope({"notes": "two"})))
    assert chat(p, "lk").status_code == 200
    hist = p.get("/state", params={"session": "lk", "history": "1"}).json()
    assert hist["state"] == {"notes": "two"}
    assert [h["step"] for h in hist["history"]] == [1, 2]  # the refused turns left nothing


def test_max_sessions_refuses_a_new_session_before_calling_upstream(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start_proxy(fake.url + "/v1", "--schema", "notes",
                                  config={"max_sessions": 1})  # fmt: skip
    fake.enqueue(Reply(text=envelope({"notes": "a"})))
    assert chat(p, "a").status_code == 200
    calls = len(fake.requests)

    r = chat(p, "b")
    assert r.status_code == 507, r.text
    assert r.json()["error"]["code"] == "store_full"
    assert "max_sessions" in r.json()["error"]["message"]
    r = messages(p, "c")
    assert r.status_code == 507, r.text
    assert r.json()["type"] == "error" and "max_sessions" in r.json()["error"]["message"]
    assert len(fake.requests) == calls  # refused before spending tokens

    fake.enqueue(Reply(text=envelope({"notes": "a2"})))
    assert chat(p, "a").status_code == 200  # an existing session goes on
    assert p.http.delete(p.url + "/state", params={"session": "a"}).status_code == 204
    fake.enqueue(Reply(text=envelope({"notes": "b"})))
    assert chat(p, "b").status_code == 200  # room again
    assert p.get("/health").status_code == 200


def test_patch_state_is_bounded_in_size_and_depth(fake: FakeProvider, proxy: Proxy) -> None:
    fake.enqueue(Reply(text=envelope({"notes": "kept"})))
    assert chat(proxy, "op").status_code == 200
    before = proxy.state("op")

    def patch(body: dict) -> httpx.Response:
        return proxy.http.patch(
            proxy.url + "/state", params={"session": "op"}, json=body, timeout=30
        )

    deep: list = []
    for _ in range(100):
        deep = [deep]
    r = patch({"facts": deep})
    assert r.status_code == 400 and "nested deeper" in r.json()["error"]["message"]
    r = patch({"facts": [[] for _ in range(20_000)]})  # 60 KB of JSON, ~1.5 MB parsed
    assert r.status_code == 400 and "limit" in r.json()["error"]["message"]
    assert proxy.state("op") == before


def test_an_absurd_usage_report_wedges_neither_the_store_nor_shutdown(
    fake: FakeProvider, start_proxy_process: StartProxyProcess
) -> None:
    # Issue 13 item 3's repro through the wire: prompt_tokens = 2^53 on a turn whose
    # transcript is > 1,024x the compact context put baseline_input_tokens past SQLite's
    # 2^63; the OverflowError on the store thread hung every later write and SIGTERM. Counts
    # are now bounded where usage is parsed and again where rows are stored (the store's own
    # unit tests check the second line of defence alone).
    p = start_proxy_process(fake.url + "/v1", "--schema", "notes")
    fake.enqueue(Reply(text=envelope({"notes": "big"}), usage={"prompt_tokens": 2**53}))
    said = {"role": "assistant", "content": "ok"}  # (user messages in a row are one task)
    asked = {"role": "user", "content": "word " * 2000}
    transcript = [m for _ in range(400) for m in (asked, said)]  # ~4 MB
    r = p.http.post(
        p.v1 + "/chat/completions",
        json={"model": "m", "messages": [*transcript, {"role": "user", "content": "x"}]},
        headers={SESSION_HEADER: "big"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    fake.enqueue(Reply(text=envelope({"notes": "after"})))
    assert chat(p, "big").status_code == 200  # the store still writes
    assert p.state("big")["step"] == 2
    assert p.get("/health").status_code == 200
    cost = p.get("/cost", params={"session": "big"}).json()
    assert cost["totals"]["input_tokens"] >= 2**53
    assert cost["totals"]["baseline_input_tokens"] >= 2**53  # clamped, not lost
    err = p.stop()
    assert p.proc is not None and p.proc.returncode in (0, -15), err
    assert "Traceback" not in err


BUDGETED = {SESSION_HEADER: "down", "x-skillstate-budget-usd": "0.25"}
OUTPUT_PRICED = {"m": {"input_per_mtok": 0, "output_per_mtok": 1_000}}  # $0.001 a token


def budgeted_call(p: Proxy) -> httpx.Response:
    """A passthrough call with max_tokens 100 ($0.10 worst case) under the session budget."""
    return p.http.post(
        p.v1 + "/chat/completions",
        json={"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "x"}]},
        headers=BUDGETED,
        timeout=60,
    )


def ledger_pricing(db: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return [r[0] for r in conn.execute("SELECT pricing FROM ledger ORDER BY rowid")]


def test_a_budgeted_call_the_store_could_not_record_is_written_later_and_counted_once(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    """The store is locked when a budgeted call's row is written at the end of its turn: the
    reply goes out, and the row, its holds and its pending row wait. The next call's spend
    read writes it first: the session has spent both calls' real cost ($0.006 each), and
    the ledger holds the two rows, no pending one. Before, the row was dropped and the
    pending row, this process's own, was counted as a call still in flight: the second
    call saw $0.006 spent, and the first was charged only at the next start."""
    p = start_proxy(fake.url + "/v1", "--mode", "passthrough", config={"prices": OUTPUT_PRICED})
    db = tmp_path / "data" / "skillstate.db"
    held = threading.Event()
    fake.enqueue(Reply(text="one two three four five", hold=held))
    first: list[httpx.Response] = []
    out = threading.Thread(target=lambda: first.append(budgeted_call(p)))
    out.start()
    fake.wait_for(lambda requests: len(requests) == 1, timeout=60)
    with locked_by_another_process(db):
        held.set()
        out.join(60)
    assert first[0].status_code == 200, first[0].text
    assert ledger_pricing(db) == ["pending"]  # the call's row could not be written

    fake.enqueue(Reply(text="one two three four five"))
    second = budgeted_call(p)
    assert second.status_code == 200, second.text
    assert float(second.headers["x-skillstate-session-spent-usd"]) == pytest.approx(0.012)
    assert ledger_pricing(db) == ["override", "override"]
