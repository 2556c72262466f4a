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
from tests.dialects.test_dialects_translate import chunk, tc_delta
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


# -- translation fidelity: unanswered calls, cut-off replies, refusals, text joins ----------


def call_item(call_id: str, kind: str = "function_call") -> dict[str, Any]:
    if kind == "custom_tool_call":
        return {"type": kind, "call_id": call_id, "name": "apply_patch", "input": "x"}
    return {"type": kind, "call_id": call_id, "name": "f", "arguments": "{}"}


def output_item(call_id: str, kind: str = "function_call_output") -> dict[str, Any]:
    return {"type": kind, "call_id": call_id, "output": "ok"}


ASK = {"type": "message", "role": "user", "content": "go"}


@pytest.mark.parametrize("upstream", ["openai", "anthropic"])
@pytest.mark.parametrize(
    "items",
    [
        [ASK, call_item("call_1")],  # the call last, as a client that dropped its output
        [ASK, call_item("call_9"), call_item("call_1"), output_item("call_9"), ASK],
    ],
)
def test_a_call_no_output_answers_is_the_apis_400_before_sending(
    upstream: str, items: list[dict[str, Any]]
) -> None:
    """The Responses API refuses it ("No tool output found for function call call_1.",
    ``param: input``); translated it was a trailing (or unanswered) assistant tool call,
    which Messages refuses ("tool_use ids were found without tool_result blocks") and chat
    completions too, in words a Responses client does not expect."""
    from skillstate.dialects.registry import request_for
    from skillstate.errors import ProxyError

    with pytest.raises(ProxyError) as e:
        request_for("openai-responses", upstream, {"model": "m", "input": items})
    assert (e.value.status, e.value.param) == (400, "input")
    assert e.value.message == "No tool output found for function call call_1."


def test_a_custom_call_no_output_answers_is_a_400_where_it_is_sent() -> None:
    """A chat upstream is sent custom tool calls: one left unanswered is the API's 400 in
    its words; an Anthropic upstream is sent none (they are dropped, and named), so there it
    is no fault."""
    from skillstate.dialects.registry import request_for
    from skillstate.errors import ProxyError

    body = {"model": "m", "input": [ASK, call_item("call_p", "custom_tool_call")]}
    with pytest.raises(ProxyError, match=r"^No tool output found for custom tool call call_p\.$"):
        request_for("openai-responses", "openai", body)
    sent = request_for("openai-responses", "anthropic", body)
    assert sent["messages"] == [{"role": "user", "content": "go"}]


def test_a_message_between_calls_and_their_outputs_follows_the_outputs() -> None:
    """The API takes a message between a call and its output (a user typing while a tool
    runs); chat completions takes a tool message only right after its call, and Messages a
    tool_result only at the start of the next user turn: the message follows the round's
    outputs (and the images they returned), which the upstreams take. Nothing is refused:
    every call is answered, in any order."""
    from skillstate.dialects.registry import request_for

    items = [ASK, call_item("c1"), call_item("c2"), ASK, output_item("c2"), output_item("c1")]
    chat = responses_request_to_chat({"model": "m", "input": items})
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant", "tool", "tool", "user"]
    sent = request_for("openai-responses", "anthropic", {"model": "m", "input": items})
    assert [b["type"] for b in sent["messages"][2]["content"]] == [
        "tool_result",
        "tool_result",
        "text",
    ]
    shot = {"type": "input_image", "image_url": "data:image/png;base64,AA"}
    items = [ASK, call_item("c1"), ASK, {**output_item("c1"), "output": [shot]}]
    chat = responses_request_to_chat({"model": "m", "input": items})
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant", "tool", "user", "user"]
    assert chat["messages"][3]["content"][1]["type"] == "image_url"  # the round's media first
    assert chat["messages"][4] == {"role": "user", "content": "go"}


def sdk_validated(response: dict[str, Any]) -> dict[str, Any]:
    """``response`` as the openai SDK reads it (its ``Response`` type), back as a dict."""
    from openai.types.responses import Response

    return Response.model_validate(response).model_dump(exclude_none=True)


def chat_reply(finish: str, text: str | None = "One, two, thr", calls: int = 0) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"id": f"call_{k}", "type": "function", "function": {"name": "f", "arguments": "{"}}
            for k in range(calls)
        ]
    choice = {"index": 0, "message": message, "finish_reason": finish}
    return {"id": "c1", "object": "chat.completion", "model": "m", "choices": [choice]}


@pytest.mark.parametrize(
    ("finish", "reason"), [("length", "max_output_tokens"), ("content_filter", "content_filter")]
)
def test_a_reply_cut_off_is_an_incomplete_response_and_item(finish: str, reason: str) -> None:
    """The API marks the response ``incomplete`` with ``incomplete_details.reason`` and the
    item it was writing ``incomplete`` (before: the message item said ``completed``)."""
    from skillstate.dialects.responses.translate import chat_response_to_responses

    resp = sdk_validated(chat_response_to_responses(chat_reply(finish), "m"))
    assert (resp["status"], resp["incomplete_details"]) == ("incomplete", {"reason": reason})
    assert [(o["type"], o["status"]) for o in resp["output"]] == [("message", "incomplete")]
    # cut in its second call: the text and the first call were done
    resp = chat_response_to_responses(chat_reply(finish, calls=2), "m")
    assert [(o["type"], o["status"]) for o in resp["output"]] == [
        ("message", "completed"),
        ("function_call", "completed"),
        ("function_call", "incomplete"),
    ]
    whole = chat_response_to_responses(chat_reply("stop"), "m")
    assert (whole["status"], whole["output"][0]["status"]) == ("completed", "completed")


