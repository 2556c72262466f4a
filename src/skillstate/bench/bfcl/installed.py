"""The installed bfcl-eval as a ``Suite``: its data, its backends and its checkers."""

from __future__ import annotations

import inspect
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from skillstate.bench.arm import BenchError
from skillstate.bench.bfcl.backends import Executor, select_ids
from skillstate.bench.bfcl.constants import GORILLA_TO_OPENAPI, INSTALL_HINT
from skillstate.bench.bfcl.tasks import Task, make_task
from skillstate.bench.wire import shorten as _short


def _jsonl(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class BfclExecutor:
    """BFCL's own ``execute_multi_turn_func_call`` against its backend classes. It keeps the
    instances in its module's globals under ``{model_name}_{task id}_{class}_instance``, so a
    unique model name gives fresh instances; ``close`` removes them."""

    def __init__(self, task: Task, model_name: str) -> None:
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

        self._mod = multi_turn_utils
        self.task = task
        self.model_name = model_name
        self.instances: dict[str, Any] = {}
        self.execute([])

    def execute(self, calls: list[str]) -> list[str]:
        results, instances = self._mod.execute_multi_turn_func_call(
            list(calls),
            self.task.initial_config,
            self.task.involved_classes,
            self.model_name,
            self.task.id,
            long_context=self.task.long_context,
            is_evaL_run=False,
        )
        self.instances = dict(instances)
        return [str(r) for r in results]

    def close(self) -> None:
        _forget_globals(self._mod, self.model_name)


def _forget_globals(module: Any, model_name: str) -> None:
    prefix = re.sub(r"[-./:]", "_", model_name) + "_"
    for key in [k for k in vars(module) if k.startswith(prefix)]:
        del vars(module)[key]


class BfclSuite:
    """The installed bfcl-eval: its data, backends and checkers."""

    name = "bfcl-eval"

    def __init__(self) -> None:
        try:
            from importlib.metadata import PackageNotFoundError, version

            import bfcl_eval
            from bfcl_eval.constants.executable_backend_config import (
                MULTI_TURN_FUNC_DOC_FILE_MAPPING,
            )
            from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker, multi_turn_utils
        except ImportError as e:
            raise BenchError(f"bfcl-eval is not usable here ({e}); {INSTALL_HINT}") from e
        try:
            self.version: str | None = version("bfcl-eval")
        except PackageNotFoundError:
            self.version = None
        try:
            from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI as mapping

            self.type_mapping: Mapping[str, str] = dict(mapping)
        except ImportError:
            self.type_mapping = GORILLA_TO_OPENAPI
        try:
            from bfcl_eval.constants.category_mapping import VERSION_PREFIX

            self.prefix = str(VERSION_PREFIX)
        except ImportError:
            self.prefix = "BFCL_v4"
        self._checker = multi_turn_checker
        self._utils = multi_turn_utils
        self._doc_files: dict[str, str] = dict(MULTI_TURN_FUNC_DOC_FILE_MAPPING)
        self.data = Path(inspect.getfile(bfcl_eval)).parent / "data"
        self._names: list[str] = []

    def tasks(self, category: str, limit: int | None, ids: Sequence[str] | None) -> list[Task]:
        qfile = self.data / f"{self.prefix}_{category}.json"
        afile = self.data / "possible_answer" / f"{self.prefix}_{category}.json"
        if not qfile.is_file() or not afile.is_file():
            raise BenchError(f"bfcl-eval has no data for category {category!r} ({qfile})")
        questions = _jsonl(qfile.read_text(encoding="utf-8"))
        answers = {a["id"]: a for a in _jsonl(afile.read_text(encoding="utf-8"))}
        docs: dict[str, list[dict[str, Any]]] = {}
        for cls, fname in self._doc_files.items():
            path = self.data / "multi_turn_func_doc" / fname
            if path.is_file():
                docs[cls] = _jsonl(path.read_text(encoding="utf-8"))
        by_id = {q["id"]: q for q in questions}
        picked = select_ids(list(by_id), limit, ids)
        return [make_task(by_id[i], answers[i], docs, category) for i in picked]

    def executor(self, task: Task, label: str) -> Executor:
        name = self._model_name(label)
        return BfclExecutor(task, name)

    def _model_name(self, label: str) -> str:
        name = f"skillstate_{uuid.uuid4().hex[:10]}_{label}"
        self._names.append(name)
        return name

    def check_state(
        self, got: Mapping[str, Any], expected: Mapping[str, Any]
    ) -> tuple[bool, list[str]]:
        result = self._checker.state_checker(dict(got), dict(expected))
        if result.get("valid"):
            return True, []
        diffs = (result.get("details") or {}).get("differences") or {}
        cls = re.search(r"for (\w+) does not", str(result.get("error_message", "")))
        prefix = f"{cls.group(1)}." if cls else ""
        return False, [f"{prefix}{attr}" for attr in diffs] or ["(state)"]

    def official_check(
        self, task: Task, decoded: list[list[list[str]]], label: str
    ) -> dict[str, Any]:
        """BFCL's ``multi_turn_checker`` on the arm's decoded calls (as its eval runner calls
        it, force-termination included)."""
        if len(decoded) != len(task.ground_truth):
            return {"valid": False, "error_type": "multi_turn:force_terminated"}
        entry = {
            "id": task.id,
            "initial_config": task.initial_config,
            "involved_classes": task.involved_classes,
        }
        name = self._model_name(label)
        try:
            result = self._checker.multi_turn_checker(
                decoded, task.ground_truth, entry, task.category, name
            )
        except Exception as e:  # an assertion inside the checker is a failed check
            return {
                "valid": False,
                "error_type": "checker_error",
                "error_message": _short(str(e), 200),
            }
        finally:
            _forget_globals(self._utils, name)
        out: dict[str, Any] = {"valid": bool(result.get("valid"))}
        if not out["valid"]:
            out["error_type"] = result.get("error_type")
            out["error_message"] = _short(str(result.get("error_message", "")), 200)
        return out

    def close(self) -> None:
        for name in self._names:
            _forget_globals(self._utils, name)
