"""Round trips per turn to the shared engines (``--store postgresql://…``,
``--coordination redis://…``), counted on the servers themselves, not inferred.

- Redis: ``MONITOR`` while the turns run: every command a client sent, by name (commands a
  Lua script runs inside ``EVALSHA`` are shown as ``lua`` and left out: ``INFO
  commandstats`` would count them too). Each command is one round trip unless a client
  pipelines (the proxy does not).
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
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

_OWN_QUERY_MARK = "skillstate-bench-engines"


def _authenticate(sock: socket.socket, url: str) -> None:
    parts = urlsplit(url)
    if parts.password:
        user = parts.username or "default"
        cmd = f"*3\r\n$4\r\nAUTH\r\n${len(user)}\r\n{user}\r\n"
        cmd += f"${len(parts.password)}\r\n{parts.password}\r\n"
        sock.sendall(cmd.encode())
        if not sock.recv(64).startswith(b"+OK"):
            raise RuntimeError("redis AUTH failed")


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), 30)
    _authenticate(sock, url)
    return sock


def _redis_command(url: str, *args: str) -> bytes:
    """One command whose answer is a bulk string (INFO, ECHO)."""
    cmd = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
    with _connect(url) as s:
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


class RedisMonitor:
    """Counts the commands clients send to Redis (``MONITOR``) from its creation until
    ``stop``, by name; a script's own commands are not counted."""

    _END = "skillstate-bench-monitor-end"

    def __init__(self, url: str) -> None:
        self.url = url
        self.counts: dict[str, int] = {}
        self._sock = _connect(url)
        self._sock.settimeout(None)
        self._sock.sendall(b"*1\r\n$7\r\nMONITOR\r\n")
        self._file = self._sock.makefile("rb")
        if not self._file.readline().startswith(b"+OK"):
            raise RuntimeError("redis MONITOR refused")
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for raw in self._file:
            line = raw.decode(errors="replace")
            if self._END in line:
                return
            client, sep, rest = line.partition("] ")
            if not sep or client.endswith(" lua"):
                continue
            name = rest.split('"', 2)[1].lower() if rest.startswith('"') else "?"
            self.counts[name] = self.counts.get(name, 0) + 1

    def stop(self) -> dict[str, int]:
        """Stop counting once every command sent so far has been seen; the counts."""
        _redis_command(self.url, "ECHO", self._END)
        self._thread.join(30)
        self._sock.close()
        return self.counts


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
    monitor = RedisMonitor(coordination) if coordination else None
    p0 = pg_statements(pg) if pg else None
    for s in sessions:
        _turn(base, body, headers, s)
    p1 = pg_statements(pg) if pg else None
    out: dict[str, Any] = {"turns": turns}
    if monitor is not None:
        per = _delta(monitor.stop(), {}, turns)
        per.pop("echo", None)  # the monitor's own end mark
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
