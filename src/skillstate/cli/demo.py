"""``skillstate demo``: the method in half a minute, offline.

A 30-turn conversation runs once per arm against a simulated model on loopback (no key, no
network): sending the full transcript (baseline), and through a real in-process skillstate
proxy in each of its modes (mask, state, auto; mask when this proxy has it). The client is
a plain standard-library HTTP client speaking the Anthropic Messages API with its own
``cache_control`` breakpoints, as agents do, so the demo runs from a plain ``pip install``
(the benches use the real ``openai`` client, from the ``bench`` extra). The simulated
provider caches and bills like Anthropic (reads 0.1x, writes 1.25x input), and the tokens
are priced as a named model (``--price-as``, default claude-sonnet-4-5): HYPOTHETICAL
dollars, since the model is simulated. It prints the per-turn prompt tokens, the totals in
tokens and dollars, what was kept and lost, the final state, and writes a JSON report and a
chart with cumulative dollars per arm.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from skillstate.bench import report as rep
from skillstate.bench.arm import BenchConfig, BenchError, regime_prices
from skillstate.bench.chart import write_chart
from skillstate.bench.console import make_console, progress_bar
from skillstate.bench.runner import available_arms, make_workload, run_benchmark
from skillstate.cli.paths import output_file

DEFAULT_DIR = "skillstate-demo"
DEFAULT_PRICE_AS = "claude-sonnet-4-5"


def run_demo(args: argparse.Namespace) -> int:
    given = getattr(args, "turns", None)
    turns = 30 if given is None else int(given)  # --turns 0 is an error, not the default
    out_dir = Path(getattr(args, "out_dir", None) or DEFAULT_DIR)
    price_as = getattr(args, "price_as", None) or DEFAULT_PRICE_AS
    cfg = BenchConfig(
        workload="conversation",
        turns=turns,
        client="plain",
        cache_regime="anthropic",
        price_as=price_as,
        arms=available_arms(),
    )
    json_path = out_dir / "report.json"
    chart_path = out_dir / "chart.html"
    try:
        make_workload(cfg)  # a bad --turns is one line before anything else is printed
        if regime_prices(price_as, cfg.cache_regime) is None:  # as replay's --price-as
            raise ValueError(
                f"no bundled price for model {price_as!r}: price it as a known model with"
                " --price-as MODEL"
            )
        for path in (json_path, chart_path):  # written after the run: checked before it
            output_file(str(path))
    except (ValueError, argparse.ArgumentTypeError) as e:
        print(f"skillstate demo: {e}", file=sys.stderr)
        return 2
    console = make_console()
    arms = {
        "baseline": "the client's full transcript goes straight to the model",
        "mask": "the same client through a skillstate proxy that masks old observations",
        "state": "the same client through a skillstate proxy (task + state + latest observation)",
        "window": "the same client through a skillstate proxy (task + state + the recent "
        "messages verbatim, checkpointed)",
        "auto": "the same client through a skillstate proxy that sends whichever form it "
        "expects to be billed least",
    }
    console.print(
        "[bold]skillstate demo[/bold]: a "
        f"{turns}-turn conversation, once per arm, with one Anthropic-format HTTP client that "
        "marks its own cache breakpoints.\n"
        + "".join(f"  {name + ':':<9} {arms[name]}\n" for name in cfg.arms)
        + "[yellow]The model is SIMULATED[/yellow] (deterministic, on loopback: no key, no "
        "network); token counts are the proxy's estimator, the same for every arm. The "
        f"provider caches like Anthropic's, and the dollars are what {price_as} would bill "
        "for these tokens: [yellow]HYPOTHETICAL[/yellow]."
    )
    try:
        with progress_bar(console, console.is_terminal) as progress:
            run = run_benchmark(cfg, progress)
    except (BenchError, ValueError) as e:
        print(f"skillstate demo: {e}", file=sys.stderr)
        return 2
    report = rep.build_report(run)
    rep.render_console(report, console)
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
