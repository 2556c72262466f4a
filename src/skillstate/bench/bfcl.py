"""BFCL v4 multi-turn replay: public tasks, real backends, both arms.

``skillstate bench bfcl`` runs tasks of the Berkeley Function Calling Leaderboard (BFCL v4,
``pip install bfcl-eval``) through the two benchmark arms (``baseline``: the full transcript
straight to the upstream; ``state``: the same transcript through an in-process proxy, one
session per task).

* **Tasks and observations are BFCL's own.** The questions, the ground-truth call sequences
  (``possible_answer``), the function docs and the Python backends (``GorillaFileSystem``,
  ``TwitterAPI``, ``MathAPI``, ``TradingBot``, ...) all come from the installed ``bfcl_eval``
  package; every tool call is executed with BFCL's own ``execute_multi_turn_func_call``
  against fresh backend instances per arm (loaded from the task's ``initial_config``), so
  every tool result a model sees is real.
* **Offline, the model replays the ground truth** (``ReplayModel``, a ``SimModel`` with a
  different policy): per step it emits the next ground-truth call(s) as ``tool_calls`` and,
  once the turn's calls are done, a short final text. It finds its place (turn, calls done)
  only from what it receives: the transcript in the baseline arm, the state in the state arm
  (so the state has to carry it), and it refuses (HTTP 400) when the context does not match
  the task. When the proxy's contract is in the context it ends every reply with a valid
  state envelope. Token counts are the simulated model's usage
  (``skillstate.tokens.estimate_tokens`` of messages + tool definitions), as in the other
  offline benches, so both arms are counted by one estimator.
* **Grouping.** BFCL's ground truth is one flat list of calls per user turn; how a model
  spreads them over steps is not recorded. ``--grouping same-name`` (default) makes
  consecutive calls to the same function one parallel step, ``call`` one call per step,
  ``turn`` all of a turn's calls in one step. The client executes a step's calls in order.
* **Checks.** After every turn each arm's backend state is compared with the ground truth's
  (BFCL's ``state_checker``: public attributes of every instance), the tool outputs with the
  ground truth's, the two arms' final states with each other, and each arm's decoded calls
  go through BFCL's own ``multi_turn_checker``.

Live (``--upstream URL --model M``) a real model makes the calls; the arms may then make
different numbers of calls (the verdict says PER-CALL ONLY) and the checks measure how well
the model did in each arm.

The machinery does not need ``bfcl_eval``: ``LocalSuite`` runs hand-written tasks in BFCL's
format against your own backend classes (that is what the tests do); ``BfclSuite`` is the
real data. bfcl-eval's declared dependencies are heavy (torch, transformers, sentence-
transformers, faiss, several provider SDKs); the multi-turn backends and data need only
``mpmath``: ``pip install --no-deps bfcl-eval==2026.3.23 mpmath==1.3.0`` works fully offline.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import inspect
import json
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import orjson

from skillstate.bench.runner import (
    EPILOG,
    Arm,
    ArmResult,
    BenchConfig,
    BenchError,
    BenchRun,
    Progress,
    emit_report,
    get_json,
    make_console,
    parse_injection,
    progress_bar,
    unwrap_state,
)
from skillstate.bench.simmodel import (
    SIM_MODEL_ID,
    SimError,
    SimModel,
    SimReply,
    message_text,
    read_state,
)
from skillstate.context import CONTRACT_MARK, CORRECTION_MARK, STATE_MARK
from skillstate.tokens import estimate_tokens

BFCL_PIN = "2026.3.23"
CATEGORIES = (
    "multi_turn_base",
    "multi_turn_long_context",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
)
GROUPINGS = ("same-name", "call", "turn")
MAX_STEPS = 20  # BFCL's MAXIMUM_STEP_LIMIT per turn
# BFCL's DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC: the user turn of a miss_func turn.
ADDED_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"
INSTALL_HINT = (
    f"pip install --no-deps bfcl-eval=={BFCL_PIN} mpmath==1.3.0 (the multi-turn backends and "
    f"data need nothing else), or pip install 'skillstate-proxy[bench]' (bfcl-eval with all "
    "its declared dependencies: torch, transformers, ...)"
)

# The state the replay model keeps in the state arm (and what a real model is asked to keep).
SCHEMA_KEYS = ("turn", "request", "calls_done", "results", "history")
INITIAL_STATE: dict[str, Any] = {
    "turn": 0,
    "request": "",
    "calls_done": 0,
    "results": [],
    "history": [],
}
RESULT_CHARS = 200  # one call's output as kept in state["results"]
HISTORY_CHARS = 300  # one finished turn as kept in state["history"]

# bfcl_eval.constants.type_mappings.GORILLA_TO_OPENAPI (BfclSuite uses the installed one).
GORILLA_TO_OPENAPI: dict[str, str] = {
    "integer": "integer",
    "number": "number",
    "float": "number",
    "string": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "dict": "object",
    "object": "object",
    "tuple": "array",
    "any": "string",
    "byte": "integer",
    "short": "integer",
    "long": "integer",
    "double": "number",
    "char": "string",
    "ArrayList": "array",
    "Array": "array",
    "HashMap": "object",
    "Hashtable": "object",
    "Queue": "array",
    "Stack": "array",
    "Any": "string",
    "String": "string",
    "Bigint": "integer",
}


# -- tasks -----------------------------------------------------------------------------------


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


def _cast_types(properties: dict[str, Any], mapping: Mapping[str, str]) -> dict[str, Any]:
    """BFCL's ``_cast_to_openai_type`` (model_handler/utils.py), same quirks."""
    for key, value in properties.items():
        if "type" not in value:
            value["type"] = "string"
        else:
            var_type = value["type"]
            if var_type == "float":
                value["format"] = "float"
                value["description"] = value.get("description", "") + " This is a float type value."
            value["type"] = mapping.get(var_type, "string")
        if value["type"] in ("array", "object"):
            if "properties" in value:
                value["properties"] = _cast_types(value["properties"], mapping)
            elif "items" in value:
                items = value["items"]
                items["type"] = mapping[items["type"]]
                if items["type"] == "array" and "items" in items:
                    items["items"]["type"] = mapping[items["items"]["type"]]
                elif items["type"] == "object" and "properties" in items:
                    items["properties"] = _cast_types(items["properties"], mapping)
        properties[key] = value
    return properties


