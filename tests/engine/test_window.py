"""The window context builder (skillstate.engine.window): exchanges, marks, append-only
layouts in each dialect, and the checkpoint instruction."""

from __future__ import annotations

import json
from itertools import pairwise
from typing import Any

import pytest

from skillstate.cost.tokens import estimate_tokens
from skillstate.dialects.registry import get_dialect
from skillstate.engine.window import (
    CHECKPOINT_MARK,
    WindowMark,
    WindowMarks,
    build_window,
    exchange_starts,
    kept_exchanges,
    kept_start,
    plan_window,
    prefix_task,
    transcript_digest,
    with_checkpoint,
)


def marks(mark: WindowMark | None) -> WindowMarks | None:
    """A session's marks holding ``mark`` only (its conversation's)."""
    return {mark.root: mark} if mark is not None else None


def openai_round(k: int) -> list[dict[str, Any]]:
    call = {"id": f"c{k}", "type": "function", "function": {"name": "run", "arguments": "{}"}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{k}", "content": f"result {k}"},
    ]


def anthropic_round(k: int) -> list[dict[str, Any]]:
    use = {"type": "tool_use", "id": f"t{k}", "name": "run", "input": {}}
    result = {"type": "tool_result", "tool_use_id": f"t{k}", "content": f"result {k}"}
    return [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]


def responses_round(k: int) -> list[dict[str, Any]]:
    return [
        {"type": "reasoning", "id": f"rs{k}", "summary": []},
        {"type": "function_call", "call_id": f"c{k}", "name": "run", "arguments": "{}"},
        {"type": "function_call_output", "call_id": f"c{k}", "output": f"result {k}"},
    ]


TRANSCRIPTS = {
    "openai": (
        [{"role": "system", "content": "SYS"}, {"role": "user", "content": "TASK"}],
        openai_round,
    ),
    "anthropic": ([{"role": "user", "content": "TASK"}], anthropic_round),
    "openai-responses": ([{"type": "message", "role": "user", "content": "TASK"}], responses_round),
}


def transcript(dialect: str, rounds: int) -> list[dict[str, Any]]:
    head, one = TRANSCRIPTS[dialect]
    return [*head, *(m for k in range(rounds) for m in one(k))]


def body_of(dialect: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    key = get_dialect(dialect).context.transcript_key
    return {"model": "m", key: messages}


def sent(dialect: str, body: dict[str, Any]) -> list[Any]:
    return body[get_dialect(dialect).context.transcript_key]


def test_exchanges_start_at_user_messages_and_after_tool_results() -> None:
    d = get_dialect("openai").context
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "TASK"},  # 1
        *openai_round(0),  # 2 (reply to the task), 3
        *openai_round(1),  # 4, 5
        {"role": "assistant", "content": "done"},  # 6
        {"role": "user", "content": "thanks"},  # 7
        {"role": "assistant", "content": "ok"},  # 8
    ]
    assert exchange_starts(msgs, d) == [1, 4, 6, 7]
    assert kept_start(msgs, d, 1, 2) == 6
    assert kept_start(msgs, d, 1, 4) == 1  # no more than 4: the window stays whole
    assert kept_start(msgs, d, 4, 1) == 7


def test_kept_exchanges_shrink_to_the_room_the_models_context_leaves() -> None:
    d = get_dialect("openai").context
    big = "x" * 40_000  # about 10,000 tokens a message by the estimate
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "TASK"},  # 1
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": big},  # 3
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": big},  # 5
        {"role": "assistant", "content": "c"},
        {"role": "user", "content": "small"},  # 7
    ]
    assert kept_start(msgs, d, 1, 3) == 3  # the last three exchanges
    # each exchange's tokens, counted the way kept_start counts them
    last = estimate_tokens(msgs[7:])
    two = last + estimate_tokens(msgs[5:7])
    assert kept_start(msgs, d, 1, 3, room=10**6) == 3  # room for all three
    assert kept_start(msgs, d, 1, 3, room=two) == 5  # room for two
    assert kept_start(msgs, d, 1, 3, room=two - 1) == 7  # for one
    assert kept_start(msgs, d, 1, 3, room=0) == 7  # the latest exchange always stays
    assert kept_start(msgs, d, 6, 3, room=0) == 7  # a window starting mid-exchange
    assert kept_start(msgs, d, 6, 3, room=10**6) == 6


