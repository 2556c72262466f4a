"""Context construction (pure): A_t = (task, state, latest observation)."""

from __future__ import annotations

import json
from typing import Any

from skillstate.dialects.anthropic import ANTHROPIC
from skillstate.dialects.openai import OPENAI
from skillstate.dialects.responses import RESPONSES
from skillstate.engine.context import (
    CONTRACT_MARK,
    STATE_MARK,
    build_compact,
    build_full,
    contract_text,
    split_transcript,
)

SYS = {"role": "system", "content": "be brief"}
TASK = {"role": "user", "content": "TASK"}


def roles(msgs: list[dict[str, Any]]) -> list[str]:
    return [m["role"] for m in msgs]


def test_first_turn_does_not_repeat_task() -> None:
    out = build_compact(OPENAI.context, {"messages": [SYS, TASK]}, ["a"], {})["messages"]
    assert roles(out) == ["system", "user", "user"]
    # The task first, as on every later turn: the prefix is the same from turn 1 on.
    assert out[1] == TASK and CONTRACT_MARK in out[2]["content"]
    assert json.dumps(out).count("TASK") == 1


def test_later_turn_sends_prefix_state_and_last_user_only() -> None:
    msgs = [SYS, TASK, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "o1"},
            {"role": "assistant", "content": "a2"}, {"role": "user", "content": "o2"}]  # fmt: skip
    out = build_compact(
        OPENAI.context, {"messages": msgs, "model": "m", "temperature": 0.2}, [], {"k": 1}
    )
    assert out["model"] == "m" and out["temperature"] == 0.2
    m = out["messages"]
    assert m[0] == SYS and m[1] == TASK and m[-1] == {"role": "user", "content": "o2"}
    assert STATE_MARK + '\n{"k":1}' in m[2]["content"]
    assert "a1" not in json.dumps(m) and "a2" not in json.dumps(m) and "o1" not in json.dumps(m)


def test_prefix_is_byte_identical_across_turns() -> None:
    base = [SYS, TASK, {"role": "assistant", "content": "x"}]
    o1 = {"role": "user", "content": "o1"}
    t1 = build_compact(OPENAI.context, {"messages": [*base, o1]}, ["a"], {"a": 1})
    more = [o1, {"role": "assistant", "content": "y"}, {"role": "user", "content": "o2"}]
    t2 = build_compact(OPENAI.context, {"messages": [*base, *more]}, ["a"], {"a": 2})
    p1 = json.dumps(t1["messages"][:2]) + t1["messages"][2]["content"].split(STATE_MARK)[0]
    p2 = json.dumps(t2["messages"][:2]) + t2["messages"][2]["content"].split(STATE_MARK)[0]
    assert p1 == p2


def test_parallel_tool_results_with_trailing_user_message_stay_together() -> None:
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}, {"id": "c2"}]}
    msgs = [TASK, {"role": "assistant", "content": "old", "tool_calls": [{"id": "c0"}]},
            {"role": "tool", "tool_call_id": "c0", "content": "r0"}, call,
            {"role": "tool", "tool_call_id": "c1", "content": "r1"},
            {"role": "tool", "tool_call_id": "c2", "content": "r2"},
            {"role": "user", "content": "and now?"}]  # fmt: skip
    out = build_compact(OPENAI.context, {"messages": msgs}, [], {})["messages"]
    assert out[2:] == msgs[3:]
    assert "c0" not in json.dumps(out)


def test_anthropic_keeps_alternation_and_pairs() -> None:
    use = {"role": "assistant", "content": [{"type": "text", "text": "t"},
           {"type": "tool_use", "id": "tu1", "name": "f", "input": {}}]}  # fmt: skip
    res = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": "r"}],
    }
    history = [{"role": "user", "content": "TASK"}, {"role": "assistant", "content": "a"}]
    body = {"system": "S", "messages": [*history, {"role": "user", "content": "o"}, use, res]}
    out = build_compact(ANTHROPIC.context, body, ["k"], {"k": 0})
    assert out["system"] == "S"
    m = out["messages"]
    assert roles(m) == ["user", "assistant", "user"]
    assert m[0]["content"][0] == {"type": "text", "text": "TASK"}
    assert CONTRACT_MARK in m[0]["content"][1]["text"] and STATE_MARK in m[0]["content"][2]["text"]
    assert m[1] == use and m[2] == res


def test_anthropic_plain_observation_joins_prefix_turn() -> None:
    body = {"messages": [{"role": "user", "content": "TASK"}, {"role": "assistant", "content": "a"},
            {"role": "user", "content": [{"type": "text", "text": "obs"}]}]}  # fmt: skip
    m = build_compact(ANTHROPIC.context, body, [], {})["messages"]
    assert len(m) == 1 and m[0]["content"][-1] == {"type": "text", "text": "obs"}


def test_full_mode_adds_only_the_contract() -> None:
    body = {"messages": [SYS, TASK, {"role": "assistant", "content": "a"}]}
    out = build_full(OPENAI.context, body, ["k"])["messages"]
    assert out[0] == SYS and out[1] == {"role": "system", "content": contract_text(["k"])}
    assert out[2:] == body["messages"][1:]
    a = build_full(
        ANTHROPIC.context, {"system": [{"type": "text", "text": "S"}], "messages": []}, []
    )
    assert a["system"][-1]["text"] == contract_text([])


def test_own_format_turns_ask_for_no_envelope() -> None:
    none = contract_text(["k"], "none")
    assert "state_patch" not in none and "```" not in none
    assert "response format you were given" in none
    sent = build_compact(OPENAI.context, {"messages": [TASK]}, ["k"], {"k": 1}, "none")["messages"]
    assert sent[0] == TASK
    assert sent[1]["content"] == none + "\n\n" + STATE_MARK + '\n{"k":1}'


def test_the_task_is_the_first_user_message_and_those_right_after_it() -> None:
    """Codex sends its environment and then the prompt as two user messages: both are the
    task, in the stable prefix on every turn; a user message after the model's first turn
    is not, nor is a tool result."""
    env = {"role": "user", "content": "<environment_context>/w</environment_context>"}
    prompt = {"role": "user", "content": "PROMPT"}
    call = {"type": "function_call", "call_id": "c1", "name": "run", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "OUT"}
    dev = {"role": "developer", "content": "be brief"}
    later = {"role": "user", "content": "LATER"}
    split = split_transcript([dev, env, prompt, call, output, later], RESPONSES.context)
    assert (split.task, split.task_end) == (1, 3)
    assert [split.in_task(k) for k in range(6)] == [False, True, True, False, False, False]
    for items in ([dev, env, prompt], [dev, env, prompt, call, output]):
        out = build_compact(RESPONSES.context, {"input": items}, [], {})["input"]
        assert out[:3] == [dev, env, prompt]  # the prefix, byte for byte on both turns
        assert json.dumps(out).count("PROMPT") == 1
    first = {"role": "user", "content": "A"}
    result = {"role": "tool", "tool_call_id": "t", "content": "R"}
    split = split_transcript([SYS, first, result, TASK], OPENAI.context)
    assert (split.task, split.task_end) == (1, 2)  # a tool result ends the task
