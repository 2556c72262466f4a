"""`skillstate cost`: the /cost summary read straight from the store (no proxy needed)."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Mapping
from typing import Any

import orjson
from rich.console import Console
from rich.text import Text

from ..config import ConfigError, Settings
from ..cost.ledger import BASELINE_MODEL_NOTE, RETRY_KINDS, parse_window, summarize_sums
from ..headertext import printable
from ..sessions.ids import is_valid_session_id
from ..store import StoreError
from ..store.factory import describe_store, make_store


def print_cost(settings: Settings, args: argparse.Namespace) -> int:
    now = time.time()
    try:
        until_text = args.until
        if until_text is not None and until_text.strip().lower() == "all":
            until_text = None  # no upper bound: up to now (cost.ledger reads `all` as 0)
        since, until = parse_window(args.since, until_text, now, ("--since", "--until"))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if args.session is not None and not is_valid_session_id(args.session):
        raise ConfigError(f"session: invalid id {args.session!r}")
    try:
        store = make_store(settings)
    except StoreError as e:
        raise ConfigError(f"store: {e}") from None
    if not store.exists():
        raise ConfigError(f"data_dir: no store at {describe_store(settings)}")

    async def read() -> dict[str, object]:
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


# --- the ledger's tables ------------------------------------------------------------------


def _fmt_int(v: int | None) -> str:
    return "—" if v is None else f"{v:,}"


def _fmt_usd(v: float | None) -> str:
    if v is None:
        return "—"
    sign = "-" if v < 0 else ""
    a = abs(v)
    return f"{sign}${a:,.4f}" if a < 100 else f"{sign}${a:,.2f}"


def _fmt_pct(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f}%"


_TOKEN_COLUMNS = (
    "requests",
    "retries",
    "input",
    "cache\nread",
    "cache\nwrite",
    "output",
    "saved\ntokens",
    "saved\ntokens %",
)
_MONEY_COLUMNS = ("cost", "baseline\ncost", "saved\n$", "saved\n$ %")


def _cells(m: Mapping[str, Any]) -> list[str]:
    """The figures of one summary line, in ``_TOKEN_COLUMNS + _MONEY_COLUMNS`` order."""
    attempts = m.get("attempts") or {}
    retries = sum(v for k, v in attempts.items() if k in RETRY_KINDS)
    cost = _fmt_usd(m.get("cost_usd"))
    if m.get("unknown_pricing_rows") or m.get("usage_unavailable_rows"):
        cost += "*"
    return [
        _fmt_int(m.get("requests")),
        _fmt_int(retries),
        _fmt_int(m.get("input_tokens")),
        _fmt_int(m.get("cache_read_tokens")),
        _fmt_int(m.get("cache_write_tokens")),
        _fmt_int(m.get("output_tokens")),
        _fmt_int(m.get("saved_input_tokens")),
        _fmt_pct(m.get("saved_pct")),
        cost,
        _fmt_usd(m.get("baseline_cost_usd")),
        _fmt_usd(m.get("saved_cost_usd")),
        _fmt_pct(m.get("saved_cost_pct")),
    ]


def _label(key: Any) -> Text:
    """A group's key as the table shows it: plain text. A model name is whatever a client
    sent, so rich must not read it as markup (``[/]`` made the command fail; ``[link=…]``
    would have drawn a link), and control characters (a terminal's escape sequences, new
    lines) are shown escaped, not sent to the terminal."""
    return Text("(none)" if key is None else printable(str(key)))


def render_table(summary: Mapping[str, Any], console: Console) -> None:
    """Print ``summarize()`` output as a rich table (groups, then a bold total row).

    Figures are never cut: when one table does not fit the console width it is split into a
    token table and a money table (label column in both; long labels fold)."""
    from rich import box
    from rich.measure import Measurement
    from rich.table import Table

    group_by = summary.get("group_by")
    groups = summary.get("groups") or []
    totals = summary.get("totals") or {}
    lines = [(_label(g.get("key")), _cells(g)) for g in groups]
    lines.append((Text("total"), _cells(totals)))

    def build(title: str, picks: list[int], caption: str | None) -> Table:
        headers = _TOKEN_COLUMNS + _MONEY_COLUMNS
        table = Table(title=title, caption=caption, caption_justify="left", box=box.SIMPLE_HEAD)
        table.add_column(group_by or "", style="cyan", overflow="fold", min_width=6)
        for i in picks:
            table.add_column(headers[i], justify="right", no_wrap=True)
        for n, (label, figures) in enumerate(lines):
            last = n == len(lines) - 1
            table.add_row(
                label,
                *(figures[i] for i in picks),
                style="bold" if last else None,
                end_section=n == len(lines) - 2,
            )
        return table

    note = summary.get("note")
    n_tok, n_all = len(_TOKEN_COLUMNS), len(_TOKEN_COLUMNS) + len(_MONEY_COLUMNS)
    table = build("skillstate cost", list(range(n_all)), note)
    natural = Measurement.get(console, console.options.update_width(10_000), table).maximum
    if natural > console.width:
        console.print(build("skillstate cost: tokens", list(range(n_tok)), None))
        table = build("skillstate cost: spend and savings", list(range(n_tok, n_all)), note)
    console.print(table)
    unknown = totals.get("unknown_pricing_rows") or 0
    unavailable = totals.get("usage_unavailable_rows") or 0
    if unknown or unavailable:
        console.print(
            f"* cost excludes {unknown} row(s) with unknown prices and {unavailable} row(s) "
            "without usage; add a price override (prices / upstreams[].prices) to include them."
        )
    estimated = totals.get("estimated_cost_usd")
    if estimated is not None:
        console.print(
            f"  the calls without usage are charged {_fmt_usd(estimated)} against budgets: "
            "their worst case, an estimate, not in cost."
        )
    console.print(
        "saved tokens % = input tokens saved / baseline input tokens; saved $ % = of the "
        "baseline cost; negative = the proxy cost more."
    )
    console.print(BASELINE_MODEL_NOTE)
