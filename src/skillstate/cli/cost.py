"""`skillstate cost`: the /cost summary read straight from the store (no proxy needed)."""

from __future__ import annotations

import argparse
import asyncio
import time

import orjson
from rich.console import Console

from ..config import ConfigError, Settings
from ..cost.ledger import parse_since, render_table, summarize_sums
from ..sessions.locks import is_valid_session_id
from ..store import StoreError
from ..store.factory import make_store, sqlite_path


def print_cost(settings: Settings, args: argparse.Namespace) -> int:
    now = time.time()
    try:
        since = parse_since(args.since, now)
        until = parse_since(args.until, now, name="--until") if args.until else now
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if args.session is not None and not is_valid_session_id(args.session):
        raise ConfigError(f"session: invalid id {args.session!r}")
    path = sqlite_path(settings)
    if path is not None and not path.exists():
        raise ConfigError(f"data_dir: no store at {path}")

    async def read() -> dict[str, object]:
        store = make_store(settings)
        await store.open()
        try:
            sums = await store.ledger_sums(since, until, args.session, group_by=args.by)
        finally:
            await store.close()
        summary = summarize_sums(sums, args.by)
        summary.update({"since": since, "until": until, "session": args.session})
        return summary

    try:
        summary = asyncio.run(read())
    except StoreError as e:
        raise ConfigError(f"store: {e}") from None
    if args.json:
        print(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
    else:
        console = Console()
        if not console.is_terminal:  # piped or redirected: no terminal width to respect
            console = Console(width=max(console.width, 200))
        render_table(summary, console)
    return 0
