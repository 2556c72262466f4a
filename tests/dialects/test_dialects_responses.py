"""The Responses dialect's pure parts: the state-mode transcript layout and the request
translation to chat completions."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses.input_token_count_params import InputTokenCountParams
from openai.types.responses.input_token_count_response import InputTokenCountResponse

from skillstate.dialects.responses import RESPONSES
from skillstate.dialects.responses.translate import responses_request_to_chat
from skillstate.engine.context import STATE_MARK, build_compact
from tests.dialects.test_dialects_translate import tc_delta
from tests.helpers import PARALLEL_CALL_ORDERS, parallel_call_pieces

SYSTEM = {"type": "message", "role": "developer", "content": "rules"}
TASK = {"type": "message", "role": "user", "content": "the task"}
OLD = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "old"}]}


def fc(i: int) -> dict[str, Any]:
    return {"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"}


def out(i: int) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": f"c{i}", "output": str(i)}


def compact(items: list[Any]) -> list[Any]:
    body = {"model": "m", "input": items}
    result: list[Any] = build_compact(RESPONSES.context, body, ["notes"], {"notes": "n"})["input"]
    return result


def test_latest_observation_is_the_last_tool_round_with_parallel_calls() -> None:
    reasoning = {"type": "reasoning", "id": "rs", "summary": [], "encrypted_content": "x"}
    older = [fc(0), out(0), OLD, {"type": "message", "role": "user", "content": "more"}]
    round_ = [reasoning, fc(1), fc(2), out(1), out(2)]
    got = compact([SYSTEM, TASK, *older, *round_])
    assert got[:2] == [SYSTEM, TASK]
    assert STATE_MARK in got[2]["content"][0]["text"]
    assert got[3:] == round_  # every call with its output, the reasoning item untouched


def test_back_to_back_tool_rounds_keep_only_the_last() -> None:
    """Codex-style loops have no message between rounds: an output followed by a call (or
    reasoning) is the model's next turn, so earlier rounds are in the state, not resent."""
    r = [{"type": "reasoning", "id": f"rs{i}", "summary": [], "encrypted_content": str(i)}
         for i in range(3)]  # fmt: skip
    items = [
        SYSTEM,
        TASK,
        r[0],
        fc(0),
        out(0),
        r[1],
        fc(1),
        out(1),
        r[2],
        fc(2),
        fc(3),
        out(2),
        out(3),
    ]
    assert compact(items)[3:] == [r[2], fc(2), fc(3), out(2), out(3)]


def test_a_user_message_between_calls_and_their_outputs_stays_with_them() -> None:
    """The API takes a message between a call and its output (a user typing while a tool
    runs): the observation is the whole round, the message in its place, no output alone."""
    reasoning = {"type": "reasoning", "id": "rs", "summary": [], "encrypted_content": "x"}
    said = {"type": "message", "role": "user", "content": "also check the tests"}
    round_ = [reasoning, fc(1), fc(2), said, out(1), out(2)]
    assert compact([SYSTEM, TASK, fc(0), out(0), OLD, *round_])[3:] == round_


def test_latest_observation_is_the_last_user_message() -> None:
    last = {"type": "message", "role": "user", "content": "now this"}
    got = compact([SYSTEM, TASK, fc(0), out(0), OLD, last])
    assert got[0] == SYSTEM and got[1] == TASK and got[3:] == [last]


def test_request_translation_keeps_images_tool_choice_and_format() -> None:
    body = {
        "model": "m",
        "input": [
            {"role": "user", "content": [
                {"type": "input_text", "text": "what is this"},
                {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "low"},
            ]},
        ],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"},
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        "reasoning": {"effort": "low"},
        "max_output_tokens": 9,
    }  # fmt: skip
    chat = responses_request_to_chat(body, max_tokens_field="max_completion_tokens")
    assert chat["messages"][0]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AA", "detail": "low"},
    }
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert chat["response_format"]["json_schema"]["name"] == "x"
    assert chat["reasoning_effort"] == "low" and chat["max_completion_tokens"] == 9


def test_input_tokens_sends_the_fields_the_sdk_lists() -> None:
    """What a native count sends of a request: the openai SDK's InputTokenCountParams (the
    endpoint refuses any other field), and its answer's shape (InputTokenCountResponse)."""
    counting = RESPONSES.token_count
    assert counting is not None and counting.path == "/responses/input_tokens"
    assert counting.fields == set(InputTokenCountParams.__annotations__)
    answer = InputTokenCountResponse.model_validate(counting.answer(12))
    assert answer.object == "response.input_tokens" and answer.input_tokens == 12


def relayed(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A chat upstream's stream (its chunks) as the Responses events a client gets."""
    import orjson

    from skillstate.dialects import sse
    from skillstate.dialects.responses.stream import ChatToResponsesRelay

    relay = ChatToResponsesRelay(request_model="m", capture_limit=1 << 20)
    events = [e for c in chunks for e in sse.SSEParser().feed(sse.encode(c))]
    raw = b"".join(b for e in events for b in relay.feed(e))
    raw += b"".join(relay.finish())
    return [orjson.loads(e.data) for e in sse.SSEParser().feed(raw)]


@pytest.mark.parametrize("order", PARALLEL_CALL_ORDERS)
def test_a_chat_streams_parallel_calls_reach_a_responses_client_whole(order: str) -> None:
    """A server that names every call before their arguments (or interleaves them): each
    function_call item's done event carries all of its arguments (Codex runs a call from
    it), and items are added, filled and done in output order."""
    chunks = parallel_call_pieces(order, tc_delta)
    events = relayed(chunks)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [(i["name"], i["arguments"]) for i in done] == [
        ("f", '{"path": "/etc/hosts"}'),
        ("g", '{"n": 2}'),
    ]
    by_item: dict[int, list[str]] = {}
    for e in events:
        if "output_index" in e:
            by_item.setdefault(e["output_index"], []).append(e["type"])
    positions = [e["output_index"] for e in events if "output_index" in e]
    assert positions == sorted(positions)  # one item at a time, in output order
    for kinds in by_item.values():
        assert kinds[0] == "response.output_item.added"
        assert kinds[-1] == "response.output_item.done"
    deltas = {i: "".join(e["delta"] for e in events
                         if e["type"] == "response.function_call_arguments.delta"
                         and e["output_index"] == i) for i in by_item}  # fmt: skip
    assert deltas == {0: '{"path": "/etc/hosts"}', 1: '{"n": 2}'}
    (final,) = [e["response"] for e in events if e["type"] == "response.completed"]
    assert [o["arguments"] for o in final["output"]] == ['{"path": "/etc/hosts"}', '{"n": 2}']
