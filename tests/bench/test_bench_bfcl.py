"""The BFCL v4 multi-turn replay (``skillstate bench bfcl``), without bfcl-eval.

Everything here runs on hand-written tasks in BFCL's own format (question turns,
possible_answer ground truth, function docs with ``"type": "dict"``, ``initial_config``,
``missed_function``) against a small backend of our own (``Shelf``, stateful, with
``_load_scenario`` like BFCL's classes, and ``Calc``, stateless like ``MathAPI``), through the
same machinery the real run uses: the replay model, the real in-process proxy, both arms, the
per-turn state checks and the shared report. The real BFCL tasks need bfcl-eval and run with
``skillstate bench bfcl --offline --tasks 20`` (docs/benchmarks.md, "BFCL v4 replay").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from skillstate.bench import bfcl
from skillstate.bench import report as rep
from skillstate.bench.arm import BenchConfig, BenchError
from skillstate.bench.bfcl import (
    ADDED_FUNCTIONS_PROMPT,
    BfclConfig,
    BfclSuite,
    FuncCall,
    LocalExecutor,
    LocalSuite,
    ReplayModel,
    Task,
    compare_instances,
    group_calls,
    make_script,
    make_task,
    openai_tools,
    parse_call,
    replay_reply,
    run_bfcl,
    run_bfcl_bench,
)
from skillstate.bench.simmodel import SIM_MODEL_ID, SimError
from skillstate.dialects.openai import OPENAI
from skillstate.engine.context import CONTRACT_MARK, STATE_MARK, build_compact
from skillstate.engine.patch import extract_envelope
from skillstate.engine.window import transcript_digest

# -- a tiny backend in BFCL's style ----------------------------------------------------------

FILLER = "inventory audit trail line; " * 40  # ~1.1 KB: observations worth compacting


class Shelf:
    def __init__(self) -> None:
        self.items: dict[str, int] = {}
        self.tags: Any = []
        self.log: list[str] = []
        self._long_context = False

    def _load_scenario(self, scenario: dict[str, Any], long_context: bool = False) -> None:
        self.items = dict(scenario.get("items", {}))
        self._long_context = long_context

    def add_item(self, name: str, count: int = 1) -> dict[str, Any]:
        self.items[name] = self.items.get(name, 0) + count
        self.log.append(f"add {name} {count}")
        return {"name": name, "count": self.items[name]}

    def remove_item(self, name: str) -> dict[str, Any]:
        if name not in self.items:
            return {"error": f"no item {name}"}
        del self.items[name]
        self.log.append(f"remove {name}")
        return {"removed": name}

    def list_items(self) -> dict[str, Any]:
        return {"items": dict(sorted(self.items.items())), "audit": FILLER}

    def set_tags(self, tags: Any) -> str:
        self.tags = tags
        return "ok"

    def explode(self) -> str:
        raise RuntimeError("shelf fell over")


class Calc:
    def add(self, a: float, b: float) -> dict[str, Any]:
        return {"result": a + b}


def _doc(name: str, desc: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"This tool belongs to the shelf. Tool description: {desc}",
        "parameters": {"type": "dict", "properties": props, "required": required},
        "response": {"type": "dict", "properties": {"ok": {"type": "boolean"}}},
    }


DOCS: dict[str, list[dict[str, Any]]] = {
    "Shelf": [
        _doc(
            "add_item",
            "Add items.",
            {
                "name": {"type": "string", "description": "Item name."},
                "count": {"type": "integer", "description": "How many.", "default": 1},
            },
            ["name"],
        ),
        _doc("remove_item", "Remove an item.", {"name": {"type": "string"}}, ["name"]),
        _doc("list_items", "List the items.", {}, []),
        _doc(
            "set_tags",
            "Set the tags.",
            {"tags": {"type": "tuple", "items": {"type": "string"}, "description": "Tags."}},
            ["tags"],
        ),
        _doc("explode", "Always fails.", {}, []),
    ],
    "Calc": [
        _doc(
            "add",
            "Add two numbers.",
            {"a": {"type": "float", "description": "a."}, "b": {"type": "float"}},
            ["a", "b"],
        )
    ],
}

ENTRIES = [
    (
        {
            "id": "multi_turn_base_0",
            "question": [
                [{"role": "user", "content": "Put two apples and a pear on the shelf, then list."}],
                [{"role": "user", "content": "Take the pear off again."}],
                [{"role": "user", "content": "What is 2 plus 3.5?"}],
                [{"role": "user", "content": "Thanks, that is all."}],
            ],
            "initial_config": {"Shelf": {"items": {"plum": 4}}},
            "path": [],
            "involved_classes": ["Shelf", "Calc"],
        },
        {
            "id": "multi_turn_base_0",
            "ground_truth": [
                [
                    "add_item(name='apple', count=2)",
                    "add_item(name='pear')",
                    "list_items()",
                ],
                ["remove_item('pear')", "list_items()"],
                ["add(a=2.0,b=3.5)"],
                [],
            ],
        },
    ),
    (
        {
            "id": "multi_turn_base_1",
            "question": [
                [{"role": "user", "content": "Add a melon, then remove the plum."}],
                [],
                [{"role": "user", "content": "List what is left."}],
            ],
            "initial_config": {"Shelf": {"items": {"plum": 1}}},
            "path": [],
            "involved_classes": ["Shelf"],
            "missed_function": {"1": ["remove_item"]},
        },
        {
            "id": "multi_turn_base_1",
            "ground_truth": [
                ["add_item(name='melon')"],
                ["remove_item(name='plum')"],
                ["list_items()"],
            ],
        },
    ),
]

# Ground truth that passes a tuple: the FC round trip (JSON arguments) turns it into a list,
# so the arms' end state differs from the ground truth's. Reported, not hidden.
TUPLE_ENTRY = (
    {
        "id": "multi_turn_base_7",
        "question": [[{"role": "user", "content": "Tag the shelf fruit and fresh."}]],
        "initial_config": {},
        "path": [],
        "involved_classes": ["Shelf"],
    },
    {"id": "multi_turn_base_7", "ground_truth": [["set_tags(tags=('fruit', 'fresh'))"]]},
)

CLASSES: dict[str, type] = {"Shelf": Shelf, "Calc": Calc}


def _tasks(entries: list[tuple[dict[str, Any], dict[str, Any]]] = ENTRIES) -> list[Task]:
    return [make_task(e, a, DOCS) for e, a in entries]


def _suite(entries: list[tuple[dict[str, Any], dict[str, Any]]] = ENTRIES) -> LocalSuite:
    return LocalSuite(_tasks(entries), CLASSES)


def _cfg(**kw: Any) -> BfclConfig:
    bench = BenchConfig(workload="bfcl", **kw.pop("bench", {}))
    return BfclConfig(bench=bench, **kw)


@pytest.fixture(scope="module")
def offline() -> dict[str, Any]:
    run, runs = run_bfcl(_cfg(), _suite())
    return bfcl.build_bfcl_report(run, runs)


# -- tasks, calls, tools ---------------------------------------------------------------------


def test_parse_call_names_positional_arguments_from_the_doc() -> None:
    docs = {d["name"]: d for d in DOCS["Shelf"]}
    assert parse_call("remove_item('pear')", docs) == FuncCall("remove_item", {"name": "pear"})
    call = parse_call("add_item(name='apple', count=2)", docs)
    assert call.args == {"name": "apple", "count": 2}
    assert call.text == "add_item(name='apple',count=2)"  # BFCL's convert_to_function_call
    for bad in ("nope()", "add_item(name=x)", "add_item('a', 2, 3)", "1 + 2"):
        with pytest.raises(ValueError):
            parse_call(bad, docs)


def test_group_calls() -> None:
    a, b = FuncCall("get", {"i": 1}), FuncCall("get", {"i": 2})
    c = FuncCall("put", {})
    calls = [a, b, c, a]
    assert group_calls(calls, "same-name") == [[a, b], [c], [a]]
    assert group_calls(calls, "call") == [[a], [b], [c], [a]]
    assert group_calls(calls, "turn") == [calls]
    assert group_calls([], "turn") == []
    with pytest.raises(ValueError):
        group_calls(calls, "random")


def test_openai_tools_follow_bfcls_openai_conversion() -> None:
    tools = {t["function"]["name"]: t for t in openai_tools(DOCS["Shelf"] + DOCS["Calc"])}
    add = tools["add"]["function"]
    assert tools["add"]["type"] == "function"
    assert add["parameters"]["type"] == "object"
    assert add["parameters"]["properties"]["a"] == {
        "type": "number",
        "format": "float",
        "description": "a. This is a float type value.",
    }
    assert add["parameters"]["properties"]["b"]["type"] == "number"
    assert add["response"]["type"] == "dict"  # BFCL's OpenAI handler keeps it as is
    tags = tools["set_tags"]["function"]["parameters"]["properties"]["tags"]
    assert tags["type"] == "array" and tags["items"]["type"] == "string"
    assert DOCS["Calc"][0]["parameters"]["type"] == "dict"  # the source docs are untouched


def test_make_task_holds_out_missed_functions_until_their_turn() -> None:
    task = _tasks()[1]
    names = [[d["name"] for d in task.functions_at(t)] for t in range(3)]
    assert "remove_item" not in names[0]
    assert "remove_item" in names[1] and "remove_item" in names[2]
    assert task.turn_messages(1) == [{"role": "user", "content": ADDED_FUNCTIONS_PROMPT}]
    script = make_script(task, "same-name")
    assert [t.user for t in script.turns][1] == ADDED_FUNCTIONS_PROMPT
    with pytest.raises(ValueError, match="differ"):
        make_task(ENTRIES[0][0], ENTRIES[1][1], DOCS)


def test_local_executor_has_bfcls_semantics() -> None:
    task = _tasks()[0]
    ex = LocalExecutor(task, CLASSES)
    assert ex.instances["Shelf"].items == {"plum": 4}  # _load_scenario(initial_config)
    out = ex.execute(["add_item(name='fig')", "explode()", "missing()", "add(a=1,b=2)"])
    assert json.loads(out[0]) == {"name": "fig", "count": 1}  # dicts as JSON text
    assert out[1] == "Error during execution: shelf fell over"
    assert out[2].startswith("Error during execution:")
    assert json.loads(out[3]) == {"result": 3}


def test_compare_instances_checks_public_attributes_only() -> None:
    a, b = Shelf(), Shelf()
    a._long_context = True
    assert compare_instances({"Shelf": a}, {"Shelf": b}) == (True, [])
    a.items["x"] = 1
    assert compare_instances({"Shelf": a}, {"Shelf": b}) == (False, ["Shelf.items"])
    assert compare_instances({}, {"Shelf": b}) == (False, ["Shelf (missing)"])


# -- the replay model ------------------------------------------------------------------------


def _tool_msgs(reply: Any, outputs: list[str]) -> list[dict[str, Any]]:
    msg = {"role": "assistant", "content": reply.content, "tool_calls": reply.tool_calls}
    tools = [
        {"role": "tool", "tool_call_id": tc["id"], "content": out}
        for tc, out in zip(reply.tool_calls, outputs, strict=True)
    ]
    return [msg, *tools]


def test_replay_reads_its_position_from_the_transcript() -> None:
    task = _tasks()[0]
    script = make_script(task, "same-name")
    messages = task.turn_messages(0)
    first = replay_reply(messages, script)
    assert [c["function"]["name"] for c in first.tool_calls] == ["add_item", "add_item"]
    assert [c["id"] for c in first.tool_calls] == ["call_1_1", "call_1_2"]
    assert first.patch is None and "```json" not in first.content  # no contract, no envelope
    messages += _tool_msgs(first, ["{}", "{}"])
    second = replay_reply(messages, script)
    assert [c["function"]["name"] for c in second.tool_calls] == ["list_items"]
    messages += _tool_msgs(second, ["{}"])
    final = replay_reply(messages, script)
    assert not final.tool_calls and final.content.startswith("[replay] turn 1 done")
    messages += [{"role": "assistant", "content": final.content}, *task.turn_messages(1)]
    nxt = replay_reply(messages, script)
    assert json.loads(nxt.tool_calls[0]["function"]["arguments"]) == {"name": "pear"}


def test_replay_reads_its_position_from_the_state_and_writes_valid_envelopes() -> None:
    task = _tasks()[0]
    script = make_script(task, "same-name")
    state = dict(bfcl.INITIAL_STATE)
    transcript = task.turn_messages(0)
    body = build_compact(OPENAI.context, {"messages": transcript}, list(bfcl.SCHEMA_KEYS), state)
    first = replay_reply(body["messages"], script)
    env = extract_envelope(first.content).envelope
    assert env is not None and env.state_patch["turn"] == 1
    assert env.state_patch["calls_done"] == 2
    state.update(env.state_patch)
    transcript += _tool_msgs(first, ['{"name": "apple", "count": 2}', "{}"])
    body = build_compact(OPENAI.context, {"messages": transcript}, list(bfcl.SCHEMA_KEYS), state)
    assert CONTRACT_MARK in json.dumps(body) and STATE_MARK in json.dumps(body)
    assert "Put two apples" in body["messages"][0]["content"]  # the task stays in the prefix
    second = replay_reply(body["messages"], script)
    assert second.tool_calls[0]["function"]["name"] == "list_items"
    patch = extract_envelope(second.content).envelope.state_patch  # type: ignore[union-attr]
    assert patch["calls_done"] == 3
    assert patch["results"][0].startswith("add_item(name='apple',count=2) -> ")
    # a state that says something else than the context: refused
    state.update(patch, turn=2)
    body = build_compact(OPENAI.context, {"messages": transcript}, list(bfcl.SCHEMA_KEYS), state)
    with pytest.raises(SimError, match="expects the user message"):
        replay_reply(body["messages"], script)


def _window_body(transcript: list[dict[str, Any]], start: int, state: dict[str, Any]) -> Any:
    from skillstate.engine.window import WindowMark, build_window, plan_window

    mark = WindowMark(start, transcript_digest(transcript, start))  # (a mark of any task)
    plan = plan_window(transcript, OPENAI.context, {"": mark})
    assert plan.reason == "kept"
    return build_window(
        OPENAI.context, {"messages": transcript}, plan, list(bfcl.SCHEMA_KEYS), state
    )


def test_replay_reads_its_position_from_a_window_and_writes_envelopes_at_checkpoints() -> None:
    """The window form: the state as of the last checkpoint, then the window's messages,
    some of which (the kept exchanges) the state already holds."""
    from skillstate.engine.window import kept_start, with_checkpoint

    task = _tasks()[0]
    script = make_script(task, "call")  # one call per step: more exchanges
    state = dict(bfcl.INITIAL_STATE)
    transcript = task.turn_messages(0)
    start = 1  # after the task, which leads the stable prefix
    checkpoints = 0
    for call, outputs in enumerate([["{}"]] * 3 + [None]):
        body = _window_body(transcript, start, state)
        checkpoint = call == 2  # at turn 1's third call
        if checkpoint:
            body = with_checkpoint(OPENAI.context, body)
        reply = replay_reply(body["messages"], script)
        env = extract_envelope(reply.content).envelope
        assert (env is not None) == checkpoint, call  # the envelope only when asked
        if env is not None:
            state.update(env.state_patch)
            checkpoints += 1
            start = kept_start(transcript, OPENAI.context, start, 1)
        if outputs is not None:
            assert reply.tool_calls, call
            transcript += _tool_msgs(reply, outputs[0:1] * len(reply.tool_calls))
        else:
            assert reply.content.startswith(f"[replay] turn {len(state.get('history') or []) + 1}")
            transcript += [{"role": "assistant", "content": reply.content}]
            transcript += task.turn_messages(1)
    assert checkpoints == 1
    assert state["turn"] == 1 and state["calls_done"] == 3
    # turn 2, its first call: the position read past the kept exchanges of turn 1
    body = with_checkpoint(OPENAI.context, _window_body(transcript, start, state))
    nxt = replay_reply(body["messages"], script)
    assert json.loads(nxt.tool_calls[0]["function"]["arguments"]) == {"name": "pear"}
    patch = extract_envelope(nxt.content).envelope.state_patch  # type: ignore[union-attr]
    assert patch["turn"] == 2 and patch["calls_done"] == 1
    assert len(patch["history"]) == 1 and patch["history"][0].startswith("turn 1 (")


def test_replay_model_answers_out_of_sync_requests_with_http_400() -> None:
    task = _tasks()[0]
    with ReplayModel() as sim:
        assert isinstance(sim, ReplayModel)
        body = {"model": "m", "messages": [{"role": "user", "content": "something else"}]}
        resp = httpx.post(sim.base_url + "/chat/completions", json=body, trust_env=False)
        assert resp.status_code == 400 and "no task is loaded" in resp.text
        sim.script = make_script(task, "call")
        resp = httpx.post(sim.base_url + "/chat/completions", json=body, trust_env=False)
        assert resp.status_code == 400 and "expects the user message" in resp.text
        ok = {
            "model": "m",
            "messages": task.turn_messages(0),
            "tools": openai_tools(task.functions),
        }
        resp = httpx.post(sim.base_url + "/chat/completions", json=ok, trust_env=False)
        assert resp.status_code == 200
        data = resp.json()
        assert data["model"] == SIM_MODEL_ID
        assert data["choices"][0]["finish_reason"] == "tool_calls"
        assert data["usage"]["prompt_tokens"] > 0
        assert [r.status for r in sim.requests] == [400, 400, 200]


# -- the benchmark ---------------------------------------------------------------------------


def test_offline_report_shape_and_verdict(offline: dict[str, Any]) -> None:
    assert tuple(offline) == rep.REPORT_KEYS
    assert offline["workload"] == "bfcl"
    assert offline["simulated"] is True and offline["model"] == SIM_MODEL_ID
    assert offline["schema"] == list(bfcl.SCHEMA_KEYS)
    b, s = offline["arms"]["baseline"], offline["arms"]["state"]
    # task 0: steps [add,add] [list] final | [remove] [list] final | [add] final | final
    # task 1: [add] final | [remove] final | [list] final
    assert b["calls"] == s["calls"] == 9 + 6
    assert b["failures"] == s["failures"] == 0
    assert s["transitions"] == {"valid": 15}
    assert s["contexts"] == {"compact": 15}
    assert offline["verdict"].startswith("VALID")
    assert (
        "End state matches BFCL's ground truth: baseline 2/2, state 2/2 tasks" in offline["verdict"]
    )
    assert "Recall" not in offline["verdict"]
    params = offline["params"]
    assert params["tasks"] == 2 and params["ground_truth_calls"] == 9
    assert params["grouping"] == "same-name" and params["replayed_model_calls"] == 15
    assert params["steps"] == 15 and params["tool_definition_tokens_per_call"] > 0


def test_offline_both_arms_replay_the_same_calls_and_match_the_ground_truth(
    offline: dict[str, Any],
) -> None:
    for arm in ("baseline", "state"):
        q = offline["arms"][arm]["quality"]
        assert q["end_state_match"] is True and q["tasks_matched"] == 2
        assert q["outputs_match_ground_truth"] == 2
        assert q["bfcl_checker_valid"] is None  # only with bfcl-eval
        for task in q["per_task"]:
            assert task["finished"] and task["differences"] == []
            assert task["turns_state_match"] == task["user_turns"]
    assert offline["arms"]["state"]["quality"]["end_state_equals_baseline"] == 2
    rows = offline["per_turn"]
    assert all(r["at"]["baseline"] == r["at"]["state"] for r in rows)
    assert rows[0]["at"]["baseline"] == {
        "task": "multi_turn_base_0",
        "turn": 1,
        "step": 1,
        "calls": 2,  # a parallel step
        "tool_tokens": rows[0]["at"]["baseline"]["tool_tokens"],
    }
    proxy_state = offline["arms"]["state"]["quality"]["per_task"][0]["proxy_state"]
    assert proxy_state["turn"] == 4 and len(proxy_state["history"]) == 4
    assert offline["arms"]["state"]["final_state"]["task"] == "multi_turn_base_1"


def test_offline_per_call_tokens(offline: dict[str, Any]) -> None:
    rows = offline["per_turn"]
    b = [r["baseline"]["prompt_tokens"] for r in rows]
    s = [r["state"]["prompt_tokens"] for r in rows]
    # the first call pays the contract and the state; later calls of task 0 carry less
    # transcript (three ~1.1 KB list_items outputs by then) than the baseline
    assert s[0] > b[0]
    assert s[8] < b[8]
    assert offline["arms"]["baseline"]["prompt_tokens"] == sum(b)
    assert offline["arms"]["state"]["prompt_tokens"] == sum(s)


def test_end_state_mismatch_is_reported_not_hidden() -> None:
    run, runs = run_bfcl(_cfg(), _suite([TUPLE_ENTRY]))
    report = bfcl.build_bfcl_report(run, runs)
    for arm in ("baseline", "state"):
        q = report["arms"][arm]["quality"]
        assert q["end_state_match"] is False and q["tasks_matched"] == 0
        assert q["per_task"][0]["differences"] == ["Shelf.tags"]
        assert q["outputs_match_ground_truth"] == 1  # "ok" either way
    assert report["arms"]["state"]["quality"]["end_state_equals_baseline"] == 1
    assert "baseline 0/1, state 0/1 tasks" in report["verdict"]


@pytest.mark.parametrize("grouping, calls", [("call", 16), ("turn", 13)])
def test_grouping_changes_the_number_of_model_calls(grouping: str, calls: int) -> None:
    run, runs = run_bfcl(_cfg(grouping=grouping), _suite())
    report = bfcl.build_bfcl_report(run, runs)
    assert report["arms"]["baseline"]["calls"] == report["arms"]["state"]["calls"] == calls
    assert report["arms"]["state"]["quality"]["tasks_matched"] == 2


def test_mode_auto_sends_the_full_transcript_when_smaller() -> None:
    run, runs = run_bfcl(_cfg(bench={"mode": "auto"}), _suite())
    report = bfcl.build_bfcl_report(run, runs)
    contexts = report["arms"]["state"]["contexts"]
    # Tasks this short never pay for the window form's switch: the transcript, untouched.
    assert contexts.get("passthrough", 0) >= 1
    assert set(contexts) <= {"passthrough", "window", "checkpoint"}
    assert report["verdict"].startswith("VALID")
    assert report["arms"]["state"]["quality"]["tasks_matched"] == 2


def test_injected_failure_makes_the_run_invalid() -> None:
    run, runs = run_bfcl(_cfg(bench={"inject_failure": ("state", 2)}), _suite())
    report = bfcl.build_bfcl_report(run, runs)
    assert report["verdict"].startswith("INVALID RUN")
    assert all(v is None for v in report["savings"].values())
    assert report["per_turn"][1]["state"]["prompt_tokens"] is None
    q = report["arms"]["state"]["quality"]
    assert q["finished"] is False and q["per_task"][0]["error"].startswith("turn 1: the call")


def test_live_path_against_an_openai_compatible_upstream() -> None:
    """--upstream: the model decides (here the replay server stands in for a provider)."""
    suite = _suite(ENTRIES[:1])
    with ReplayModel() as sim:
        assert isinstance(sim, ReplayModel)
        sim.script = make_script(suite.task_list[0], "same-name")
        cfg = _cfg(bench={"upstream": sim.base_url, "model": "replay", "api_key": "k"})
        run, runs = run_bfcl(cfg, suite)
    report = bfcl.build_bfcl_report(run, runs)
    assert report["params"]["offline"] is False
    assert report["arms"]["baseline"]["prompt_tokens_source"] in ("responses", "proxy ledger")
    assert report["verdict"].startswith("VALID")
    assert report["arms"]["state"]["quality"]["tasks_matched"] == 1


def test_setup_errors() -> None:
    with pytest.raises(BenchError, match="unknown task"):
        run_bfcl(_cfg(ids=["nope"]), _suite())
    with pytest.raises(BenchError, match="grouping"):
        run_bfcl(_cfg(grouping="x"), _suite())
    with pytest.raises(BenchError, match="needs --model"):
        run_bfcl(_cfg(bench={"upstream": "http://127.0.0.1:9/v1"}), _suite())


# -- command line ----------------------------------------------------------------------------


def _parse(argv: list[str]) -> argparse.Namespace:
    from skillstate.cli.main import build_parser

    return build_parser(with_benches=True).parse_args(argv)


def test_bench_bfcl_is_registered() -> None:
    args = _parse(["bench", "bfcl", "--tasks", "3", "--grouping", "call", "--ids", "a, b"])
    cfg = bfcl.config_from_args(args)
    assert cfg.tasks == 3 and cfg.grouping == "call" and cfg.ids == ["a", "b"]
    assert cfg.category == "multi_turn_base" and cfg.bench.offline
    args = _parse(["bench", "bfcl", "--upstream", "http://x/v1", "--model", "m"])
    assert bfcl.config_from_args(args).bench.upstream == "http://x/v1"
    with pytest.raises(BenchError):
        bfcl.config_from_args(_parse(["bench", "bfcl", "--offline", "--upstream", "http://x"]))


def test_without_bfcl_eval_the_command_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from skillstate.cli.main import main

    monkeypatch.setitem(sys.modules, "bfcl_eval", None)  # as if not installed
    with pytest.raises(BenchError, match="pip install --no-deps bfcl-eval=="):
        BfclSuite()
    assert main(["bench", "bfcl", "--tasks", "1"]) == 2
    err = capsys.readouterr().err
    assert "bfcl-eval is not usable here" in err and "mpmath" in err


def test_run_bfcl_bench_console_json_and_chart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, chart = tmp_path / "r.json", tmp_path / "c.svg"
    args = _parse(["bench", "bfcl", "--offline", "--out", str(out), "--chart", str(chart)])
    assert run_bfcl_bench(args, suite=_suite()) == 0
    text = capsys.readouterr().out
    assert "skillstate bench bfcl" in text and "Per task" in text
    assert "Quality, state: end state matches the ground truth in 2/2 tasks" in text
    assert "recall of recorded facts" not in text
    report = json.loads(out.read_text())
    assert tuple(report) == rep.REPORT_KEYS and report["workload"] == "bfcl"
    assert chart.read_text().startswith("<svg")
