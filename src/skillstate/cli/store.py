"""``skillstate store copy --from URL --to URL``: one store's content into another (e.g. a
single-node SQLite install into the shared PostgreSQL store), verified, with a short
summary. Every failure is one line (ConfigError), never a traceback."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from pydantic import ValidationError

from ..config import ConfigError, Settings
from ..store import Store, StoreError
from ..store.base import COUNTED
from ..store.copy import CopyReport, copy_store
from ..store.factory import describe_store, make_store
from ..store.schemes import URL_FORMS, url_problem
from ..urltext import redacted


def add_store_parser(sub: Any) -> None:
    """The ``store`` command and its ``copy`` subcommand."""
    store = sub.add_parser("store", help="store maintenance: copy one store into another")
    actions = store.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    copy = actions.add_parser(
        "copy",
        help="copy sessions (with their history), keys, stored responses and the ledger"
        " from one store into another, then verify",
    )
    urls = URL_FORMS
    copy.add_argument("--from", dest="source", required=True, metavar="URL",
                      help=f"{urls} (only read)")  # fmt: skip
    copy.add_argument("--to", dest="dest", required=True, metavar="URL",
                      help=f"{urls} (must be empty unless --merge)")  # fmt: skip
    copy.add_argument(
        "--merge",
        action="store_true",
        help="add to a destination that holds data already (refused when an id is on both"
        " sides; nothing there is replaced)",
    )


def run_store(args: argparse.Namespace) -> int:
    """Run ``skillstate store copy``; 0 when the copy verified, 1 when it did not."""
    if args.source == args.dest:
        raise ConfigError("store copy: --from and --to are the same store")
    try:
        report = asyncio.run(_copy(args.source, args.dest, args.merge))
    except StoreError as e:
        raise ConfigError(f"store copy: {e}") from None
    _print_summary(args.source, args.dest, report)
    return 1 if report.problems else 0


async def _copy(source_url: str, dest_url: str, merge: bool) -> CopyReport:
    source = open_url(source_url, "--from", must_exist=True)
    dest = open_url(dest_url, "--to", must_exist=False)
    await _open(source, "--from")
    try:
        await _open(dest, "--to")
        try:
            return await copy_store(
                source,
                dest,
                merge=merge,
                progress=_progress,
                source_dir=source.home,
                dest_dir=dest.home,
            )
        finally:
            await dest.close()
    finally:
        await source.close()


def open_url(url: str, option: str, *, must_exist: bool) -> Store:
    """The (unopened) store a URL names; ConfigError for a URL that names none."""
    problem = url_problem(url)
    if problem:
        raise ConfigError(f"{option}: {problem}")
    try:
        settings = Settings(store=url)
    except ValidationError as e:  # its message only: the URL may carry a password
        reason = str(e.errors()[0]["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"{option}: {reason}") from None
    try:
        # exclusive: a proxy still running on a SQLite file would change it during the copy
        store = make_store(settings, exclusive=True)
    except StoreError as e:
        raise ConfigError(f"{option}: {e}") from None
    if must_exist and not store.exists():
        raise ConfigError(f"{option}: no store at {describe_store(settings)}")
    return store


async def _open(store: Store, option: str) -> None:
    try:
        await store.open()
    except StoreError as e:
        raise ConfigError(f"{option}: {e}") from None


def _progress(what: str) -> None:
    print(f"  … {what}", file=sys.stderr, flush=True)


def _print_summary(source: str, dest: str, report: CopyReport) -> None:
    print(f"copied {redacted(source)} -> {redacted(dest)}")
    width = max(len(f"{n:,}") for n in report.source.values())
    for name in COUNTED:
        line = f"  {name:<15} {report.source[name]:>{width},}"
        if report.before[name]:
            line += f"  (the destination had {report.before[name]:,}, now {report.after[name]:,})"
        print(line)
    if report.problems:
        for problem in report.problems:
            print(f"NOT VERIFIED: {problem}", file=sys.stderr)
        return
    print(
        f"verified: every count, the step, schema and state of {report.sessions_verified:,}"
        " session(s), the ledger's totals and every key"
    )
    if report.secret is not None:
        print(f"client keys: their secret was {report.secret}")
