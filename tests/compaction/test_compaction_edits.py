"""Anthropic context editing as the proxy applies it: which tool results and thinking
blocks go, what stays paired, and the applied_edits the API would report."""

from __future__ import annotations

from typing import Any

import pytest

from skillstate.compaction.edits import apply_edits, edits_of
from skillstate.engine.mask import MASK_MARK
from skillstate.errors import ProxyError

JSON = dict[str, Any]


def tool_round(k: int, name: str = "Read", size: int = 400) -> list[JSON]:
    call = {"type": "tool_use", "id": f"toolu_{k}", "name": name, "input": {"path": f"f{k}.py"}}
    result = {"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": f"{k}" * size}
    return [
        {"role": "assistant", "content": [{"type": "text", "text": f"reading {k}"}, call]},
        {"role": "user", "content": [result]},
    ]


def body(rounds: int, **edit: Any) -> JSON:
    messages: list[JSON] = [{"role": "user", "content": "fix the bug"}]
    for k in range(rounds):
        messages += tool_round(k, name="Bash" if k == 1 else "Read")
    spec = {"type": "clear_tool_uses_20250919", **edit}
    return {
        "model": "m",
        "max_tokens": 10,
        "messages": messages,
        "context_management": {"edits": [spec]},
    }


def results(b: JSON) -> list[Any]:
    return [
        blk["content"]
        for m in b["messages"]
        if isinstance(m["content"], list)
        for blk in m["content"]
        if blk["type"] == "tool_result"
    ]


def test_old_tool_results_are_cleared_and_stay_paired() -> None:
    req = body(6, trigger={"type": "input_tokens", "value": 100})
    out = apply_edits(req, edits_of(req) or [])
    assert "context_management" not in out.body
    got = results(out.body)
    assert all(r.startswith(MASK_MARK) for r in got[:3])  # all but the last 3 (default keep)
    assert got[3:] == [f"{k}" * 400 for k in (3, 4, 5)]
    ids = [
        blk["tool_use_id"]
        for m in out.body["messages"]
        if isinstance(m["content"], list)
        for blk in m["content"]
        if blk["type"] == "tool_result"
    ]
    assert ids == [f"toolu_{k}" for k in range(6)]
    (applied,) = out.applied
    assert applied["type"] == "clear_tool_uses_20250919"
    assert applied["cleared_tool_uses"] == 3 and applied["cleared_input_tokens"] > 250
    assert req["messages"][2]["content"][0]["content"] == "0" * 400  # the request untouched


def test_below_the_trigger_nothing_is_cleared() -> None:
    req = body(6)  # default trigger: 100,000 input tokens
    out = apply_edits(req, edits_of(req) or [])
    assert out.applied == [] and results(out.body) == results(req)


def test_keep_exclude_inputs_and_clear_at_least() -> None:
    req = body(
        6,
        trigger={"type": "tool_uses", "value": 2},
        keep={"type": "tool_uses", "value": 1},
        exclude_tools=["Bash"],
        clear_tool_inputs=True,
    )
    out = apply_edits(req, edits_of(req) or [])
    got = results(out.body)
    assert got[1] == "1" * 400  # Bash: excluded
    assert [r.startswith(MASK_MARK) for r in got] == [True, False, True, True, True, False]
    inputs = [
        blk["input"]
        for m in out.body["messages"]
        if m["role"] == "assistant"
        for blk in m["content"]
        if blk["type"] == "tool_use"
    ]
    assert inputs[0] == {} and inputs[1] == {"path": "f1.py"} and inputs[5] == {"path": "f5.py"}
    assert out.applied[0]["cleared_tool_uses"] == 4
    many = body(
        6,
        trigger={"type": "tool_uses", "value": 2},
        clear_at_least={"type": "input_tokens", "value": 10_000},
    )
    assert apply_edits(many, edits_of(many) or []).applied == []


def test_old_thinking_is_cleared() -> None:
    think = {"type": "thinking", "thinking": "hmm " * 50, "signature": "sig"}
    messages: list[JSON] = [{"role": "user", "content": "go"}]
    for k in range(3):
        messages.append(
            {"role": "assistant", "content": [think, {"type": "text", "text": f"a{k}"}]}
        )
        messages.append({"role": "user", "content": f"u{k}"})
    req = {
        "messages": messages,
        "context_management": {"edits": [{"type": "clear_thinking_20251015"}]},
    }
    out = apply_edits(req, edits_of(req) or [])
    kinds = [
        [b["type"] for b in m["content"]] for m in out.body["messages"] if m["role"] == "assistant"
    ]
    assert kinds == [["text"], ["text"], ["thinking", "text"]]
    assert out.applied == [
        {
            "type": "clear_thinking_20251015",
            "cleared_thinking_turns": 2,
            "cleared_input_tokens": out.applied[0]["cleared_input_tokens"],
        }
    ]
    assert out.applied[0]["cleared_input_tokens"] > 50
    keep_all = {
        **req,
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    }
    assert apply_edits(keep_all, edits_of(keep_all) or []).applied == []


@pytest.mark.parametrize(
    "cm",
    [
        "clear",
        {"edits": "clear"},
        {"edits": [{"type": "clear_everything"}]},
        {
            "edits": [
                {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": -1}}
            ]
        },
        {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "turns", "value": 3}}]},
    ],
)
def test_bad_context_management_is_a_400(cm: Any) -> None:
    req = {**body(6), "context_management": cm}
    with pytest.raises(ProxyError) as e:
        apply_edits(req, edits_of(req) or [])
    assert e.value.status == 400 and e.value.param == "context_management"
