"""``skillstate bench validity``: valid state transitions with constrained decoding off vs on.

One run, one workload, one upstream: the state arm of the conversation (or tools) workload
twice through a fresh proxy each time, first with ``constrain: off``, then with
``constrain: json_schema``. A turn is valid when the proxy committed a patch (its
``x-skillstate-transition`` header), after the proxy's own re-asks; "first attempt" counts
the valid turns that needed none. No baseline arm: validity is a property of the state arm.
Offline, the simulated model always writes a valid envelope and ignores the grammar, so both
settings score 100 %: that only exercises the plumbing; the measurement needs a live model.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from typing import Any

from skillstate import __version__
from skillstate.bench.arm import ArmResult, BenchConfig, BenchError
from skillstate.bench.console import emit_report, make_console, progress_bar
from skillstate.bench.options import config_from_args, upstream_args, workload_args
from skillstate.bench.runner import make_workload, open_target, run_state_arm
from skillstate.cli.paths import output_file

SETTINGS = ("off", "json_schema")


def run_validity(cfg: BenchConfig, progress: Any = None) -> dict[str, Any]:
    """Both settings in one run; returns the report."""
    workload = make_workload(cfg)
    with contextlib.ExitStack() as stack:
        target = open_target(cfg, stack)
        arms = {
            c: run_state_arm(cfg, workload, target, progress, name=c, constrain=c) for c in SETTINGS
        }
    failed = {c: [r.turn for r in a.calls if r.status != "ok"] for c, a in arms.items()}
    bad = {c: turns for c, turns in failed.items() if turns}
    return {
        "version": __version__,
        "benchmark": "validity",
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "workload": workload.name,
        "params": {
            "turns": cfg.turns if workload.name == "conversation" else cfg.steps,
            "seed": cfg.seed,
            "distractor_bytes": cfg.distractor_bytes,
            "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature,
            "upstream": cfg.upstream or "simulated model (offline)",
        },
        "model": target.model,
        "arms": {c: arm_summary(a) for c, a in arms.items()},
        "verdict": "valid run"
        if not bad
        else "INVALID: failed calls " + "; ".join(f"{c}: turns {t}" for c, t in bad.items()),
    }


def arm_summary(arm: ArmResult) -> dict[str, Any]:
    calls = [r for r in arm.calls if r.status == "ok"]
    valid = [r for r in calls if r.transition == "valid"]
    totals = (arm.ledger or {}).get("totals") or {}
    return {
        "turns": len(arm.calls),
        "valid": len(valid),
        "valid_pct": round(100 * len(valid) / len(arm.calls), 1) if arm.calls else None,
        "valid_first_attempt": sum(1 for r in valid if not r.retries),
        "reasks": sum(r.retries or 0 for r in calls),
        # every attempt, re-asks included, as the upstream reported it (the proxy's ledger)
        "prompt_tokens_all_attempts": totals.get("input_tokens"),
        "seconds": arm.seconds,
        "per_turn": [
            {
                "turn": r.turn,
                "transition": r.transition if r.status == "ok" else "error",
                "retries": r.retries,
                "prompt_tokens": r.prompt_tokens,
                "why": r.validation or r.error,
            }
            for r in arm.calls
        ],
        "final_state": arm.final_state,
    }


def render(report: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    p = report["params"]
    console.print(
        f"skillstate bench validity · {report['workload']} · {p['turns']} turns · "
        f"model {report['model']} · max_tokens {p['max_tokens']}"
    )
    table = Table(box=None)
    for col in ("constrain", "valid", "first attempt", "re-asks", "prompt tokens", "seconds"):
        table.add_column(col, justify="left" if col == "constrain" else "right")
    for name, a in report["arms"].items():
        tokens = a["prompt_tokens_all_attempts"]
        table.add_row(
            name,
            f"{a['valid']}/{a['turns']} ({a['valid_pct']} %)",
            f"{a['valid_first_attempt']}/{a['turns']}",
            str(a["reasks"]),
            f"{tokens:,}" if tokens is not None else "-",
            f"{a['seconds']:.0f}",
        )
    console.print(table)
    for name, a in report["arms"].items():
        marks = "".join(
            "✓" if t["transition"] == "valid" else ("!" if t["transition"] == "error" else "✗")
            for t in a["per_turn"]
        )
        console.print(f"{name:>12}  {marks}")
    console.print("(✓ valid, ✗ invalid after the proxy's re-asks, ! failed call)")
    console.print(report["verdict"])


def add_validity_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "validity",
        help="valid state transitions, constrained decoding off vs on, in one run",
        description="The state arm twice through the proxy: constrain off, then json_schema. "
        "Meant for a live model (--upstream); the offline simulated model is always valid.",
        epilog="Exit status: 0 valid run, 1 INVALID run (a call failed), 2 usage error.",
    )
    p.add_argument("--turns", type=int, default=30, metavar="N", help="turns (default 30)")
    upstream_args(p)
    workload_args(p)
    p.add_argument("--out", metavar="FILE", type=output_file, help="write the JSON report here")
    p.add_argument("--json", action="store_true", help="print the JSON report to stdout")
    p.set_defaults(bench_workload="validity")


def run_validity_bench(args: argparse.Namespace) -> int:
    console = make_console(stderr=bool(getattr(args, "json", False)))
    try:
        cfg = config_from_args(args)
        cfg.workload = "conversation"
        with progress_bar(console, console.is_terminal) as progress:
            report = run_validity(cfg, progress)
    except (BenchError, ValueError) as e:
        print(f"skillstate bench: {e}", file=sys.stderr)
        return 2
    render(report, console)
    return emit_report(report, args, console, "skillstate bench")
