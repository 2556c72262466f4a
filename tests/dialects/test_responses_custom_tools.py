"""Custom tools (free-text input under an optional grammar: Codex's ``apply_patch``) between
a Responses client and a chat-completions upstream, both ways: the tool, its calls and their
outputs, the named tool_choice, and a reply's custom calls as JSON and as a stream. Shapes as
the openai SDK 3.57 types give them (chat: ChatCompletionCustomToolParam,
ChatCompletionMessageCustomToolCall, ChatCompletionNamedToolChoiceCustomParam; Responses:
CustomTool, ResponseCustomToolCall, ResponseCustomToolCallInput{Delta,Done}Event)."""

from __future__ import annotations

from typing import Any

import orjson
from openai.types.chat import ChatCompletion
from openai.types.responses import Response, ResponseCustomToolCall, ResponseStreamEvent
from pydantic import TypeAdapter

from skillstate.cost.baseline import tool_call_chars
from skillstate.dialects import sse
from skillstate.dialects.openai import OPENAI
from skillstate.dialects.registry import make_relay, reply_for, request_for
from skillstate.dialects.responses.translate import split_tools, untranslated_items
from tests.helpers import APPLY_PATCH, CHAT_PATCH_FORMAT

PATCH = "*** Begin Patch\n*** Add File: a.txt\n+hello\n*** End Patch\n"
SHELL = {"type": "function", "name": "shell", "parameters": {"type": "object"}}
TRANSCRIPT: list[dict[str, Any]] = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "add a.txt"}]},
    {"type": "custom_tool_call", "call_id": "call_p1", "name": "apply_patch", "input": PATCH,
     "id": "ctc_1", "status": "completed"},
    {"type": "function_call", "call_id": "call_s1", "name": "shell", "arguments": "{}"},
    {"type": "custom_tool_call_output", "call_id": "call_p1", "output": "Success. A a.txt"},
    {"type": "function_call_output", "call_id": "call_s1", "output": "a.txt"},
]  # fmt: skip


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "gpt-5", "input": TRANSCRIPT, "tools": [APPLY_PATCH, SHELL], **extra}


def test_a_custom_tool_goes_to_chat_in_chats_shape_with_its_grammar_nested() -> None:
    chat = request_for("openai-responses", "openai", body())
    assert chat["tools"][0] == {
        "type": "custom",
        "custom": {
            "name": "apply_patch",
            "description": "Use the `apply_patch` tool to edit files.",
            "format": CHAT_PATCH_FORMAT,
        },
    }
    assert chat["tools"][1]["function"]["name"] == "shell"
    text = {**APPLY_PATCH, "format": {"type": "text"}}
    plain = {"type": "custom", "name": "note"}  # no format: unconstrained text
    kept, dropped = split_tools([text, plain])
    assert [t["custom"] for t in kept] == [
        {"name": "apply_patch", "description": APPLY_PATCH["description"],
         "format": {"type": "text"}},
        {"name": "note"},
    ]  # fmt: skip
    assert dropped == []


def test_custom_calls_and_outputs_become_a_paired_tool_calls_message() -> None:
    chat = request_for("openai-responses", "openai", body())
    assert chat["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_p1", "type": "custom",
             "custom": {"name": "apply_patch", "input": PATCH}},
            {"id": "call_s1", "type": "function",
             "function": {"name": "shell", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "call_p1", "content": "Success. A a.txt"},
        {"role": "tool", "tool_call_id": "call_s1", "content": "a.txt"},
    ]  # fmt: skip
    assert untranslated_items(TRANSCRIPT) == []


def test_a_named_custom_tool_choice_is_chats_nested_one() -> None:
    choice = {"type": "custom", "name": "apply_patch"}
    chat = request_for("openai-responses", "openai", body(tool_choice=choice))
    assert chat["tool_choice"] == {"type": "custom", "custom": {"name": "apply_patch"}}


def test_an_anthropic_upstream_gets_no_custom_tool_call_or_output() -> None:
    """Messages has no free-text tool: the custom tool, its calls and outputs stay out (and
    are named), the function tool and its pair go; a forced custom choice falls to auto."""
    sent = request_for(
        "openai-responses", "anthropic", body(tool_choice={"type": "custom", "name": "apply_patch"})
    )
    assert [t["name"] for t in sent["tools"]] == ["shell"]
    assert sent["tool_choice"] == {"type": "auto"}
    assert "apply_patch" not in orjson.dumps(sent["messages"]).decode()
    assert sent["messages"][0]["content"] == "add a.txt"
    assert [b["type"] for m in sent["messages"][1:] for b in m["content"]] == [
        "tool_use", "tool_result"
    ]  # fmt: skip
    assert split_tools([APPLY_PATCH, SHELL], custom=False)[1] == ["apply_patch"]
    assert untranslated_items(TRANSCRIPT, custom=False) == [
        "custom_tool_call",
        "custom_tool_call_output",
    ]


