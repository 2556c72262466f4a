"""What one ``bench bfcl`` run is made of: its config, its workload, the ground truth's run,
and the record of one task in one arm."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from skillstate.bench.arm import BenchConfig
from skillstate.bench.bfcl.backends import Suite
from skillstate.bench.bfcl.constants import INITIAL_STATE, MAX_STEPS, RESULT_CHARS, SCHEMA_KEYS
from skillstate.bench.bfcl.replay import make_script
from skillstate.bench.bfcl.tasks import Task


@dataclass
class BfclConfig:
    bench: BenchConfig = field(default_factory=lambda: BenchConfig(workload="bfcl"))
    category: str = "multi_turn_base"
    tasks: int | None = 20
    ids: list[str] | None = None
    grouping: str = "same-name"
    max_steps: int = MAX_STEPS


@dataclass
class Truth:
    snapshots: list[dict[str, Any]]  # deep copies of the instances after each turn
    outputs: list[list[str]]  # per turn
    final: dict[str, Any]


@dataclass
class TaskRun:
    """One task in one arm."""

    task: Task
    calls: list[int] = field(default_factory=list)  # indexes into the arm's CallRecords
    steps: list[dict[str, Any]] = field(default_factory=list)  # where each call was
    decoded: list[list[list[str]]] = field(default_factory=list)  # turn -> step -> calls
    outputs: list[list[str]] = field(default_factory=list)
    turn_state_match: list[bool] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    finished: bool = False
    error: str | None = None
    final: dict[str, Any] | None = None
    end_state_match: bool = False
    official: dict[str, Any] | None = None
    proxy_state: Any = None
    expected_outputs: list[list[str]] = field(default_factory=list)  # the ground truth's
    matches_baseline: bool | None = None  # state arm: final state equals the baseline arm's


class BfclWorkload:
    """What the report needs of a workload (``name``, ``schema_keys``, ``params()``)."""

    name = "bfcl"
    schema_keys = SCHEMA_KEYS

    def __init__(self, cfg: BfclConfig, suite: Suite, tasks: list[Task]) -> None:
        self.cfg = cfg
        self.suite = suite
        self.tasks = tasks
        self.scripts = {t.id: make_script(t, cfg.grouping) for t in tasks}
        self.steps = 0  # model calls per arm, set after the run
        self.tool_tokens: float | None = None  # mean tokens of the tool definitions per call

    @property
    def initial_state(self) -> dict[str, Any]:
        return copy.deepcopy(INITIAL_STATE)

    def params(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "source": f"{self.suite.name} {self.suite.version or ''}".strip(),
            "category": self.cfg.category,
            "tasks": len(self.tasks),
            "task_ids": [t.id for t in self.tasks],
            "user_turns": sum(t.turns for t in self.tasks),
            "ground_truth_calls": sum(len(c) for t in self.tasks for c in t.ground_truth),
            "grouping": self.cfg.grouping,
            "replayed_model_calls": sum(s.model_calls for s in self.scripts.values()),
            "max_steps_per_turn": self.cfg.max_steps,
            "state_result_chars": RESULT_CHARS,
            "tool_definition_tokens_per_call": self.tool_tokens,
        }


def ground_truth_run(suite: Suite, task: Task) -> Truth:
    """The ground truth's calls against fresh backends: the states and outputs to match."""
    ex = suite.executor(task, "gt")
    try:
        snaps, outs = [], []
        for calls in task.ground_truth:
            outs.append(ex.execute(list(calls)))
            snaps.append(copy.deepcopy(ex.instances))
        return Truth(snaps, outs, copy.deepcopy(ex.instances))
    finally:
        ex.close()