def openai_tools(
    docs: Sequence[Mapping[str, Any]], mapping: Mapping[str, str] = GORILLA_TO_OPENAPI
) -> list[dict[str, Any]]:
    """BFCL function docs -> the ``tools`` BFCL's OpenAI chat-completions handler sends
    (``convert_to_tool`` with ``ModelStyle.OPENAI_COMPLETIONS``: ``response`` kept)."""
    out: list[dict[str, Any]] = []
    for doc in docs:
        item = copy.deepcopy(dict(doc))
        item["name"] = item["name"].replace(".", "_")
        params = item.setdefault("parameters", {})
        params["type"] = "object"
        params["properties"] = _cast_types(params.get("properties") or {}, mapping)
        out.append({"type": "function", "function": item})
    return out


# -- the replay model ------------------------------------------------------------------------


@dataclass
class ScriptTurn:
    user: str  # the text of the turn's (last) user message, to check the context against
    steps: list[list[FuncCall]]


@dataclass
class Script:
    task_id: str
    turns: list[ScriptTurn]

    @property
    def model_calls(self) -> int:
        return sum(len(t.steps) + 1 for t in self.turns)


def make_script(task: Task, grouping: str) -> Script:
    turns = []
    for t, calls in enumerate(task.gt_calls()):
        msgs = task.turn_messages(t)
        user = message_text(msgs[-1]) if msgs else ""
        turns.append(ScriptTurn(user, group_calls(calls, grouping)))
    return Script(task.id, turns)


def _short(text: str, limit: int) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _marked(msg: Mapping[str, Any]) -> bool:
    text = message_text(dict(msg))
    return CONTRACT_MARK in text or STATE_MARK in text or CORRECTION_MARK in text


def _result_line(call: str, output: str) -> str:
    return f"{_short(call, 120)} -> {_short(output, RESULT_CHARS)}"


def _history_line(n: int, request: str, outcomes: Sequence[tuple[str, str]]) -> str:
    done = "; ".join(f"{_short(c, 80)} -> {_short(o, 60)}" for c, o in outcomes)
    return _short(f"turn {n} ({_short(request, 60)}): {done or 'no function call'}", HISTORY_CHARS)


