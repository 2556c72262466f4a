"""``skillstate store copy`` into and out of PostgreSQL, /cost summed in PostgreSQL, and the
ledger's retention on PostgreSQL, against the tier's real server."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from skillstate.store import Store
from skillstate.store.postgres.store import PostgresStore
from skillstate.store.sqlite import SQLiteStore
from tests.conftest import StartProxy, proxy_env
from tests.cost.test_ledger_sums import check_sums_match_rows, random_row
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, oai
from tests.storefill import SCHEMA, envelope, everything, filled_by_a_proxy, keyed_turn, turn

HANG = 60.0  # a guard against a hang, not a performance threshold


def store_copy(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "skillstate", "store", "copy", *args],
        capture_output=True, text=True, env=proxy_env(), cwd=cwd, timeout=120,
    )  # fmt: skip


def read_all(store: Store) -> dict[str, Any]:
    async def read() -> dict[str, Any]:
        await store.open()
        try:
            return await everything(store)
        finally:
            await asyncio.wait_for(store.close(), HANG)

    return asyncio.run(read())


def comparable(content: dict[str, Any]) -> dict[str, Any]:
    """What two backends hold alike: ``state_bytes`` is each one's own encoding's size."""
    sessions = [dataclasses.replace(s, state_bytes=0) for s in content["sessions"]]
    return {**content, "sessions": sessions}


async def test_sql_sums_equal_python_summary_postgres(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.open()
    try:
        rng = random.Random(5)
        await check_sums_match_rows(store, [random_row(rng) for _ in range(3000)])
    finally:
        await asyncio.wait_for(store.close(), HANG)


def test_a_proxy_filled_sqlite_store_moves_to_postgresql_and_continues_there(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path, pg_url: str
) -> None:
    data = tmp_path / "data"
    key, steps = filled_by_a_proxy(start_proxy, fake, data)
    source = data / "skillstate.db"

    r = store_copy("--from", f"sqlite://{source}", "--to", pg_url, cwd=tmp_path)

    assert r.returncode == 0, r.stderr
    assert "verified: every count, the step, schema and state of 4 session(s)" in r.stdout
    assert "Traceback" not in r.stderr
    want = comparable(read_all(SQLiteStore(source)))
    assert comparable(read_all(PostgresStore(pg_url))) == want

    # A proxy on PostgreSQL (another data dir: the key's secret came with the copy)
    # continues the copied sessions at their next step.
    config = {"store": pg_url}
    on_pg = start_proxy(
        fake.url + "/v1", "--schema", SCHEMA, "--data-dir", str(tmp_path / "replica"),
        config=config,
    )  # fmt: skip
    client = oai(on_pg, key)
    r2 = turn(client, fake, "long", envelope({"notes": "on postgresql"}))
    assert r2.headers["x-skillstate-step"] == str(steps["long"] + 1)
    sent = len(fake.requests)  # the kept turn's retry replays it: nothing is sent
    retried = keyed_turn(client)
    assert retried.headers["x-skillstate-replayed"] == "true" and len(fake.requests) == sent
    fake.enqueue(Reply(text=envelope({"notes": "chained"})))
    chained = client.responses.create(
        model="gpt-4o-mini",
        input="and then?",
        previous_response_id=max(want["responses"], key=lambda r: r.created).response["id"],
        extra_headers={SESSION_HEADER: "resp"},
    )
    assert chained.output_text
    auth = {"authorization": f"Bearer {key}"}
    long = on_pg.get("/state", params={"session": "long"}, headers=auth).json()
    assert long["state"] == {"step": 5, "notes": "on postgresql"} and long["step"] == 6
    cost = on_pg.get("/cost", params={"since": "all"}, headers=auth).json()["totals"]
    assert cost["requests"] == sum(1 for row in want["ledger"] if row.kind == "generation") + 2
    on_pg.stop()

    # And back: PostgreSQL into a new SQLite file, everything again.
    back = tmp_path / "back" / "skillstate.db"
    r3 = store_copy("--from", pg_url, "--to", f"sqlite://{back}", cwd=tmp_path)
    assert r3.returncode == 0, r3.stderr
    assert comparable(read_all(SQLiteStore(back))) == comparable(read_all(PostgresStore(pg_url)))


def test_refusals_with_postgresql_are_one_line(
    tmp_path: Path, pg_url: str, fake: FakeProvider, start_proxy: StartProxy
) -> None:
    source = tmp_path / "data" / "skillstate.db"
    proxy = start_proxy(fake.url + "/v1", "--schema", SCHEMA)
    turn(oai(proxy, "k"), fake, "a", envelope({}))
    proxy.stop()
    assert store_copy("--from", f"sqlite://{source}", "--to", pg_url, cwd=tmp_path).returncode == 0
    closed = "postgresql://skillstate:secret-pw@127.0.0.1:9/none"  # nothing listens on port 9
    cases = {
        "the destination is not empty (1 sessions": (f"sqlite://{source}", pg_url),
        "--to: cannot open store postgresql://skillstate:***@127.0.0.1:9/none": (
            f"sqlite://{source}",
            closed,
        ),
        "--from: cannot open store postgresql://skillstate:***@127.0.0.1:9/none": (
            closed,
            f"sqlite://{source}x",
        ),
    }
    for needle, (src, dst) in cases.items():
        r = store_copy("--from", src, "--to", dst, cwd=tmp_path)
        assert r.returncode == 2 and r.stdout == "", r
        assert r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr
        assert "secret-pw" not in r.stderr


def test_ledger_retention_purges_old_rows_on_postgresql(
    fake: FakeProvider, start_proxy: StartProxy, pg_url: str
) -> None:
    proxy = start_proxy(
        fake.url + "/v1", "--schema", SCHEMA, config={"store": pg_url, "purge_interval": 0.2}
    )
    turn(oai(proxy, "k"), fake, "r", envelope({}))
    day = 86400.0

    async def add_old_rows() -> None:
        store = PostgresStore(pg_url)
        await store.open()
        try:
            rows = [random_row(random.Random(i)) for i in range(2)]
            old = [dataclasses.replace(r, session="r", ts=time.time() - age * day)
                   for r, age in zip(rows, (91, 89), strict=True)]  # fmt: skip
            await store.add_ledger_rows(old)
        finally:
            await asyncio.wait_for(store.close(), HANG)

    asyncio.run(add_old_rows())
    # The periodic purge (every 0.2 s here) drops rows older than ledger_retention (90 days).
    deadline = time.monotonic() + HANG
    rows = -1
    while time.monotonic() < deadline:
        cost = proxy.get("/cost", params={"since": "all", "session": "r"}).json()["totals"]
        rows = sum(cost["attempts"].values())
        if rows == 2:
            break
        time.sleep(0.1)
    assert rows == 2  # the turn's row and the 89-day-old one
