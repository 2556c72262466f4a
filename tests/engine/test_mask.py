"""Tests for skillstate.engine.mask: observation masking in blocks, tool-call pairing kept."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skillstate.cost.baseline import CacheRegime
from skillstate.cost.pricing import Prices
from skillstate.cost.remask import RemaskRule
from skillstate.engine.mask import MASK_MARK, mask_transcript, masked_count, placeholder

LONG = "observation " * 50  # 600 characters


def openai_session(rounds: list[tuple[str, int]]) -> dict[str, Any]:
    """A chat-completions agent transcript: each round is ("tools", n parallel calls) or
    ("user", length of the user's message); the model answers every observation."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Task: " + LONG},
    ]
    for r, (kind, n) in enumerate(rounds):
        if kind == "tools":
            calls = [
                {
                    "id": f"c{r}_{i}",
                    "type": "function",
                    "function": {"name": "f", "arguments": "{}"},
                }
                for i in range(n)
            ]
            messages.append({"role": "assistant", "content": None, "tool_calls": calls})
            messages += [
                {"role": "tool", "tool_call_id": c["id"], "content": f"result {c['id']} " + LONG}
                for c in calls
            ]
        else:
            messages.append({"role": "assistant", "content": f"answer {r}"})
            messages.append({"role": "user", "content": "u" * n})
    return {"model": "m", "messages": messages}


def anthropic_session(rounds: list[tuple[str, int]]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Task: " + LONG}]
    for r, (kind, n) in enumerate(rounds):
        if kind == "tools":
            uses = [
                {"type": "tool_use", "id": f"t{r}_{i}", "name": "f", "input": {}} for i in range(n)
            ]
            messages.append(
                {"role": "assistant", "content": [{"type": "text", "text": "on it"}, *uses]}
            )
            results = [
                {"type": "tool_result", "tool_use_id": u["id"], "content": LONG, "is_error": False}
                for u in uses
            ]
            messages.append({"role": "user", "content": results})
        else:
            messages.append({"role": "assistant", "content": f"answer {r}"})
            messages.append({"role": "user", "content": [{"type": "text", "text": "u" * n}]})
    return {"model": "m", "system": "sys", "messages": messages}


SESSIONS = {"openai": openai_session, "anthropic": anthropic_session}


def tool_pairs(dialect: str, messages: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """(position, id) of every tool call and tool result, in order."""
    found: list[tuple[int, str]] = []
    for k, m in enumerate(messages):
        if dialect == "openai":
            found += [(k, c["id"]) for c in m.get("tool_calls") or []]
            if m["role"] == "tool":
                found.append((k, m["tool_call_id"]))
        elif isinstance(m["content"], list):
            for b in m["content"]:
                if b["type"] in ("tool_use", "tool_result"):
                    found.append((k, b.get("id") or b.get("tool_use_id")))
    return found


def test_masked_count_moves_in_blocks() -> None:
    assert [masked_count(g, 3) for g in range(13)] == [0, 0, 0, 0, 0, 0, 3, 3, 3, 6, 6, 6, 9]
    assert [masked_count(g, 1) for g in range(4)] == [0, 0, 1, 2]
    with pytest.raises(ValueError, match="mask_keep"):
        masked_count(5, 0)


def test_openai_masks_old_tool_results_and_long_user_messages_only() -> None:
    rounds = [("tools", 2), ("user", 1000), ("user", 5), ("tools", 1), ("tools", 1), ("tools", 1)]
    body = openai_session(rounds)
    before = orjson.dumps(body)
    out = mask_transcript("openai", body, keep=3)
    assert orjson.dumps(body) == before  # not mutated
    msgs, orig = out["messages"], body["messages"]
    # 7 observations (the task is the first): masked = ((7 - 3) // 3) * 3 = 3
    assert orig[1]["content"].startswith("Task")
    assert out["messages"][1] is orig[1]  # the task is never masked
    assert msgs[3]["content"] == placeholder(orig[3]["content"])  # round 0's tool results
    assert msgs[4]["content"] == placeholder(orig[4]["content"])
    assert msgs[3]["tool_call_id"] == "c0_0" and msgs[3]["role"] == "tool"
    assert msgs[6]["content"] == placeholder("u" * 1000)  # round 1: a long user message
    assert msgs[8] is orig[8]  # round 2: a short user message ("u" * 5) is kept ...
    assert msgs[10] is orig[10]  # ... and the later observations are whole
    assert all(m is o for m, o in zip(msgs, orig, strict=True) if m["role"] == "assistant")
    assert placeholder(orig[3]["content"]).startswith(MASK_MARK)


def test_anthropic_masks_tool_results_keeping_ids() -> None:
    body = anthropic_session([("tools", 2)] * 6)
    out = mask_transcript("anthropic", body, keep=3)
    assert out["system"] == "sys"
    # 7 observations: the task and 6 rounds of results; the first 3 are masked
    first = out["messages"][2]["content"]
    assert [b["tool_use_id"] for b in first] == ["t0_0", "t0_1"]
    assert all(b["content"] == placeholder(LONG) and b["is_error"] is False for b in first)
    assert out["messages"][0] is body["messages"][0]
    assert out["messages"][6] is body["messages"][6]  # round 2: the fourth observation


SHORT = '{"ok": true, "id": 7}'  # a result about the size of its placeholder


def responses_session(rounds: int) -> dict[str, Any]:
    """A Responses agent input: the task, then one function call and its output a round."""
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "Task"}]
    for r in range(rounds):
        items.append({"type": "function_call", "call_id": f"r{r}", "name": "f", "arguments": "{}"})
        items.append({"type": "function_call_output", "call_id": f"r{r}", "output": LONG})
    return {"model": "m", "input": items}


