"""``skillstate bench ...``: every bench's sub-command, and the one place that dispatches.

The only module that imports all the benches (the benches import shared pieces from
:mod:`.arm`, :mod:`.runner`, :mod:`.options` and :mod:`.console`, never this one). The
benches other than ``overhead`` need the ``bench`` extra (the ``openai`` client); without it
the command says in one line how to install it.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import Any

from skillstate.bench.options import EPILOG, common_args

EXTRA_HINT = "pip install 'skillstate-proxy[bench]'"
# Bench -> the modules it needs beyond the runtime's own dependencies.
NEEDS: dict[str, tuple[str, ...]] = {
    "conversation": ("openai",),
    "tools": ("openai",),
    "validity": ("openai",),
    "bfcl": ("openai",),  # bfcl-eval itself is checked by the bench (its own install line)
    "overhead": (),
    "replay": (),
}


def add_bench_parsers(subparsers: Any, *, overhead: bool = False) -> None:
    """Add ``conversation``, ``tools``, ``bfcl``, ``validity`` (and with ``overhead=True``
    ``overhead``) to an argparse subparsers object."""
    from skillstate.bench.bfcl import add_bfcl_parser  # BFCL v4 replay (bfcl-eval optional)
    from skillstate.bench.validity import add_validity_parser

    if overhead:
        from skillstate.bench.overhead import add_overhead_parser

        add_overhead_parser(subparsers)
    conv = subparsers.add_parser(
        "conversation",
        help="long chat with facts to keep and recall probes",
        description="Baseline (full transcript) vs state (through the proxy): a long chat.",
        epilog=EPILOG,
    )
    conv.add_argument("--turns", type=int, default=50, metavar="N", help="turns (default 50)")
    common_args(conv)
    conv.set_defaults(bench_workload="conversation")
    tools = subparsers.add_parser(
        "tools",
        help="multi-step tool loop over an in-memory issue tracker",
        description="Baseline vs state: a tool-calling loop that triages an issue tracker.",
        epilog=EPILOG,
    )
    tools.add_argument(
        "--steps", type=int, default=20, metavar="N", help="about this many model calls (20)"
    )
    common_args(tools)
    tools.set_defaults(bench_workload="tools")
    add_bfcl_parser(subparsers)
    add_validity_parser(subparsers)
    from skillstate.bench.replay.cli import add_bench_replay_parser

    add_bench_replay_parser(subparsers)


def missing_extra(bench: str) -> str | None:
    """The one line to print when ``bench`` cannot run here for want of the extra, else None."""
    missing = [m for m in NEEDS.get(bench, ()) if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return f"skillstate bench {bench}: needs {', '.join(missing)} (the bench extra): {EXTRA_HINT}"


def run_bench(args: argparse.Namespace) -> int:
    """``skillstate bench NAME``: 0 = valid run, 1 = INVALID run, 2 = bad usage or setup."""
    bench = str(getattr(args, "bench", None) or getattr(args, "bench_workload", None))
    problem = missing_extra(bench)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if bench == "overhead":
        from skillstate.bench.overhead import run_overhead

        return run_overhead(args)
    if bench == "bfcl":
        from skillstate.bench.bfcl import run_bfcl_bench

        return run_bfcl_bench(args)
    if bench == "replay":
        from skillstate.bench.replay.cli import run_bench_replay

        return run_bench_replay(args)
    if bench == "validity":
        from skillstate.bench.validity import run_validity_bench

        return run_validity_bench(args)
    return _run_two_arms(args)


def _run_two_arms(args: argparse.Namespace) -> int:
    """``skillstate bench conversation|tools``."""
    from skillstate.bench import report as rep
    from skillstate.bench.arm import BenchError
    from skillstate.bench.console import emit_report, make_console, progress_bar
    from skillstate.bench.options import config_from_args
    from skillstate.bench.runner import run_benchmark

    console = make_console(stderr=bool(getattr(args, "json", False)))
    try:
        cfg = config_from_args(args)
        with progress_bar(console, console.is_terminal) as progress:
            run = run_benchmark(cfg, progress)
    except (BenchError, ValueError) as e:
        print(f"skillstate bench: {e}", file=sys.stderr)
        return 2
    report = rep.build_report(run)
    rep.render_console(report, console)
    return emit_report(report, args, console, "skillstate bench")


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point (``python -m skillstate.bench.commands conversation ...``)."""
    parser = argparse.ArgumentParser(prog="skillstate bench")
    sub = parser.add_subparsers(dest="bench_command", required=True)
    add_bench_parsers(sub)
    return run_bench(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
