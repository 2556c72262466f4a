"""Command-line paths checked when the command line is read: a report a long run writes at
its end (``--json``, ``--html``, ``--out``, ``--chart``) must not fail only then, after the
run, with a traceback about where it was to go."""

from __future__ import annotations

import argparse
from pathlib import Path


def output_file(value: str) -> str:
    """An argparse type: a file the command can write (its directories are made, as the
    report writers make them; a file that did not exist is not left behind). A path that
    cannot be written is a usage error naming it."""
    path = Path(value)
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a"):  # appends nothing: an existing file is left as it is
            pass
        if not existed:
            path.unlink()
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot write {value}: {e.strerror}") from None
    return value