def test_a_tool_result_shorter_than_min_chars_is_kept_whole() -> None:
    # Masking "ok" saves about its placeholder's size and takes away what the agent did.
    chat = openai_session([("tools", 2)] * 6)
    chat["messages"][3] = {**chat["messages"][3], "content": SHORT}
    out = mask_transcript("openai", chat, keep=3)["messages"]
    long = chat["messages"][4]["content"]
    assert out[3]["content"] == SHORT and out[4]["content"] == placeholder(long)

    messages = anthropic_session([("tools", 2)] * 6)
    results = messages["messages"][2]["content"]
    messages["messages"][2] = {
        "role": "user",
        "content": [{**results[0], "content": SHORT}, *results[1:]],
    }
    out = mask_transcript("anthropic", messages, keep=3)["messages"]
    assert [b["content"] for b in out[2]["content"]] == [SHORT, placeholder(LONG)]

    responses = responses_session(6)
    responses["input"][2] = {**responses["input"][2], "output": SHORT}
    out = mask_transcript("openai-responses", responses, keep=3)["input"]
    outputs = [m["output"] for m in out if m["type"] == "function_call_output"]
    assert outputs[0] == SHORT and outputs[1] == placeholder(LONG)


def test_short_sessions_are_untouched() -> None:
    body = openai_session([("tools", 1)] * 4)  # 5 observations < 2 * keep
    out = mask_transcript("openai", body, keep=3)
    assert out == body and all(
        a is b for a, b in zip(out["messages"], body["messages"], strict=True)
    )


rounds_strategy = st.lists(
    st.tuples(st.sampled_from(["tools", "user"]), st.integers(1, 3)).map(
        lambda t: t if t[0] == "tools" else ("user", t[1] * 300)
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["openai", "anthropic"]), rounds_strategy, st.integers(1, 5))
def test_masking_keeps_every_tool_call_paired(
    dialect: str, rounds: list[tuple[str, int]], keep: int
) -> None:
    body = SESSIONS[dialect](rounds)
    out = mask_transcript(dialect, body, keep=keep)
    assert [m["role"] for m in out["messages"]] == [m["role"] for m in body["messages"]]
    assert tool_pairs(dialect, out["messages"]) == tool_pairs(dialect, body["messages"])


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["openai", "anthropic"]), rounds_strategy, st.integers(1, 5))
def test_prefix_is_byte_identical_between_re_masks(
    dialect: str, rounds: list[tuple[str, int]], keep: int
) -> None:
    """Replaying a growing session: each request's masked transcript is a byte-prefix of
    the next one's, except at a re-mask, which happens at most every ``keep`` requests."""
    previous: list[bytes] | None = None
    breaks: list[int] = []
    for t in range(1, len(rounds) + 1):
        sent = [
            orjson.dumps(m)
            for m in mask_transcript(dialect, SESSIONS[dialect](rounds[:t]), keep=keep)["messages"]
        ]
        if previous is not None and sent[: len(previous)] != previous:
            breaks.append(t)
        previous = sent
    assert all(b - a >= keep for a, b in itertools.pairwise(breaks))
    # and a break happens only where the masked count moves (observations = t + 1)
    assert all(masked_count(t + 1, keep) != masked_count(t, keep) for t in breaks)