@dataclass
class _SeenTurn:
    user: str
    calls: list[tuple[str, str]]  # (call text, output)


def _calls_by_id(messages: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for m in messages:
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function") or {}
            out[str(tc.get("id"))] = _decoded_text(str(fn.get("name")), fn.get("arguments"))
    return out


def _decoded_text(name: str, arguments: Any) -> str:
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        args = None
    return bfcl_call_string(name, args) if isinstance(args, dict) else f"{name}(?)"


def _transcript_turns(messages: Sequence[Mapping[str, Any]]) -> list[_SeenTurn]:
    ids = _calls_by_id(messages)
    turns: list[_SeenTurn] = []
    for m in messages:
        role = m.get("role")
        if role in ("system", "developer") or _marked(m):
            continue
        if role == "user":
            turns.append(_SeenTurn(message_text(dict(m)), []))
        elif role == "tool" and turns:
            turns[-1].calls.append(
                (ids.get(str(m.get("tool_call_id")), "?"), message_text(dict(m)))
            )
    return turns


def _observation_calls(messages: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """The trailing tool results, paired with the calls that asked for them."""
    ids = _calls_by_id(messages)
    out: list[tuple[str, str]] = []
    for m in reversed(messages):
        if m.get("role") != "tool":
            break
        out.append((ids.get(str(m.get("tool_call_id")), "?"), message_text(dict(m))))
    return out[::-1]


def _drop_corrections(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Remove trailing (reply, CORRECTION) pairs the proxy adds when it re-asks."""
    while (
        len(messages) >= 2
        and messages[-1].get("role") == "user"
        and CORRECTION_MARK in message_text(messages[-1])
    ):
        messages = messages[:-2]
    return messages


def _envelope(patch: dict[str, Any], action: str) -> str:
    body = orjson.dumps({"state_patch": patch, "action": action}).decode()
    return f"```json\n{body}\n```"


def replay_reply(messages: list[dict[str, Any]], script: Script) -> SimReply:
    """The replay model's reply: a pure function of the context and the task's script.

    Raises ``SimError`` when the context does not fit the script (the arm is out of sync)."""
    messages = _drop_corrections([m for m in messages if isinstance(m, dict)])
    if not messages:
        raise SimError("replay: no messages")
    contract = any(CONTRACT_MARK in message_text(m) for m in messages)
    state = read_state(messages)
    last = messages[-1]
    history: list[str]
    if state is not None:  # the proxy's compact context: the position comes from the state
        turn_no = state.get("turn")
        done = state.get("calls_done")
        if not isinstance(turn_no, int) or not isinstance(done, int):
            raise SimError("replay: the state has no integer turn/calls_done")
        history = [str(h) for h in state.get("history") or []]
        if last.get("role") == "tool":
            t, k = turn_no - 1, done
            request = str(state.get("request") or "")
            results = [str(r) for r in state.get("results") or []]
            results += [_result_line(c, o) for c, o in _observation_calls(messages)]
        elif last.get("role") == "user" and not _marked(last):
            t, k, request, results = turn_no, 0, message_text(last), []
        else:
            raise SimError(f"replay: cannot read the position from a {last.get('role')} message")
    else:  # a full transcript: count turns and results
        seen = _transcript_turns(messages)
        if not seen:
            raise SimError("replay: no user turn in the context")
        t, k, request = len(seen) - 1, len(seen[-1].calls), seen[-1].user
        results = [_result_line(c, o) for c, o in seen[-1].calls]
        history = [_history_line(i + 1, s.user, s.calls) for i, s in enumerate(seen[:-1])]
    if not 0 <= t < len(script.turns):
        raise SimError(
            f"replay: turn {t + 1} is outside task {script.task_id} (0..{len(script.turns)})"
        )
    turn = script.turns[t]
    if request != turn.user:
        raise SimError(
            f"replay: task {script.task_id} turn {t + 1} expects the user message "
            f"{_short(turn.user, 60)!r}, the context has {_short(request, 60)!r}"
        )
    bounds = [0]
    for step in turn.steps:
        bounds.append(bounds[-1] + len(step))
    if k not in bounds:
        raise SimError(f"replay: {k} calls done in turn {t + 1}, not a step boundary {bounds}")
    i = bounds.index(k)
    patch: dict[str, Any] = {"turn": t + 1, "request": request}
    if i < len(turn.steps):
        step = turn.steps[i]
        calls = [
            {
                "id": f"call_{t + 1}_{k + j + 1}",
                "type": "function",
                "function": {"name": c.name, "arguments": orjson.dumps(c.args).decode()},
            }
            for j, c in enumerate(step)
        ]
        patch.update(calls_done=k + len(step), results=results)
        reply = SimReply("", tool_calls=calls, action="call_tools", patch=patch)
    else:
        names = ", ".join(c.name for s in turn.steps for c in s) or "no function call needed"
        outcomes = [(*r.split(" -> ", 1), "")[:2] for r in results]
        line = _history_line(t + 1, request, [(a, b) for a, b in outcomes])
        patch.update(calls_done=k, results=[], history=[*history, line])
        text = f"[replay] turn {t + 1} done: {names}."
        reply = SimReply(text, action="answer", patch=patch)
    if contract:
        env = _envelope(patch, reply.action)
        reply.content = f"{reply.content}\n\n{env}" if reply.content else env
    else:
        reply.patch = None
    return reply


class ReplayModel(SimModel):
    """The simulated model, replaying ``script`` (set it before each task)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, cache: bool = True) -> None:
        super().__init__(host, port, cache=cache)
        self.script: Script | None = None

    def reply(self, body: dict[str, Any]) -> SimReply:
        script = self.script
        if script is None:
            raise SimError("replay: no task is loaded")
        return replay_reply(list(body.get("messages") or []), script)


# -- backends --------------------------------------------------------------------------------


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


# -- the benchmark ---------------------------------------------------------------------------


@dataclass
class BfclConfig:
    bench: BenchConfig = field(default_factory=lambda: BenchConfig(workload="bfcl"))
    category: str = "multi_turn_base"
    tasks: int | None = 20
    ids: list[str] | None = None
    grouping: str = "same-name"
    max_steps: int = MAX_STEPS


@dataclass
class _Truth:
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


def _truth(suite: Suite, task: Task) -> _Truth:
    ex = suite.executor(task, "gt")
    try:
        snaps, outs = [], []
        for calls in task.ground_truth:
            outs.append(ex.execute(list(calls)))
            snaps.append(copy.deepcopy(ex.instances))
        return _Truth(snaps, outs, copy.deepcopy(ex.instances))
    finally:
        ex.close()


def _json_safe(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS))


def _run_task(
    arm: Arm,
    suite: Suite,
    task: Task,
    truth: _Truth,
    result: ArmResult,
    run: TaskRun,
    max_steps: int,
    progress: Callable[[], None],
) -> None:
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
                    _decoded_text(str((tc.get("function") or {}).get("name")), _args(tc))
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


def run_bfcl(
    cfg: BfclConfig, suite: Suite | None = None, progress: Progress | None = None
) -> tuple[BenchRun, dict[str, list[TaskRun]]]:
    """Both arms over the selected tasks; ``build_bfcl_report`` makes the report."""
    from skillstate.config import Settings, Upstream
    from skillstate.server import ProxyServer
    from skillstate.session import SESSION_HEADER
    from skillstate.upstream.client import base_url as openai_base

    bc = cfg.bench
    if bc.mode not in ("state", "auto"):
        raise BenchError(f"--mode must be state or auto, got {bc.mode!r}")
    if cfg.grouping not in GROUPINGS:
        raise BenchError(f"--grouping must be one of {', '.join(GROUPINGS)}")
    if cfg.category not in CATEGORIES:
        raise BenchError(f"--category must be one of {', '.join(CATEGORIES)}")
    if cfg.max_steps < 1:
        raise BenchError("--max-steps must be at least 1")
    if bc.inject_failure is not None and not bc.offline:
        raise BenchError("--inject-failure needs the simulated model (--offline)")
    own_suite = suite is None
    suite = suite or BfclSuite()
    try:
        tasks = suite.tasks(cfg.category, cfg.tasks, cfg.ids)
        if not tasks:
            raise BenchError("no tasks selected")
        workload = BfclWorkload(cfg, suite, tasks)
        truths = {t.id: _truth(suite, t) for t in tasks}
        runs: dict[str, list[TaskRun]] = {"baseline": [], "state": []}
        arms: dict[str, ArmResult] = {}
        expected = sum(s.model_calls for s in workload.scripts.values())
        with contextlib.ExitStack() as stack:
            replay: ReplayModel | None = None
            if bc.offline:
                replay = ReplayModel()
                replay.start()
                stack.callback(replay.stop)
                upstream_url, model, key = replay.url, SIM_MODEL_ID, "sim-needs-no-key"
            else:
                upstream_url, model, key = _live_upstream(bc)
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="skillstate-bfcl-"))

            def tick(arm_name: str, result: ArmResult) -> Callable[[], None]:
                def update() -> None:
                    if progress:
                        progress(arm_name, len(result.calls), max(expected, len(result.calls)))

                return update

            base = ArmResult("baseline")
            arm = Arm("baseline", bc, openai_base(upstream_url), key, model, {}, replay)
            stack.callback(arm.close)
            t0 = time.perf_counter()
            for task in tasks:
                if replay is not None:
                    replay.script = workload.scripts[task.id]
                run = TaskRun(task)
                _run_task(
                    arm,
                    suite,
                    task,
                    truths[task.id],
                    base,
                    run,
                    cfg.max_steps,
                    tick("baseline", base),
                )
                runs["baseline"].append(run)
            base.seconds = round(time.perf_counter() - t0, 3)
            arms["baseline"] = base

            if replay is not None:
                replay.reset_cache()
            settings = Settings.model_validate(
                {
                    "host": "127.0.0.1",
                    "port": 0,
                    "upstreams": [Upstream(name="bench", url=upstream_url, api_key=key)],
                    "schema": list(SCHEMA_KEYS),
                    "initial_state": workload.initial_state,
                    "data_dir": Path(tmp),
                    "mode": bc.mode,
                    "constrain": bc.constrain,
                }
            )
            proxy = stack.enter_context(ProxyServer(settings))
            prefix = f"bench-bfcl-{uuid.uuid4().hex[:8]}"
            st = ArmResult("state", session=prefix)
            t0 = time.perf_counter()
            for task in tasks:
                if replay is not None:
                    replay.script = workload.scripts[task.id]
                session = f"{prefix}-{re.sub(r'[^A-Za-z0-9_-]', '_', task.id)}"[:128]
                headers = {SESSION_HEADER: session}
                task_arm = Arm("state", bc, proxy.url + "/v1", key, model, headers, replay)
                try:
                    run = TaskRun(task)
                    _run_task(
                        task_arm,
                        suite,
                        task,
                        truths[task.id],
                        st,
                        run,
                        cfg.max_steps,
                        tick("state", st),
                    )
                finally:
                    task_arm.close()
                run.proxy_state = unwrap_state(get_json(f"{proxy.url}/state?session={session}"))
                runs["state"].append(run)
            st.seconds = round(time.perf_counter() - t0, 3)
            last = runs["state"][-1]
            st.final_state = {"task": last.task.id, "state": last.proxy_state}
            st.ledger = get_json(f"{proxy.url}/cost")
            arms["state"] = st
        workload.steps = len(arms["baseline"].calls)
        steps = [s for r in runs["baseline"] for s in r.steps]
        if steps:
            workload.tool_tokens = round(sum(s["tool_tokens"] for s in steps) / len(steps), 1)
        _cross_check(suite, runs)
        for name in ("baseline", "state"):
            arms[name].quality = _quality(runs[name], name)
        bench_run = BenchRun(bc, cast(Any, workload), model, arms)
        return bench_run, runs
    finally:
        if own_suite:
            suite.close()


