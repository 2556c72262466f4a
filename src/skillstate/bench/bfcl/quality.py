"""Each arm's quality in ``bench bfcl``: end state, tool outputs and BFCL's checker."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from skillstate.bench.bfcl.workload import TaskRun


def _json_safe(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS))


def arm_quality(runs: list[TaskRun], arm: str) -> dict[str, Any]:
    """An arm's ``quality`` section of the report, from its task runs."""
    n = len(runs)
    matched = sum(1 for r in runs if r.end_state_match)
    official = [r.official for r in runs if r.official is not None]
    valid = sum(1 for o in official if o.get("valid"))
    outputs_ok = sum(1 for r in runs if r.finished and r.outputs == r.expected_outputs)
    tasks = []
    for r in runs:
        row: dict[str, Any] = {
            "id": r.task.id,
            "user_turns": r.task.turns,
            "ground_truth_calls": sum(len(c) for c in r.task.ground_truth),
            "model_calls": len(r.calls),
            "finished": r.finished,
            "end_state_match": r.end_state_match,
            "turns_state_match": sum(r.turn_state_match),
            "differences": r.differences,
            "bfcl_check": r.official,
        }
        if r.error:
            row["error"] = r.error
        if arm != "baseline":
            row["end_state_equals_baseline"] = r.matches_baseline
            row["proxy_state"] = _json_safe(r.proxy_state)
        tasks.append(row)
    out: dict[str, Any] = {
        "recall_pct": None,
        "aside_recall_pct": None,
        "facts_kept": [],
        "facts_lost": [],
        "end_state_match": n > 0 and matched == n,
        "end_state_match_pct": round(100.0 * matched / n, 1) if n else None,
        "tasks_matched": matched,
        "tasks": n,
        "finished": all(r.finished for r in runs),
        "outputs_match_ground_truth": outputs_ok,
        "bfcl_checker_valid": valid if official else None,
        "bfcl_checker_valid_pct": round(100.0 * valid / len(official), 1) if official else None,
        "per_task": tasks,
    }
    if arm != "baseline":
        out["end_state_equals_baseline"] = sum(1 for r in runs if r.matches_baseline)
    return out