# -- the re-mask rule: re-mask only when the saving pays for the rewrite (issue 23) ------------

SONNET = Prices(3.0, 15.0, 0.30, 3.75)  # USD per million tokens, Anthropic's cache rates


def rule(pricing: str, breakpoints: bool = True) -> RemaskRule:
    return RemaskRule(CacheRegime(pricing, min_tokens=0), SONNET, client_breakpoints=breakpoints)  # type: ignore[arg-type]


def test_the_rule_re_masks_at_once_where_nothing_is_cached() -> None:
    for r in (rule("none"), rule("anthropic", breakpoints=False)):
        assert r.pays(saving=1, rewrite=10**6, whole=2 * 10**6, turns=1)
        assert not r.pays(saving=0, rewrite=0, whole=10**6, turns=100)


def test_the_rule_weighs_the_saving_against_the_rewrite() -> None:
    # anthropic: saving * 0.30 * turns against rewrite * (3.75 - 0.30)
    r = rule("anthropic")
    assert not r.pays(saving=1_000, rewrite=100_000, whole=200_000, turns=100)  # 30,000 < 345,000
    assert r.pays(saving=20_000, rewrite=100_000, whole=200_000, turns=100)  # 600,000 > 345,000
    # openai: the rewrite is sent uncached (input 3.00 less the read 0.30 it would have cost)
    assert rule("openai").pays(
        saving=10_000, rewrite=100_000, whole=200_000, turns=100
    )  # 300,000 > 270,000
    assert not rule("openai").pays(saving=9_000, rewrite=100_000, whole=200_000, turns=100)


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_a_rule_that_always_pays_masks_all_but_the_last_keep(dialect: str) -> None:
    body = SESSIONS[dialect]([("tools", 1)] * 8)
    out = mask_transcript(dialect, body, keep=2, pays=lambda saving, rewrite, whole, turns: True)
    masked = [k for k, m in enumerate(out["messages"]) if MASK_MARK in orjson.dumps(m).decode()]
    # 9 observations: the task, then 8 rounds of tool results. All but the last 2 are masked,
    # the task excepted (it never is): the results of rounds 1-6.
    assert len(masked) == 6


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_a_rule_that_never_pays_masks_nothing(dialect: str) -> None:
    body = SESSIONS[dialect]([("tools", 1)] * 8)
    out = mask_transcript(dialect, body, keep=2, pays=lambda saving, rewrite, whole, turns: False)
    assert out["messages"] == body["messages"]


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["openai", "anthropic"]),
    rounds_strategy,
    st.integers(1, 4),
    st.sampled_from(["anthropic", "openai", "none"]),
)
def test_under_the_rule_a_request_rewrites_the_cache_only_when_it_pays(
    dialect: str, rounds: list[tuple[str, int]], keep: int, pricing: str
) -> None:
    """Replaying a growing session under the rule: each request's masked transcript is a
    byte-prefix of the next one's, except where the rule said a re-mask pays, computed
    here from the plain sizes of the transcript."""
    r = rule(pricing)
    calls: list[tuple[int, int, int, bool]] = []

    def pays(saving: int, rewrite: int, whole: int, turns: int) -> bool:
        assert 0 <= rewrite <= whole  # a tail of the request as it would be sent
        verdict = r.pays(saving, rewrite, whole, turns)
        calls.append((saving, rewrite, turns, verdict))
        return verdict

    previous: list[bytes] | None = None
    for t in range(1, len(rounds) + 1):
        calls.clear()
        out = mask_transcript(dialect, SESSIONS[dialect](rounds[:t]), keep=keep, pays=pays)
        sent = [orjson.dumps(m) for m in out["messages"]]
        remasked_now = bool(calls) and calls[-1][3]  # the last call is for this request
        if previous is not None and sent[: len(previous)] != previous:
            assert remasked_now  # the cache is rewritten only where the rule said it pays
        previous = sent


def test_no_message_of_the_task_is_masked() -> None:
    """The task is the first user message and the user messages right after it (Codex: its
    environment, then the prompt): masked, the prompt would be gone for good."""
    body = openai_session([("tools", 1)] * 8)
    prompt = {"role": "user", "content": "The prompt: " + LONG}
    body["messages"].insert(2, prompt)
    masked = mask_transcript("openai", body, keep=2)["messages"]
    assert masked[1] == body["messages"][1] and masked[2] == prompt
    assert sum(MASK_MARK in str(m.get("content")) for m in masked) >= 4  # the rest is masked