@pytest.mark.parametrize("dialect", list(TRANSCRIPTS))
def test_window_is_append_only_between_checkpoints(dialect: str) -> None:
    d = get_dialect(dialect).context
    mark: WindowMark | None = None
    previous: str | None = None
    for rounds in range(0, 8):
        msgs = transcript(dialect, rounds)
        plan = plan_window(msgs, d, marks(mark))
        assert plan.reason == ("new" if mark is None else "kept")
        mark = plan.mark(msgs)
        out = build_window(d, body_of(dialect, msgs), plan, ["notes"], {"notes": "x"})
        text = json.dumps(sent(dialect, out))
        assert text.count("TASK") == 1  # the task is in the prefix, once
        if previous is not None:
            assert text.startswith(previous[:-1])  # the previous list is a prefix
        previous = text
        for k in range(rounds):
            assert text.count(f"result {k}") == 1


@pytest.mark.parametrize("dialect", list(TRANSCRIPTS))
def test_restarted_window_keeps_the_last_exchanges_paired(dialect: str) -> None:
    d = get_dialect(dialect).context
    msgs = transcript(dialect, 6)
    plan = plan_window(msgs, d, None)
    start = kept_start(msgs, d, plan.start, 3)
    mark = WindowMark(start, transcript_digest(msgs, start))
    later = transcript(dialect, 7)
    plan = plan_window(later, d, marks(mark))
    assert plan.reason == "kept" and plan.exchanges == 4
    text = json.dumps(sent(dialect, build_window(d, body_of(dialect, later), plan, [], {})))
    assert "result 2" not in text
    for k in (3, 4, 5, 6):
        assert text.count(f"result {k}") == 1
    ids = ["c3", "c4", "c5", "c6"] if dialect != "anthropic" else ["t3", "t4", "t5", "t6"]
    for i in ids:  # each call with its result
        assert text.count(f'"{i}"') == 2


def test_mark_ignores_moved_cache_breakpoints() -> None:
    d = get_dialect("anthropic").context
    msgs = transcript("anthropic", 4)
    mark = WindowMark(3, transcript_digest(msgs, 3))
    moved = json.loads(json.dumps(msgs))
    moved[2]["content"][0]["cache_control"] = {"type": "ephemeral"}
    assert plan_window(moved, d, marks(mark)).reason == "kept"


@pytest.mark.parametrize("change", ["compaction", "edit", "restart"])
def test_a_changed_transcript_starts_a_fresh_window_with_all_of_it(change: str) -> None:
    d = get_dialect("openai").context
    msgs = transcript("openai", 6)
    start = kept_start(msgs, d, 1, 3)
    mark = WindowMark(start, transcript_digest(msgs, start))
    if change == "compaction":
        new = [msgs[0], {"role": "user", "content": "SUMMARY of the work so far"}, *openai_round(9)]
    elif change == "edit":
        new = json.loads(json.dumps(transcript("openai", 7)))
        new[3]["content"] = "result 0, edited"
    else:
        new = [msgs[0], {"role": "user", "content": "A NEW TASK"}]
    plan = plan_window(new, d, marks(mark))
    assert plan.reason == "changed" and plan.start == 1  # after the system message
    assert plan.exchanges == len(exchange_starts(new, d, 1))
    out = sent("openai", build_window(d, body_of("openai", new), plan, [], {"k": 1}))
    text = json.dumps(out)
    results = [m.get("tool_call_id") for m in out if m["role"] == "tool"]
    if change == "compaction":
        assert results == ["c9"]
        assert text.count("SUMMARY") == 1
    elif change == "edit":  # the whole edited transcript, in order, once
        assert results == [f"c{k}" for k in range(7)]
        assert text.count("result 0, edited") == 1
    else:
        assert text.count("A NEW TASK") == 1 and "result" not in text
    assert '{\\"k\\":1}' in text or '{"k":1}' in text  # the state as it is


