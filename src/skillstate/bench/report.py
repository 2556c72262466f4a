"""The benchmark report: one JSON document plus its console rendering.

Top-level keys (exactly): ``version``, ``revision``, ``workload``, ``params``, ``model``,
``schema``, ``simulated``, ``arms``, ``per_turn``, ``savings``, ``verdict``.

Counting rules
--------------
* An arm's ``prompt_tokens`` counts EVERY upstream request the arm caused: offline from the
  simulated model's own log (so a proxy re-ask after an invalid state patch counts), live from
  the responses' usage, raised to the proxy ledger's total when that is larger. What the client
  saw in the responses is ``client_prompt_tokens``.
* ``savings`` are null unless the run is valid. ``prompt_tokens_pct`` compares totals and is
  only given when both arms made the same number of calls; ``per_call_pct`` compares the mean
  prompt tokens per call; ``break_even_turn`` is the first turn from which the state arm's
  cumulative prompt tokens never exceed the baseline's again.
* The verdict refuses to claim savings ("INVALID RUN: ...") when either arm had a failed call
  or no tokens were counted, and claims only the per-call figure when the call counts differ.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from skillstate import __version__
from skillstate.bench.simmodel import SIM_MODEL_ID

if TYPE_CHECKING:
    from rich.console import Console

    from skillstate.bench.arm import ArmResult, BenchRun, CallRecord

REPORT_KEYS = (
    "version",
    "revision",
    "workload",
    "params",
    "model",
    "schema",
    "simulated",
    "arms",
    "per_turn",
    "savings",
    "verdict",
)


def git_revision() -> str | None:
    """``git rev-parse HEAD`` of the checkout this package runs from, or None."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    rev = out.stdout.strip()
    return rev if out.returncode == 0 and len(rev) == 40 else None


def _counted_prompt(c: CallRecord) -> int | None:
    if c.upstream_prompt_tokens is not None and c.status == "ok":
        return max(c.upstream_prompt_tokens, c.prompt_tokens or 0)
    return c.prompt_tokens


def _arm_summary(arm: ArmResult) -> dict[str, Any]:
    calls = arm.calls
    ok = [c for c in calls if c.status == "ok"]
    failed = [c for c in calls if c.status != "ok"]
    client_prompt = sum(c.prompt_tokens or 0 for c in ok)
    prompt = sum(_counted_prompt(c) or 0 for c in ok)
    source = "responses"
    if any(c.upstream_prompt_tokens is not None for c in calls):
        source = "simulated model log"
    ledger_in = None
    if isinstance(arm.ledger, Mapping):
        totals = arm.ledger.get("totals")
        if isinstance(totals, Mapping) and isinstance(totals.get("input_tokens"), int):
            ledger_in = totals["input_tokens"]
    if ledger_in is not None and ledger_in > prompt and source == "responses":
        prompt, source = ledger_in, "proxy ledger"
    costs = [c.cost_usd for c in ok]
    cost = round(sum(c for c in costs if c is not None), 9) if ok and None not in costs else None
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": sum(c.completion_tokens or 0 for c in ok),
        "cached_tokens": sum(c.cached_tokens or 0 for c in ok),
        "calls": len(calls),
        "failures": len(failed),
        "failed_calls": [{"turn": c.turn, "error": c.error} for c in failed],
        "prompt_tokens_per_call": round(prompt / len(ok), 1) if ok else None,
        "client_prompt_tokens": client_prompt,
        "prompt_tokens_source": source,
        "cost_usd": cost,
        "proxy_retries": sum(c.retries or 0 for c in calls),
        "http_requests": sum(c.http_requests for c in calls),
        "latency_ms_total": round(sum(c.latency_ms for c in calls), 1),
        "seconds": arm.seconds,
        "quality": arm.quality,
    }
    if any(c.upstream_requests is not None for c in calls):
        out["upstream_requests"] = sum(c.upstream_requests or 0 for c in calls)
    if arm.name == "state":
        injected = [c.injected_tokens for c in ok if c.injected_tokens is not None]
        out["injected_tokens_per_call"] = (
            round(sum(injected) / len(injected), 1) if injected else None
        )
        contexts: dict[str, int] = {}
        for c in calls:
            if c.context:
                contexts[c.context] = contexts.get(c.context, 0) + 1
        out["contexts"] = contexts
        transitions: dict[str, int] = {}
        for c in calls:
            if c.transition:
                transitions[c.transition] = transitions.get(c.transition, 0) + 1
        out["transitions"] = transitions
        out["session"] = arm.session
        out["final_state"] = arm.final_state
        out["ledger"] = arm.ledger
    return out


