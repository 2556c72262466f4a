"""A key's rows and sessions are found by an id range (``alice:`` up to ``alice;``), which
holds only in code-point order: in a database whose default collation is a language's (what
initdb gives under LANG=en_US.UTF-8), punctuation is ignored at first and ``alice:s1`` falls
outside it. The key's budget spend, /cost and /state listings must not depend on that."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from skillstate.store import SessionCommit, TransitionRecord
from skillstate.store.postgres.store import PostgresStore
from tests.cost.test_ledger_sums import random_row
from tests.scale.services import PostgresServer

HANG = 60.0  # a guard against a hang, not a performance threshold


async def english_database(server: PostgresServer) -> str:
    """A new database whose default collation is ICU's en-US; its URL."""
    admin = await asyncpg.connect(server.url())
    try:
        await admin.execute(
            "CREATE DATABASE english TEMPLATE template0 ENCODING 'UTF8'"
            " LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"
        )
    finally:
        await admin.close()
    return urlunsplit(urlsplit(server.url())._replace(path="/english"))


async def test_a_keys_rows_and_sessions_under_an_english_collation(
    postgres_server: PostgresServer,
) -> None:
    import dataclasses
    import random

    url = await english_database(postgres_server)
    store = PostgresStore(url)
    await store.open()
    try:
        rng = random.Random(1)
        rows = []
        for session, cost in [("alice:s1", 1.0), ("alice-x", 5.0), ("bob:s1", 7.0)]:
            row = dataclasses.replace(random_row(rng), session=session, ts=100.0, cost_usd=cost)
            rows.append(row)
        await store.add_ledger_rows(rows)
        for i, session in enumerate(["alice:s1", "alice:s2", "alicex", "bob:t"]):
            await store.commit(SessionCommit(
                session, expected_step=0, state={}, schema=[], now=100.0 + i,
                transition=TransitionRecord(1, "valid", {}, None, [], 100.0 + i),
            ))  # fmt: skip

        assert await store.ledger_spend("alice:", 0.0) == 1.0  # the key's daily budget
        sums = await store.ledger_sums(0.0, 1e11, None, "alice:", "session")
        assert [(s.key, s.rows) for s in sums] == [("alice:s1", 1)]  # /cost?key=alice
        listed = await store.sessions_page(10, None, "alice:")  # GET /state as alice
        assert sorted(s["session"] for s in listed) == ["alice:s1", "alice:s2"]
    finally:
        await asyncio.wait_for(store.close(), HANG)
