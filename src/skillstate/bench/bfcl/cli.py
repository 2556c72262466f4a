"""``skillstate bench bfcl``: its options and its entry point."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from skillstate.bench.arm import BenchConfig, BenchError
from skillstate.bench.bfcl.backends import Suite
from skillstate.bench.bfcl.constants import CATEGORIES, GROUPINGS, INSTALL_HINT, MAX_STEPS
from skillstate.bench.bfcl.report import build_bfcl_report, render_bfcl_console
from skillstate.bench.bfcl.run import BfclConfig, run_bfcl
from skillstate.bench.console import emit_report, make_console, progress_bar
from skillstate.bench.options import EPILOG, client_fields, cost_args, upstream_url
from skillstate.cli.paths import output_file


def add_bfcl_parser(subparsers: Any) -> None:
    """``skillstate bench bfcl``."""
    p = subparsers.add_parser(
        "bfcl",
        help="replay BFCL v4 multi-turn tasks against BFCL's own backends (needs bfcl-eval)",
        description="Baseline (full transcript) vs state (through the proxy) on BFCL v4 "
        "multi-turn tasks. Offline the model replays the ground-truth calls; the calls run "
        f"against BFCL's Python backends. Needs bfcl-eval: {INSTALL_HINT}.",
        epilog=EPILOG,
    )
    p.add_argument("--tasks", type=int, default=20, metavar="N", help="the first N tasks (20)")
    p.add_argument(
        "--category", choices=CATEGORIES, default="multi_turn_base", help="(multi_turn_base)"
    )
    p.add_argument("--ids", metavar="ID,ID", help="these task ids instead of the first N")
    p.add_argument(
        "--grouping",
        choices=GROUPINGS,
        default="same-name",
        help="how a turn's ground-truth calls become model steps: consecutive calls to one "
        "function in parallel (same-name, default), one per step (call), all at once (turn)",
    )
    p.add_argument(
        "--max-steps", type=int, default=MAX_STEPS, metavar="N", help="per turn (BFCL: 20)"
    )
    src = p.add_argument_group("upstream")
    src.add_argument(
        "--offline",
        action="store_true",
        help="replay the ground truth with the simulated model (the default without --upstream)",
    )
    src.add_argument("--upstream", metavar="URL", type=upstream_url, default=argparse.SUPPRESS,
                     help="a live upstream")  # fmt: skip
    src.add_argument("--model", metavar="M", help="model name for --upstream")
    p.add_argument("--mode", choices=("state", "auto"), default="state", help="state arm (state)")
    p.add_argument("--stream", action="store_true", help="stream the replies (SSE)")
    p.add_argument("--max-tokens", type=int, default=512, metavar="N", help="per call (512)")
    cost_args(p)
    p.add_argument("--out", metavar="FILE", type=output_file, help="write the JSON report here")
    p.add_argument(
        "--chart", metavar="FILE", type=output_file, help="write a chart (.svg, .html, or .png)"
    )
    p.add_argument("--json", action="store_true", help="print the JSON report to stdout")
    p.add_argument("--inject-failure", metavar="ARM:CALL", help="make that call fail (offline)")
    p.set_defaults(bench_workload="bfcl")


def config_from_args(args: argparse.Namespace) -> BfclConfig:
    upstream = getattr(args, "upstream", None)
    if getattr(args, "offline", False) and upstream:
        raise BenchError("--offline and --upstream exclude each other")
    ids = [i.strip() for i in (getattr(args, "ids", None) or "").split(",") if i.strip()]
    tasks = getattr(args, "tasks", 20)
    if tasks is not None and tasks < 1:
        raise BenchError("--tasks must be at least 1")
    bench = BenchConfig(workload="bfcl", **client_fields(args, upstream))
    return BfclConfig(
        bench=bench,
        category=getattr(args, "category", "multi_turn_base"),
        tasks=tasks,
        ids=ids or None,
        grouping=getattr(args, "grouping", "same-name"),
        max_steps=getattr(args, "max_steps", MAX_STEPS),
    )


def run_bfcl_bench(args: argparse.Namespace, suite: Suite | None = None) -> int:
    """``skillstate bench bfcl``: 0 = valid run, 1 = INVALID run, 2 = usage or setup error."""

    console = make_console(stderr=bool(getattr(args, "json", False)))
    try:
        cfg = config_from_args(args)
        with progress_bar(console, console.is_terminal) as progress:
            run, runs = run_bfcl(cfg, suite, progress)
    except (BenchError, ValueError) as e:
        print(f"skillstate bench bfcl: {e}", file=sys.stderr)
        return 2
    report = build_bfcl_report(run, runs)
    render_bfcl_console(report, console)
    return emit_report(report, args, console, "skillstate bench bfcl")