def _row(c: CallRecord | None) -> dict[str, Any] | None:
    if c is None:
        return None
    row: dict[str, Any] = {
        "prompt_tokens": _counted_prompt(c) if c.status == "ok" else None,
        "completion_tokens": c.completion_tokens,
        "cached_tokens": c.cached_tokens,
        "latency_ms": c.latency_ms,
        "retries": c.retries,
        "status": c.status,
    }
    if c.error:
        row["error"] = c.error
    if c.injected_tokens is not None:
        row["injected_tokens"] = c.injected_tokens
    if c.context:
        row["context"] = c.context
    if c.transition:
        row["transition"] = c.transition
    if c.cost_usd is not None:
        row["cost_usd"] = c.cost_usd
    return row


def _per_turn(run: BenchRun) -> list[dict[str, Any]]:
    b, s = run.arms["baseline"].calls, run.arms["state"].calls
    rows: list[dict[str, Any]] = []
    cum_b = cum_s = 0
    for i in range(max(len(b), len(s))):
        cb = b[i] if i < len(b) else None
        cs = s[i] if i < len(s) else None
        rb, rs = _row(cb), _row(cs)
        cum_b += (rb or {}).get("prompt_tokens") or 0
        cum_s += (rs or {}).get("prompt_tokens") or 0
        rows.append(
            {
                "turn": i + 1,
                "baseline": rb,
                "state": rs,
                "cum_baseline": cum_b,
                "cum_state": cum_s,
            }
        )
    return rows


def break_even_turn(per_turn: list[dict[str, Any]]) -> int | None:
    """First turn from which cum_state <= cum_baseline holds for every later turn."""
    turn: int | None = None
    for row in per_turn:
        if row["baseline"] is None or row["state"] is None:
            break
        if row["cum_state"] <= row["cum_baseline"]:
            if turn is None:
                turn = row["turn"]
        else:
            turn = None
    return turn


def _pct(new: float, old: float) -> float | None:
    return round(100.0 * (1.0 - new / old), 1) if old > 0 else None


def _quality_sentence(workload: str, arms: dict[str, Any]) -> str:
    qb, qs = arms["baseline"]["quality"], arms["state"]["quality"]
    if workload == "tools":

        def yn(q: Mapping[str, Any]) -> str:
            return "yes" if q.get("end_state_match") else "NO"

        text = f"End state as expected: baseline {yn(qb)}, state {yn(qs)}."
        if not qs.get("end_state_match"):
            text += f" The state arm got {qs.get('mismatch_count')} issue(s) wrong."
        return text

    def pct(v: Any) -> str:
        return "n/a" if v is None else f"{v:g}%"

    text = (
        f"Recall of recorded facts: baseline {pct(qb.get('recall_pct'))}, "
        f"state {pct(qs.get('recall_pct'))}."
    )
    lost = qs.get("facts_lost") or []
    lost_rec = [f["key"] for f in lost if f["kind"] == "recorded"]
    lost_aside = [f["key"] for f in lost if f["kind"] == "aside"]
    if lost_rec:
        text += f" The state arm LOST recorded facts: {', '.join(lost_rec)}."
    if lost_aside:
        text += (
            f" Lost by the state arm: {len(lost_aside)} aside(s) ({', '.join(lost_aside)}), "
            "never recorded to state (lossy by design)."
        )
    return text