def _live_upstream(bc: BenchConfig) -> tuple[str, str, str]:
    import os

    from skillstate.bench.runner import _KEY_ENVS

    assert bc.upstream is not None
    if not bc.model:
        raise BenchError("--upstream needs --model")
    key = bc.api_key or next((os.environ[k] for k in _KEY_ENVS if k in os.environ), None)
    if not key:
        raise BenchError("live runs need a key in SKILLSTATE_API_KEY or OPENAI_API_KEY")
    return bc.upstream.rstrip("/"), bc.model, key


def _cross_check(suite: Suite, runs: dict[str, list[TaskRun]]) -> None:
    base = {r.task.id: r for r in runs["baseline"]}
    for r in runs["state"]:
        b = base.get(r.task.id)
        same = None
        if b is not None and b.final is not None and r.final is not None:
            same, _ = suite.check_state(r.final, b.final)
        r.matches_baseline = same


def _quality(runs: list[TaskRun], arm: str) -> dict[str, Any]:
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
        if arm == "state":
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
    if arm == "state":
        out["end_state_equals_baseline"] = sum(1 for r in runs if r.matches_baseline)
    return out


# -- the report ------------------------------------------------------------------------------


def _quality_sentence(arms: Mapping[str, Any]) -> str:
    parts = []
    for name in ("baseline", "state"):
        q = arms[name]["quality"]
        text = f"{name} {q.get('tasks_matched')}/{q.get('tasks')}"
        parts.append(text)
    sentence = "End state matches BFCL's ground truth: " + ", ".join(parts) + " tasks"
    qs = arms["state"]["quality"]
    if qs.get("end_state_equals_baseline") is not None:
        sentence += (
            f"; state arm equals baseline arm in {qs['end_state_equals_baseline']}/{qs['tasks']}"
        )
    checks = [arms[n]["quality"].get("bfcl_checker_valid") for n in ("baseline", "state")]
    if None not in checks:
        sentence += f"; BFCL multi_turn_checker valid: baseline {checks[0]}, state {checks[1]}"
    return sentence + "."


