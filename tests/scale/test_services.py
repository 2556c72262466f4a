"""The tier's own servers answer: a query on PostgreSQL, a round trip on Redis."""

from __future__ import annotations

import asyncpg
import redis.asyncio as redis


async def test_postgres_answers(pg_url: str) -> None:
    conn = await asyncpg.connect(pg_url)
    try:
        assert await conn.fetchval("SELECT 40 + 2") == 42
    finally:
        await conn.close()


async def test_redis_answers(redis_url: str) -> None:
    client = redis.from_url(redis_url)
    try:
        assert await client.set("k", "v", nx=True, px=1000)
        assert await client.get("k") == b"v"
        assert not await client.set("k", "w", nx=True, px=1000)
    finally:
        await client.aclose()
