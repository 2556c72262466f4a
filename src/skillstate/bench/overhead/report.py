"""The report: the JSON dict (numbers, targets) and its rendering as rich tables."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .stats import percentile, round3, round_diff, summarize
from .transcripts import print_transcripts, summarize_transcripts

if TYPE_CHECKING:
    from rich.table import Table


SCHEMA_VERSION = 2
TARGETS = {
    # Absolute: forward mode sequential added p50; state mode p50 and throughput.
    # Relative to the floor (a minimal aiohttp + uvloop forwarder in the same run, --floor):
    # CPU per request (sequential and under concurrency) and req/s for forward; CPU under
    # concurrency and added p50 for state (issue 22); added p50 for streams.
    "forward": {
        "added_p50_ms_max": 1.0,
        "cpu_vs_floor_max": 2.0,
        "concurrent_cpu_vs_floor_max": 2.0,
        "rps_vs_floor_min": 0.5,
    },
    "state": {
        "added_p50_ms_max": 2.0,
        "proxied_rps_min": 1500.0,
        "concurrent_cpu_vs_floor_max": 3.0,
        "added_p50_vs_floor_max": 2.5,
    },
    "stream": {"added_p50_vs_floor_max": 1.3},
}
PATHS = ("direct", "proxied", "floor")
# State-mode CPU per call at the largest --transcript-kb size vs the smallest (issue 22).
TRANSCRIPT_GROWTH_MAX = 1.5


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _sequential(seq: dict[str, Any]) -> dict[str, Any]:
    paths = [p for p in PATHS if p in seq["lat"]]
    out: dict[str, Any] = {p: summarize(seq["lat"][p]) for p in paths}
    d = out["direct"]
    for p, key in (("proxied", "added"), ("floor", "floor_added")):
        if p not in out:
            continue
        x = out[p]
        rounds = [r[f"{p}_p50_ms"] - r["direct_p50_ms"] for r in seq["per_round"]]
        out[key] = {
            "p50_ms": round_diff(x["p50_ms"], d["p50_ms"]),
            "p99_ms": round_diff(x["p99_ms"], d["p99_ms"]),
            "mean_ms": round_diff(x["mean_ms"], d["mean_ms"]),
            "p50_ms_median_of_rounds": round3(percentile(sorted(rounds), 50)),
            "p50_ms_per_round": [round3(r) for r in rounds],
        }
    cpu = seq["cpu_ms_per_request"]
    out["proxy_cpu_ms_per_request"] = round3(cpu["proxied"]) if cpu.get("proxied") else None
    if "floor" in out:
        out["floor_cpu_ms_per_request"] = round3(cpu["floor"]) if cpu.get("floor") else None
        out["vs_floor"] = {
            "added_p50_ratio": _ratio(
                out["added"]["p50_ms_median_of_rounds"],
                out["floor_added"]["p50_ms_median_of_rounds"],
            ),
            "cpu_ratio": _ratio(out["proxy_cpu_ms_per_request"], out["floor_cpu_ms_per_request"]),
        }
    return out


def _concurrency(conc: dict[str, Any], connections: int) -> dict[str, Any]:
    out: dict[str, Any] = {"connections": connections}
    for path in (p for p in PATHS if p in conc):
        c = conc[path]
        s = summarize(c["lat"])
        s["rps"] = round(len(c["lat"]) / c["elapsed"], 1) if c["elapsed"] else None
        s["errors"] = c["errors"]
        s["seconds"] = round(c["elapsed"], 3)
        if c["first_error"]:
            s["first_error"] = c["first_error"][0]
        n = len(c["lat"])
        s["cpu_ms_per_request"] = round3(c["cpu_s"] * 1000 / n) if c["cpu_s"] and n else None
        out[path] = s
    cpu_ms = out["proxied"]["cpu_ms_per_request"]
    out["proxy_cpu_ms_per_request"] = cpu_ms
    # the GIL keeps the proxy on about one core: this is its throughput on an idle core
    out["proxy_cpu_bound_rps"] = round(1000 / cpu_ms) if cpu_ms else None
    d, p = out["direct"], out["proxied"]
    out["added"] = {
        "p50_ms": round_diff(p["p50_ms"], d["p50_ms"]),
        "p99_ms": round_diff(p["p99_ms"], d["p99_ms"]),
        "rps_ratio": _ratio(p["rps"], d["rps"]),
    }
    if "floor" in out:
        f = out["floor"]
        out["vs_floor"] = {
            "rps_ratio": _ratio(p["rps"], f["rps"]),
            "cpu_ratio": _ratio(cpu_ms, f["cpu_ms_per_request"]),
            "added_p50_ratio": _ratio(
                round_diff(p["p50_ms"], d["p50_ms"]), round_diff(f["p50_ms"], d["p50_ms"])
            ),
        }
    return out


def build_report(
    a: argparse.Namespace, raw: dict[str, Any], info: dict[str, Any]
) -> dict[str, Any]:
    rep: dict[str, Any] = {
        "tool": "skillstate bench overhead",
        "schema": SCHEMA_VERSION,
        "config": info["config"],
        "machine": info["machine"],
        "samples": {k: raw.get(f"{k}_sample") for k in PATHS if f"{k}_sample" in raw},
    }
    if raw.get("sequential"):
        rep["sequential"] = _sequential(raw["sequential"])
    if raw.get("concurrency"):
        rep["concurrency"] = _concurrency(raw["concurrency"], a.concurrency)
    if raw.get("state_check"):
        rep["state_check"] = raw["state_check"]
    if raw.get("turn_profile"):
        rep["turn_profile"] = raw["turn_profile"]
    if raw.get("engines"):
        rep["engines"] = raw["engines"]
    if raw.get("transcripts"):
        rep["transcripts"] = summarize_transcripts(raw["transcripts"])
    rep["targets"] = _targets(a, rep)
    return rep


def _target(value: float | None, bound: float, upper: bool) -> dict[str, Any] | None:
    if value is None:
        return None
    key = "max" if upper else "min"
    return {"value": value, key: bound, "met": value <= bound if upper else value >= bound}


def _targets(a: argparse.Namespace, rep: dict[str, Any]) -> dict[str, Any]:
    t = {**TARGETS[a.mode], **(TARGETS["stream"] if a.stream else {})}
    res: dict[str, Any] = {"applies_to": "skillstate" if not a.target else "target gateway"}
    seq, conc = rep.get("sequential") or {}, rep.get("concurrency") or {}
    seq_floor, conc_floor = seq.get("vs_floor") or {}, conc.get("vs_floor") or {}
    checks = {
        "added_p50_ms": (seq.get("added", {}).get("p50_ms"), "added_p50_ms_max", True),
        "proxied_rps": (conc.get("proxied", {}).get("rps"), "proxied_rps_min", False),
        "cpu_vs_floor": (seq_floor.get("cpu_ratio"), "cpu_vs_floor_max", True),
        "concurrent_cpu_vs_floor": (
            conc_floor.get("cpu_ratio"),
            "concurrent_cpu_vs_floor_max",
            True,
        ),
        "rps_vs_floor": (conc_floor.get("rps_ratio"), "rps_vs_floor_min", False),
        "added_p50_vs_floor": (seq_floor.get("added_p50_ratio"), "added_p50_vs_floor_max", True),
    }
    for name, (value, key, upper) in checks.items():
        if key in t:
            got = _target(value, t[key], upper)
            if got is not None:
                res[name] = got
    growth = (rep.get("transcripts") or {}).get("state_largest_vs_smallest_cpu")
    if growth is not None:
        res["transcript_growth"] = _target(growth, TRANSCRIPT_GROWTH_MAX, True)
    return res


def _f(x: Any, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return str(x)


def _table(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> Table:
    """A rich table: the ``path`` column left-aligned, every other one right-aligned."""
    from rich.table import Table

    t = Table()
    for col in columns:
        t.add_column(col, justify="left" if col == "path" else "right")
    for row in rows:
        t.add_row(*row)
    return t


def _path_rows(
    section: dict[str, Any], cells: Callable[[dict[str, Any]], list[str]], added: list[str]
) -> list[list[str]]:
    """A row per path (direct, proxied, floor) from ``cells(section[path])``, then the
    "added" row (proxied minus direct)."""
    rows = [[path, *cells(section[path])] for path in PATHS if path in section]
    return [*rows, ["[bold]added[/bold]", *added]]


def print_report(rep: dict[str, Any]) -> None:
    from rich.console import Console

    con = Console()
    if not con.is_terminal:
        con = Console(width=110)
    cfg = rep["config"]
    m = rep["machine"]
    title = (
        f"skillstate bench overhead: mode={cfg['mode']}{' stream' if cfg['stream'] else ''}, "
        f"proxy={cfg['proxy']}"
    )
    con.print(f"[bold]{title}[/bold]")
    con.print(
        f"[dim]{m['cpu_count']} CPUs ({m['cpu_model']}), Python {m['python']}, "
        f"git {m['git']['revision'][:12]}{'+dirty' if m['git']['dirty'] else ''}, "
        f"load {m['loadavg_start']}[/dim]"
    )
    if rep.get("sequential"):
        _print_sequential(con, cfg, rep["sequential"])
    if rep.get("concurrency"):
        _print_concurrency(con, cfg, rep["concurrency"])
    if rep.get("turn_profile"):
        _print_turn_profile(con, rep["turn_profile"])
    if rep.get("engines"):
        _print_engines(con, rep["engines"])
    if rep.get("transcripts"):
        print_transcripts(con, rep["transcripts"], _table)
    _print_state_checks(con, rep.get("state_check") or {})
    _print_targets(con, cfg, rep["targets"])


def _print_sequential(con: Any, cfg: dict[str, Any], seq: dict[str, Any]) -> None:
    con.print(
        f"[bold]sequential[/bold]: {cfg['rounds']} interleaved rounds x {cfg['requests']} "
        f"requests per path, {cfg['warmup']} warm-ups, one keep-alive connection each (ms)"
    )
    ad = seq["added"]
    rows = _path_rows(
        seq,
        lambda s: [
            str(s["n"]),
            *(_f(s[k]) for k in ("p50_ms", "p99_ms", "mean_ms", "min_ms", "max_ms")),
        ],
        [
            "",
            f"[bold]{_f(ad['p50_ms'])}[/bold]",
            f"[bold]{_f(ad['p99_ms'])}[/bold]",
            _f(ad["mean_ms"]),
            "",
            "",
        ],
    )
    con.print(_table(("path", "n", "p50", "p99", "mean", "min", "max"), rows))
    con.print(
        f"  added p50, median of per-round differences: {_f(ad['p50_ms_median_of_rounds'])} ms"
        f"  (rounds: {', '.join(_f(x) for x in ad['p50_ms_per_round'])})"
    )
    if seq.get("proxy_cpu_ms_per_request") is not None:
        con.print(
            f"  proxy CPU per request: {_f(seq['proxy_cpu_ms_per_request'])} ms "
            "(less sensitive to a busy machine than wall time)"
        )
    if seq.get("vs_floor"):
        fa, vf = seq["floor_added"], seq["vs_floor"]
        con.print(
            f"  floor: added p50 {_f(fa['p50_ms_median_of_rounds'])} ms (median of rounds), "
            f"CPU {_f(seq['floor_cpu_ms_per_request'])} ms per request; proxy vs floor: "
            f"added p50 x{_f(vf['added_p50_ratio'])}, CPU x{_f(vf['cpu_ratio'])}"
        )


def _print_concurrency(con: Any, cfg: dict[str, Any], conc: dict[str, Any]) -> None:
    con.print(
        f"[bold]concurrency[/bold]: {conc['connections']} connections, {cfg['duration']:g} s "
        f"per path in {cfg['segments']} alternating segments each (ms)"
    )
    ad = conc["added"]
    rows = _path_rows(
        conc,
        lambda s: [
            _f(s["rps"], 0),
            str(s["n"]),
            str(s["errors"]),
            *(_f(s[k]) for k in ("p50_ms", "p99_ms", "mean_ms")),
        ],
        [
            f"x{_f(ad['rps_ratio'])}",
            "",
            "",
            f"[bold]{_f(ad['p50_ms'])}[/bold]",
            _f(ad["p99_ms"]),
            "",
        ],
    )
    con.print(_table(("path", "req/s", "n", "errors", "p50", "p99", "mean"), rows))
    if conc.get("proxy_cpu_ms_per_request") is not None:
        con.print(
            f"  proxy CPU per request: {_f(conc['proxy_cpu_ms_per_request'])} ms, so about "
            f"{conc['proxy_cpu_bound_rps']:,} req/s if the proxy had one core to itself"
        )
    if conc.get("vs_floor"):
        vf = conc["vs_floor"]
        con.print(
            f"  proxy vs floor: req/s x{_f(vf['rps_ratio'])}, CPU x{_f(vf['cpu_ratio'])}, "
            f"added p50 x{_f(vf['added_p50_ratio'])}"
        )
    for path in (p for p in PATHS if p in conc):
        if conc[path].get("first_error"):
            con.print(f"  [red]{path} first error:[/red] {conc[path]['first_error']}")


def _print_turn_profile(con: Any, tp: dict[str, Any]) -> None:
    con.print(
        f"[bold]turn profile[/bold]: one state session, {tp['turns']} turns, proxy CPU "
        f"clock: {tp['cpu_clock'] or 'unavailable (no pid)'}"
    )
    rows = [
        [
            f"{w['turns'][0]}-{w['turns'][1]}",
            _f(w["proxy_cpu_ms_per_turn"]),
            _f(w["wall_p50_ms"]),
            _f(w["wall_mean_ms"]),
        ]
        for w in tp["windows"]
    ]
    con.print(_table(("turns", "proxy CPU ms/turn", "wall p50 ms", "wall mean ms"), rows))
    con.print(
        f"  last/first window: CPU x{_f(tp['cpu_ratio_last_vs_first'])}, "
        f"wall p50 x{_f(tp['wall_ratio_last_vs_first'])}"
    )


def _print_state_checks(con: Any, sc: dict[str, Any]) -> None:
    for label, c in sc.items():
        if "step" in c:
            con.print(
                f"  state check ({label}): session {c['session']} at step {c['step']}, "
                f"state {c['state_bytes']:,} bytes"
            )
        else:
            con.print(f"  [yellow]state check ({label}) failed:[/yellow] {c}")


def _print_targets(con: Any, cfg: dict[str, Any], tg: dict[str, Any]) -> None:
    labels = {
        "added_p50_ms": "added p50",
        "proxied_rps": "proxied req/s",
        "cpu_vs_floor": "CPU vs floor, sequential",
        "concurrent_cpu_vs_floor": "CPU vs floor, concurrent",
        "rps_vs_floor": "req/s vs floor",
        "added_p50_vs_floor": "added p50 vs floor",
        "transcript_growth": "state CPU, largest transcript vs smallest",
    }
    parts = []
    for key, label in labels.items():
        if key in tg:
            x = tg[key]
            bound = f"<= {x['max']}" if "max" in x else f">= {x['min']:,}"
            mark = "[green]met[/green]" if x["met"] else "[red]missed[/red]"
            val = _f(x["value"], 0 if key == "proxied_rps" else 3)
            parts.append(f"{label} {val} ({bound}): {mark}")
    if parts:
        con.print(f"targets ({cfg['mode']} mode): " + "; ".join(parts))


def _print_engines(con: Any, eng: dict[str, Any]) -> None:
    """Round trips per turn, counted on the engines (bench/overhead/engines.py)."""
    con.print(f"[bold]engines[/bold]: {eng['turns']} steady-state turns, counted on the servers")
    redis = eng.get("redis")
    if redis:
        by = ", ".join(f"{k} {_f(v)}" for k, v in redis["by_command"].items())
        con.print(f"  Redis: {_f(redis['commands_per_turn'])} commands per turn ({by})")
    pg = eng.get("postgresql")
    if pg and "error" in pg:
        con.print(f"  [yellow]PostgreSQL: {pg['error']}[/yellow]")
    elif pg:
        con.print(
            f"  PostgreSQL: {_f(pg['statements_per_turn'])} statements per turn (each its own "
            f"transaction unless inside BEGIN…COMMIT: {_f(pg['transactions_per_turn'])} "
            "COMMITs per turn)"
        )
        for q, v in pg["by_statement"].items():
            con.print(f"    {_f(v)}  {q[:96]}")
