"""BFCL multi-turn tasks: the entry, its ground-truth calls, and call strings both ways."""

from __future__ import annotations

import ast
import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from skillstate.bench.bfcl.constants import ADDED_FUNCTIONS_PROMPT


@dataclass(frozen=True)
class FuncCall:
    """One call: its name and keyword arguments (positional ones named from the doc)."""

    name: str
    args: dict[str, Any]

    @property
    def text(self) -> str:
        """BFCL's execution string for a decoded FC call (``convert_to_function_call``)."""
        return bfcl_call_string(self.name, self.args)


@dataclass
class Task:
    """One BFCL multi-turn entry plus its ground truth."""

    id: str
    category: str
    question: list[list[dict[str, Any]]]  # per turn: the user message(s); [] on a miss_func turn
    ground_truth: list[list[str]]  # per turn: the ground-truth call strings
    initial_config: dict[str, Any]
    involved_classes: list[str]
    functions: list[dict[str, Any]]  # function docs offered from the first turn
    missed: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # turn -> docs added

    @property
    def long_context(self) -> bool:
        return "long_context" in self.category or "composite" in self.category

    @property
    def turns(self) -> int:
        return len(self.question)

    def turn_messages(self, t: int) -> list[dict[str, Any]]:
        """The user message(s) the client sends at turn ``t`` (BFCL's FC inference loop)."""
        if t in self.missed:
            return [{"role": "user", "content": ADDED_FUNCTIONS_PROMPT}]
        return [dict(m) for m in self.question[t]]

    def functions_at(self, t: int) -> list[dict[str, Any]]:
        docs = list(self.functions)
        for turn in sorted(self.missed):
            if turn <= t:
                docs.extend(self.missed[turn])
        return docs

    def docs_by_name(self) -> dict[str, dict[str, Any]]:
        return {d["name"]: d for d in self.functions_at(self.turns)}

    def gt_calls(self) -> list[list[FuncCall]]:
        docs = self.docs_by_name()
        return [[parse_call(c, docs) for c in turn] for turn in self.ground_truth]


def make_task(
    entry: Mapping[str, Any],
    answer: Mapping[str, Any],
    docs_by_class: Mapping[str, list[dict[str, Any]]],
    category: str | None = None,
) -> Task:
    """A task from one BFCL question entry, its possible_answer entry and the function docs of
    each class (BFCL's ``populate_test_cases_with_predefined_functions``: every function of the
    involved classes, minus the held-out ones of ``missed_function``, offered again at their
    turn). ``excluded_function`` is ignored, as BFCL's own inference ignores it."""
    if entry.get("id") != answer.get("id"):
        raise ValueError(f"question {entry.get('id')!r} and answer {answer.get('id')!r} differ")
    tid = str(entry["id"])
    functions: list[dict[str, Any]] = []
    for cls in entry["involved_classes"]:
        if cls not in docs_by_class:
            raise ValueError(f"{tid}: no function docs for class {cls!r}")
        functions.extend(copy.deepcopy(docs_by_class[cls]))
    missed: dict[int, list[dict[str, Any]]] = {}
    for turn, names in (entry.get("missed_function") or {}).items():
        held: list[dict[str, Any]] = []
        for name in names:
            idx = next((i for i, d in enumerate(functions) if d["name"] == name), None)
            if idx is None:
                raise ValueError(f"{tid}: held-out function {name!r} is not documented")
            held.append(functions.pop(idx))
        missed[int(turn)] = held
    question = [list(turn) for turn in entry["question"]]
    truth = [list(turn) for turn in answer["ground_truth"]]
    if len(question) != len(truth):
        raise ValueError(f"{tid}: {len(question)} turns but {len(truth)} ground-truth turns")
    return Task(
        id=tid,
        category=category or tid.rsplit("_", 1)[0],
        question=question,
        ground_truth=truth,
        initial_config=copy.deepcopy(dict(entry.get("initial_config") or {})),
        involved_classes=list(entry["involved_classes"]),
        functions=functions,
        missed=missed,
    )


def parse_call(text: str, docs: Mapping[str, Mapping[str, Any]]) -> FuncCall:
    """``mv(source='a', destination='b')`` -> FuncCall; positional arguments are named in the
    order of the function doc's ``properties`` (the backends' signature order)."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"not a call: {text!r}") from e
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a plain function call: {text!r}")
    name = node.func.id
    doc = docs.get(name)
    if doc is None:
        raise ValueError(f"{text!r}: no function doc for {name!r}")
    order = list((doc.get("parameters") or {}).get("properties") or {})
    if len(node.args) > len(order):
        raise ValueError(f"{text!r}: more positional arguments than documented parameters")
    args: dict[str, Any] = {}
    try:
        for pname, value in zip(order, node.args, strict=False):
            args[pname] = ast.literal_eval(value)
        for kw in node.keywords:
            if kw.arg is None:
                raise ValueError(f"{text!r}: **kwargs are not supported")
            args[kw.arg] = ast.literal_eval(kw.value)
    except (ValueError, SyntaxError) as e:
        raise ValueError(f"{text!r}: arguments must be literals ({e})") from e
    return FuncCall(name, args)


def bfcl_call_string(name: str, args: Mapping[str, Any]) -> str:
    """BFCL's ``convert_to_function_call`` for one decoded call: ``name(k=repr(v),...)``."""
    return f"{name}({','.join(f'{k}={v!r}' for k, v in args.items())})"


def group_calls(calls: Sequence[FuncCall], grouping: str) -> list[list[FuncCall]]:
    """Split one turn's calls into model steps (see the module docstring)."""
    if grouping == "turn":
        return [list(calls)] if calls else []
    if grouping == "call":
        return [[c] for c in calls]
    if grouping != "same-name":
        raise ValueError(f"unknown grouping {grouping!r}")
    groups: list[list[FuncCall]] = []
    for c in calls:
        if groups and groups[-1][-1].name == c.name:
            groups[-1].append(c)
        else:
            groups.append([c])
    return groups


def decoded_text(name: str, arguments: Any) -> str:
    """A tool call as the model sent it (JSON arguments) -> BFCL's call string."""
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        args = None
    return bfcl_call_string(name, args) if isinstance(args, dict) else f"{name}(?)"