def build_bfcl_report(run: BenchRun, runs: Mapping[str, list[TaskRun]]) -> dict[str, Any]:
    """``report.build_report`` (same keys, verdict and savings) plus where each call was."""
    from skillstate.bench import report as rep

    report = rep.build_report(run)
    where = {name: [s for r in runs[name] for s in r.steps] for name in ("baseline", "state")}
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

    from skillstate.bench import report as rep

    with console.capture() as cap:
        rep.render_console(report, console)
    text = cap.get()
    arms = report["arms"]
    quality = []
    for name in ("baseline", "state"):
        q = arms[name]["quality"]
        line = (
            f"Quality, {name}: end state matches the ground truth in {q['tasks_matched']}/"
            f"{q['tasks']} tasks · tool outputs identical to the ground truth's in "
            f"{q['outputs_match_ground_truth']}/{q['tasks']}"
        )
        if q.get("bfcl_checker_valid") is not None:
            line += f" · BFCL multi_turn_checker valid {q['bfcl_checker_valid']}/{q['tasks']}"
        if name == "state" and q.get("end_state_equals_baseline") is not None:
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
        "state",
        "saved",
        "end state",
        "BFCL check",
    ):
        table.add_column(
            col, justify="left" if col in ("task", "end state", "BFCL check") else "right"
        )
    qb, qs = arms["baseline"]["quality"]["per_task"], arms["state"]["quality"]["per_task"]
    tokens = _tokens_per_task(report)
    for b, s in zip(qb, qs, strict=False):
        tb, ts = tokens["baseline"].get(b["id"]), tokens["state"].get(s["id"])
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


