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
* The verdict refuses to claim savings ("INVALID RUN: ...") when any arm had a failed call
  or no tokens were counted, and claims only the per-call figure when the call counts differ.
  Its token sentence is about the ``state`` arm (the first proxied arm when there is none).

Dollars
-------
With rates (offline: ``--price-as`` under ``--cache-regime``, see
:func:`skillstate.bench.arm.regime_prices`), every arm's ``cost_usd`` is its billed cost, split
into ``cost_breakdown`` (plain input, cache reads, cache writes, output; the counts are the
simulated provider's own, ``cache_write_tokens`` among them). ``savings.by_arm[ARM]`` gives,
for each proxied arm against the baseline: ``prompt_tokens_pct``, ``cost_pct`` (billed cost,
negative when the arm cost more), ``saved_usd``, ``last10_cost_ratio`` (baseline cost over
the arm's over the last 10 calls) and, when the proxy's ledger reports it,
``ledger_saved_cost_usd`` (the proxy's /cost ``saved_cost_usd``) with ``ledger_vs_measured_pct``
(its difference from the measured ``saved_usd``, in % of the baseline's cost).
``savings.cost_pct`` is the ``state`` arm's.
"""

from __future__ import annotations

import dataclasses
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
    from skillstate.cost.pricing import Prices

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


def cost_breakdown(arm: Mapping[str, Any], prices: Prices) -> dict[str, float]:
    """An arm's billed cost by part, USD: plain input, cache reads, cache writes, output."""
    read, write = arm["cached_tokens"], arm["cache_write_tokens"]
    plain = arm["prompt_tokens"] - read - write
    parts = {
        "input_usd": plain * prices.input_per_mtok,
        "cache_read_usd": read * prices.cache_read_per_mtok,
        "cache_write_usd": write * prices.cache_write_per_mtok,
        "output_usd": arm["completion_tokens"] * prices.output_per_mtok,
    }
    return {k: round(v / 1e6, 9) for k, v in parts.items()}


def _ledger_saved(ledger: Any) -> float | None:
    """The proxy's /cost ``saved_cost_usd`` (older proxies: ``saved_usd``), or None."""
    totals = ledger.get("totals") if isinstance(ledger, Mapping) else None
    if not isinstance(totals, Mapping):
        return None
    for key in ("saved_cost_usd", "saved_usd"):
        value = totals.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _arm_summary(arm: ArmResult, prices: Prices | None = None) -> dict[str, Any]:
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
        "cache_write_tokens": sum(c.cache_write_tokens or 0 for c in ok),
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
    if prices is not None and ok:
        out["cost_breakdown"] = cost_breakdown(out, prices)
    if arm.name != "baseline":
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
    if c.cache_write_tokens:
        row["cache_write_tokens"] = c.cache_write_tokens
    if c.cost_usd is not None:
        row["cost_usd"] = c.cost_usd
    return row


def _per_turn(run: BenchRun) -> list[dict[str, Any]]:
    """One row per call index: each arm's cell, cumulative prompt tokens (``cum_ARM``) and,
    when priced, cumulative billed dollars (``cum_cost_ARM``)."""
    names = list(run.arms)
    calls = {n: run.arms[n].calls for n in names}
    rows: list[dict[str, Any]] = []
    cum = dict.fromkeys(names, 0)
    cum_cost: dict[str, float | None] = dict.fromkeys(names, 0.0)
    for i in range(max(len(c) for c in calls.values())):
        row: dict[str, Any] = {"turn": i + 1}
        for n in names:
            cell = _row(calls[n][i] if i < len(calls[n]) else None)
            row[n] = cell
            cum[n] += (cell or {}).get("prompt_tokens") or 0
            spent = cum_cost[n]
            if cell is not None and spent is not None:
                cost = cell.get("cost_usd")
                cum_cost[n] = None if cost is None else round(spent + cost, 9)
        for n in names:
            row[f"cum_{n}"] = cum[n]
        for n in names:
            if cum_cost[n] is not None and any(c.cost_usd is not None for c in calls[n]):
                row[f"cum_cost_{n}"] = cum_cost[n]
        rows.append(row)
    return rows


def break_even_turn(per_turn: list[dict[str, Any]], arm: str = "state") -> int | None:
    """First turn from which cum_ARM <= cum_baseline holds for every later turn."""
    turn: int | None = None
    for row in per_turn:
        if row["baseline"] is None or row.get(arm) is None:
            break
        if row[f"cum_{arm}"] <= row["cum_baseline"]:
            if turn is None:
                turn = row["turn"]
        else:
            turn = None
    return turn


def _pct(new: float, old: float) -> float | None:
    return round(100.0 * (1.0 - new / old), 1) if old > 0 else None


def primary_arm(arms: Mapping[str, Any]) -> str:
    """The proxied arm the token sentences are about: ``state``, else the first proxied one."""
    if "state" in arms:
        return "state"
    return next(n for n in arms if n != "baseline")


def _quality_sentence(workload: str, arms: dict[str, Any]) -> str:
    qb, qs = arms["baseline"]["quality"], arms[primary_arm(arms)]["quality"]
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


def _dollar_sentence(report_arms: Mapping[str, Any], savings: Mapping[str, Any]) -> str:
    b = report_arms["baseline"]
    if b.get("cost_usd") is None:
        return ""
    parts = [f"baseline ${b['cost_usd']:.4f}"]
    for name, sv in (savings.get("by_arm") or {}).items():
        cost = report_arms[name].get("cost_usd")
        if cost is None:
            continue
        pct = sv.get("cost_pct")
        if pct is None:  # a different number of calls: totals are not compared
            parts.append(f"{name} ${cost:.4f} (over {report_arms[name]['calls']} calls)")
        else:
            parts.append(f"{name} ${cost:.4f} ({_signed(pct).replace(' fewer', ' cheaper')})")
    return " Billed: " + ", ".join(parts) + "."


def _verdict(
    report_arms: dict[str, Any], savings: dict[str, Any], workload: str, simulated: bool
) -> str:
    name = primary_arm(report_arms)
    b, s = report_arms["baseline"], report_arms[name]
    failed = [(n, a) for n, a in report_arms.items() if a["failures"]]
    if failed:
        first = failed[0][1]["failed_calls"][0]
        counts = ", ".join(f"{a['failures']} in the {n} arm" for n, a in failed)
        return (
            f"INVALID RUN: failed call(s): {counts} (first: {failed[0][0]} turn "
            f"{first['turn']}: {first['error']}); no savings are claimed."
        )
    if not all(a["prompt_tokens"] for a in report_arms.values()):
        return (
            "INVALID RUN: no prompt tokens were counted in one of the arms; no savings are claimed."
        )
    tail = _dollar_sentence(report_arms, savings) + " " + _quality_sentence(workload, report_arms)
    if simulated:
        tail += " (Simulated model: token counts are estimates, not a provider's.)"
    if b["calls"] != s["calls"]:
        per = savings["per_call_pct"]
        return (
            f"PER-CALL ONLY: the arms made different numbers of calls ({b['calls']} vs "
            f"{s['calls']}), so totals are not compared; per call the {name} arm sent "
            f"{_signed(per)} prompt tokens than the baseline." + tail
        )
    pct = savings["prompt_tokens_pct"]
    be = savings["break_even_turn"]
    be_text = f"break-even at turn {be}" if be is not None else "no break-even within the run"
    return (
        f"VALID: the {name} arm sent {_signed(pct)} prompt tokens than the baseline "
        f"({s['prompt_tokens']:,} vs {b['prompt_tokens']:,} over {b['calls']} calls each); "
        f"{be_text}." + tail
    )


def _signed(pct: float | None) -> str:
    if pct is None:
        return "an unknown share of"
    return f"{pct:g}% fewer" if pct >= 0 else f"{-pct:g}% MORE"


def _last_cost(per_turn: list[dict[str, Any]], arm: str, n: int = 10) -> float | None:
    cells = [row.get(arm) for row in per_turn[-n:]]
    costs = [c.get("cost_usd") for c in cells if c is not None]
    if not costs or None in costs:
        return None
    return float(sum(costs))


def _arm_savings(
    name: str, arms: Mapping[str, Any], per_turn: list[dict[str, Any]]
) -> dict[str, Any]:
    """One proxied arm against the baseline (see the module docstring)."""
    b, a = arms["baseline"], arms[name]
    same = b["calls"] == a["calls"]
    out: dict[str, Any] = {
        "prompt_tokens_pct": _pct(a["prompt_tokens"], b["prompt_tokens"]) if same else None,
        "per_call_pct": _pct(a["prompt_tokens_per_call"] or 0, b["prompt_tokens_per_call"] or 0),
        "saved_tokens": b["prompt_tokens"] - a["prompt_tokens"] if same else None,
        "cost_pct": None,
        "saved_usd": None,
        "last10_cost_ratio": None,
        "break_even_turn": break_even_turn(per_turn, name) if same else None,
    }
    if same and b.get("cost_usd") is not None and a.get("cost_usd") is not None:
        out["saved_usd"] = round(b["cost_usd"] - a["cost_usd"], 9)
        out["cost_pct"] = _pct(a["cost_usd"], b["cost_usd"])
        lb, la = _last_cost(per_turn, "baseline"), _last_cost(per_turn, name)
        if lb is not None and la:
            out["last10_cost_ratio"] = round(lb / la, 2)
    ledger = _ledger_saved(a.get("ledger"))
    if ledger is not None:
        out["ledger_saved_cost_usd"] = round(ledger, 9)
        if out["saved_usd"] is not None and b["cost_usd"]:
            out["ledger_vs_measured_pct"] = round(
                100 * (ledger - out["saved_usd"]) / b["cost_usd"], 2
            )
    return out


def build_report(run: BenchRun) -> dict[str, Any]:
    from skillstate.bench.arm import bench_prices

    cfg = run.config
    prices = bench_prices(cfg)
    arms = {name: _arm_summary(arm, prices) for name, arm in run.arms.items()}
    per_turn = _per_turn(run)
    main_arm = primary_arm(arms)
    b, s = arms["baseline"], arms[main_arm]
    valid = all(not a["failures"] and a["prompt_tokens"] for a in arms.values())
    savings: dict[str, Any] = {
        "prompt_tokens_pct": None,
        "per_call_pct": None,
        "break_even_turn": None,
        "cost_pct": None,
        "by_arm": None,
    }
    if valid:
        savings["per_call_pct"] = _pct(s["prompt_tokens_per_call"], b["prompt_tokens_per_call"])
        if b["calls"] == s["calls"]:
            savings["prompt_tokens_pct"] = _pct(s["prompt_tokens"], b["prompt_tokens"])
            savings["break_even_turn"] = break_even_turn(per_turn, main_arm)
        savings["by_arm"] = {n: _arm_savings(n, arms, per_turn) for n in arms if n != "baseline"}
        savings["cost_pct"] = savings["by_arm"][main_arm]["cost_pct"]
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
        "cache_regime": cfg.regime_label if cfg.offline else None,
        "auto_compact": cfg.auto_compact,
        "config": cfg.config,
        "prices_per_mtok": None if prices is None else dataclasses.asdict(prices),
        "arms": list(run.arms),
        "inject_failure": f"{cfg.inject_failure[0]}:{cfg.inject_failure[1]}"
        if cfg.inject_failure
        else None,
        "token_counts": "skillstate.cost.tokens.estimate_tokens (simulated model usage)"
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
    from rich.panel import Panel

    sim = " [yellow](SIMULATED model)[/yellow]" if report["simulated"] else ""
    params = report["params"]
    size = params.get("turns") or params.get("steps")
    console.print(
        f"[bold]skillstate bench[/bold] {report['workload']} · {size} "
        f"{'turns' if report['workload'] == 'conversation' else 'steps'} · model "
        f"{report['model']}{sim} · mode {params.get('mode')}"
    )
    main_arm = primary_arm(report["arms"])
    console.print(_per_turn_table(report, main_arm))
    console.print(_totals_table(report))
    _print_quality(report, console)
    _print_savings(report, main_arm, console)
    final = report["arms"][main_arm].get("final_state")
    if final is not None:
        console.print(_final_state_panel(final, main_arm))
    style = "red" if report["verdict"].startswith("INVALID") else "green"
    console.print(Panel(report["verdict"], title="Verdict", title_align="left", style=style))


def _per_turn_table(report: Mapping[str, Any], main_arm: str) -> Any:
    """Prompt tokens per turn and arm (a condensed selection of the turns), with notes."""
    from rich import box
    from rich.table import Table

    rows = report["per_turn"]
    names = list(report["arms"])
    shown = condensed_rows(len(rows))
    caption = f"{len(shown)} of {len(rows)} turns shown" if len(shown) < len(rows) else None
    table = Table(
        title="Prompt tokens per turn",
        title_justify="left",
        caption=caption,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
    )
    cols = ["turn", *names, f"{main_arm}/baseline", "cum. baseline", f"cum. {main_arm}", ""]
    for col in cols:
        table.add_column(col, justify="right" if col else "left")
    for idx in shown:
        r = rows[idx]
        cells = {n: r.get(n) or {} for n in names}
        bp, sp = cells["baseline"].get("prompt_tokens"), cells[main_arm].get("prompt_tokens")
        ratio = f"{100 * sp / bp:.0f}%" if bp and sp is not None else "—"
        table.add_row(
            str(r["turn"]),
            *(_fmt(cells[n].get("prompt_tokens")) for n in names),
            ratio,
            _fmt(r["cum_baseline"]),
            _fmt(r[f"cum_{main_arm}"]),
            " ".join(_turn_notes(cells)),
        )
    return table


def _turn_notes(cells: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What a per-turn row says besides the numbers: failures, re-asks, other contexts."""
    notes = []
    for arm, cell in cells.items():
        if cell.get("status") == "error":
            notes.append(f"[red]{arm} FAILED[/red]")
        if cell.get("retries"):
            notes.append(f"{arm} re-asked {cell['retries']}x")
        if arm != "baseline" and cell.get("context") and cell["context"] not in ("compact", arm):
            notes.append(f"{arm} sent {cell['context']}")
    return notes


def _totals_table(report: Mapping[str, Any]) -> Any:
    """Calls, tokens and cost per arm, and each arm's cost against the baseline's."""
    from rich import box
    from rich.table import Table

    params, arms = report["params"], report["arms"]
    regime = params.get("cache_regime")
    title = "Totals" + (f" (cache regime {regime})" if regime else "")
    if params.get("price_as"):
        title += f" · billed as {params['price_as']}"
        if report["simulated"]:
            title += " (hypothetical)"
    totals = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    heads = ("arm", "calls", "failed", "prompt", "per call", "output", "cache read")
    for col in (*heads, "cache write", "cost", "vs baseline"):
        totals.add_column(col, justify="left" if col == "arm" else "right")
    by_arm = report["savings"].get("by_arm") or {}
    for name, a in arms.items():
        pct = (by_arm.get(name) or {}).get("cost_pct")
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
            _fmt(a.get("cache_write_tokens")),
            _usd(a["cost_usd"]),
            ""
            if name == "baseline"
            else ("other calls" if pct is None else _signed(pct).replace(" fewer", " cheaper")),
        )
    return totals


def _print_quality(report: Mapping[str, Any], console: Console) -> None:
    for name, arm in report["arms"].items():
        q = arm["quality"]
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


def _print_savings(report: Mapping[str, Any], main_arm: str, console: Console) -> None:
    """The savings line, what each arm's ledger said, and what each arm lost."""
    sv = report["savings"]
    console.print(
        f"Savings ({main_arm}): prompt tokens {_fmt(sv['prompt_tokens_pct'])}% · per call "
        f"{_fmt(sv['per_call_pct'])}% · billed cost {_fmt(sv.get('cost_pct'))}% · break-even "
        f"turn {_fmt(sv['break_even_turn'])}"
    )
    for name, arm_sv in (sv.get("by_arm") or {}).items():
        if arm_sv.get("ledger_saved_cost_usd") is not None:
            console.print(
                f"Ledger ({name}): the proxy's /cost says saved "
                f"{_usd(arm_sv['ledger_saved_cost_usd'])}; "
                f"measured {_usd(arm_sv.get('saved_usd'))} "
                f"(difference {_fmt(arm_sv.get('ledger_vs_measured_pct'))}% of the baseline)"
            )
    for name, arm in report["arms"].items():
        lost = arm["quality"].get("facts_lost") or []
        if lost:
            items = ", ".join(f"{f['key']} ({f['kind']}, turn {f['turn']})" for f in lost)
            console.print(f"[red]Facts lost by the {name} arm:[/red] {items}")
        mism = arm["quality"].get("mismatch_count")
        if mism:
            console.print(
                f"[red]{name} arm: {mism} issue(s) differ from the expected end state[/red]"
            )


def _final_state_panel(final: Any, main_arm: str) -> Any:
    from rich.json import JSON
    from rich.panel import Panel

    text = orjson.dumps(final).decode()
    if len(text) > 3000:
        text = orjson.dumps({"(truncated)": text[:3000]}).decode()
    pretty = orjson.dumps(final, option=orjson.OPT_INDENT_2).decode()
    body = JSON(text) if pretty.count("\n") <= 30 else JSON(text, indent=None)
    return Panel(body, title=f"Final state ({main_arm} arm)", title_align="left")
