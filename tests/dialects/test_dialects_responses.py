"""The Responses dialect's pure parts: the state-mode transcript layout and the request
translation to chat completions."""

from __future__ import annotations

from typing import Any

from openai.types.responses.input_token_count_params import InputTokenCountParams
from openai.types.responses.input_token_count_response import InputTokenCountResponse

from skillstate.dialects.responses import RESPONSES
from skillstate.dialects.responses.translate import responses_request_to_chat
from skillstate.engine.context import STATE_MARK, build_compact

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
