"""What a replay reports: per session and in total, per cache regime and arm, the billed
dollars (and their split), the ratio to passthrough, verbatim reach, calls, errors, invalid
turns and the envelope's share of the output; the truth check against the log's own bill.
No message text unless ``--include-text``."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from skillstate.bench.reach import mean_reach
from skillstate.headertext import printable

from .run import COSTS, ArmRun, ReplayOptions, SessionRun
from .sources import Problem, Skipped

__all__ = [
    "TRUTH_TOLERANCE",
    "arm_summary",
    "build_report",
    "note_lines",
    "render_console",
    "report_json",
    "write_json",
]

TRUTH_TOLERANCE = 0.05  # a simulated bill further than this from the recorded one is flagged


def _ratio(value: float, base: float | None) -> float | None:
    return value / base if base else None


def arm_summary(run: ArmRun, passthrough: ArmRun | None) -> dict[str, Any]:
    total = run.total_usd
    reach = mean_reach(run.reach)
    output = run.tokens["output"]
    return {
        "usd": total,
        "ratio": _ratio(total, passthrough.total_usd if passthrough else None),
        "usd_split": dict(run.usd),
        "tokens": dict(run.tokens),
        "reach": reach["verbatim"],
        "reach_with_state": reach["with_state"],
        "reach_calls": reach["calls"],
        "calls": run.calls,
        "errors": run.errors,
        "invalid": run.invalid,
        "upstream_requests": run.upstream_requests,
        "envelope_output_share": run.tokens["envelope"] / output if output else 0.0,
        "first_error": run.first_error,
        "seconds": round(run.seconds, 2),
    }


def _arms(arms: Mapping[str, ArmRun]) -> dict[str, Any]:
    base = arms.get("passthrough")
    return {name: arm_summary(run, base) for name, run in arms.items()}


def truth(run: SessionRun) -> dict[str, Any] | None:
    """The recorded bill next to the simulated passthrough bill: the same tokens priced the
    same way (the model's own cache-read price where the price book has one), under the
    log's provider's regime. A session whose log lacks its system prompt and tools is
    compared with a stand-in for them in the simulated calls (``standin_tokens``)."""
    if run.recorded_usd is None or run.recorded_regime is None:
        return None
    passthrough = run.arms.get(run.recorded_regime, {}).get("passthrough")
    if passthrough is None:
        return None
    simulated = passthrough.total_usd if run.simulated_usd is None else run.simulated_usd
    diff = _ratio(simulated, run.recorded_usd)
    gap = None
    if run.recorded_first_prompt is not None and passthrough.first_prompt is not None:
        gap = passthrough.first_prompt - run.recorded_first_prompt
    return {
        "regime": run.recorded_regime,
        "recorded_usd": run.recorded_usd,
        "simulated_usd": simulated,
        "difference": None if diff is None else diff - 1,
        "off": diff is None or abs(diff - 1) > TRUTH_TOLERANCE,
        "standin_tokens": run.standin_tokens,
        "first_call_prompt_tokens": {
            "recorded": run.recorded_first_prompt,
            "simulated": passthrough.first_prompt,
            "simulated_minus_recorded": gap,
        },
    }


def session_summary(run: SessionRun) -> dict[str, Any]:
    out: dict[str, Any] = {
        "file": run.file,
        "id": run.id,
        "source": run.source,
        "model": run.model,
        "calls": run.calls,
        "arms": {regime: _arms(arms) for regime, arms in run.arms.items()},
        "truth": truth(run),
        "notes": run.notes,
    }
    if run.texts is not None:
        out["replies"] = run.texts
    return out


def build_report(
    runs: Iterable[SessionRun],
    problems: Iterable[Problem],
    options: ReplayOptions,
    arms: tuple[str, ...],
    seconds: float,
    skipped: Iterable[Skipped] = (),
) -> dict[str, Any]:
    """The report: ``problems`` were not replayed (the replay fails), ``skipped`` had
    nothing to replay (an empty session, a bookkeeping file: noted, not a failure)."""
    runs = list(runs)
    totals: dict[str, dict[str, ArmRun]] = {}
    for run in runs:
        for regime, per_arm in run.arms.items():
            for arm, result in per_arm.items():
                totals.setdefault(regime, {}).setdefault(arm, ArmRun()).add(result)
    truths = [t for t in (truth(r) for r in runs) if t is not None]
    recorded = sum(t["recorded_usd"] for t in truths)
    simulated = sum(t["simulated_usd"] for t in truths)
    return {
        "kind": "skillstate-replay",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(seconds, 1),
        "options": {
            "arms": list(arms),
            "regimes": list(options.regimes) or "each log's provider's",
            "price_as": options.price_as or "each log's model",
            "envelope_tokens": options.envelope_tokens,
            "config": options.config,
            "include_text": options.include_text,
        },
        "problems": [{"path": p.path, "reason": p.reason} for p in problems],
        "skipped": [{"path": p.path, "reason": p.reason} for p in skipped],
        "sessions": [session_summary(r) for r in runs],
        "totals": {regime: _arms(per_arm) for regime, per_arm in totals.items()},
        "per_call_usd": {
            regime: {arm: [round(x, 8) for x in r.per_call_usd] for arm, r in per_arm.items()}
            for regime, per_arm in totals.items()
        },
        "truth": {
            "sessions": len(truths),
            "recorded_usd": recorded,
            "simulated_usd": simulated,
            "difference": simulated / recorded - 1 if recorded else None,
            "off": any(t["off"] for t in truths),
        },
    }


def report_json(report: Mapping[str, Any]) -> bytes:
    return orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n"


def write_json(report: Mapping[str, Any], path: Path) -> None:
    path.write_bytes(report_json(report))


# -- the terminal --------------------------------------------------------------------------


def _usd(v: float | None) -> str:
    if v is None:
        return "-"
    return f"${v:.3f}" if v < 1 else f"${v:.2f}" if v < 100 else f"${v:,.0f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _literal(value: Any) -> str:
    """Text from a log or the command line (a session id, a model name) as console markup
    that prints it as it is: ``[bold]`` in a session id is not a style, and an escape
    sequence in it is written out (``\\x1b``), not sent to the terminal."""
    from rich.markup import escape

    return escape(printable(str(value)))


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def totals_table(regime: str, arms: Mapping[str, Any], title: str) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    heads = (
        "arm",
        "billed",
        "x pt",
        "input",
        "read",
        "write",
        "output",
        "reach",
        "+state",
        "calls",
        "err",
        "inv",
        "env",
    )
    for col in heads:
        table.add_column(col, justify="left" if col == "arm" else "right", no_wrap=True)
    for name, a in arms.items():
        split = a["usd_split"]
        table.add_row(
            name,
            _usd(a["usd"]),
            _x(a["ratio"]),
            *(_usd(split[c]) for c in COSTS),
            _pct(a["reach"]),
            _pct(a["reach_with_state"]),
            str(a["calls"]),
            f"[red]{a['errors']}[/red]" if a["errors"] else "0",
            f"[yellow]{a['invalid']}[/yellow]" if a["invalid"] else "0",
            _pct(a["envelope_output_share"]),
        )
    return table


def sessions_table(report: Mapping[str, Any], regime: str) -> Any:
    from rich.table import Table

    arms = list(report["totals"].get(regime, {}))
    table = Table(
        title=f"per session, {regime} cache: billed vs passthrough (reach)", title_justify="left"
    )
    table.add_column("session")
    table.add_column("calls", justify="right")
    table.add_column("passthrough", justify="right")
    for arm in arms:
        if arm != "passthrough":
            table.add_column(arm, justify="right")
    for s in report["sessions"]:
        per_arm = s["arms"].get(regime)
        if not per_arm:
            continue
        cells = [
            _literal(s["id"][:40]),
            str(s["calls"]),
            _usd(per_arm.get("passthrough", {}).get("usd")),
        ]
        for arm in arms:
            if arm != "passthrough" and arm in per_arm:
                a = per_arm[arm]
                cells.append(f"{_x(a['ratio'])} ({_pct(a['reach'])})")
        table.add_row(*cells)
    return table


def truth_table(report: Mapping[str, Any]) -> Any:
    from rich.table import Table

    table = Table(
        title="truth check: the log's own bill vs the simulated passthrough bill",
        title_justify="left",
    )
    for col in ("session", "regime", "recorded", "simulated", "difference", "first call in"):
        table.add_column(col, justify="left" if col == "session" else "right")
    for s in report["sessions"]:
        t = s["truth"]
        if t is None:
            continue
        diff = t["difference"]
        text = "-" if diff is None else f"{100 * diff:+.1f}%"
        first = t["first_call_prompt_tokens"]
        table.add_row(
            _literal(s["id"][:40]),
            t["regime"],
            _usd(t["recorded_usd"]),
            _usd(t["simulated_usd"]),
            f"[red]{text}[/red]" if t["off"] else f"[green]{text}[/green]",
            f"{first['recorded']} rec / {first['simulated']} sim",
        )
    return table


def render_console(report: Mapping[str, Any], console: Any) -> None:
    """The report's tables and notes (a session id, a model name or an error from the log is
    text, never rich markup)."""
    price_as = _literal(report["options"]["price_as"])
    for regime, arms in report["totals"].items():
        n = sum(1 for s in report["sessions"] if regime in s["arms"])
        title = (
            f"{n} session(s), {regime} cache regime, priced as {price_as} "
            "(x pt = vs passthrough; read/write = cache; err = errors, inv = invalid turns; "
            "env = the envelope's share of the output)"
        )
        console.print(totals_table(regime, arms, title))
        for arm, a in arms.items():
            if a["errors"]:
                console.print(
                    printable(
                        f"{arm}: {a['errors']} call(s) failed, the first with {a['first_error']}"
                    ),
                    markup=False,
                    highlight=False,
                    style="red",
                )
        if n > 1:
            console.print(sessions_table(report, regime))
    if report["truth"]["sessions"]:
        console.print(truth_table(report))
        off = [s for s in report["sessions"] if s["truth"] and s["truth"]["off"]]
        if off:
            console.print(
                f"[red]the simulated passthrough bill is more than {TRUTH_TOLERANCE:.0%} off the "
                f"recorded bill in {len(off)} session(s): the figures above rest on the "
                "simulation[/red]"
            )
    for line in note_lines(report["sessions"]):
        console.print(printable(line), markup=False, highlight=False)
    console.print(
        "reach: of the next action's history tokens, the share the upstream got verbatim from "
        "the transcript (reach+state: anywhere, the state's text too)",
        style="dim",
    )


def note_lines(sessions: Iterable[Mapping[str, Any]], named: int = 3) -> list[str]:
    """One line per distinct note: a note many sessions share (e.g. that a log has no
    request lines) is said once, with how many and the first ``named`` of them."""
    by_note: dict[str, list[str]] = {}
    for s in sessions:
        for note in s["notes"]:
            by_note.setdefault(note, []).append(str(s["id"]))
    lines = []
    for note, ids in by_note.items():
        if len(ids) == 1:
            lines.append(f"note: {ids[0]}: {note}")
            continue
        distinct = list(dict.fromkeys(ids))
        more = f" and {len(distinct) - named} more" if len(distinct) > named else ""
        lines.append(f"note ({len(ids)}x): {note} ({', '.join(distinct[:named])}{more})")
    return lines
