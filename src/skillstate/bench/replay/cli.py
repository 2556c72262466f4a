"""``skillstate replay PATH...`` and ``skillstate bench replay``: the command lines.

Exit status: 0 every session replayed without an error; 1 a file was not (wholly)
replayed, a call failed or the truth check is off by more than 5%; 2 a usage error.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skillstate.cli.paths import output_file

from .session import ENVELOPE_TOKENS, REGIMES

if TYPE_CHECKING:
    from .run import ReplayOptions

__all__ = [
    "BENCH_PRICE",
    "add_bench_replay_parser",
    "add_replay_parser",
    "run_bench_replay",
    "run_replay",
    "shared_traces",
]

BENCH_PRICE = "claude-sonnet-4-5"  # the bench's default price book model (issue 23's)
BENCH_REGIMES = ("openai", "anthropic")
PROG = "skillstate replay"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--arms",
        metavar="A,B",
        help="proxy modes to replay in (default: every mode this proxy has: passthrough, mask, "
        "state, window, auto)",
    )
    p.add_argument(
        "--price-as",
        metavar="MODEL",
        help="price every call as this model (bundled genai-prices; default: the model the log "
        "names)",
    )
    p.add_argument(
        "--envelope-tokens",
        type=int,
        default=ENVELOPE_TOKENS,
        metavar="N",
        help=f"size of the simulated model's envelope when the proxy asks for one (default "
        f"{ENVELOPE_TOKENS}: the prior measured on SWE-bench traces)",
    )
    # SUPPRESS: `skillstate --config FILE replay ...` (the top-level flag) works too.
    p.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="the proxy's config file (default: the proxy's defaults)",
    )
    p.add_argument("--json", metavar="OUT", type=output_file, help="write the report as JSON")
    p.add_argument(
        "--html", metavar="OUT", type=output_file, help="write a self-contained HTML report"
    )
    p.add_argument(
        "--include-text",
        action="store_true",
        help="put the recorded replies' text into the JSON report (default: none)",
    )


def add_replay_parser(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="replay your agents' logs through every mode: what each would have billed and kept",
        description=(
            "Replay Claude Code logs (~/.claude/projects), Codex CLI rollouts (~/.codex/sessions) "
            "or OpenAI-format transcripts through a real in-process proxy once per mode, against "
            "a simulated provider that answers with the recorded replies. Nothing leaves the "
            "machine."
        ),
        epilog=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="log files or directories")
    p.add_argument(
        "--cache-regime",
        metavar="REGIME",
        help=f"the simulated provider's prompt cache and billing: {', '.join(REGIMES)}, "
        "optionally with the cache read at another fraction of the input price (openai@0.1); "
        "default: the log's provider's (anthropic for Claude Code, openai for Codex and "
        "transcripts)",
    )
    _common(p)


def add_bench_replay_parser(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="replay the shared SWE-bench traces: arms x cache regimes, dollars and reach",
        description="skillstate replay over ../shared/data/swe-traces/traces.json (or --traces) "
        "in every arm, under the openai and the anthropic cache regimes.",
    )
    p.add_argument(
        "--traces",
        metavar="FILE",
        help="a transcript file (default: <repo>/../shared/data/swe-traces/traces.json)",
    )
    p.add_argument(
        "--regimes",
        metavar="R,S",
        default=",".join(BENCH_REGIMES),
        help=f"cache regimes, as --cache-regime of skillstate replay (default "
        f"{','.join(BENCH_REGIMES)})",
    )
    _common(p)
    p.set_defaults(price_as=BENCH_PRICE)


def shared_traces() -> Path:
    """``<repo>/../shared/data/swe-traces/traces.json`` (the repo of this source tree)."""
    repo = Path(__file__).resolve().parents[4]
    return repo.parent / "shared" / "data" / "swe-traces" / "traces.json"


def _options(args: argparse.Namespace, regimes: tuple[str, ...]) -> ReplayOptions:
    from ...cost.worstcase import UNLIMITED_OUTPUT as MAX_ENVELOPE_TOKENS
    from .run import ReplayError, ReplayOptions

    arms = tuple(a.strip() for a in (args.arms or "").split(",") if a.strip())
    if not 0 <= args.envelope_tokens <= MAX_ENVELOPE_TOKENS:
        # The simulated model writes that many tokens per reply: past a model's output
        # limit the replay would only build strings until memory runs out.
        raise ReplayError(f"--envelope-tokens must be 0 to {MAX_ENVELOPE_TOKENS:,}")
    return ReplayOptions(
        arms=arms,
        regimes=regimes,
        price_as=args.price_as,
        envelope_tokens=args.envelope_tokens,
        config=getattr(args, "config", None),
        include_text=bool(args.include_text),
    )


def run_replay(args: argparse.Namespace) -> int:
    regimes = (args.cache_regime,) if args.cache_regime else ()
    return _run(args, list(args.paths), regimes, PROG)


def run_bench_replay(args: argparse.Namespace) -> int:
    traces = Path(args.traces) if args.traces else shared_traces()
    regimes = tuple(r.strip() for r in args.regimes.split(",") if r.strip())
    return _run(args, [str(traces)], regimes, "skillstate bench replay")


def _run(args: argparse.Namespace, paths: list[str], regimes: tuple[str, ...], prog: str) -> int:
    from skillstate.bench.console import make_console

    from . import report as rep
    from .run import ReplayError, SessionRun, available_arms, replay
    from .sources import Problem

    console = make_console()
    if not console.is_terminal:  # a file or a pipe: wide enough for the tables
        from rich.console import Console

        console = Console(width=160)
    runs: list[SessionRun] = []
    problems: list[Problem] = []
    t0 = time.perf_counter()
    try:
        options = _options(args, regimes)
        with _progress(console) as progress:
            for _, item in replay(paths, options, progress):
                if isinstance(item, Problem):
                    problems.append(item)
                    print(f"{prog}: {item.line()}", file=sys.stderr, flush=True)
                else:
                    runs.append(item)
    except ReplayError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    arms = options.arms or available_arms()
    report = rep.build_report(runs, problems, options, arms, time.perf_counter() - t0)
    if runs:
        rep.render_console(report, console)
    else:
        print(f"{prog}: no session was replayed", file=sys.stderr)
    if args.json:
        rep.write_json(report, Path(args.json))
        console.print(f"report: {args.json}", markup=False, highlight=False)
    if args.html:
        from .html import write_html

        write_html(report, Path(args.html))
        console.print(f"html: {args.html}", markup=False, highlight=False)
    failed = any(a["errors"] for arms_ in report["totals"].values() for a in arms_.values())
    return 1 if problems or failed or report["truth"]["off"] or not runs else 0


class _progress:
    """A rich progress bar over all the calls to replay, with its ETA (terminals only)."""

    def __init__(self, console: Any) -> None:
        self._console = console
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Any:
        if not self._console.is_terminal:
            return None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn("replaying calls"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self._console,
            transient=True,
        )
        self._bar.__enter__()
        self._task = self._bar.add_task("calls", total=None)

        def update(done: int, total: int) -> None:
            self._bar.update(self._task, completed=done, total=total or None)

        return update

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
