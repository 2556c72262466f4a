"""``skillstate demo``: the method in half a minute, offline.

A 30-turn conversation runs twice against a simulated model on loopback (no key, no
network): once sending the full transcript (baseline), once through a real in-process
skillstate proxy (state). The client is a plain standard-library HTTP client speaking the
OpenAI chat-completions format, so the demo runs from a plain ``pip install`` (the benches
use the real ``openai`` client, from the ``bench`` extra). It prints the per-turn prompt
tokens, the totals, what was kept and lost, the final state, and writes a JSON report and a
chart.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from skillstate.bench import report as rep
from skillstate.bench.arm import BenchConfig, BenchError
from skillstate.bench.chart import write_chart
from skillstate.bench.console import make_console, progress_bar
from skillstate.bench.runner import make_workload, run_benchmark

DEFAULT_DIR = "skillstate-demo"


def run_demo(args: argparse.Namespace) -> int:
    given = getattr(args, "turns", None)
    turns = 30 if given is None else int(given)  # --turns 0 is an error, not the default
    out_dir = Path(getattr(args, "out_dir", None) or DEFAULT_DIR)
    cfg = BenchConfig(workload="conversation", turns=turns, client="plain")
    try:
        make_workload(cfg)  # a bad --turns is one line before anything else is printed
    except ValueError as e:
        print(f"skillstate demo: {e}", file=sys.stderr)
        return 2
    console = make_console()
    console.print(
        "[bold]skillstate demo[/bold]: a "
        f"{turns}-turn conversation, twice, with one OpenAI-format HTTP client.\n"
        "  baseline: the client's full transcript goes straight to the model\n"
        "  state:    the same client goes through a real skillstate proxy (task + state + "
        "latest observation)\n"
        "[yellow]The model is SIMULATED[/yellow] (deterministic, on loopback: no key, no "
        "network); token counts are the proxy's estimator, the same for both arms."
    )
    try:
        with progress_bar(console, console.is_terminal) as progress:
            run = run_benchmark(cfg, progress)
    except (BenchError, ValueError) as e:
        print(f"skillstate demo: {e}", file=sys.stderr)
        return 2
    report = rep.build_report(run)
    rep.render_console(report, console)
    json_path = out_dir / "report.json"
    chart_path = out_dir / "chart.html"
    try:
        rep.write_json(report, json_path)
        write_chart(report, chart_path)
    except OSError as e:
        print(f"skillstate demo: cannot write to {out_dir}: {e.strerror or e}", file=sys.stderr)
        return 2
    console.print(f"JSON report: {json_path.resolve()}")
    console.print(f"chart:       {chart_path.resolve()}")
    console.print(
        "Next: [bold]skillstate bench conversation --turns 100[/bold] or "
        "[bold]skillstate bench tools[/bold]; add --upstream URL --model M for a live model "
        "(the benches need [bold]pip install 'skillstate-proxy\\[bench]'[/bold])."
    )
    return 1 if report["verdict"].startswith("INVALID") else 0
