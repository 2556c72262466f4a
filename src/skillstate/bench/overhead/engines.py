"""Round trips per turn to the shared engines (``--store postgresql://…``,
``--coordination redis://…``), counted on the servers themselves, not inferred.

- Redis: ``INFO commandstats`` before and after (every command the replicas sent, by name;
  our own ``INFO`` is left out). Each command is one round trip unless a client pipelines.
- PostgreSQL: ``pg_stat_statements`` before and after (statements executed by the proxy,
  ``BEGIN``/``COMMIT`` included since utility statements are tracked by default; each is one
  round trip with asyncpg), and ``COMMIT`` calls as transactions. The extension must be in
  ``shared_preload_libraries``; without it the PostgreSQL counts are reported missing (the
  ``pg_stat_database`` counters lag by up to the stats flush interval, so they are not used).

``count_turns`` sends ``turns`` state turns to one proxy on sessions that already exist
(seeded first), between the two snapshots, so the counts are per steady-state turn.
"""

from __future__ import annotations

import asyncio
import http.client
import socket
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import orjson

_OWN_QUERY_MARK = "skillstate-bench-engines"


def _redis_command(url: str, *args: str) -> bytes:
    parts = urlsplit(url)
    cmd = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
    with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), 5) as s:
        if parts.password:
            user = parts.username or "default"
            auth = f"*3\r\n$4\r\nAUTH\r\n${len(user)}\r\n{user}\r\n"
            auth += f"${len(parts.password)}\r\n{parts.password}\r\n"
            s.sendall(auth.encode())
            if not s.recv(64).startswith(b"+OK"):
                raise RuntimeError("redis AUTH failed")
        s.sendall(cmd.encode())
        head = b""
        while not head.endswith(b"\r\n"):
            head += s.recv(1)
        if not head.startswith(b"$"):
            raise RuntimeError(f"redis answered {head!r}")
        size = int(head[1:-2])
        body = b""
        while len(body) < size + 2:
            chunk = s.recv(size + 2 - len(body))
            if not chunk:
                raise RuntimeError("redis closed the connection")
            body += chunk
        return body[:size]


def redis_commands(url: str) -> dict[str, int]:
    """Calls per command name since the server started (``INFO commandstats``)."""
    out: dict[str, int] = {}
    for line in _redis_command(url, "INFO", "commandstats").decode().splitlines():
        if line.startswith("cmdstat_"):
            name, _, stats = line[len("cmdstat_") :].partition(":")
            fields = dict(f.split("=", 1) for f in stats.split(","))
            out[name] = int(fields["calls"])
    return out


async def _pg_statements(url: str) -> dict[str, int] | str:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        try:
            rows = await conn.fetch(
                f"SELECT /* {_OWN_QUERY_MARK} */ query, calls FROM pg_stat_statements "
                "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
        except asyncpg.PostgresError as e:
            return (
                f"pg_stat_statements unavailable ({e}); load it with shared_preload_libraries"
                " = 'pg_stat_statements' and CREATE EXTENSION pg_stat_statements"
            )
        out: dict[str, int] = {}
        for r in rows:
            if _OWN_QUERY_MARK in r["query"]:
                continue
            q = " ".join(r["query"].split())
            out[q] = out.get(q, 0) + int(r["calls"])
        return out
    finally:
        await conn.close()


def pg_statements(url: str) -> dict[str, int] | str:
    """Calls per normalised statement in the store's database, or why they are unknown."""
    return asyncio.run(_pg_statements(url))


def _turn(base: str, body: bytes, headers: Sequence[tuple[str, str]], session: str) -> None:
    parts = urlsplit(base)
    c = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    try:
        c.request(
            "POST",
            "/v1/chat/completions",
            body,
            dict(
                [*headers, ("content-type", "application/json"), ("x-skillstate-session", session)]
            ),
        )
        r = c.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"turn on {session}: HTTP {r.status}: {data[:300]!r}")
    finally:
        c.close()


def _delta(after: dict[str, int], before: dict[str, int], turns: int) -> dict[str, float]:
    out = {k: (v - before.get(k, 0)) / turns for k, v in after.items()}
    return {k: round(v, 3) for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v}


def count_turns(
    base: str,
    body: bytes,
    headers: Sequence[tuple[str, str]],
    *,
    store: str | None,
    coordination: str | None,
    turns: int,
    tag: str,
) -> dict[str, Any]:
    """Per-turn Redis commands and PostgreSQL statements over ``turns`` steady-state turns
    (each on its own already-seeded session, sequentially, on the proxy at ``base``)."""
    sessions = [f"bench-trips-{tag}-{i:04d}" for i in range(turns)]
    for s in sessions:  # seed: the measured turns find their session existing
        _turn(base, body, headers, s)
    pg = store if store and urlsplit(store).scheme.startswith("postgres") else None
    r0 = redis_commands(coordination) if coordination else None
    p0 = pg_statements(pg) if pg else None
    for s in sessions:
        _turn(base, body, headers, s)
    r1 = redis_commands(coordination) if coordination else None
    p1 = pg_statements(pg) if pg else None
    out: dict[str, Any] = {"turns": turns}
    if r0 is not None and r1 is not None:
        r0.pop("info", None), r1.pop("info", None)
        per = _delta(r1, r0, turns)
        out["redis"] = {"commands_per_turn": round(sum(per.values()), 3), "by_command": per}
    if isinstance(p0, str) or isinstance(p1, str):
        out["postgresql"] = {"error": p0 if isinstance(p0, str) else p1}
    elif p0 is not None and p1 is not None:
        per = _delta(p1, p0, turns)
        commits = sum(v for q, v in per.items() if q.upper().rstrip(";") in ("COMMIT", "END"))
        out["postgresql"] = {
            "statements_per_turn": round(sum(per.values()), 3),
            "transactions_per_turn": round(commits, 3),
            "by_statement": per,
        }
    return out


def dumps(counts: dict[str, Any]) -> str:
    return orjson.dumps(counts, option=orjson.OPT_INDENT_2).decode()