def claude_code_after_compact() -> list[dict[str, Any]]:
    """The transcript Claude Code 2.1.332 sends on the run after ``claude -p /compact``
    (recorded in the agents tier, texts shortened): its summary as the first user message, an
    empty system message, the last reply before the compaction, the files it read again as
    user messages, then the new prompt joined to the command's caveat, and a system message."""
    return [
        {
            "role": "user",
            "content": [{"type": "text", "text": "This session is being continued. SUMMARY"}],
        },
        {"role": "system", "content": [], "output_config": {"effort": "medium"}},
        {"role": "assistant", "content": [{"type": "text", "text": "KEPT REPLY"}]},
        {"role": "user", "content": "<system-reminder>Called the Read tool: READ AGAIN"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>Result of calling the Read tool"},
                {"type": "text", "text": "<command-name>/compact</command-name>"},
                {"type": "text", "text": "NEW PROMPT"},
            ],
        },
        {"role": "system", "content": [{"type": "text", "text": "DEFERRED TOOLS"}]},
    ]


def test_claude_code_compact_sends_its_whole_new_transcript_once_in_order() -> None:
    d = get_dialect("anthropic").context
    before = [*transcript("anthropic", 6), {"role": "user", "content": "next"}]
    start = kept_start(before, d, 0, 1)
    assert start > 0  # a checkpoint restarted the window
    mark = WindowMark(start, transcript_digest(before, start))
    after = claude_code_after_compact()
    plan = plan_window(after, d, marks(mark))
    assert plan.reason == "changed" and plan.start == 0
    out = sent("anthropic", build_window(d, body_of("anthropic", after), plan, [], {"k": 1}))
    text = json.dumps(out)
    order = ["SUMMARY", "STATE", "KEPT REPLY", "READ AGAIN", "NEW PROMPT", "DEFERRED TOOLS"]
    assert all(text.count(t) == 1 for t in order if t != "STATE")  # none twice, none lost
    positions = [text.index(t) for t in order]
    assert positions == sorted(positions)  # in the client's order, the state before them
    assert "result" not in text  # nothing of the transcript before the compaction
    assert out[1:] == after[1:]  # verbatim after the summary's turn


@pytest.mark.parametrize("dialect", list(TRANSCRIPTS))
def test_checkpoint_instruction_follows_the_latest_observation(dialect: str) -> None:
    d = get_dialect(dialect).context
    msgs = transcript(dialect, 3)
    plan = plan_window(msgs, d, None)
    window = build_window(d, body_of(dialect, msgs), plan, [], {})
    asked = with_checkpoint(d, window)
    before, after = sent(dialect, window), sent(dialect, asked)
    assert CHECKPOINT_MARK not in json.dumps(before)
    assert CHECKPOINT_MARK in json.dumps(after[-1])
    if dialect == "anthropic":  # joined to the last user turn: roles keep alternating
        assert len(after) == len(before)
        assert after[-1]["content"][: len(before[-1]["content"])] == before[-1]["content"]
        assert after[:-1] == before[:-1]
    else:
        assert after[: len(before)] == before


@pytest.mark.parametrize("kind", ["text", "input_text", "output_text"])
def test_the_digest_reads_a_one_text_block_content_as_its_string(kind: str) -> None:
    as_text = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    as_blocks = [
        {"role": "user", "content": [{"type": kind, "text": "hello"}]},
        {
            "role": "assistant",
            "content": [{"type": kind, "text": "hi", "annotations": [], "cache_control": {}}],
        },
    ]
    assert transcript_digest(as_text, 2) == transcript_digest(as_blocks, 2)
    # What the message says still counts: another text, two blocks, a block with more.
    other = [as_text[0], {"role": "assistant", "content": "hi!"}]
    two = [as_text[0], {"role": "assistant", "content": [{"type": kind, "text": "h"}] * 2}]
    block = {"type": kind, "text": "hi", "citations": [{"url": "u"}]}
    cited = [as_text[0], {"role": "assistant", "content": [block]}]
    image = [as_text[0], {"role": "assistant", "content": [{"type": "image", "text": "hi"}]}]
    for changed in (other, two, cited, image):
        assert transcript_digest(changed, 2) != transcript_digest(as_text, 2)
    # A tool result's content too (Anthropic's tool_result block).
    result = {"type": "tool_result", "tool_use_id": "t", "content": "out"}
    blocks = {**result, "content": [{"type": "text", "text": "out"}]}
    one = [{"role": "user", "content": [result]}]
    assert transcript_digest(one, 1) == transcript_digest(
        [{"role": "user", "content": [blocks]}], 1
    )


