"""What the benchmarks print and write: the console, the progress bar, the report files."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from skillstate.bench.arm import Progress


@contextlib.contextmanager
def progress_bar(console: Any, enabled: bool = True) -> Iterator[Progress | None]:
    """A rich progress bar with one task per arm; yields the callback."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(
        TextColumn("{task.description:>9}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=console,
        transient=True,
    ) as bar:
        tasks: dict[str, Any] = {}

        def update(arm: str, done: int, total: int) -> None:
            if arm not in tasks:
                tasks[arm] = bar.add_task(arm, total=total)
            bar.update(tasks[arm], completed=done, total=max(total, done))

        yield update


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