def _tokens_per_task(report: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {"baseline": {}, "state": {}}
    for row in report["per_turn"]:
        for arm in out:
            cell, at = row.get(arm), (row.get("at") or {}).get(arm)
            if cell is None or at is None:
                continue
            out[arm][at["task"]] = out[arm].get(at["task"], 0) + (cell.get("prompt_tokens") or 0)
    return out


# -- command line ----------------------------------------------------------------------------


def add_bfcl_parser(subparsers: Any) -> None:
    """``skillstate bench bfcl``."""
    p = subparsers.add_parser(
        "bfcl",
        help="replay BFCL v4 multi-turn tasks against BFCL's own backends (needs bfcl-eval)",
        description="Baseline (full transcript) vs state (through the proxy) on BFCL v4 "
        "multi-turn tasks. Offline the model replays the ground-truth calls; the calls run "
        f"against BFCL's Python backends. Needs bfcl-eval: {INSTALL_HINT}.",
        epilog=EPILOG,
    )
    p.add_argument("--tasks", type=int, default=20, metavar="N", help="the first N tasks (20)")
    p.add_argument(
        "--category", choices=CATEGORIES, default="multi_turn_base", help="(multi_turn_base)"
    )
    p.add_argument("--ids", metavar="ID,ID", help="these task ids instead of the first N")
    p.add_argument(
        "--grouping",
        choices=GROUPINGS,
        default="same-name",
        help="how a turn's ground-truth calls become model steps: consecutive calls to one "
        "function in parallel (same-name, default), one per step (call), all at once (turn)",
    )
    p.add_argument(
        "--max-steps", type=int, default=MAX_STEPS, metavar="N", help="per turn (BFCL: 20)"
    )
    src = p.add_argument_group("upstream")
    src.add_argument(
        "--offline",
        action="store_true",
        help="replay the ground truth with the simulated model (the default without --upstream)",
    )
    src.add_argument("--upstream", metavar="URL", default=argparse.SUPPRESS, help="a live upstream")
    src.add_argument("--model", metavar="M", help="model name for --upstream")
    p.add_argument("--mode", choices=("state", "auto"), default="state", help="state arm (state)")
    p.add_argument("--stream", action="store_true", help="stream the replies (SSE)")
    p.add_argument("--max-tokens", type=int, default=512, metavar="N", help="per call (512)")
    p.add_argument("--price-as", metavar="MODEL", help="price the token counts as this model")
    p.add_argument("--out", metavar="FILE", help="write the JSON report here")
    p.add_argument("--chart", metavar="FILE", help="write a chart (.svg, .html, or .png)")
    p.add_argument("--json", action="store_true", help="print the JSON report to stdout")
    p.add_argument("--inject-failure", metavar="ARM:CALL", help="make that call fail (offline)")
    p.set_defaults(bench_workload="bfcl")


def config_from_args(args: argparse.Namespace) -> BfclConfig:
    upstream = getattr(args, "upstream", None)
    if getattr(args, "offline", False) and upstream:
        raise BenchError("--offline and --upstream exclude each other")
    ids = [i.strip() for i in (getattr(args, "ids", None) or "").split(",") if i.strip()]
    tasks = getattr(args, "tasks", 20)
    if tasks is not None and tasks < 1:
        raise BenchError("--tasks must be at least 1")
    bench = BenchConfig(
        workload="bfcl",
        mode=getattr(args, "mode", "state") or "state",
        upstream=upstream,
        model=getattr(args, "model", None),
        stream=bool(getattr(args, "stream", False)),
        max_tokens=getattr(args, "max_tokens", 512),
        price_as=getattr(args, "price_as", None),
        inject_failure=parse_injection(getattr(args, "inject_failure", None)),
    )
    return BfclConfig(
        bench=bench,
        category=getattr(args, "category", "multi_turn_base"),
        tasks=tasks,
        ids=ids or None,
        grouping=getattr(args, "grouping", "same-name"),
        max_steps=getattr(args, "max_steps", MAX_STEPS),
    )


def run_bfcl_bench(args: argparse.Namespace, suite: Suite | None = None) -> int:
    """``skillstate bench bfcl``: 0 = valid run, 1 = INVALID run, 2 = usage or setup error."""

    console = make_console(stderr=bool(getattr(args, "json", False)))
    try:
        cfg = config_from_args(args)
        with progress_bar(console, console.is_terminal) as progress:
            run, runs = run_bfcl(cfg, suite, progress)
    except (BenchError, ValueError) as e:
        print(f"skillstate bench bfcl: {e}", file=sys.stderr)
        return 2
    report = build_bfcl_report(run, runs)
    render_bfcl_console(report, console)
    return emit_report(report, args, console, "skillstate bench bfcl")


__all__ = [
    "BFCL_PIN",
    "CATEGORIES",
    "GROUPINGS",
    "BfclConfig",
    "BfclSuite",
    "FuncCall",
    "LocalSuite",
    "ReplayModel",
    "Script",
    "Task",
    "add_bfcl_parser",
    "bfcl_call_string",
    "build_bfcl_report",
    "compare_instances",
    "group_calls",
    "make_script",
    "make_task",
    "openai_tools",
    "parse_call",
    "replay_reply",
    "run_bfcl",
    "run_bfcl_bench",
]
