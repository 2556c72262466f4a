"""A store known unable to write refuses a turn before it is sent upstream: its commit would
fail, after the upstream had billed it."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import StartProxy
from tests.e2e.test_e2e_store_faults import chat, envelope, messages
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import locked_by_another_process


def test_a_store_that_failed_to_write_refuses_the_next_turn_before_sending_it(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    p = start_proxy(fake.url + "/v1", "--schema", "notes", config={"store_busy_timeout": 0.2})
    fake.enqueue(Reply(text=envelope({"notes": "one"})))
    assert chat(p, "lk").status_code == 200
    with locked_by_another_process(tmp_path / "data" / "skillstate.db"):
        # The first turn finds out only at its commit: sent, then refused.
        fake.enqueue(Reply(text=envelope({"notes": "lost"})))
        assert chat(p, "lk").status_code == 503
        sent = len(fake.requests)
        # From then on the store is known broken: refused before anything is sent.
        for send in (chat, messages):
            r = send(p, "lk")
            assert r.status_code == 503, r.text
            assert "the turn was not sent" in r.text and "locked" in r.text
        assert r.json()["type"] == "error"  # in the client's dialect
        assert len(fake.requests) == sent
    # Unlocked: the next turn probes, goes through and commits.
    fake.enqueue(Reply(text=envelope({"notes": "two"})))
    assert chat(p, "lk").status_code == 200
    hist = p.get("/state", params={"session": "lk", "history": "1"}).json()
    assert hist["state"] == {"notes": "two"}
    assert [h["step"] for h in hist["history"]] == [1, 2]
