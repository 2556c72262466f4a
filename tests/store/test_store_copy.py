"""``skillstate store copy`` between SQLite stores: a store filled by a real proxy copied
whole and verified, a proxy on the copy continuing a session at its next step, and every
refusal in one line with nothing written. (PostgreSQL: tests/scale/test_store_copy_pg.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from skillstate.auth.keys import SECRET_FILE
from skillstate.store import KeptReply, SessionRecord, StoredResponse, TransitionRecord
from skillstate.store.copy import CopyRefused, copy_store
from skillstate.store.records import LedgerRow
from skillstate.store.sqlite import SQLiteStore
from tests.conftest import StartProxy, proxy_env
from tests.fakeprovider import FakeProvider
from tests.helpers import oai
from tests.storefill import SCHEMA, envelope, everything, filled_by_a_proxy, keyed_turn, turn


def store_copy(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "skillstate", "store", "copy", *args],
        capture_output=True,
        text=True,
        env=proxy_env(),
        cwd=cwd,
        timeout=120,
    )


def read_all(path: Path) -> dict[str, Any]:
    async def read() -> dict[str, Any]:
        store = SQLiteStore(path)
        await store.open()
        try:
            return await everything(store)
        finally:
            await store.close()

    return asyncio.run(read())


def test_a_proxy_filled_store_is_copied_whole_and_continues_on_the_copy(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    key, steps = filled_by_a_proxy(start_proxy, fake, data)
    source, dest = data / "skillstate.db", tmp_path / "copy" / "skillstate.db"

    r = store_copy("--from", f"sqlite://{source}", "--to", f"sqlite://{dest}", cwd=tmp_path)

    assert r.returncode == 0, r.stderr
    want = read_all(source)
    counts = want["counts"]
    assert counts["sessions"] == 4 and counts["keys"] == 1 and counts["responses"] == 2
    assert counts["transitions"] == sum(steps.values()) == 1 + 5 + 2 + 2
    assert counts["ledger"] >= 1 + 5 + 4 + 2  # the invalid turn's two rollback retries too
    assert f"copied sqlite://{source} -> sqlite://{dest}" in r.stdout
    assert re.search(rf"\n  ledger +{counts['ledger']}\n", r.stdout), r.stdout
    assert "verified: every count, the step, schema and state of 4 session(s)" in r.stdout
    # the key's secret goes with it: the copy's data dir gets the source's
    assert f"client keys: their secret was written to {dest.parent / SECRET_FILE}" in r.stdout
    assert (dest.parent / SECRET_FILE).read_bytes() == (data / SECRET_FILE).read_bytes()
    assert "Traceback" not in r.stderr
    assert read_all(dest) == want  # every record, field for field, in the same order

    # A proxy on the copy continues at the next step, with the same client key.
    on_copy = start_proxy(fake.url + "/v1", "--schema", SCHEMA, "--data-dir", str(dest.parent))
    client = oai(on_copy, key)
    r2 = turn(client, fake, "long", envelope({"notes": "after the copy"}))
    assert r2.headers["x-skillstate-step"] == str(steps["long"] + 1)
    state = on_copy.get(
        "/state", params={"session": "long"}, headers={"authorization": f"Bearer {key}"}
    ).json()
    assert state["state"] == {"step": 5, "notes": "after the copy"}
    # ... with the copied stored response to chain on
    first = want["responses"][0]
    assert client.responses.retrieve(first.response["id"]).id == first.response["id"]
    # ... and the turn kept under its Idempotency-Key: a retry replays it, nothing is sent
    assert counts["kept_replies"] == 1 and len(want["kept"]) == 1
    sent = len(fake.requests)
    retried = keyed_turn(client)
    assert retried.headers["x-skillstate-replayed"] == "true"
    assert retried.http_response.content == want["kept"][0].body and len(fake.requests) == sent


def test_refusals_are_one_line_and_write_nothing(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    proxy = start_proxy(fake.url + "/v1", "--schema", SCHEMA)
    turn(oai(proxy, "k"), fake, "a", envelope({}))
    source = f"sqlite://{data / 'skillstate.db'}"
    other = tmp_path / "other.db"
    cases = {
        # the source is in use by a running proxy: it would change during the copy
        "in use by another skillstate proxy": (source, f"sqlite://{other}"),
    }
    for needle, (src, dst) in cases.items():
        r = store_copy("--from", src, "--to", dst, cwd=tmp_path)
        assert r.returncode == 2 and r.stdout == "", r
        assert r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr
    proxy.stop()
    assert store_copy("--from", source, "--to", f"sqlite://{other}", cwd=tmp_path).returncode == 0
    before = other.read_bytes()
    cases = {
        "the destination is not empty (1 sessions, 1 transitions, 1 ledger": (
            source,
            f"sqlite://{other}",
        ),
        "--from and --to are the same store": (source, source),
        "--from: no store at": (f"sqlite://{tmp_path / 'none.db'}", f"sqlite://{other}"),
        "--to: must be sqlite:///path or postgresql://…, not http:": (source, "http://x/y"),
        "--from: must be sqlite:///path or postgresql://…, not a URL": ("nothing", source),
        "--to: sqlite:///path needs a file path, e.g.": (source, "sqlite:///"),
    }
    for needle, (src, dst) in cases.items():
        r = store_copy("--from", src, "--to", dst, cwd=tmp_path)
        assert r.returncode == 2 and r.stdout == "", r
        assert r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr
        assert r.stderr.startswith("skillstate: store copy") or "--" in r.stderr
    assert other.read_bytes() == before
    r = store_copy("--from", source, cwd=tmp_path)  # argparse's own errors: one line too
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--to" in r.stderr


# -- the copy itself, store to store --------------------------------------------------------


def session(name: str, step: int, state: dict[str, Any]) -> SessionRecord:
    return SessionRecord(name, state, ["a", "b"], step, 1000.0 + step, 2000.0 + step)


def history(steps: int) -> list[TransitionRecord]:
    return [
        TransitionRecord(
            i,
            "valid" if i % 3 else "invalid",
            {"a": i},
            f"act {i}",
            [],
            100.0 + i,
            "compact",
            {"why": i} if i == 2 else None,
        )
        for i in range(1, steps + 1)
    ]


def ledger_row(ts: float, session: str | None, cost: float | None) -> LedgerRow:
    return LedgerRow(ts, session, "up", "m", "generation", 200, 10, 2, 0, 0, "list", cost,
                     12, cost, "state")  # fmt: skip


async def filled(path: Path, names: list[str], steps: int = 7) -> SQLiteStore:
    store = SQLiteStore(path)
    await store.open()
    for n in names:
        await store.import_session(session(n, steps, {"a": steps, "b": {"deep": [1, 2.5]}}))
        await store.import_transitions(n, history(steps))
        await store.put_response(StoredResponse(f"resp_{n}", n, 5.0, None, [{"x": 1}], {"id": 1}))
        kept = KeptReply(n, "k1", "fp", n, 6.0, 200, n == "s2", {"x-a": "1"}, b"{}", steps)
        await store.keep_reply(kept, [])
    await store.add_ledger_rows(
        [ledger_row(float(i), names[i % len(names)], i / 7) for i in range(23)]
    )
    return store


async def test_pages_smaller_than_every_table_copy_everything(tmp_path: Path) -> None:
    source = await filled(tmp_path / "a.db", ["s1", "s2", "s3", "k:s4", "s5"])
    for session, usd in (("s1", 5.0), ("k:s4", 0.25), ("k:passthrough", 2.0)):
        await source.set_session_budget(session, usd, replace=False)
    dest = SQLiteStore(tmp_path / "b.db")
    await dest.open()
    seen: list[str] = []
    try:
        report = await copy_store(source, dest, page=2, progress=seen.append)
        assert report.problems == []
        assert report.sessions_verified == 5
        assert report.after == report.source == {
            "sessions": 5, "transitions": 35, "ledger": 23, "keys": 0, "responses": 5,
            "session_budgets": 3, "kept_replies": 5,
        }  # fmt: skip
        assert await everything(dest) == await everything(source)
        assert await dest.session_budget("k:passthrough") == 2.0  # no session row needed
        assert "verifying" in seen
        with pytest.raises(CopyRefused, match=r"--merge: 18 id\(s\)"):  # 5 + 5 + 3 + 5 kept
            await copy_store(source, dest, merge=True)
    finally:
        await source.close()
        await dest.close()


async def test_merge_adds_to_a_store_and_refuses_shared_ids(tmp_path: Path) -> None:
    source = await filled(tmp_path / "a.db", ["s1", "s2"])
    dest = await filled(tmp_path / "b.db", ["t1"], steps=3)
    try:
        with pytest.raises(CopyRefused, match="the destination is not empty"):
            await copy_store(source, dest)
        report = await copy_store(source, dest, merge=True, page=1)
        assert report.problems == [] and report.sessions_verified == 2
        assert report.after["sessions"] == 3 and report.after["ledger"] == 46
        before = await everything(dest)
        with pytest.raises(CopyRefused, match=r"--merge: 6 id\(s\) exist in both stores"):
            await copy_store(source, dest, merge=True)
        assert await everything(dest) == before  # nothing written
    finally:
        await source.close()
        await dest.close()


class LossyStore(SQLiteStore):
    """A destination that loses what it is given: a state key, a transition, a ledger row."""

    async def import_session(self, record: SessionRecord) -> None:
        state = {k: v for k, v in record.state.items() if k != "b"}
        await super().import_session(dataclasses.replace(record, state=state))

    async def import_transitions(self, session: str, history: list[TransitionRecord]) -> None:
        await super().import_transitions(session, history[1:])

    async def add_ledger_rows(self, rows: list[LedgerRow]) -> None:
        await super().add_ledger_rows(rows[1:])


async def test_verification_reports_what_the_destination_lost(tmp_path: Path) -> None:
    source = await filled(tmp_path / "a.db", ["s1", "s2"])
    dest = LossyStore(tmp_path / "b.db")
    await dest.open()
    try:
        report = await copy_store(source, dest, page=100)
    finally:
        await source.close()
        await dest.close()
    assert report.sessions_verified == 0
    assert report.problems == [
        "transitions: 12 in the destination, expected 14",
        "ledger: 22 in the destination, expected 23",
        "session s1: step, schema or state differ",
        "session s2: step, schema or state differ",
        "ledger totals (rows, input, output, cache tokens, USD) grew by"
        " (22, 220, 44, 0, 36.142857142857146), expected (23, 230, 46, 0, 36.142857142857146)",
    ]


async def test_keys_bring_their_secret_and_merge_refuses_two_secrets(tmp_path: Path) -> None:
    from skillstate.auth.keys import server_secret
    from skillstate.auth.record import KeyRecord

    a_dir, b_dir, c_dir = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    source = await filled(a_dir / "skillstate.db", ["s1"])
    await source.save_key(KeyRecord("alice", "digest-a", False, None, None, None, 1.0), new=True)
    a_secret = server_secret(a_dir)
    other = await filled(b_dir / "skillstate.db", ["t1"])
    await other.save_key(KeyRecord("bob", "digest-b", False, None, None, None, 1.0), new=True)
    server_secret(b_dir)  # a secret of its own
    fresh = SQLiteStore(c_dir / "skillstate.db")
    await fresh.open()
    try:
        before = await everything(other)
        with pytest.raises(CopyRefused, match="hashed with different secrets"):
            await copy_store(source, other, merge=True, source_dir=a_dir, dest_dir=b_dir)
        assert await everything(other) == before
        report = await copy_store(source, fresh, source_dir=a_dir, dest_dir=c_dir)
        assert report.problems == [] and report.secret == f"written to {c_dir / SECRET_FILE}"
        assert (c_dir / SECRET_FILE).read_bytes() == a_secret
        # without a place for the secret, the copy says the keys will not work
        lost = SQLiteStore(tmp_path / "d" / "skillstate.db")
        await lost.open()
        try:
            report = await copy_store(source, lost, source_dir=a_dir)
            assert report.secret is None
            assert report.problems[0].startswith("client keys: the secret they were hashed with")
        finally:
            await lost.close()
    finally:
        for store in (source, other, fresh):
            await store.close()


@pytest.mark.parametrize("side", ["--from", "--to"])
def test_a_file_that_is_not_a_database_is_refused_and_left_exactly_as_it_was(
    tmp_path: Path, side: str
) -> None:
    # e.g. a mistyped sqlite:///etc/passwd: neither made private (0600) nor given a lock file
    victim = tmp_path / "passwd"
    victim.write_text("root:x:0:0:root:/root:/bin/bash\n")
    victim.chmod(0o644)
    other = f"sqlite://{tmp_path / 'other.db'}"
    src, dst = (f"sqlite://{victim}", other) if side == "--from" else (other, f"sqlite://{victim}")
    if side == "--to":
        read_all(tmp_path / "other.db")  # an empty store to copy from
    r = store_copy("--from", src, "--to", dst, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r
    assert "file is not a database" in r.stderr
    assert oct(victim.stat().st_mode & 0o777) == oct(0o644)
    assert victim.read_text() == "root:x:0:0:root:/root:/bin/bash\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("passwd")) == ["passwd"]


def _foreign_db(path: Path) -> bytes:
    import sqlite3

    db = sqlite3.connect(path)
    db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    db.execute("INSERT INTO users VALUES (1, 'ann')")
    db.commit()
    db.close()
    path.chmod(0o644)
    return path.read_bytes()


@pytest.mark.parametrize("side", ["--from", "--to"])
def test_another_applications_sqlite_file_is_refused_and_left_exactly_as_it_was(
    tmp_path: Path, side: str
) -> None:
    """It was adopted: the copy wrote skillstate's tables, WAL mode and a lock file into it
    and exited 0, ``--from`` (which only reads) too."""
    victim = tmp_path / "app.db"
    before = _foreign_db(victim)
    other = f"sqlite://{tmp_path / 'other.db'}"
    src, dst = (f"sqlite://{victim}", other) if side == "--from" else (other, f"sqlite://{victim}")
    if side == "--to":
        read_all(tmp_path / "other.db")  # an empty store to copy from
    r = store_copy("--from", src, "--to", dst, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stdout == "", r
    assert f"{side}: {victim} is not a skillstate store (it holds other tables: users)" in r.stderr
    assert victim.read_bytes() == before and oct(victim.stat().st_mode & 0o777) == oct(0o644)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("app")) == ["app.db"]


def test_an_empty_file_as_the_source_is_no_store_and_stays_empty(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    r = store_copy("--from", f"sqlite://{empty}", "--to", f"sqlite://{tmp_path / 'x.db'}",
                   cwd=tmp_path)  # fmt: skip
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r
    assert f"--from: no store at {empty}" in r.stderr
    assert empty.read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]


def test_migrate_and_the_proxy_refuse_another_applications_database(tmp_path: Path) -> None:
    victim = tmp_path / "app.db"
    before = _foreign_db(victim)
    r = subprocess.run(
        [sys.executable, "-m", "skillstate", "migrate", "--store", f"sqlite://{victim}"],
        capture_output=True, text=True, env=proxy_env(), cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stdout == "", r
    assert f"store: {victim} is not a skillstate store" in r.stderr
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    (data / "skillstate.db").write_bytes(before)
    for args in (["cost"], ["--upstream", "http://127.0.0.1:1/v1", "--port", "0"]):
        r = subprocess.run(
            [sys.executable, "-m", "skillstate", *args, "--data-dir", str(data)],
            capture_output=True, text=True, env=proxy_env(), cwd=tmp_path, timeout=60,
        )  # fmt: skip
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r
        assert "is not a skillstate store" in r.stderr and "Traceback" not in r.stderr
        assert (data / "skillstate.db").read_bytes() == before
    assert victim.read_bytes() == before


def test_the_tables_a_new_store_makes_are_the_ones_known_as_a_stores(tmp_path: Path) -> None:
    from skillstate.store.datadir import STORE_TABLES, foreign_tables, sqlite_tables

    read_all(tmp_path / "new.db")  # opened (made) and closed: its tables are in the file
    assert sqlite_tables(tmp_path / "new.db") == STORE_TABLES
    assert foreign_tables(tmp_path / "new.db") == set()
