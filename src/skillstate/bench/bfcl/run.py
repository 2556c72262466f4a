"""``run_bfcl``: both arms over the selected tasks, then the checks across them."""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import Callable
from typing import Any, cast

from skillstate.bench.arm import Arm, ArmResult, BenchError, BenchRun, Progress
from skillstate.bench.bfcl.backends import Suite
from skillstate.bench.bfcl.constants import CATEGORIES, GROUPINGS, SCHEMA_KEYS
from skillstate.bench.bfcl.installed import BfclSuite
from skillstate.bench.bfcl.quality import arm_quality
from skillstate.bench.bfcl.replay import ReplayModel
from skillstate.bench.bfcl.task_loop import run_task
from skillstate.bench.bfcl.tasks import Task
from skillstate.bench.bfcl.workload import (
    BfclConfig,
    BfclWorkload,
    TaskRun,
    Truth,
    ground_truth_run,
)
from skillstate.bench.runner import (
    Target,
    arm_mode,
    check_config,
    live_target,
    open_proxy,
    unwrap_state,
)
from skillstate.bench.simmodel import SIM_MODEL_ID
from skillstate.bench.wire import get_json


def _check_config(cfg: BfclConfig) -> None:
    check_config(cfg.bench)
    if cfg.grouping not in GROUPINGS:
        raise BenchError(f"--grouping must be one of {', '.join(GROUPINGS)}")
    if cfg.category not in CATEGORIES:
        raise BenchError(f"--category must be one of {', '.join(CATEGORIES)}")
    if cfg.max_steps < 1:
        raise BenchError("--max-steps must be at least 1")


class _Run:
    """The parts both arms share: the workload, the ground truth, the upstream, progress."""

    def __init__(
        self,
        cfg: BfclConfig,
        suite: Suite,
        tasks: list[Task],
        target: Target,
        replay: ReplayModel | None,
        progress: Progress | None,
    ) -> None:
        self.cfg = cfg
        self.suite = suite
        self.workload = BfclWorkload(cfg, suite, tasks)
        self.truths: dict[str, Truth] = {t.id: ground_truth_run(suite, t) for t in tasks}
        self.target = target
        self.replay = replay
        self.progress = progress
        self.expected = sum(s.model_calls for s in self.workload.scripts.values())

    def tick(self, arm_name: str, result: ArmResult) -> Callable[[], None]:
        def update() -> None:
            if self.progress:
                calls = len(result.calls)
                self.progress(arm_name, calls, max(self.expected, calls))

        return update

    def task(self, arm: Arm, task: Task, result: ArmResult) -> TaskRun:
        if self.replay is not None:
            self.replay.script = self.workload.scripts[task.id]
        run = TaskRun(task)
        tick = self.tick(arm.name, result)
        run_task(arm, self.suite, task, self.truths[task.id], result, run, self.cfg.max_steps, tick)
        return run


def _baseline_arm(r: _Run, runs: list[TaskRun]) -> ArmResult:
    """Every task's full transcript straight to the upstream, one client for all tasks."""
    from skillstate.upstream.client import base_url as openai_base

    t = r.target
    result = ArmResult("baseline")
    arm = Arm("baseline", r.cfg.bench, openai_base(t.url), t.key, t.model, {}, r.replay)
    try:
        t0 = time.perf_counter()
        runs.extend(r.task(arm, task, result) for task in r.workload.tasks)
        result.seconds = round(time.perf_counter() - t0, 3)
    finally:
        arm.close()
    return result


def _proxy_arm(
    r: _Run, runs: list[TaskRun], stack: contextlib.ExitStack, name: str = "state"
) -> ArmResult:
    """Every task through one fresh in-process proxy in the arm's mode, one session (and
    client) per task."""
    from skillstate.sessions.ids import SESSION_HEADER

    bc, t = r.cfg.bench, r.target
    if r.replay is not None:
        r.replay.reset_cache()
    proxy = open_proxy(
        stack,
        t,
        schema_keys=SCHEMA_KEYS,
        initial_state=r.workload.initial_state,
        mode=arm_mode(bc, name),
        constrain=bc.constrain,
        tmp_prefix="skillstate-bfcl-",
        cfg=bc,
    )
    prefix = f"bench-bfcl-{name}-{uuid.uuid4().hex[:8]}"
    result = ArmResult(name, session=prefix)
    t0 = time.perf_counter()
    for task in r.workload.tasks:
        session = f"{prefix}-{re.sub(r'[^A-Za-z0-9_-]', '_', task.id)}"[:128]
        headers = {SESSION_HEADER: session}
        arm = Arm(name, bc, proxy.url + "/v1", t.key, t.model, headers, r.replay)
        try:
            run = r.task(arm, task, result)
        finally:
            arm.close()
        run.proxy_state = unwrap_state(get_json(f"{proxy.url}/state?session={session}"))
        runs.append(run)
    result.seconds = round(time.perf_counter() - t0, 3)
    last = runs[-1]
    result.final_state = {"task": last.task.id, "state": last.proxy_state}
    result.ledger = get_json(f"{proxy.url}/cost")
    return result


def run_bfcl(
    cfg: BfclConfig, suite: Suite | None = None, progress: Progress | None = None
) -> tuple[BenchRun, dict[str, list[TaskRun]]]:
    """Both arms over the selected tasks; ``build_bfcl_report`` makes the report."""
    bc = cfg.bench
    _check_config(cfg)
    own_suite = suite is None
    suite = suite or BfclSuite()
    try:
        tasks = suite.tasks(cfg.category, cfg.tasks, cfg.ids)
        if not tasks:
            raise BenchError("no tasks selected")
        runs: dict[str, list[TaskRun]] = {name: [] for name in bc.arms}
        with contextlib.ExitStack() as stack:
            replay: ReplayModel | None = None
            if bc.offline:
                replay = ReplayModel(regime=cast(Any, bc.cache_regime))
                replay.start()
                stack.callback(replay.stop)
                target = Target(replay.url, SIM_MODEL_ID, "sim-needs-no-key")
            else:
                target = live_target(bc)
            r = _Run(cfg, suite, tasks, target, replay, progress)
            arms = {"baseline": _baseline_arm(r, runs["baseline"])}
            for name in bc.arms:
                if name != "baseline":
                    arms[name] = _proxy_arm(r, runs[name], stack, name)
        workload = r.workload
        workload.steps = len(arms["baseline"].calls)
        steps = [s for run in runs["baseline"] for s in run.steps]
        if steps:
            workload.tool_tokens = round(sum(s["tool_tokens"] for s in steps) / len(steps), 1)
        _cross_check(suite, runs)
        for name in arms:
            arms[name].quality = arm_quality(runs[name], name)
        return BenchRun(bc, cast(Any, workload), target.model, arms), runs
    finally:
        if own_suite:
            suite.close()


def _cross_check(suite: Suite, runs: dict[str, list[TaskRun]]) -> None:
    """Each proxied arm's final backend state against the baseline arm's, task by task."""
    base = {r.task.id: r for r in runs["baseline"]}
    for name, arm_runs in runs.items():
        if name == "baseline":
            continue
        for r in arm_runs:
            b = base.get(r.task.id)
            same = None
            if b is not None and b.final is not None and r.final is not None:
                same, _ = suite.check_state(r.final, b.final)
            r.matches_baseline = same