def chat_reply(calls: list[dict[str, Any]], content: str | None = None) -> dict[str, Any]:
    reply = {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-5",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None,
                     "message": {"role": "assistant", "content": content, "tool_calls": calls}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }  # fmt: skip
    ChatCompletion.model_validate(reply)  # the SDK's own reading of it
    return reply


def test_a_chat_reply_custom_call_is_a_custom_tool_call_item() -> None:
    call = {"id": "call_9", "type": "custom", "custom": {"name": "apply_patch", "input": PATCH}}
    fn = {"id": "call_8", "type": "function", "function": {"name": "shell", "arguments": "{}"}}
    resp = Response.model_validate(
        reply_for("openai-responses", "openai", chat_reply([call, fn], "Patching."), "gpt-5")
    )
    assert [o.type for o in resp.output] == ["message", "custom_tool_call", "function_call"]
    item = resp.output[1]
    assert isinstance(item, ResponseCustomToolCall)
    assert (item.call_id, item.name, item.input) == ("call_9", "apply_patch", PATCH)
    assert item.id is not None and item.id.startswith("ctc_")


def stream_events(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat chunks through the Responses bridge's relay; the client's events, parsed."""
    relay = make_relay(
        "openai-responses", "openai", request_model="gpt-5", client_wants_usage=True,
        capture_limit=1 << 20,
    )  # fmt: skip
    parser = sse.SSEParser()
    raw = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    out = [b for e in parser.feed(raw) for b in relay.feed(e)] + relay.finish()
    assert relay.has_tool_calls
    events = [orjson.loads(e.data) for e in sse.SSEParser().feed(b"".join(out))]
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    for e in events:
        adapter.validate_python(e)  # every event one the SDK's union reads
    return events


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-5",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }  # fmt: skip


def custom_stream(continuation: dict[str, Any]) -> list[dict[str, Any]]:
    head = {"index": 0, "id": "call_7", "type": "custom",
            "custom": {"name": "apply_patch", "input": ""}}  # fmt: skip
    pieces = [PATCH[:10], PATCH[10:30], PATCH[30:]]
    return [
        chunk({"role": "assistant", "content": None, "tool_calls": [head]}),
        *(chunk({"tool_calls": [{**continuation, "custom": {"input": p}}]}) for p in pieces),
        chunk({}, "tool_calls"),
    ]


def test_a_streamed_custom_call_is_the_responses_custom_tool_call_events() -> None:
    events = stream_events(custom_stream({"index": 0}))
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added",
        *["response.custom_tool_call_input.delta"] * 3,
        "response.custom_tool_call_input.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    added, done = events[2]["item"], events[-2]["item"]
    assert added["type"] == "custom_tool_call" and added["input"] == ""
    assert added["status"] == "in_progress" and added["call_id"] == "call_7"
    item_id = added["id"]
    deltas = [e for e in events if e["type"] == "response.custom_tool_call_input.delta"]
    assert {(e["item_id"], e["output_index"]) for e in deltas} == {(item_id, 0)}
    assert "".join(e["delta"] for e in deltas) == PATCH
    assert events[-3]["input"] == PATCH and events[-3]["item_id"] == item_id
    assert done == {**added, "status": "completed", "input": PATCH}
    final = Response.model_validate(events[-1]["response"])
    assert isinstance(final.output[0], ResponseCustomToolCall) and final.output[0].input == PATCH


def test_continuation_pieces_with_null_members_still_feed_the_custom_call() -> None:
    """A gateway's pieces name every member, the others null (llm-rosetta #488, Codex through
    a chat endpoint): ``{"index": 0, "id": null, "type": null, "function": null, "custom":
    {"input": ...}}``."""
    nulls = {"index": 0, "id": None, "type": None, "function": None}
    events = stream_events(custom_stream(nulls))
    assert events[-2]["item"]["input"] == PATCH and events[-2]["item"]["call_id"] == "call_7"


def test_a_function_call_beside_an_echoed_empty_custom_stays_a_function_call() -> None:
    """Some gateways echo ``custom: {}`` on function calls' pieces: an empty custom object
    says nothing, the call is the function call its ``function`` member says."""
    head = {"index": 0, "id": "call_1", "function": {"name": "shell", "arguments": ""},
            "custom": {}}  # fmt: skip
    events = stream_events([
        chunk({"tool_calls": [head]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}, "custom": {}}]}),
        chunk({}, "tool_calls"),
    ])  # fmt: skip
    assert events[-2]["item"]["type"] == "function_call"
    assert events[-2]["item"]["arguments"] == "{}"


def test_a_chat_replys_custom_calls_count_as_what_the_reply_said() -> None:
    """The envelope's share of a chat reply (state mode's baseline) counts a custom call's
    name and input as a function call's name and arguments, JSON and streamed."""
    call = {"id": "call_9", "type": "custom", "custom": {"name": "apply_patch", "input": PATCH}}
    assert tool_call_chars("openai", chat_reply([call])) == len("apply_patch") + len(PATCH)
    stripper = OPENAI.stream_stripper()
    pieces = custom_stream({"index": 0})
    counted = sum(stripper.tool_chars(None, c) for c in pieces)
    assert counted == len("apply_patch") + len(PATCH)
