"""Where a replay's tasks, backends and checkers come from: the protocols, and the local
suite (hand-written tasks in BFCL's format and your own backend classes, no bfcl-eval)."""

from __future__ import annotations

import ast
import copy
import inspect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from skillstate.bench.arm import BenchError
from skillstate.bench.bfcl.constants import GORILLA_TO_OPENAPI
from skillstate.bench.bfcl.tasks import Task


class Executor(Protocol):
    """Backend instances for one task and one arm, and how calls run against them."""

    instances: dict[str, Any]

    def execute(self, calls: list[str]) -> list[str]: ...
    def close(self) -> None: ...


class Suite(Protocol):
    """Where tasks, backends and checkers come from."""

    name: str
    version: str | None
    type_mapping: Mapping[str, str]

    def tasks(self, category: str, limit: int | None, ids: Sequence[str] | None) -> list[Task]: ...
    def executor(self, task: Task, label: str) -> Executor: ...
    def check_state(
        self, got: Mapping[str, Any], expected: Mapping[str, Any]
    ) -> tuple[bool, list[str]]: ...
    def official_check(
        self, task: Task, decoded: list[list[list[str]]], label: str
    ) -> dict[str, Any] | None: ...
    def close(self) -> None: ...


def compare_instances(
    got: Mapping[str, Any], expected: Mapping[str, Any]
) -> tuple[bool, list[str]]:
    """BFCL's ``state_checker`` rule: every public attribute of every expected instance must
    equal the other instance's. Returns (equal, ["Class.attr", ...] that differ)."""
    diffs: list[str] = []
    for cls, exp in expected.items():
        have = got.get(cls)
        if have is None or type(have) is not type(exp):
            diffs.append(f"{cls} (missing)")
            continue
        for attr in vars(exp):
            if not attr.startswith("_") and getattr(have, attr, None) != getattr(exp, attr):
                diffs.append(f"{cls}.{attr}")
    return not diffs, diffs


def _result_text(value: Any) -> str:
    """BFCL's conversion of a backend's return value into the tool result."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


class LocalExecutor:
    """BFCL's execution semantics for your own classes, without ``eval``: each call string is
    parsed (literal arguments only) and sent to the instance that has that public method."""

    def __init__(self, task: Task, classes: Mapping[str, type]) -> None:
        self.instances: dict[str, Any] = {}
        self._methods: dict[str, Any] = {}
        for name in task.involved_classes:
            inst = classes[name]()
            loader = getattr(inst, "_load_scenario", None)
            if loader is not None:
                loader(
                    copy.deepcopy(task.initial_config.get(name, {})), long_context=task.long_context
                )
            self.instances[name] = inst
            for mname, method in inspect.getmembers(inst, predicate=inspect.ismethod):
                if not mname.startswith("_"):
                    self._methods[mname] = method

    def execute(self, calls: list[str]) -> list[str]:
        out = []
        for text in calls:
            try:
                node = ast.parse(text.strip(), mode="eval").body
                if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                    raise ValueError(f"not a function call: {text}")
                method = self._methods.get(node.func.id)
                if method is None:
                    raise NameError(f"name '{node.func.id}' is not defined")
                args = [ast.literal_eval(a) for a in node.args]
                kwargs = {str(k.arg): ast.literal_eval(k.value) for k in node.keywords}
                out.append(_result_text(method(*args, **kwargs)))
            except Exception as e:  # BFCL reports every failure as the call's output
                out.append(f"Error during execution: {e}")
        return out

    def close(self) -> None:
        pass


@dataclass
class LocalSuite:
    """Hand-written tasks in BFCL's format and your own backend classes (no bfcl_eval)."""

    task_list: list[Task]
    classes: dict[str, type]
    name: str = "local"
    version: str | None = None
    type_mapping: Mapping[str, str] = field(default_factory=lambda: GORILLA_TO_OPENAPI)

    def tasks(self, category: str, limit: int | None, ids: Sequence[str] | None) -> list[Task]:
        by_id = {t.id: t for t in self.task_list}
        return [by_id[i] for i in select_ids(list(by_id), limit, ids)]

    def executor(self, task: Task, label: str) -> Executor:
        return LocalExecutor(task, self.classes)

    def check_state(
        self, got: Mapping[str, Any], expected: Mapping[str, Any]
    ) -> tuple[bool, list[str]]:
        return compare_instances(got, expected)

    def official_check(
        self, task: Task, decoded: list[list[list[str]]], label: str
    ) -> dict[str, Any] | None:
        return None

    def close(self) -> None:
        pass


def select_ids(known: Sequence[str], limit: int | None, ids: Sequence[str] | None) -> list[str]:
    """``ids`` (all must exist), else the first ``limit`` of ``known`` (all when None)."""
    if ids:
        missing = [i for i in ids if i not in set(known)]
        if missing:
            raise BenchError(f"unknown task id(s): {', '.join(missing)}")
        return list(ids)
    return list(known[:limit] if limit else known)
