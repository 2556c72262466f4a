"""The Store contract, run against both backends: SQLite (a file in tmp_path) and
PostgreSQL (a fresh database of the tier's real server). Same calls, same answers."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from skillstate.auth.record import KeyRecord
from skillstate.auth.tenancy import UNKEYED
from skillstate.cost.ledger import summarize, summarize_sums
from skillstate.cost.usage import MAX_TOKEN_COUNT
from skillstate.store import (
    SessionCommit,
    StepConflict,
    Store,
    StoredResponse,
    StoreError,
    StoreFull,
    TransitionRecord,
)
from skillstate.store.postgres.store import PostgresStore
from skillstate.store.rows import MAX_USD
from skillstate.store.sqlite import SQLiteStore
from tests.storefill import ledger_row

# A guard against a hang, not a performance threshold.
HANG = 30.0


def open_backend(kind: str, tmp_path: Path, pg_url: str, **options: Any) -> Store:
    if kind == "sqlite":
        return SQLiteStore(tmp_path / "skillstate.db", **options)
    return PostgresStore(pg_url, **options)


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(backend: str, request: pytest.FixtureRequest) -> str:
    # Only the postgres runs need a database (and the tier's server).
    return str(request.getfixturevalue("pg_url")) if backend == "postgres" else ""


@pytest.fixture
async def store(backend: str, tmp_path: Path, url: str) -> AsyncIterator[Store]:
    s = open_backend(backend, tmp_path, url)
    await s.open()
    try:
        yield s
    finally:
        await asyncio.wait_for(s.close(), HANG)


def transition(step: int, **extra: Any) -> TransitionRecord:
    return TransitionRecord(step, "valid", {"k": step}, "a", [], float(step), **extra)


async def commit(
    store: Store, session: str, expected: int, state: dict[str, Any] | None, **kw: Any
) -> int:
    return await store.commit(SessionCommit(
        session, expected_step=expected, state=state, schema=["k"],
        transition=transition(expected + 1), now=float(expected + 1), **kw,
    ))  # fmt: skip


async def test_commit_load_and_history(store: Store) -> None:
    assert await store.load("s") is None
    assert await commit(store, "s", 0, {"k": 1}) == 1
    assert await commit(store, "s", 1, None) == 2  # a turn that leaves the state alone
    assert await commit(store, "s", 2, {"k": 3}) == 3
    rec = await store.load("s")
    assert rec is not None
    assert (rec.state, rec.schema, rec.step, rec.created, rec.updated) == (
        {"k": 3}, ["k"], 3, 1.0, 3.0,
    )  # fmt: skip
    assert rec.state_bytes == len(b'{"k":3}')
    tr = TransitionRecord(4, "invalid", None, None, ["bad"], 4.0, "full", {"form": "full"})
    await store.commit(
        SessionCommit("s", expected_step=3, state=None, schema=["k"], transition=tr, now=4.0)
    )
    history = await store.history_page("s", 10)
    assert [t.step for t in history] == [1, 2, 3, 4]
    assert history[0].patch == {"k": 1} and history[0].action == "a"
    assert history[3] == tr
    assert [t.step for t in await store.history_page("s", 2, after_step=1)] == [2, 3]


async def test_a_stale_step_is_a_conflict_and_writes_nothing(store: Store) -> None:
    rows = [ledger_row(ts=5.0)]
    assert await commit(store, "s", 0, {"k": 1}) == 1
    with pytest.raises(StepConflict, match="moved from step 0 to 1"):
        await commit(store, "s", 0, {"k": "x"}, ledger=rows)  # a second "new" session
    assert await commit(store, "s", 1, {"k": 2}) == 2
    with pytest.raises(StepConflict, match="moved from step 1 to 2"):
        await commit(store, "s", 1, {"k": "y"}, ledger=rows)
    with pytest.raises(StepConflict):
        await commit(store, "gone", 3, {"k": "z"})  # a session that does not exist
    rec = await store.load("s")
    assert rec is not None and (rec.step, rec.state) == (2, {"k": 2})
    assert [t.step for t in await store.history_page("s", 10)] == [1, 2]
    assert await store.ledger_rows(0, 10) == []  # the refused turns' rows are not there
    assert await store.load("gone") is None


async def test_concurrent_commits_on_one_step_exactly_one_wins(store: Store) -> None:
    assert await commit(store, "s", 0, {"k": 0}) == 1
    results = await asyncio.gather(
        *(commit(store, "s", 1, {"k": i}) for i in range(8)), return_exceptions=True
    )
    assert results.count(2) == 1
    assert all(isinstance(r, StepConflict) for r in results if r != 2)
    assert [t.step for t in await store.history_page("s", 10)] == [1, 2]
    # And new sessions: one creation wins.
    created = await asyncio.gather(
        *(commit(store, "n", 0, {"k": i}) for i in range(8)), return_exceptions=True
    )
    assert created.count(1) == 1


async def test_ledger_rows_with_the_commit_and_alone(store: Store) -> None:
    await commit(store, "key.a", 0, {"k": 1}, ledger=[ledger_row(ts=1.0, session="key.a")])
    alone = [ledger_row(ts=2.0 + i, session=f"key.b{i}", cost_usd=0.25) for i in range(20)]
    # Many writers at once: group-committed, every one acknowledged.
    await asyncio.gather(*(store.add_ledger_rows([r]) for r in alone))
    await store.add_ledger_rows([ledger_row(ts=50.0, session="other", saved_cost_usd=-0.5)])
    rows = await store.ledger_rows(0, 100)
    assert len(rows) == 22 and [r.ts for r in rows] == sorted(r.ts for r in rows)
    assert rows[-1].saved_cost_usd == -0.5
    assert len(await store.ledger_rows(0, 100, session="key.a")) == 1
    assert len(await store.ledger_rows(0, 100, prefix="key.")) == 21
    assert await store.ledger_spend("key.b", 0) == pytest.approx(5.0)
    assert await store.ledger_spend("key.", 10.0) == pytest.approx(0.25 * 12)
    assert await store.purge_ledger(older_than=10.0) == 9
    assert len(await store.ledger_rows(0, 100)) == 13


async def test_a_row_written_again_replaces_itself_alone_with_a_commit_or_a_kept_reply(
    store: Store,
) -> None:
    first = ledger_row(ts=1.0, kind="rollback-retry", cost_usd=0.5, row_id="a1")
    await store.add_ledger_rows([first, ledger_row(ts=2.0, cost_usd=0.25, row_id="b1")])
    again = ledger_row(ts=1.0, kind="generation", cost_usd=0.5, row_id="a1")
    await commit(store, "s", 0, {"k": 1}, ledger=[again, ledger_row(ts=3.0, row_id="c1")])
    await store.add_ledger_rows([ledger_row(ts=2.0, kind="stream", cost_usd=0.25, row_id="b1")])
    rows = await store.ledger_rows(0, 100)
    assert [(r.row_id, r.kind) for r in rows] == [
        ("a1", "generation"), ("b1", "stream"), ("c1", "generation"),
    ]  # fmt: skip
    assert await store.ledger_spend("s", 0, whole=True) == pytest.approx(1.25)
    # Rows without an id (from before ids, or made outside a turn) are never merged.
    await store.add_ledger_rows([ledger_row(ts=4.0), ledger_row(ts=4.0)])
    assert len(await store.ledger_rows(0, 100)) == 5


async def test_a_stored_response_is_written_with_the_commit_or_not_at_all(store: Store) -> None:
    def response(rid: str) -> StoredResponse:
        return StoredResponse(rid, "s", 1.0, None, [{"role": "user"}], {"id": rid})

    assert await commit(store, "s", 0, {"k": 1}, response=response("resp_1")) == 1
    assert [r.id for r in await store.response_chain("resp_1", 10)] == ["resp_1"]
    with pytest.raises(StepConflict):  # a stale step: neither the turn nor its response
        await commit(store, "s", 0, {"k": 2}, response=response("resp_2"))
    assert await store.response_chain("resp_2", 10) == []
    assert await commit(store, "s", 1, None) == 2  # a commit without one stores none
    assert (await store.counts())["responses"] == 1


async def test_numbers_beyond_what_the_store_holds_are_clamped(store: Store) -> None:
    huge = ledger_row(
        input_tokens=2**53, baseline_input_tokens=2**64, output_tokens=-5,
        cost_usd=math.inf, baseline_cost_usd=math.nan, status=10**6, model="m\x00" * 10_000,
    )  # fmt: skip
    step = await store.commit(SessionCommit(
        "s", expected_step=0, state={"k": 1}, schema=["k"], transition=transition(1),
        now=math.inf, ledger=[huge],
    ))  # fmt: skip
    assert step == 1
    (row,) = await store.ledger_rows(0, math.inf)
    assert row.input_tokens == MAX_TOKEN_COUNT and row.baseline_input_tokens == MAX_TOKEN_COUNT
    assert row.output_tokens == 0 and row.status == 999
    assert row.cost_usd == MAX_USD and row.baseline_cost_usd is None
    assert row.model == "m" * 128  # 256 characters, then the NULs dropped
    rec = await store.load("s")
    assert rec is not None and math.isfinite(rec.updated)


async def test_sessions_pages_delete_and_purge(store: Store) -> None:
    for i, name in enumerate(["a.1", "a.2", "b.1", "a.3"]):
        await store.commit(SessionCommit(
            name, expected_step=0, state={"k": i}, schema=["k"], transition=transition(1),
            now=float(10 + i),
        ))  # fmt: skip
    page = await store.sessions_page(2)
    assert [p["session"] for p in page] == ["a.3", "b.1"]
    assert page[0] == {"session": "a.3", "step": 1, "updated": 13.0, "state_bytes": 7}
    after = (page[-1]["updated"], page[-1]["session"])
    assert [p["session"] for p in await store.sessions_page(10, after)] == ["a.2", "a.1"]
    assert [p["session"] for p in await store.sessions_page(10, prefix="a.")] == [
        "a.3", "a.2", "a.1",
    ]  # fmt: skip
    assert await store.delete("a.2") and not await store.delete("a.2")
    assert await store.history_page("a.2", 10) == []
    assert await store.purge_sessions(older_than=12.0, keep={"a.1"}) == 0  # b.1 is 12.0
    assert await store.purge_sessions(older_than=12.5, keep={"a.1"}) == 1
    assert {p["session"] for p in await store.sessions_page(10)} == {"a.1", "a.3"}
    assert await store.history_page("b.1", 10) == []


async def test_the_ids_in_no_namespace_are_listed_and_summed_with_unkeyed(store: Store) -> None:
    """``UNKEYED`` as the prefix: the ids without ``:`` (sessions made before the first
    key), page by page; an id with one is its prefix's, a key's or not (``ghost``)."""
    names = ["early2", "alice:s1", "early1", "ghost:x", "early3", "alice:s2"]
    for i, name in enumerate(names):
        await store.commit(SessionCommit(
            name, expected_step=0, state={"k": i}, schema=["k"], transition=transition(1),
            now=float(10 + i % 3),  # ties in updated: the pages go by id within them
        ))  # fmt: skip
    listed: list[str] = []
    after = None
    while page := await store.sessions_page(1, after, UNKEYED):
        listed += [p["session"] for p in page]
        after = (page[-1]["updated"], page[-1]["session"])
    assert listed == ["early1", "early3", "early2"]
    assert [p["session"] for p in await store.sessions_page(10, None, "alice:")] == [
        "alice:s2", "alice:s1",
    ]  # fmt: skip
    sessions = [*names, None]
    rows = [ledger_row(ts=float(i), session=s, cost_usd=1.0) for i, s in enumerate(sessions)]
    await store.add_ledger_rows(rows)
    unkeyed = await store.ledger_rows(0, 100, prefix=UNKEYED)
    assert [r.session for r in unkeyed] == ["early2", "early1", "early3", None]
    by_key = summarize_sums(await store.ledger_sums(0, 100, group_by="key"), "key")
    mine = summarize_sums(await store.ledger_sums(0, 100, None, UNKEYED), None)
    none_group = next(g for g in by_key["groups"] if g["key"] is None)
    assert mine["totals"]["requests"] == none_group["requests"] == 4
    assert mine["totals"]["cost_usd"] == pytest.approx(none_group["cost_usd"])
    one = await store.ledger_sums(0, 100, "early1", UNKEYED)
    assert summarize_sums(one, None)["totals"]["requests"] == 1
    assert await store.ledger_sums(0, 100, "alice:s1", UNKEYED) == []


async def test_a_call_without_usage_is_spent_at_its_estimate(store: Store) -> None:
    """A cut call's row (no usage, no measured cost) counts at its estimate in every
    budget's spend, and ``/cost``'s sums show it apart from the measured cost."""
    cut = {"status": 499, "pricing": "usage-unavailable", "input_tokens": None,
           "output_tokens": None, "cost_usd": None, "baseline_input_tokens": None,
           "baseline_cost_usd": None}  # fmt: skip
    rows = [
        ledger_row(session="k:a", cost_usd=0.5),
        ledger_row(session="k:a", estimated_cost_usd=0.25, **cut),
        ledger_row(session="k:a", estimated_cost_usd=0.125, **cut),
        ledger_row(session="k:a", **cut),  # from before estimates: nothing, as then
    ]
    await store.add_ledger_rows(rows)
    assert await store.ledger_spend("k:a", 0, whole=True) == pytest.approx(0.875)
    assert await store.ledger_spend("k:a", 0, whole=True, unpriced=(1e5, 1e6)) == pytest.approx(
        0.875
    )
    assert await store.ledger_spend("k:", 0) == pytest.approx(0.875)
    read = await store.ledger_rows(0, 100)
    assert [r.estimated_cost_usd for r in read] == [None, 0.25, 0.125, None]
    totals = summarize_sums(await store.ledger_sums(0, 100))["totals"]
    assert totals["cost_usd"] == pytest.approx(0.5)
    assert totals["estimated_cost_usd"] == pytest.approx(0.375)
    assert totals["usage_unavailable_rows"] == 3
    assert summarize(read)["totals"] == totals


async def test_session_budgets_and_their_spend(store: Store) -> None:
    assert await store.session_budget("k:run") is None
    assert await store.set_session_budget("k:run", 5.0, replace=False) == 5.0
    assert await store.set_session_budget("k:run", 9.0, replace=False) == 5.0  # the first stays
    assert await store.set_session_budget("k:run", 2.5, replace=True) == 2.5  # PATCH /state
    assert await store.session_budget("k:run") == 2.5
    rows = [
        ledger_row(session="k:run", cost_usd=0.5),
        ledger_row(session="k:run", pricing="unknown", cost_usd=None),  # 10 in, 5 out
        ledger_row(session="k:run1", cost_usd=4.0),  # another session sharing the prefix
    ]
    await store.add_ledger_rows(rows)
    assert await store.ledger_spend("k:run", 0, whole=True) == pytest.approx(0.5)
    counted = await store.ledger_spend("k:run", 0, whole=True, unpriced=(1e5, 1e6))
    assert counted == pytest.approx(0.5 + (10 * 1e5 + 5 * 1e6) / 1e6)
    assert await store.ledger_spend("k:", 0) == pytest.approx(4.5)
    assert await store.set_session_budget("k:run", None, replace=True) is None
    await store.set_session_budget("k:run", 1.0, replace=False)
    await commit(store, "k:run", 0, {"k": 1})
    assert await store.delete("k:run")  # a session's budget goes with it
    assert await store.session_budget("k:run") is None
    # One with no state row (passthrough) is purged with the session TTL, unless in use.
    await store.set_session_budget("k:free", 1.0, replace=False)
    await store.set_session_budget("k:busy", 1.0, replace=False)
    await store.purge_sessions(older_than=time.time() + 1, keep={"k:busy"})
    assert await store.session_budget("k:free") is None
    assert await store.session_budget("k:busy") == 1.0


def link(rid: str, previous: str | None, created: float = 100.0, session: str = "s") -> Any:
    item = {"type": "message", "role": "user", "content": rid}
    return StoredResponse(rid, session, created, previous, [item], {"id": rid, "output": []})


async def test_stored_responses(store: Store) -> None:
    for i in range(5):
        await store.put_response(link(f"r{i}", f"r{i - 1}" if i else None))
    assert [r.id for r in await store.response_chain("r4", 100)] == ["r0", "r1", "r2", "r3", "r4"]
    assert [r.id for r in await store.response_chain("r4", 2)] == ["r3", "r4"]
    assert await store.response_chain("nope", 10) == []
    await store.put_response(link("r4", "r3", created=200.0))  # replaced
    (r4,) = await store.response_chain("r4", 1)
    assert r4.created == 200.0 and r4.input[0]["content"] == "r4"
    assert await store.delete_response("r2") and not await store.delete_response("r2")
    assert [r.id for r in await store.response_chain("r4", 100)] == ["r3", "r4"]
    await store.put_response(link("old", None, created=10.0, session="x"))
    await store.purge_sessions(older_than=50.0)
    assert await store.response_chain("old", 1) == []
    await store.delete("s")
    assert await store.response_chain("r4", 1) == []


async def test_keys(store: Store) -> None:
    key = KeyRecord("alice", "d1", False, 10, None, 1.5, 100.0, None, None)
    assert not await store.has_keys()
    await store.save_key(key, new=True)
    assert await store.has_keys()
    with pytest.raises(StoreError, match="a key named 'alice' already exists"):
        await store.save_key(KeyRecord("alice", "d2", True, None, None, None, 1.0), new=True)
    await store.save_key(KeyRecord("bob", "d3", True, None, 100, None, 5.0), new=True)
    assert [k.name for k in await store.keys()] == ["alice", "bob"]
    assert await store.key_by_digest("d1") == key
    revoked = KeyRecord("alice", "d9", False, 10, None, 1.5, 100.0, None, 200.0)
    await store.save_key(revoked, new=False)  # rotate/revoke replace it
    assert await store.key_by_digest("d1") is None
    assert await store.key_by_digest("d9") == revoked
    bob = await store.key_by_digest("d3")
    assert bob is not None and bob.admin is True and bob.tpm == 100


async def test_max_sessions_refuses_a_new_session_but_not_old_ones(
    backend: str, tmp_path: Path, url: str
) -> None:
    store = open_backend(backend, tmp_path, url, max_sessions=2)
    await store.open()
    try:
        assert await commit(store, "a", 0, {}) == 1
        assert await commit(store, "b", 0, {}) == 1
        with pytest.raises(StoreFull, match="max_sessions") as err:
            await commit(store, "c", 0, {})
        assert err.value.status == 507
        with pytest.raises(StoreFull):
            store.ensure_room_for_session()
        assert await commit(store, "a", 1, {"x": 1}) == 2  # an existing session goes on
        assert await store.delete("b")
        store.ensure_room_for_session()
        assert await commit(store, "c", 0, {}) == 1
    finally:
        await store.close()


async def test_health_check_and_writable(store: Store) -> None:
    assert await store.check(timeout=HANG) is None
    await store.ensure_writable(timeout=HANG)


# -- PostgreSQL only: what a turn costs the database -------------------------------------


@pytest.mark.parametrize("cache_bytes", [0, 1 << 20])
async def test_a_turn_is_one_statement_to_load_and_one_to_commit(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, cache_bytes: int
) -> None:
    """Counted on the connections (asyncpg's query logger): in steady state a load is one
    statement (none from the cache that leases verify), a commit (the session's
    compare-and-set, the transition and the ledger rows) one statement, and concurrent
    ledger writers share one INSERT."""
    import asyncpg

    statements: list[str] = []
    create_pool = asyncpg.create_pool

    def counting_pool(*args: Any, **kwargs: Any) -> Any:
        async def init(conn: asyncpg.Connection) -> None:
            conn.add_query_logger(lambda record: statements.append(record.query))

        return create_pool(*args, init=init, **kwargs)

    monkeypatch.setattr(asyncpg, "create_pool", counting_pool)
    store = PostgresStore(pg_url, pool_size=1, cache_bytes=cache_bytes)
    await store.open()
    try:
        rows = [ledger_row(ts=1.0), ledger_row(ts=1.5)]
        assert await commit(store, "s", 0, {"k": 0}, ledger=rows) == 1
        await store.load("s")
        statements.clear()
        for step in range(1, 6):
            assert await store.load("s") is not None
            assert await commit(store, "s", step, {"k": step}, ledger=rows) == step + 1
        assert len(statements) == (5 if cache_bytes else 10), statements
        statements.clear()
        await asyncio.gather(*(store.add_ledger_rows([ledger_row(ts=2.0)]) for _ in range(50)))
        assert len(statements) == 1, statements
        assert len(await store.ledger_rows(0, 10)) == 12 + 50
    finally:
        await store.close()


async def test_a_cached_copy_behind_another_writer_is_refused_at_commit(
    backend: str, tmp_path: Path, url: str
) -> None:
    """Two processes on one database, each with its session cache (PostgreSQL keeps one
    when leases verify it): a copy left behind by the other's commit is what load() may
    return (the caller checks its step: Hold.current), load(fresh=True) reads the database,
    and a commit built on the stale copy is a StepConflict that drops it."""
    options: dict[str, Any] = {} if backend == "sqlite" else {"cache_bytes": 1 << 20}
    a = open_backend(backend, tmp_path, url, **options)
    b = open_backend(backend, tmp_path, url, **options)
    await a.open()
    await b.open()
    try:
        assert await commit(a, "s", 0, {"k": "a1"}) == 1
        assert await commit(b, "s", 1, {"k": "b2"}) == 2
        stale = await a.load("s")
        assert stale is not None and (stale.step, stale.state) == (1, {"k": "a1"})
        fresh = await a.load("s", fresh=True)
        assert fresh is not None and (fresh.step, fresh.state) == (2, {"k": "b2"})
        assert await commit(b, "s", 2, {"k": "b3"}) == 3
        with pytest.raises(StepConflict, match="moved from step 2 to 3"):
            await commit(a, "s", 2, {"k": "a3"})
        after = await a.load("s")  # the conflict dropped the copy
        assert after is not None and (after.step, after.state) == (3, {"k": "b3"})
        assert await a.delete("s")
        assert await b.load("s", fresh=True) is None
    finally:
        await a.close()
        await b.close()


async def test_without_cache_bytes_postgresql_reads_every_load(pg_url: str) -> None:
    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    await a.open()
    await b.open()
    try:
        assert await commit(a, "s", 0, {"k": "a1"}) == 1
        assert await commit(b, "s", 1, {"k": "b2"}) == 2
        rec = await a.load("s")
        assert rec is not None and rec.step == 2
    finally:
        await a.close()
        await b.close()


def kept(key: str = "k1", *, scope: str = "alice:s", session: str = "alice:s", **kw: Any) -> Any:
    from skillstate.store import KeptReply

    fields: dict[str, Any] = {
        "fingerprint": "f" * 64, "created": 10.0, "status": 200, "stream": False,
        "headers": {"x-skillstate-step": "1"}, "body": b'{"id":"x"}\x00\xff', "step": None,
    }  # fmt: skip
    return KeptReply(scope, key, session=session, **{**fields, **kw})


async def test_a_kept_reply_is_written_with_the_commit_or_not_at_all(store: Store) -> None:
    from skillstate.store import KeptAlready

    reply = kept(step=1)
    assert await commit(store, "alice:s", 0, {"k": 1}, kept=reply, ledger=[ledger_row()]) == 1
    assert await store.kept_reply("alice:s", "k1") == reply
    assert await store.kept_reply("alice:s", "k2") is None
    assert await store.kept_reply("bob:s", "k1") is None  # another key's scope
    # The same key again: nothing of the second commit is written (no step, no ledger row).
    with pytest.raises(KeptAlready):
        await commit(store, "alice:s", 1, {"k": 2}, kept=kept(step=2), ledger=[ledger_row()])
    assert (await store.load("alice:s", fresh=True)).step == 1  # type: ignore[union-attr]
    assert len(await store.ledger_rows(0, 100)) == 1
    # A conflicting step writes no kept reply either.
    with pytest.raises(StepConflict):
        await commit(store, "alice:s", 0, {"k": 2}, kept=kept("k3", step=1))
    assert await store.kept_reply("alice:s", "k3") is None


async def test_keep_reply_writes_the_reply_and_its_ledger_rows_together(store: Store) -> None:
    from skillstate.store import KeptAlready

    reply = kept(stream=True, body=None)
    await store.keep_reply(reply, [ledger_row(), ledger_row(ts=2.0)])
    assert await store.kept_reply("alice:s", "k1") == reply
    assert len(await store.ledger_rows(0, 100)) == 2
    with pytest.raises(KeptAlready):
        await store.keep_reply(reply, [ledger_row(ts=3.0)])
    assert len(await store.ledger_rows(0, 100)) == 2


async def test_kept_replies_expire_and_go_with_their_session(store: Store) -> None:
    await commit(store, "alice:s", 0, {"k": 1}, kept=kept("old", created=5.0, step=1))
    await store.keep_reply(kept("new", created=50.0), [])
    await store.keep_reply(kept("other", session="alice:t", created=5.0), [])
    assert await store.purge_kept_replies(10.0) == 2
    assert await store.kept_reply("alice:s", "old") is None
    assert await store.kept_reply("alice:s", "new") is not None
    assert await store.delete("alice:s")
    assert await store.kept_reply("alice:s", "new") is None
