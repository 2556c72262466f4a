"""`skillstate bench overhead` with replicas on the tier's PostgreSQL and Redis: the run has
no errors, and the round trips per turn are counted on the engines (docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path

from skillstate.bench import overhead

TINY = [
    "--mode", "state",
    "--warmup", "1",
    "--rounds", "1",
    "--requests", "2",
    "--duration", "0.4",
    "--concurrency", "4",
    "--sessions", "8",
    "--trips", "10",
    "--quiet",
]  # fmt: skip


def test_two_replicas_on_postgresql_and_redis_with_round_trips_counted(
    tmp_path: Path, pg_url: str, redis_url: str
) -> None:
    out = tmp_path / "out.json"
    argv = [*TINY, "--store", pg_url, "--coordination", redis_url, "--replicas", "2"]
    args = overhead.build_parser().parse_args([*argv, "--json", str(out)])
    assert overhead.run_overhead(args) == 0
    rep = json.loads(out.read_text())
    assert rep["config"]["replicas"] == 2 and rep["config"]["store"] == pg_url
    conc = rep["concurrency"]["proxied"]
    assert conc["errors"] == 0 and conc["n"] > 0
    assert rep["state_check"]["seeded"]["step"] >= 1
    engines = rep["engines"]
    assert engines["turns"] == 10
    # A state turn's Redis round trips are the lease's scripts (acquire, release; a slow
    # turn also renews), nothing else.
    redis = engines["redis"]["by_command"]
    assert set(redis) == {"evalsha"} and redis["evalsha"] >= 2, redis
    # The tier's PostgreSQL has no pg_stat_statements: the report says how to get the counts.
    assert "pg_stat_statements" in engines["postgresql"]["error"]
