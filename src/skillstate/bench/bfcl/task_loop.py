"""One task in one arm: BFCL's multi-turn client loop, the calls run against the backends."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from skillstate.bench.arm import Arm, ArmResult
from skillstate.bench.bfcl.backends import Suite
from skillstate.bench.bfcl.tasks import Task, decoded_text
from skillstate.bench.bfcl.tools import openai_tools
from skillstate.bench.bfcl.workload import TaskRun, Truth
from skillstate.cost.tokens import estimate_tokens


def run_task(
    arm: Arm,
    suite: Suite,
    task: Task,
    truth: Truth,
    result: ArmResult,
    run: TaskRun,
    max_steps: int,
    progress: Callable[[], None],
) -> None:
    """Run ``task`` through ``arm`` into ``run``; the calls are appended to ``result``."""
    run.expected_outputs = truth.outputs
    ex = suite.executor(task, arm.name)
    try:
        messages: list[dict[str, Any]] = []
        for t in range(task.turns):
            tools = openai_tools(task.functions_at(t), suite.type_mapping)
            tool_tokens = estimate_tokens(tools)  # the same in both arms
            messages.extend(task.turn_messages(t))
            steps: list[list[str]] = []
            outputs: list[str] = []
            for step in range(max_steps + 1):
                if step == max_steps:
                    run.error = f"turn {t + 1}: no final answer after {max_steps} steps"
                    break
                reply, rec = arm.call(len(result.calls) + 1, messages, tools)
                result.calls.append(rec)
                run.calls.append(len(result.calls) - 1)
                tool_calls = (reply or {}).get("tool_calls") or []
                run.steps.append(
                    {
                        "task": task.id,
                        "turn": t + 1,
                        "step": step + 1,
                        "calls": len(tool_calls),
                        "tool_tokens": tool_tokens,
                    }
                )
                progress()
                if reply is None:
                    run.error = f"turn {t + 1}: the call failed: {rec.error}"
                    break
                messages.append(reply)
                if not tool_calls:
                    break
                decoded = [
                    decoded_text(str((tc.get("function") or {}).get("name")), _args(tc))
                    for tc in tool_calls
                ]
                outs = ex.execute(decoded)
                steps.append(decoded)
                outputs.extend(outs)
                for tc, out in zip(tool_calls, outs, strict=True):
                    messages.append({"role": "tool", "tool_call_id": tc.get("id"), "content": out})
            run.decoded.append(steps)
            run.outputs.append(outputs)
            ok, diffs = suite.check_state(ex.instances, truth.snapshots[t])
            run.turn_state_match.append(ok)
            if run.error:
                break
        run.finished = run.error is None and len(run.decoded) == task.turns
        ok, diffs = suite.check_state(ex.instances, truth.final)
        run.end_state_match = ok and run.finished
        run.differences = diffs
        run.final = ex.instances
    finally:
        ex.close()
    run.official = suite.official_check(task, run.decoded, arm.name + "_check")


def _args(tc: Mapping[str, Any]) -> Any:
    return (tc.get("function") or {}).get("arguments")
