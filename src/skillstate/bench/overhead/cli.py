"""Entry points: ``skillstate bench overhead`` (a subcommand) and ``python -m``."""

from __future__ import annotations

import argparse
from typing import Any, cast

from .arguments import DESCRIPTION, add_args, build_parser
from .run import run_overhead


def add_overhead_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``overhead`` subcommand (for ``skillstate bench overhead``)."""
    p = cast(
        argparse.ArgumentParser,
        subparsers.add_parser(
            "overhead",
            help="latency the proxy adds in front of a fast upstream",
            description=DESCRIPTION,
        ),
    )
    add_args(p)
    p.set_defaults(func=run_overhead)
    return p


def main(argv: list[str] | None = None) -> int:
    return run_overhead(build_parser().parse_args(argv))
