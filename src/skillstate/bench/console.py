"""What the benchmarks print and write: the console, the progress bar, the report files."""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from skillstate.bench.arm import Progress


@contextlib.contextmanager
def progress_bar(console: Any, enabled: bool = True) -> Iterator[Progress | None]:
    """A rich progress bar with one task per arm, its elapsed time and ETA; yields the
    callback."""
    if not enabled:
        yield None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("{task.description:>9}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as bar:
        tasks: dict[str, Any] = {}

        def update(arm: str, done: int, total: int) -> None:
            if arm not in tasks:
                tasks[arm] = bar.add_task(arm, total=total)
            bar.update(tasks[arm], completed=done, total=max(total, done))

        yield update


_PHASE = re.compile(r"^(?P<label>.*?)\s*(?P<done>\d+)/(?P<total>\d+)\b")


@contextlib.contextmanager
def phase_progress(console: Any, enabled: bool = True) -> Iterator[Callable[[str], None]]:
    """A callback for phase messages: "sequential round 3/7 ..." moves a bar (with its ETA)
    per phase on a terminal; other messages, or any message off a terminal, are printed as
    lines on ``console``."""
    if not enabled:
        yield lambda msg: console.print(f"  {msg}", markup=False, highlight=False)
        return
    with progress_bar(console) as bar:
        assert bar is not None

        def say(msg: str) -> None:
            m = _PHASE.match(msg)
            if m is None:
                console.print(f"  {msg}", markup=False, highlight=False)
                return
            # A phase's message announces step N, so N - 1 steps are done.
            bar(m["label"], int(m["done"]) - 1, int(m["total"]))

        yield say


def make_console(stderr: bool = False) -> Any:
    """A rich console; wide enough for the tables when output goes to a file or a pipe."""
    from rich.console import Console

    console = Console(stderr=stderr)
    if not console.is_terminal:
        console = Console(stderr=stderr, width=110)
    return console


def emit_report(report: dict[str, Any], args: argparse.Namespace, console: Any, prog: str) -> int:
    """Write --out / --chart / --json for a finished report; the exit code of a bench."""
    from skillstate.bench import report as rep

    if getattr(args, "out", None):
        rep.write_json(report, Path(args.out))
        console.print(f"report: {args.out}")
    if getattr(args, "chart", None):
        from skillstate.bench.chart import write_chart

        try:
            write_chart(report, Path(args.chart))
        except RuntimeError as e:
            print(f"{prog}: {e}", file=sys.stderr)
            return 2
        console.print(f"chart: {args.chart}")
    if getattr(args, "json", False):
        sys.stdout.write(rep.dumps(report) + "\n")
    return 1 if report["verdict"].startswith("INVALID") else 0
