"""The `scale` tier (`make test-scale`): the proxy's shared backends against real servers,
a PostgreSQL cluster and a redis-server started by the tier on loopback (services.py).

A missing server binary fails the tier with what to install; it is never skipped.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .replicas import ReplicaSet
from .services import PostgresServer, RedisServer, postgres_bindir


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bindir = postgres_bindir()
    if bindir is None:
        pytest.fail("PostgreSQL is not installed: apt-get install postgresql")
    server = PostgresServer(bindir)
    try:
        server.start()
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed: apt-get install redis-server")
    server = RedisServer(binary)
    try:
        server.start()
        yield server
    finally:
        server.destroy()


@pytest.fixture
def pg_url(postgres_server: PostgresServer) -> str:
    """A fresh, empty database of the shared cluster (restarted if a test stopped it)."""
    if postgres_server.proc is None:
        postgres_server.start()
    return postgres_server.create_database()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The shared redis-server, emptied (restarted if a test stopped it)."""
    if redis_server.proc is None:
        redis_server.start()
    redis_server.flush()
    return redis_server.url()


@pytest.fixture
def start_replicas(tmp_path: Path) -> Iterator[Callable[..., ReplicaSet]]:
    """start_replicas(upstream_url, store_url, coordination_url, n=3, config=…, args=…):
    N real proxy processes sharing the store and Redis (replicas.py), stopped after the
    test; their logs are printed when it fails."""
    sets: list[ReplicaSet] = []

    def start(upstream: str, store: str, coordination: str | None, **kw: Any) -> ReplicaSet:
        reps = ReplicaSet(
            tmp_path / f"set{len(sets)}", upstream, store=store, coordination=coordination, **kw
        )
        sets.append(reps)
        return reps.start()

    yield start
    for reps in sets:
        reps.close()
        print(reps.logs())  # shown by pytest only when the test failed
