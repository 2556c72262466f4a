"""A store filled the way users fill it (a real proxy, the openai SDK, the fake provider),
a deep comparison of two stores, and a ledger row to write by hand: for the ``skillstate
store copy`` and store tests of both tiers (SQLite in the main suite, PostgreSQL in
tests/scale)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import openai

from skillstate.cli.main import main
from skillstate.store import KeptReply, Store
from skillstate.store.records import LedgerRow
from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, envelope, oai

SCHEMA = "facts,notes,step"


async def listed_in_pages(store: Store, size: int) -> list[str]:
    """The sessions as GET /state pages them, ``size`` at a time (most recently updated
    first, ties by id), following each page's cursor."""
    listed: list[str] = []
    after = None
    while page := await store.sessions_page(size, after):
        listed += [p["session"] for p in page]
        after = (page[-1]["updated"], page[-1]["session"])
    return listed


def ledger_row(**overrides: Any) -> LedgerRow:
    """A priced generation row of session "s" (10 in, 5 out, $0.50; baseline $2.00),
    with ``overrides``."""
    row: dict[str, Any] = {
        "ts": 1.0, "session": "s", "upstream": "u", "model": "m", "kind": "generation",
        "status": 200, "input_tokens": 10, "output_tokens": 5, "cache_read_tokens": None,
        "cache_write_tokens": None, "pricing": "known", "cost_usd": 0.5,
        "baseline_input_tokens": 40, "baseline_cost_usd": 2.0, "mode": "state",
    }  # fmt: skip
    return LedgerRow(**{**row, **overrides})


def make_key(data: Path, name: str) -> str:
    """``skillstate keys create --name NAME`` on the data dir; the new key."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["keys", "--data-dir", str(data), "create", "--name", name]) == 0
    return out.getvalue().strip()


def turn(client: openai.OpenAI, fake: FakeProvider, session: str, reply: str) -> Any:
    fake.enqueue(Reply(text=reply, usage={"prompt_tokens": 120, "completion_tokens": 30}))
    return client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": f"next step of {session}"}],
        extra_headers={SESSION_HEADER: session},
    )


IDEMPOTENCY_KEY = "fill-1"


def keyed_turn(client: openai.OpenAI) -> Any:
    """The same turn of session ``keyed`` with the same Idempotency-Key each time: the first
    runs it, every retry gets its kept reply."""
    return client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "a turn worth retrying"}],
        extra_headers={SESSION_HEADER: "keyed", "Idempotency-Key": IDEMPOTENCY_KEY},
    )


def fill(proxy: Proxy, fake: FakeProvider, key: str) -> dict[str, int]:
    """Sessions with valid and invalid transitions (rollback retries in the ledger), a
    chain of stored Responses API responses and a turn kept under an Idempotency-Key
    (``keyed_turn``), as client ``key``; returns each session's step as the proxy
    reported it."""
    client = oai(proxy, key)
    steps: dict[str, int] = {}
    fake.enqueue(Reply(text=envelope({"notes": "kept"})))
    steps["keyed"] = int(keyed_turn(client).headers["x-skillstate-step"])
    for i in range(1, 6):
        r = turn(client, fake, "long", envelope({"step": i, "notes": f"turn {i}"}))
        steps["long"] = int(r.headers["x-skillstate-step"])
    turn(client, fake, "short", envelope({"facts": {"city": "Lyon", "n": 1.5}}))
    fake.enqueue(Reply(text=envelope({"nope": 1})))  # invalid, then re-asked twice
    fake.enqueue(Reply(text=envelope({"nope": 2})))
    r = turn(client, fake, "short", envelope({"nope": 3}))
    assert r.headers["x-skillstate-transition"] == "invalid"
    steps["short"] = int(r.headers["x-skillstate-step"])
    fake.enqueue(Reply(text=envelope({"notes": "from responses"})))
    first = client.responses.create(
        model="gpt-4o-mini", input="hi", extra_headers={SESSION_HEADER: "resp"}
    )
    fake.enqueue(Reply(text=envelope({"step": 2})))
    raw = client.responses.with_raw_response.create(
        model="gpt-4o-mini",
        input="more",
        previous_response_id=first.id,
        extra_headers={SESSION_HEADER: "resp"},
    )
    steps["resp"] = int(raw.headers["x-skillstate-step"])
    return steps


def filled_by_a_proxy(
    start_proxy: StartProxy, fake: FakeProvider, data: Path
) -> tuple[str, dict[str, int]]:
    """The data dir ``data`` (the one ``start_proxy`` gives its proxy) filled by a proxy,
    stopped after, as alice's client (:func:`fill`): her key and each session's step."""
    key = make_key(data, "alice")
    proxy = start_proxy(fake.url + "/v1", "--schema", SCHEMA)
    steps = fill(proxy, fake, key)
    proxy.stop()
    return key, steps


async def everything(store: Store) -> dict[str, Any]:
    """All a store holds, read through its export methods and history pages."""
    sessions, history, responses, ledger = [], {}, [], []
    after: str | None = None
    while page := await store.export_sessions(after, 2):
        for s in page:
            sessions.append(s)
            history[s.session] = await store.history_page(s.session, 10_000)
        after = page[-1].session
    after = None
    while rpage := await store.export_responses(after, 2):
        responses += rpage
        after = rpage[-1].id
    budgets: list[tuple[str, float]] = []
    after = None
    while bpage := await store.export_session_budgets(after, 2):
        budgets += bpage
        after = bpage[-1][0]
    kept: list[KeptReply] = []
    kept_after: tuple[str, str] | None = None
    while kpage := await store.export_kept_replies(kept_after, 2):
        kept += kpage
        kept_after = (kpage[-1].scope, kpage[-1].key)
    position = 0
    while True:
        rows, position = await store.export_ledger(position, 3)
        if not rows:
            break
        ledger += rows
    return {
        "sessions": sessions,
        "history": history,
        "responses": responses,
        "ledger": ledger,
        "budgets": budgets,
        "kept": kept,
        "keys": await store.keys(),
        "counts": await store.counts(),
    }
