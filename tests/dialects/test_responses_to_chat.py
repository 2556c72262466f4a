"""Chat completions (and Messages, through it) -> an upstream of kind ``openai-responses``:
the request members the e2e tests (``tests/e2e/test_e2e_responses_upstream.py``) do not
reach, and the stream relay fed events a server may send that the fake provider does not
(done events without deltas, an in-band error, a response incomplete for its content)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from skillstate.dialects import sse
from skillstate.dialects.registry import make_relay, reply_for, request_for
from skillstate.errors import ProxyError


def to_responses(**body: Any) -> dict[str, Any]:
    body = {"model": "gpt-5-codex", "messages": [{"role": "user", "content": "hi"}], **body}
    return request_for("openai", "openai-responses", body)


def test_tools_and_choices_go_flat_with_strict_written() -> None:
    grammar = {"type": "grammar", "grammar": {"syntax": "lark", "definition": "start: /.+/"}}
    allowed = [
        {"type": "function", "function": {"name": "f"}},
        {"type": "custom", "custom": {"name": "patch"}},
    ]
    sent = to_responses(
        tools=[
            {"type": "function", "function": {"name": "f", "strict": True, "parameters": {}}},
            {"type": "function", "function": {"name": "g"}},
            {"type": "custom", "custom": {"name": "patch", "format": grammar}},
        ],
        tool_choice={
            "type": "allowed_tools",
            "allowed_tools": {"mode": "required", "tools": allowed},
        },
    )
    assert sent["tools"] == [
        {"type": "function", "name": "f", "parameters": {}, "strict": True},
        {"type": "function", "name": "g", "strict": False,
         "parameters": {"type": "object", "properties": {}}},
        {"type": "custom", "name": "patch",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
    ]  # fmt: skip
    assert sent["tool_choice"] == {
        "type": "allowed_tools",
        "mode": "required",
        "tools": [{"type": "function", "name": "f"}, {"type": "custom", "name": "patch"}],
    }
    custom_choice = {"type": "custom", "custom": {"name": "patch"}}
    assert to_responses(tool_choice=custom_choice)["tool_choice"] == {
        "type": "custom",
        "name": "patch",
    }
    assert to_responses(tool_choice="required")["tool_choice"] == "required"


def test_members_under_their_responses_names_and_what_is_dropped() -> None:
    sent = to_responses(
        messages=[
            {"role": "system", "content": [{"type": "text", "text": "Rules."}]},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "refusal": "No."},
            {"role": "developer", "content": "Later note."},
            {"role": "user", "content": [{"type": "file", "file": {"file_id": "file-1"}}]},
        ],
        response_format={"type": "json_object"},
        verbosity="low",
        store=True,
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False},
        seed=7,
        frequency_penalty=0.5,
        logprobs=True,
        max_tokens=100,
    )
    assert sent["instructions"] == "Rules."
    assert sent["input"] == [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "refusal", "refusal": "No."}]},
        {"type": "message", "role": "developer", "content": "Later note."},
        {"type": "message", "role": "user",
         "content": [{"type": "input_file", "file_id": "file-1"}]},
    ]  # fmt: skip
    assert sent["text"] == {"format": {"type": "json_object"}, "verbosity": "low"}
    assert sent["store"] is True and sent["stream"] is True and sent["max_output_tokens"] == 100
    assert sent["stream_options"] == {"include_obfuscation": False}
    assert sent["include"] == ["message.output_text.logprobs"] and "top_logprobs" not in sent
    assert not {"seed", "frequency_penalty", "logprobs", "max_tokens", "messages"} & set(sent)


@pytest.mark.parametrize(
    ("member", "value", "param"),
    [
        ("functions", [{"name": "f"}], None),
        ("web_search_options", {}, "web_search_options"),
        ("audio", {"voice": "alloy", "format": "wav"}, "audio"),
    ],
)
def test_what_has_no_responses_form_is_refused(member: str, value: Any, param: str | None) -> None:
    with pytest.raises(ProxyError) as e:
        to_responses(**{member: value})
    assert e.value.status == 400 and e.value.param == param


TOKEN = {"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": []}


def test_logprobs_are_asked_for_and_come_back_as_chats() -> None:
    """``logprobs`` / ``top_logprobs`` as the Responses API asks for them; the entries of
    an output_text part (JSON) and of a text delta (stream) as chat's ``logprobs.content``
    (the same members in both APIs)."""
    sent = to_responses(logprobs=True, top_logprobs=2)
    assert sent["include"] == ["message.output_text.logprobs"] and sent["top_logprobs"] == 2
    part = {"type": "output_text", "text": "Hi", "annotations": [], "logprobs": [TOKEN]}
    resp = {**RESPONSE, "status": "completed", "output": [{"type": "message", "content": [part]}]}
    reply = reply_for("openai", "openai-responses", resp, "m")
    assert reply["choices"][0]["logprobs"] == {"content": [TOKEN], "refusal": None}
    no_logprobs = {**resp, "output": [{"type": "message", "content": [{**part, "logprobs": []}]}]}
    assert (
        reply_for("openai", "openai-responses", no_logprobs, "m")["choices"][0]["logprobs"] is None
    )
    delta = {"type": "response.output_text.delta", "output_index": 0, "content_index": 0,
             "delta": "Hi", "logprobs": [TOKEN]}  # fmt: skip
    chunks = feed(chat_relay(), [{"type": "response.created", "response": RESPONSE}, delta])
    assert chunks[-1]["choices"][0]["logprobs"] == {"content": [TOKEN], "refusal": None}  # type: ignore[index]


@pytest.mark.parametrize(("effort", "sent"), [("low", "low"), ("xhigh", "xhigh"), ("max", "xhigh")])
def test_a_messages_effort_is_the_responses_reasoning_effort(effort: str, sent: str) -> None:
    body = {
        "model": "gpt-5-codex",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
        "output_config": {"effort": effort},
        "thinking": {"type": "enabled", "budget_tokens": 2048},
    }
    assert request_for("anthropic", "openai-responses", body)["reasoning"] == {"effort": sent}
    body.pop("output_config")  # thinking's token budget alone is no effort level
    assert "reasoning" not in request_for("anthropic", "openai-responses", body)


def test_an_empty_stop_and_a_single_choice_are_no_trouble() -> None:
    assert "stop" not in to_responses(stop=[], n=1)


def feed(relay: Any, events: list[dict[str, Any]]) -> list[dict[str, Any] | str]:
    """The chat chunks the relay sends for ``events``, then for its finish."""
    raw = b"".join(sse.encode(e, event=e["type"]) for e in events)
    out = [b for ev in sse.SSEParser().feed(raw) for b in relay.feed(ev)]
    if relay.complete:
        out += relay.finish()
    parsed = sse.SSEParser().feed(b"".join(out))
    return [e.data if e.data == "[DONE]" else json.loads(e.data) for e in parsed]


def chat_relay(include_usage: bool = False) -> Any:
    return make_relay(
        "openai",
        "openai-responses",
        request_model="m",
        client_wants_usage=include_usage,
        capture_limit=1 << 20,
    )


RESPONSE = {"id": "resp_1", "model": "gpt-5-codex", "created_at": 7, "status": "in_progress"}
USAGE = {
    "input_tokens": 10,
    "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
    "output_tokens": 5,
    "output_tokens_details": {"reasoning_tokens": 2},
    "total_tokens": 15,
}


def test_done_events_without_deltas_still_say_everything() -> None:
    """A server that streams no deltas (only each item's done events): the text and the
    call's arguments reach the client once, from the done events."""
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f"}
    chunks = feed(
        chat_relay(include_usage=True),
        [
            {"type": "response.created", "response": RESPONSE},
            {"type": "response.output_text.delta", "output_index": 0, "content_index": 0,
             "item_id": "msg_1", "delta": "Hel"},
            {"type": "response.output_text.done", "output_index": 0, "content_index": 0,
             "item_id": "msg_1", "text": "Hello."},
            {"type": "response.output_item.added", "output_index": 1,
             "item": {**call, "arguments": ""}},
            {"type": "response.output_item.done", "output_index": 1,
             "item": {**call, "arguments": '{"a":1}'}},
            {"type": "response.completed",
             "response": {**RESPONSE, "status": "completed", "usage": USAGE}},
        ],
    )  # fmt: skip
    deltas = [c["choices"][0]["delta"] for c in chunks if isinstance(c, dict) and c["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == "Hello."
    pieces = [t for d in deltas for t in d.get("tool_calls") or ()]
    assert pieces[0] == {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": ""},
    }
    assert "".join(p["function"]["arguments"] for p in pieces) == '{"a":1}'
    assert chunks[-3]["choices"][0]["finish_reason"] == "tool_calls"  # type: ignore[index]
    assert chunks[-2]["usage"] == {  # type: ignore[index]
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 4},
        "completion_tokens_details": {"reasoning_tokens": 2},
    }
    assert chunks[-1] == "[DONE]"
    assert all(c["id"] == "chatcmpl-resp_1" for c in chunks if isinstance(c, dict))


def test_items_sent_only_when_done_say_everything_once() -> None:
    """A server that sends each item only in its ``response.output_item.done`` (no added
    event, no deltas; items without ids, as Codex's SSE fixtures have them): the message's
    text and refusal and each call reach the client, each call under its own index."""
    text = {"type": "output_text", "text": "Hi."}
    calls = [
        {"type": "function_call", "call_id": f"call_{k}", "name": "f", "arguments": f'{{"k":{k}}}'}
        for k in (1, 2)
    ]
    message = {"type": "message", "role": "assistant", "content": [text]}
    refused = {**message, "content": [{"type": "refusal", "refusal": "No."}]}
    items = [message, refused, *calls]
    chunks = feed(
        chat_relay(),
        [
            *({"type": "response.output_item.done", "output_index": i, "item": item}
              for i, item in enumerate(items)),
            {"type": "response.completed", "response": {**RESPONSE, "status": "completed"}},
        ],
    )  # fmt: skip
    deltas = [c["choices"][0]["delta"] for c in chunks if isinstance(c, dict) and c["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == "Hi."
    assert "".join(d.get("refusal") or "" for d in deltas) == "No."
    pieces = [t for d in deltas for t in d.get("tool_calls") or ()]
    said: dict[int, str] = {}
    for p in pieces:
        said[p["index"]] = said.get(p["index"], "") + p["function"]["arguments"]
    assert said == {0: '{"k":1}', 1: '{"k":2}'}
    assert [p["id"] for p in pieces if "id" in p] == ["call_1", "call_2"]


def test_a_response_cut_for_its_content_finishes_with_content_filter() -> None:
    relay = chat_relay()
    done = {**RESPONSE, "status": "incomplete", "usage": USAGE}
    done["incomplete_details"] = {"reason": "content_filter"}
    chunks = feed(relay, [{"type": "response.incomplete", "response": done}])
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}  # type: ignore[index]
    last = chunks[-2]["choices"][0]  # type: ignore[index]
    assert last == {"index": 0, "delta": {"content": ""}, "logprobs": None,
                    "finish_reason": "content_filter"}  # fmt: skip
    assert "usage" not in chunks[-2] and relay.usage.input_tokens == 10


OVERLOADED = {"code": "server_error", "message": "Overloaded."}
IN_BAND_ERRORS = [
    {"type": "error", **OVERLOADED, "param": None},
    {"type": "response.failed", "response": {**RESPONSE, "status": "failed", "error": OVERLOADED}},
]


@pytest.mark.parametrize("event", IN_BAND_ERRORS)
def test_an_in_band_error_ends_the_stream_with_its_message(event: dict[str, Any]) -> None:
    """... and its code: the upstream's, not a generic stream error."""
    relay = chat_relay()
    feed(relay, [{"type": "response.created", "response": RESPONSE}, event])
    assert isinstance(relay.upstream_error, ProxyError) and not relay.complete
    err = json.loads(relay.error(relay.upstream_error).split(b"data: ")[1])
    assert err["error"]["message"] == "Overloaded." and err["error"]["code"] == "server_error"