def test_the_digest_reads_a_null_member_as_one_left_out_but_not_inside_values() -> None:
    """On a message and its parts a member sent as ``null`` (an SDK's ``model_dump()``) is
    the member left out (``exclude_none``), and a Responses item's ``"type": "message"`` is
    the API's default; inside a value (a tool call's input, an action) ``null`` is a value."""
    typed = [
        {
            "type": "message",
            "id": None,
            "role": "user",
            "content": [{"type": "input_text", "text": "a", "logprobs": None}],
            "status": None,
        },
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "id": None},
        {
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "x", "annotations": [], "logprobs": []},
                {"type": "output_text", "text": "y", "logprobs": None},
            ],
        },
    ]
    plain = [
        {"role": "user", "content": [{"type": "input_text", "text": "a"}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "x"}, {"type": "output_text", "text": "y"}],
        },
    ]
    assert transcript_digest(typed, 3) == transcript_digest(plain, 3)
    # Another item type, a member with a value, a null inside a value: another message.
    reasoning = [{**plain[0], "type": "reasoning"}, *plain[1:]]
    assert transcript_digest(reasoning, 3) != transcript_digest(plain, 3)
    with_id = [{**plain[0], "id": "msg_1"}, *plain[1:]]
    assert transcript_digest(with_id, 3) != transcript_digest(plain, 3)
    use = {"type": "tool_use", "id": "t", "name": "edit", "input": {"path": "a"}}
    nulled = {**use, "input": {"path": "a", "old": None}}
    assert transcript_digest([{"role": "assistant", "content": [use]}], 1) != transcript_digest(
        [{"role": "assistant", "content": [nulled]}], 1
    )
    action = {"type": "computer_call", "call_id": "c", "action": {"type": "click", "x": None}}
    bare = {**action, "action": {"type": "click"}}
    assert transcript_digest([action], 1) != transcript_digest([bare], 1)


def test_the_digest_reads_content_as_one_text_only_on_messages_and_parts() -> None:
    """A ``content`` member inside a value (a tool call's input) is free JSON: a list of one
    text block there is not the same input as its string, so editing it is a change."""
    listed = {"content": [{"type": "text", "text": "x"}]}
    use = {"type": "tool_use", "id": "t", "name": "write", "input": listed}
    as_string = {**use, "input": {"content": "x"}}
    assert transcript_digest([{"role": "assistant", "content": [use]}], 1) != transcript_digest(
        [{"role": "assistant", "content": [as_string]}], 1
    )
    call = {"type": "computer_call", "call_id": "c", "action": {"type": "type", **listed}}
    plain = {**call, "action": {"type": "type", "content": "x"}}
    assert transcript_digest([call], 1) != transcript_digest([plain], 1)
    # a tool result's content (a part's member) is still read as its one text
    result = {"type": "tool_result", "tool_use_id": "t", **listed}
    bare = {**result, "content": "x"}
    assert transcript_digest([{"role": "user", "content": [result]}], 1) == transcript_digest(
        [{"role": "user", "content": [bare]}], 1
    )


def test_kept_exchanges_are_the_ranges_from_kept_start_oldest_first() -> None:
    d = get_dialect("openai").context
    msgs = transcript("openai", 5)  # system, task, then 5 rounds of 2 messages
    assert kept_exchanges(msgs, d, 2, 3) == [(6, 8), (8, 10), (10, 12)]
    assert kept_exchanges(msgs, d, 2, 1) == [(10, 12)]
    assert kept_exchanges(msgs, d, 8, 3) == [(8, 10), (10, 12)]  # no more than 3: all


@pytest.mark.parametrize("dialect", list(TRANSCRIPTS))
def test_a_transcript_that_ends_at_the_mark_is_a_changed_one(dialect: str) -> None:
    """A rewind to an earlier request whose transcript ends where the window starts: its
    digest matches, but a window from there would send none of it."""
    d = get_dialect(dialect).context
    msgs = transcript(dialect, 6)
    start = kept_start(msgs, d, 1, 2)
    mark = WindowMark(start, transcript_digest(msgs, start))
    rewound = msgs[:start]
    plan = plan_window(rewound, d, marks(mark))
    assert plan.reason == "changed"
    text = json.dumps(sent(dialect, build_window(d, body_of(dialect, rewound), plan, [], {})))
    assert all(text.count(f"result {k}") == 1 for k in range(4))  # its latest result too
    assert plan_window(msgs[: start + 1], d, marks(mark)).reason == "kept"  # one more: it holds
    head = TRANSCRIPTS[dialect][0]  # ends with the task, which the prefix carries
    at_task = WindowMark(len(head), transcript_digest(head, len(head)))
    assert plan_window(head, d, marks(at_task)).reason == "kept"