def test_an_anthropic_reply_at_max_tokens_is_incomplete_for_a_responses_client() -> None:
    from skillstate.dialects.registry import reply_for

    message = {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-m",
        "content": [{"type": "text", "text": "One, two, thr"}], "stop_reason": "max_tokens",
        "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 16},
    }  # fmt: skip
    resp = sdk_validated(reply_for("openai-responses", "anthropic", message, "claude-m"))
    assert (resp["status"], resp["incomplete_details"]) == (
        "incomplete",
        {"reason": "max_output_tokens"},
    )
    assert resp["output"][0]["status"] == "incomplete"


def validated_events(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Responses events a chat stream becomes, each read by the openai SDK's event type,
    numbered one after another."""
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    events = relayed(chunks)
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    for e in events:
        adapter.validate_python(e)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def test_a_streamed_reply_cut_off_ends_incomplete_with_its_item_incomplete() -> None:
    chunks = [chunk({"role": "assistant", "content": "One, two, thr"}), chunk({}, "length")]
    events = validated_events(chunks)
    (done,) = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done["status"] == "incomplete"
    assert events[-1]["type"] == "response.incomplete"
    final = sdk_validated(events[-1]["response"])
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [o["status"] for o in final["output"]] == ["incomplete"]
    # a call cut in its arguments: the text before it was done
    chunks = [chunk({"content": "Let me look."}), tc_delta(0, id="c1", name="f", args='{"p')]
    events = validated_events([*chunks, chunk({}, "length")])
    done_items = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [(i["type"], i["status"]) for i in done_items] == [
        ("message", "completed"),
        ("function_call", "incomplete"),
    ]
    assert [o["status"] for o in events[-1]["response"]["output"]] == ["completed", "incomplete"]


def test_a_chat_refusal_is_a_refusal_part_json_and_streamed() -> None:
    """A chat reply's ``refusal`` is the message item's ``refusal`` content part, as the
    Responses API gives a model's refusal (before: left out, an empty output); streamed,
    ``response.refusal.delta`` and ``.done`` events, as the API streams one."""
    from skillstate.dialects.responses.translate import chat_response_to_responses

    reply = chat_reply("stop", text=None)
    reply["choices"][0]["message"]["refusal"] = "I can't help with that."
    resp = sdk_validated(chat_response_to_responses(reply, "m"))
    assert resp["status"] == "completed"
    (item,) = resp["output"]
    assert (item["type"], item["status"]) == ("message", "completed")
    assert item["content"] == [{"type": "refusal", "refusal": "I can't help with that."}]
    chunks = [
        chunk({"role": "assistant", "content": None, "refusal": None}),
        chunk({"refusal": "I can't "}),
        chunk({"refusal": "help with that."}),
        chunk({}, "stop"),
    ]
    events = validated_events(chunks)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.refusal.delta",
        "response.refusal.delta",
        "response.refusal.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = next(e for e in events if e["type"] == "response.refusal.done")
    assert done["refusal"] == "I can't help with that."
    final = sdk_validated(events[-1]["response"])
    assert final["output"][0]["content"] == item["content"]


def test_text_and_refusal_are_two_parts_of_one_message() -> None:
    from skillstate.dialects.responses.translate import chat_response_to_responses

    reply = chat_reply("stop", text="Here is")
    reply["choices"][0]["message"]["refusal"] = "No."
    (item,) = chat_response_to_responses(reply, "m")["output"]
    assert [p["type"] for p in item["content"]] == ["output_text", "refusal"]
    events = validated_events([chunk({"content": "Here is"}), chunk({"refusal": "No."}),
                               chunk({}, "stop")])  # fmt: skip
    (done,) = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done["content"] == [
        {"type": "output_text", "text": "Here is", "annotations": [], "logprobs": []},
        {"type": "refusal", "refusal": "No."},
    ]


def text_parts(*texts: str, kind: str = "input_text") -> list[dict[str, Any]]:
    return [{"type": kind, "text": t} for t in texts]


def test_parts_joined_as_the_translations_join_them() -> None:
    """A system or developer message's parts apart by a blank line, a call output's one a
    line, an assistant's run together (one output), a user message's kept as parts, as
    ``translate`` joins them (before: every one run together, "ab")."""
    body = {
        "model": "m",
        "input": [
            {"type": "message", "role": "developer", "content": text_parts("a", "b")},
            {"type": "message", "role": "user", "content": text_parts("c", "d")},
            {"type": "message", "role": "assistant",
             "content": text_parts("e", "f", kind="output_text")},
            call_item("c1"),
            {"type": "function_call_output", "call_id": "c1", "output": text_parts("g", "h")},
        ],
    }  # fmt: skip
    messages = responses_request_to_chat(body)["messages"]
    assert messages[0] == {"role": "developer", "content": "a\n\nb"}
    assert messages[1] == {"role": "user", "content": text_parts("c", "d", kind="text")}
    assert messages[2]["content"] == "ef"
    assert messages[4] == {"role": "tool", "tool_call_id": "c1", "content": "g\nh"}
    one = {"model": "m", "input": [{"role": "user", "content": text_parts("c")}]}
    assert responses_request_to_chat(one)["messages"] == [{"role": "user", "content": "c"}]


def test_chat_parts_joined_as_the_translations_join_them_for_a_responses_upstream() -> None:
    from skillstate.dialects.registry import request_for

    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    body = {
        "model": "gpt-5-codex",
        "messages": [
            {"role": "system", "content": parts},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": parts},
            {"role": "developer", "content": parts},
        ],
    }
    sent = request_for("openai", "openai-responses", body)
    assert sent["instructions"] == "a\n\nb"
    assert sent["input"][2] == {"type": "function_call_output", "call_id": "c1", "output": "a\nb"}
    assert sent["input"][3] == {"type": "message", "role": "developer", "content": "a\n\nb"}