def _verdict(
    report_arms: dict[str, Any], savings: dict[str, Any], workload: str, simulated: bool
) -> str:
    b, s = report_arms["baseline"], report_arms["state"]
    if b["failures"] or s["failures"]:
        first = (b["failed_calls"] or s["failed_calls"])[0]
        return (
            f"INVALID RUN: {b['failures']} failed call(s) in the baseline arm and "
            f"{s['failures']} in the state arm (first: turn {first['turn']}: {first['error']}); "
            "no savings are claimed."
        )
    if not b["prompt_tokens"] or not s["prompt_tokens"]:
        return (
            "INVALID RUN: no prompt tokens were counted in one of the arms; no savings are claimed."
        )
    tail = " " + _quality_sentence(workload, report_arms)
    if simulated:
        tail += " (Simulated model: token counts are estimates, not a provider's.)"
    if b["calls"] != s["calls"]:
        per = savings["per_call_pct"]
        return (
            f"PER-CALL ONLY: the arms made different numbers of calls ({b['calls']} vs "
            f"{s['calls']}), so totals are not compared; per call the state arm sent "
            f"{_signed(per)} prompt tokens than the baseline." + tail
        )
    pct = savings["prompt_tokens_pct"]
    be = savings["break_even_turn"]
    be_text = f"break-even at turn {be}" if be is not None else "no break-even within the run"
    return (
        f"VALID: the state arm sent {_signed(pct)} prompt tokens than the baseline "
        f"({s['prompt_tokens']:,} vs {b['prompt_tokens']:,} over {b['calls']} calls each); "
        f"{be_text}." + tail
    )


def _signed(pct: float | None) -> str:
    if pct is None:
        return "an unknown share of"
    return f"{pct:g}% fewer" if pct >= 0 else f"{-pct:g}% MORE"


def build_report(run: BenchRun) -> dict[str, Any]:
    cfg = run.config
    arms = {name: _arm_summary(run.arms[name]) for name in ("baseline", "state")}
    per_turn = _per_turn(run)
    b, s = arms["baseline"], arms["state"]
    valid = not b["failures"] and not s["failures"] and b["prompt_tokens"] and s["prompt_tokens"]
    savings: dict[str, Any] = {
        "prompt_tokens_pct": None,
        "per_call_pct": None,
        "break_even_turn": None,
    }
    if valid:
        savings["per_call_pct"] = _pct(s["prompt_tokens_per_call"], b["prompt_tokens_per_call"])
        if b["calls"] == s["calls"]:
            savings["prompt_tokens_pct"] = _pct(s["prompt_tokens"], b["prompt_tokens"])
            savings["break_even_turn"] = break_even_turn(per_turn)
    params = {
        **run.workload.params(),
        "mode": cfg.mode,
        "constrain": cfg.constrain,
        "stream": cfg.stream,
        "offline": cfg.offline,
        "upstream": cfg.upstream,
        "max_tokens": cfg.max_tokens,
        "temperature": cfg.temperature,
        "price_as": cfg.price_as,
        "inject_failure": f"{cfg.inject_failure[0]}:{cfg.inject_failure[1]}"
        if cfg.inject_failure
        else None,
        "token_counts": "skillstate.tokens.estimate_tokens (simulated model usage)"
        if cfg.offline
        else "provider usage",
    }
    reported = sorted({c.model for a in run.arms.values() for c in a.calls if c.model is not None})
    params["reported_models"] = reported
    simulated = cfg.offline or SIM_MODEL_ID in reported
    report = {
        "version": __version__,
        "revision": git_revision(),
        "workload": run.workload.name,
        "params": params,
        "model": run.model,
        "schema": list(run.workload.schema_keys),
        "simulated": simulated,
        "arms": arms,
        "per_turn": per_turn,
        "savings": savings,
        "verdict": _verdict(arms, savings, run.workload.name, simulated),
    }
    assert tuple(report) == REPORT_KEYS
    return report


def dumps(report: Mapping[str, Any]) -> str:
    return orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()