GREETING = {
    "openai": {"role": "assistant", "content": "Hello! What should I do?"},
    "anthropic": {"role": "assistant", "content": "Hello! What should I do?"},
    "openai-responses": {
        "type": "message",
        "role": "assistant",
        "content": "Hello! What should I do?",
    },
}


def said(dialect: str, role: str, text: str) -> dict[str, Any]:
    if dialect == "openai-responses":
        return {"type": "message", "role": role, "content": text}
    return {"role": role, "content": text}


def texts(dialect: str, messages: list[Any]) -> list[tuple[str, str]]:
    """(role, text) of each message, its text blocks joined."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(b.get("text", "") for b in content if isinstance(b, dict))
        out.append((m.get("role", ""), content or ""))
    return out


@pytest.mark.parametrize("dialect", list(TRANSCRIPTS))
def test_a_greeting_before_the_task_stays_before_it(dialect: str) -> None:
    """A chat that opens with the assistant's greeting: the window keeps the client's order
    (the task is not moved before the greeting: on Anthropic the turn would then end with
    an assistant message, a prefill), and stays append-only."""
    d = get_dialect(dialect).context
    msgs = [GREETING[dialect], said(dialect, "user", "TASK")]
    mark = None
    previous: list[Any] | None = None
    for turn in range(3):
        plan = plan_window(msgs, d, marks(mark))
        mark = plan.mark(msgs)
        out = sent(dialect, build_window(d, body_of(dialect, msgs), plan, [], {"k": 1}))
        got = texts(dialect, out)
        order = [t for _, t in got]
        assert got[-1][0] == "user"  # the client's latest message last, no prefill
        joined = json.dumps(order)
        assert joined.count("TASK") == 1 and joined.index("Hello!") < joined.index("TASK")
        roles = [r for r, _ in got]
        assert all(a != b for a, b in pairwise(roles))  # alternating
        if previous is not None:
            assert out[: len(previous)] == previous  # append-only
        previous = out
        msgs = [*msgs, said(dialect, "assistant", f"answer {turn}"), said(dialect, "user", "more")]
    assert prefix_task(plan.split, plan.start, msgs, d) is None


def test_the_task_goes_in_the_prefix_after_system_text_only() -> None:
    d = get_dialect("openai").context
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "TASK"}]
    plan = plan_window(msgs, d, None)
    assert prefix_task(plan.split, plan.start, msgs, d) == 1
    assert prefix_task(plan.split, 3, [*msgs, *openai_round(0)], d) == 1  # a later window


def test_no_exchange_starts_between_a_call_and_its_output() -> None:
    """A Responses input with a user message between a call and its output: a window that
    started at that message would send the output without its call (a 400 on every turn
    after, the mark never moving)."""
    d = get_dialect("openai-responses").context
    msgs = [
        {"type": "message", "role": "user", "content": "TASK"},  # 0
        *responses_round(0),  # 1 2 3
        {"type": "reasoning", "id": "rs1", "summary": []},  # 4
        {"type": "function_call", "call_id": "c1", "name": "run", "arguments": "{}"},  # 5
        said("openai-responses", "user", "also check the tests"),  # 6
        {"type": "function_call_output", "call_id": "c1", "output": "result 1"},  # 7
        *responses_round(2),  # 8 9 10
    ]
    assert exchange_starts(msgs, d) == [0, 4, 8]
    start = kept_start(msgs, d, 0, 2)
    assert start == 4
    mark = WindowMark(start, transcript_digest(msgs, start))
    later = [*msgs, *responses_round(3)]
    plan = plan_window(later, d, marks(mark))
    body = body_of("openai-responses", later)
    out = sent("openai-responses", build_window(d, body, plan, [], {}))
    ids = [m.get("call_id") for m in out if "call_id" in m]
    assert ids == ["c1", "c1", "c2", "c2", "c3", "c3"]
