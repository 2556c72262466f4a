"""``skillstate replay PATH...`` and ``skillstate bench replay``: the command lines.

Truth check: where a log records its usage, the log's own bill (its model's prices, the
cache read at the model's own price) next to the simulated passthrough bill priced the same
way, under the log's provider's regime. A log without its system prompt and tools (Claude
Code without api-request lines, every Codex rollout) is replayed with a stand-in of the
size its first call recorded, where they sit, the same bytes every call (a note says how
many tokens).

Exit status: 0 every session replayed without an error; 1 a file was not (wholly)
replayed, a call failed, the truth check is off by more than 5% or a report could not be
written; 2 a usage error. A session with no model call (a summary-only file, a rollout with
only its session_meta) is a note on stderr, not a failure. ``--json -`` (or ``--html -``)
writes that report to stdout, the tables then go to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skillstate.cli.paths import output_file
from skillstate.headertext import printable

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
    p.add_argument(
        "--json", metavar="OUT", type=_report_file, help="write the report as JSON (- stdout)"
    )
    p.add_argument(
        "--html",
        metavar="OUT",
        type=_report_file,
        help="write a self-contained HTML report (- stdout)",
    )
    p.add_argument(
        "--include-text",
        action="store_true",
        help="put the recorded replies' text into the JSON report (default: none)",
    )


STDOUT = "-"  # a report file argument that means stdout


def _report_file(value: str) -> str:
    return value if value == STDOUT else output_file(value)


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
        help=f"the simulated provider's prompt cache and billing: {', '.join(REGIMES)} (cache "
        "reads at 0.5x / 0.1x / 1x the input price), optionally with the cache read at another "
        "fraction of the input price (openai@0.1); default: the log's provider's (anthropic "
        "for Claude Code, openai for Codex and transcripts) with the cache read at the model's "
        "own price where the price book has one (gpt-5: 0.1x)",
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
    from .sources import Problem, Skipped

    to_stdout = [flag for flag in ("json", "html") if getattr(args, flag) == STDOUT]
    if len(to_stdout) > 1:
        print(f"{prog}: --json - and --html - cannot both go to stdout", file=sys.stderr)
        return 2
    # With a report on stdout, the tables go to stderr (stdout is the report alone).
    console = make_console(stderr=bool(to_stdout))
    if not console.is_terminal:  # a file or a pipe: wide enough for the tables
        from rich.console import Console

        console = Console(width=160, stderr=bool(to_stdout))
    runs: list[SessionRun] = []
    problems: list[Problem] = []
    skipped: list[Skipped] = []
    t0 = time.perf_counter()
    try:
        options = _options(args, regimes)
        with _progress(console) as progress:
            for _, item in replay(paths, options, progress):
                if isinstance(item, Skipped):  # nothing to replay, nothing wrong
                    skipped.append(item)
                    print(f"{prog}: note: {printable(item.line())}", file=sys.stderr, flush=True)
                elif isinstance(item, Problem):
                    problems.append(item)
                    print(f"{prog}: {printable(item.line())}", file=sys.stderr, flush=True)
                else:
                    runs.append(item)
    except ReplayError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    arms = options.arms or available_arms()
    seconds = time.perf_counter() - t0
    report = rep.build_report(runs, problems, options, arms, seconds, skipped)
    # The files first: a report the console cannot show (a closed or full stdout) is kept.
    written = _write_reports(report, args, console, prog)
    try:
        if runs:
            rep.render_console(report, console)
        else:
            print(f"{prog}: no session was replayed", file=sys.stderr)
    except OSError as e:
        _drop_stdout()
        print(f"{prog}: cannot print the report: {e.strerror or e}", file=sys.stderr)
        written = False
    failed = any(a["errors"] for arms_ in report["totals"].values() for a in arms_.values())
    bad = problems or failed or report["truth"]["off"] or not runs or not written
    return 1 if bad else 0


def _write_reports(
    report: dict[str, Any], args: argparse.Namespace, console: Any, prog: str
) -> bool:
    """``--json`` and ``--html``; False (and one line on stderr each) when one could not be
    written."""
    from .html import render_html
    from .report import report_json

    ok = True
    for flag, label in (("json", "report"), ("html", "html")):
        where = getattr(args, flag)
        if not where:
            continue
        data = report_json(report) if flag == "json" else render_html(report).encode()
        try:
            if where == STDOUT:
                sys.stdout.flush()
                sys.stdout.buffer.write(data)
                sys.stdout.flush()
            else:
                Path(where).write_bytes(data)
                console.print(f"{label}: {where}", markup=False, highlight=False)
        except OSError as e:
            if where == STDOUT:
                _drop_stdout()
            print(f"{prog}: --{flag} {where}: {e.strerror or e}", file=sys.stderr)
            ok = False
    return ok


def _drop_stdout() -> None:
    """Point stdout at the null device: what is still buffered for it (a full disk, a closed
    pipe) would fail again when the interpreter flushes it on exit, with a traceback."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError):
        pass  # not a real file (a test's capture): nothing to flush on exit


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