def write_json(report: Mapping[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(report) + "\n", encoding="utf-8")


# -- console ---------------------------------------------------------------------------------


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:,.1f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _usd(v: Any) -> str:
    return "—" if v is None else f"${v:,.4f}"


def condensed_rows(n: int, limit: int = 24) -> list[int]:
    """Indexes of the rows to show for a table of n rows: all of them up to ``limit``, else
    the first and last five and evenly spaced ones in between."""
    if n <= limit:
        return list(range(n))
    head = tail = 5
    middle = limit - head - tail
    step = (n - head - tail) / (middle + 1)
    mid = {head + round(step * (i + 1)) for i in range(middle)}
    return sorted({*range(head), *mid, *range(n - tail, n)})


def render_console(report: Mapping[str, Any], console: Console) -> None:
    from rich import box
    from rich.json import JSON
    from rich.panel import Panel
    from rich.table import Table

    sim = " [yellow](SIMULATED model)[/yellow]" if report["simulated"] else ""
    params = report["params"]
    size = params.get("turns") or params.get("steps")
    console.print(
        f"[bold]skillstate bench[/bold] {report['workload']} · {size} "
        f"{'turns' if report['workload'] == 'conversation' else 'steps'} · model "
        f"{report['model']}{sim} · mode {params.get('mode')}"
    )

    rows = report["per_turn"]
    shown = condensed_rows(len(rows))
    caption = f"{len(shown)} of {len(rows)} turns shown" if len(shown) < len(rows) else None
    table = Table(
        title="Prompt tokens per turn",
        title_justify="left",
        caption=caption,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for col in ("turn", "baseline", "state", "state/baseline", "cum. baseline", "cum. state", ""):
        table.add_column(col, justify="right" if col else "left")
    for idx in shown:
        r = rows[idx]
        b, s = r["baseline"] or {}, r["state"] or {}
        bp, sp = b.get("prompt_tokens"), s.get("prompt_tokens")
        ratio = f"{100 * sp / bp:.0f}%" if bp and sp is not None else "—"
        notes = []
        for arm, cell in (("baseline", b), ("state", s)):
            if cell.get("status") == "error":
                notes.append(f"[red]{arm} FAILED[/red]")
            if cell.get("retries"):
                notes.append(f"{arm} re-asked {cell['retries']}x")
        if s.get("context") and s["context"] != "compact":
            notes.append(f"state sent {s['context']}")
        table.add_row(
            str(r["turn"]),
            _fmt(bp),
            _fmt(sp),
            ratio,
            _fmt(r["cum_baseline"]),
            _fmt(r["cum_state"]),
            " ".join(notes),
        )
    console.print(table)

    arms = report["arms"]
    totals = Table(title="Totals", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("arm", "calls", "failed", "prompt", "per call", "output", "cached", "cost"):
        totals.add_column(col, justify="left" if col == "arm" else "right")
    for name in ("baseline", "state"):
        a = arms[name]
        totals.add_row(
            name,
            _fmt(a["calls"]),
            f"[red]{a['failures']}[/red]" if a["failures"] else "0",
            _fmt(a["prompt_tokens"]),
            _fmt(
                None if a["prompt_tokens_per_call"] is None else round(a["prompt_tokens_per_call"])
            ),
            _fmt(a["completion_tokens"]),
            _fmt(a["cached_tokens"]),
            _usd(a["cost_usd"]),
        )
    console.print(totals)
    for name in ("baseline", "state"):
        q = arms[name]["quality"]
        if report["workload"] == "tools":
            match = q.get("end_state_match")
            qual = "end state " + ("[green]as expected[/green]" if match else "[red]DIFFERS[/red]")
            if not q.get("finished"):
                qual += " · [red]did not finish[/red]"
        else:
            qual = (
                f"recall of recorded facts {_fmt(q.get('recall_pct'))}% · "
                f"of asides {_fmt(q.get('aside_recall_pct'))}%"
            )
        console.print(f"Quality, {name}: {qual}")

    sv = report["savings"]
    console.print(
        f"Savings: prompt tokens {_fmt(sv['prompt_tokens_pct'])}% · per call "
        f"{_fmt(sv['per_call_pct'])}% · break-even turn {_fmt(sv['break_even_turn'])}"
    )
    for name in ("baseline", "state"):
        lost = arms[name]["quality"].get("facts_lost") or []
        if lost:
            items = ", ".join(f"{f['key']} ({f['kind']}, turn {f['turn']})" for f in lost)
            console.print(f"[red]Facts lost by the {name} arm:[/red] {items}")
        mism = arms[name]["quality"].get("mismatch_count")
        if mism:
            console.print(
                f"[red]{name} arm: {mism} issue(s) differ from the expected end state[/red]"
            )

    final = arms["state"].get("final_state")
    if final is not None:
        text = orjson.dumps(final).decode()
        if len(text) > 3000:
            text = orjson.dumps({"(truncated)": text[:3000]}).decode()
        pretty = orjson.dumps(final, option=orjson.OPT_INDENT_2).decode()
        body = JSON(text) if pretty.count("\n") <= 30 else JSON(text, indent=None)
        console.print(Panel(body, title="Final state (state arm)", title_align="left"))
    style = "red" if report["verdict"].startswith("INVALID") else "green"
    console.print(Panel(report["verdict"], title="Verdict", title_align="left", style=style))
