"""The ``bench bfcl`` report: the shared report plus where each call was, and its console."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from skillstate.bench import report as rep
from skillstate.bench.arm import BenchRun
from skillstate.bench.bfcl.workload import TaskRun


def _quality_sentence(arms: Mapping[str, Any]) -> str:
    parts = []
    main = rep.primary_arm(arms)
    for name in arms:
        q = arms[name]["quality"]
        text = f"{name} {q.get('tasks_matched')}/{q.get('tasks')}"
        parts.append(text)
    sentence = "End state matches BFCL's ground truth: " + ", ".join(parts) + " tasks"
    qs = arms[main]["quality"]
    if qs.get("end_state_equals_baseline") is not None:
        sentence += (
            f"; {main} arm equals baseline arm in {qs['end_state_equals_baseline']}/{qs['tasks']}"
        )
    checks = [arms[n]["quality"].get("bfcl_checker_valid") for n in ("baseline", main)]
    if None not in checks:
        sentence += f"; BFCL multi_turn_checker valid: baseline {checks[0]}, {main} {checks[1]}"
    return sentence + "."


def build_bfcl_report(run: BenchRun, runs: Mapping[str, list[TaskRun]]) -> dict[str, Any]:
    """``report.build_report`` (same keys, verdict and savings) plus where each call was."""
    report = rep.build_report(run)
    where = {name: [s for r in runs[name] for s in r.steps] for name in runs}
    for i, row in enumerate(report["per_turn"]):
        row["at"] = {name: where[name][i] if i < len(where[name]) else None for name in where}
    old = rep._quality_sentence(report["workload"], report["arms"])
    new = _quality_sentence(report["arms"])
    verdict = report["verdict"]
    if old in verdict:
        verdict = verdict.replace(old, new, 1)
    elif not verdict.startswith("INVALID"):
        verdict += " " + new
    report["verdict"] = verdict
    return report


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def render_bfcl_console(report: Mapping[str, Any], console: Any) -> None:
    """The shared console rendering, with BFCL's quality lines and a per-task table."""
    from rich import box
    from rich.table import Table

    with console.capture() as cap:
        rep.render_console(report, console)
    text = cap.get()
    arms = report["arms"]
    quality = []
    main = rep.primary_arm(arms)
    for name in arms:
        q = arms[name]["quality"]
        line = (
            f"Quality, {name}: end state matches the ground truth in {q['tasks_matched']}/"
            f"{q['tasks']} tasks · tool outputs identical to the ground truth's in "
            f"{q['outputs_match_ground_truth']}/{q['tasks']}"
        )
        if q.get("bfcl_checker_valid") is not None:
            line += f" · BFCL multi_turn_checker valid {q['bfcl_checker_valid']}/{q['tasks']}"
        if name != "baseline" and q.get("end_state_equals_baseline") is not None:
            line += f" · equals the baseline arm in {q['end_state_equals_baseline']}/{q['tasks']}"
        quality.append(line + "\n")
    out: list[str] = []
    for line in text.splitlines(keepends=True):
        if _ANSI.sub("", line).startswith("Quality, "):
            out.extend(quality)
            quality = []
        else:
            out.append(line)
    console.file.write("".join(out))
    console.file.flush()

    table = Table(title="Per task", title_justify="left", box=box.SIMPLE_HEAD)
    for col in (
        "task",
        "turns",
        "GT calls",
        "model calls",
        "baseline",
        main,
        "saved",
        "end state",
        "BFCL check",
    ):
        table.add_column(
            col, justify="left" if col in ("task", "end state", "BFCL check") else "right"
        )
    qb, qs = arms["baseline"]["quality"]["per_task"], arms[main]["quality"]["per_task"]
    tokens = _tokens_per_task(report, main)
    for b, s in zip(qb, qs, strict=False):
        tb, ts = tokens["baseline"].get(b["id"]), tokens[main].get(s["id"])
        saved = f"{100 * (1 - ts / tb):.1f}%" if tb and ts is not None else "—"

        def yn(v: Any) -> str:
            return "—" if v is None else ("yes" if v else "[red]NO[/red]")

        def chk(row: Mapping[str, Any]) -> str:
            c = row.get("bfcl_check")
            return (
                "n/a"
                if c is None
                else ("valid" if c.get("valid") else f"[red]{c.get('error_type')}[/red]")
            )

        table.add_row(
            b["id"],
            str(b["user_turns"]),
            str(b["ground_truth_calls"]),
            f"{b['model_calls']}/{s['model_calls']}",
            rep._fmt(tb),
            rep._fmt(ts),
            saved,
            f"{yn(b['end_state_match'])}/{yn(s['end_state_match'])}",
            f"{chk(b)}/{chk(s)}",
        )
    console.print(table)


def _tokens_per_task(report: Mapping[str, Any], main: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {"baseline": {}, main: {}}
    for row in report["per_turn"]:
        for arm in out:
            cell, at = row.get(arm), (row.get("at") or {}).get(arm)
            if cell is None or at is None:
                continue
            out[arm][at["task"]] = out[arm].get(at["task"], 0) + (cell.get("prompt_tokens") or 0)
    return out
