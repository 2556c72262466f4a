"""The report: the JSON dict (numbers, targets) and its rendering as rich tables."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .stats import percentile, round3, round_diff, summarize

if TYPE_CHECKING:
    from rich.table import Table


SCHEMA_VERSION = 1
TARGETS = {
    # (metric, limit): forward mode sequential added p50; state mode p50 and throughput.
    "forward": {"added_p50_ms_max": 1.0},
    "state": {"added_p50_ms_max": 2.0, "proxied_rps_min": 1000.0},
}


def build_report(
    a: argparse.Namespace, raw: dict[str, Any], info: dict[str, Any]
) -> dict[str, Any]:
    rep: dict[str, Any] = {
        "tool": "skillstate bench overhead",
        "schema": SCHEMA_VERSION,
        "config": info["config"],
        "machine": info["machine"],
        "samples": {k: raw.get(f"{k}_sample") for k in ("direct", "proxied")},
    }
    seq = raw.get("sequential")
    if seq:
        d, p = summarize(seq["lat"]["direct"]), summarize(seq["lat"]["proxied"])
        rounds = [r["proxied_p50_ms"] - r["direct_p50_ms"] for r in seq["per_round"]]
        rep["sequential"] = {
            "direct": d,
            "proxied": p,
            "added": {
                "p50_ms": round_diff(p["p50_ms"], d["p50_ms"]),
                "p99_ms": round_diff(p["p99_ms"], d["p99_ms"]),
                "mean_ms": round_diff(p["mean_ms"], d["mean_ms"]),
                "p50_ms_median_of_rounds": round3(percentile(sorted(rounds), 50)),
                "p50_ms_per_round": [round3(x) for x in rounds],
            },
            "proxy_cpu_ms_per_request": round3(seq["proxy_cpu_ms_per_request"])
            if seq["proxy_cpu_ms_per_request"] is not None
            else None,
        }
    conc = raw.get("concurrency")
    if conc:
        out: dict[str, Any] = {"connections": a.concurrency}
        for path in ("direct", "proxied"):
            c = conc[path]
            s = summarize(c["lat"])
            s["rps"] = round(len(c["lat"]) / c["elapsed"], 1) if c["elapsed"] else None
            s["errors"] = c["errors"]
            s["seconds"] = round(c["elapsed"], 3)
            if c["first_error"]:
                s["first_error"] = c["first_error"][0]
            out[path] = s
        pc_s = conc["proxied"]["proxy_cpu_s"]
        n_p = len(conc["proxied"]["lat"])
        cpu_ms = pc_s * 1000 / n_p if pc_s and n_p else None
        out["proxy_cpu_ms_per_request"] = round3(cpu_ms) if cpu_ms else None
        # the GIL keeps the proxy on about one core: this is its throughput on an idle core
        out["proxy_cpu_bound_rps"] = round(1000 / cpu_ms) if cpu_ms else None
        d, p = out["direct"], out["proxied"]
        out["added"] = {
            "p50_ms": round_diff(p["p50_ms"], d["p50_ms"]),
            "p99_ms": round_diff(p["p99_ms"], d["p99_ms"]),
            "rps_ratio": round(p["rps"] / d["rps"], 3) if d["rps"] and p["rps"] else None,
        }
        rep["concurrency"] = out
    if raw.get("state_check"):
        rep["state_check"] = raw["state_check"]
    if raw.get("turn_profile"):
        rep["turn_profile"] = raw["turn_profile"]
    rep["targets"] = _targets(a, rep)
    return rep


def _targets(a: argparse.Namespace, rep: dict[str, Any]) -> dict[str, Any]:
    t = TARGETS[a.mode]
    res: dict[str, Any] = {"applies_to": "skillstate" if not a.target else "target gateway"}
    seq = rep.get("sequential")
    if seq and seq["added"]["p50_ms"] is not None:
        v = seq["added"]["p50_ms"]
        res["added_p50_ms"] = {
            "value": v,
            "max": t["added_p50_ms_max"],
            "met": v <= t["added_p50_ms_max"],
        }
    conc = rep.get("concurrency")
    if "proxied_rps_min" in t and conc and conc["proxied"]["rps"] is not None:
        v = conc["proxied"]["rps"]
        res["proxied_rps"] = {
            "value": v,
            "min": t["proxied_rps_min"],
            "met": v >= t["proxied_rps_min"],
        }
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
    """A row per path (direct, proxied) from ``cells(section[path])``, then the "added" row."""
    rows = [[path, *cells(section[path])] for path in ("direct", "proxied")]
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
    seq = rep.get("sequential")
    if seq:
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
    conc = rep.get("concurrency")
    if conc:
        con.print(
            f"[bold]concurrency[/bold]: {conc['connections']} connections, {cfg['duration']:g} s "
            f"per path in {cfg['segments'] * 2} alternating segments (ms)"
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
        for path in ("direct", "proxied"):
            if conc[path].get("first_error"):
                con.print(f"  [red]{path} first error:[/red] {conc[path]['first_error']}")
    tp = rep.get("turn_profile")
    if tp:
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
    sc = rep.get("state_check")
    if sc:
        for label, c in sc.items():
            if "step" in c:
                con.print(
                    f"  state check ({label}): session {c['session']} at step {c['step']}, "
                    f"state {c['state_bytes']:,} bytes"
                )
            else:
                con.print(f"  [yellow]state check ({label}) failed:[/yellow] {c}")
    tg = rep["targets"]
    parts = []
    for key, label in (("added_p50_ms", "added p50"), ("proxied_rps", "proxied req/s")):
        if key in tg:
            x = tg[key]
            bound = f"<= {x['max']}" if "max" in x else f">= {x['min']:,.0f}"
            mark = "[green]met[/green]" if x["met"] else "[red]missed[/red]"
            val = _f(x["value"], 0 if key == "proxied_rps" else 3)
            parts.append(f"{label} {val} ({bound}): {mark}")
    if parts:
        con.print(f"targets ({cfg['mode']} mode): " + "; ".join(parts))
