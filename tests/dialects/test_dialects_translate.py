"""Tests for skillstate.dialects.translate: Anthropic Messages <-> OpenAI chat completions.

Streams are checked end to end through the real SDK accumulators: the translated SSE bytes
are served with an httpx2 MockTransport to `anthropic.Anthropic` / `openai.OpenAI`, and the
message the SDK builds must equal the non-streamed translation of the same reply.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jiter import from_json

from skillstate.dialects import sse
from skillstate.dialects.anthropic import ANTHROPIC, validate_anthropic_request
from skillstate.dialects.openai import validate_openai_request
from skillstate.dialects.translate import (
    AnthropicStreamToOpenAI,
    OpenAIStreamToAnthropic,
    ToolArgsStream,
    anthropic_request_to_openai,
    anthropic_response_to_openai,
    openai_request_to_anthropic,
    openai_response_to_anthropic,
    parse_tool_arguments,
)
from skillstate.errors import ProxyError
from tests.helpers import PARALLEL_CALL_ORDERS, parallel_call_pieces

# ----------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------


class _Served:
    """One SDK client per dialect, answering every request with `body`."""

    def __init__(self) -> None:
        self.body = b""

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, content=self.body
        )


_served = _Served()
_anthropic = anthropic.Anthropic(
    api_key="test",
    base_url="http://upstream.test",
    http_client=httpx2.Client(transport=httpx2.MockTransport(_served.handler)),
    max_retries=0,
)
_openai = openai.OpenAI(
    api_key="test",
    base_url="http://upstream.test/v1",
    http_client=httpx2.Client(transport=httpx2.MockTransport(_served.handler)),
    max_retries=0,
)


def sdk_message(body: bytes) -> dict[str, Any]:
    """The message the anthropic SDK accumulates from an SSE body."""
    _served.body = body
    with _anthropic.messages.stream(
        model="claude-test", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        final = stream.get_final_message()
    return final.model_dump(exclude_none=True)


def sdk_completion(body: bytes) -> dict[str, Any]:
    """The completion the openai SDK accumulates from an SSE body."""
    _served.body = body
    with _openai.chat.completions.stream(
        model="gpt-test",
        messages=[{"role": "user", "content": "hi"}],
        stream_options={"include_usage": True},
    ) as stream:
        for _ in stream:
            pass
        # the accumulated snapshot (get_final_completion() refuses finish_reason "length")
        final = stream.current_completion_snapshot
    return final.model_dump(exclude_none=True)


def as_message(d: dict[str, Any]) -> dict[str, Any]:
    return anthropic.types.Message.model_validate(d).model_dump(exclude_none=True)


def events(body: bytes) -> list[tuple[str | None, Any]]:
    parser = sse.SSEParser()
    out = []
    for ev in parser.feed(body) + parser.flush():
        out.append((ev.event, ev.data if ev.data == "[DONE]" else json.loads(ev.data)))
    return out


def run_openai_stream(
    chunks: list[dict[str, Any]], model: str = "claude-test"
) -> tuple[OpenAIStreamToAnthropic, bytes]:
    t = OpenAIStreamToAnthropic(model)
    out: list[bytes] = []
    for chunk in chunks:
        out.extend(t.feed(chunk))
    out.extend(t.finish())
    return t, b"".join(out)


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict:
    c: dict[str, Any] = {
        "id": "chatcmpl-abc",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-up",
        "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}],
    }
    c.update(extra)
    return c


def usage_chunk(usage: dict[str, Any]) -> dict:
    return {"id": "chatcmpl-abc", "object": "chat.completion.chunk", "choices": [], "usage": usage}


def tc_delta(
    index: int, *, id: str | None = None, name: str | None = None, args: str | None = None
):
    d: dict[str, Any] = {"index": index}
    if id is not None:
        d["id"] = id
        d["type"] = "function"
    fn: dict[str, Any] = {}
    if name is not None:
        fn["name"] = name
    if args is not None:
        fn["arguments"] = args
    if fn:
        d["function"] = fn
    return chunk({"tool_calls": [d]})


def oa_response(
    content: str | None,
    tool_calls: list[tuple[str | None, str, str]] = (),  # type: ignore[assignment]
    finish: str | None = "stop",
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        msg["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            if i is not None
            else {"type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in tool_calls
        ]
    resp: dict[str, Any] = {
        "id": "chatcmpl-abc",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-up",
        "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
    }
    if usage is not None:
        resp["usage"] = usage
    return resp


def base_request(**kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "claude-test",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
    }
    body.update(kw)
    return body


def validated_to_openai(body: Any) -> dict:
    """The proxy's path: the dialect validates once, then the translator maps."""
    validate_anthropic_request(body)
    return anthropic_request_to_openai(body)


def validated_to_anthropic(body: Any) -> dict:
    """The proxy's path: the dialect validates once, then the translator maps."""
    validate_openai_request(body)
    return openai_request_to_anthropic(body)


def raises_invalid(fn: Any, *args: Any, match: str, **kw: Any) -> ProxyError:
    with pytest.raises(ProxyError, match=match) as info:
        fn(*args, **kw)
    assert info.value.kind == "invalid_request"
    assert info.value.status == 400
    return info.value


USAGE = {
    "prompt_tokens": 120,
    "completion_tokens": 15,
    "total_tokens": 135,
    "prompt_tokens_details": {"cached_tokens": 100},
}

# ----------------------------------------------------------------------------------------
# Direction 1: requests
# ----------------------------------------------------------------------------------------


def test_system_string_and_blocks_become_leading_system_message() -> None:
    out = anthropic_request_to_openai(base_request(system="Be terse."))
    assert out["messages"][0] == {"role": "system", "content": "Be terse."}
    out = anthropic_request_to_openai(
        base_request(
            system=[
                {"type": "text", "text": "A", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "B"},
            ]
        )
    )
    assert out["messages"][0] == {"role": "system", "content": "A\n\nB"}
    assert out["messages"][1] == {"role": "user", "content": "hi"}
    assert anthropic_request_to_openai(base_request(system=""))["messages"][0]["role"] == "user"


def test_scalar_fields_and_dropped_fields() -> None:
    body = base_request(
        max_tokens=321,
        temperature=0.3,
        top_p=0.9,
        top_k=5,
        stop_sequences=["END", "STOP"],
        metadata={"user_id": "u1"},
        thinking={"type": "enabled", "budget_tokens": 1024},
        stream=True,
    )
    out = anthropic_request_to_openai(body)
    assert out == {
        "model": "claude-test",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 321,
        "temperature": 0.3,
        "top_p": 0.9,
        "stop": ["END", "STOP"],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    out = anthropic_request_to_openai(base_request(stream=False))
    assert out["stream"] is False and "stream_options" not in out


def test_user_content_string_single_block_and_multiple_blocks() -> None:
    out = anthropic_request_to_openai(
        base_request(
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "one"}]},
                {"role": "assistant", "content": "ok"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ]
        )
    )
    assert out["messages"] == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]


def test_image_blocks() -> None:
    msgs = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
                },
                {"type": "image", "source": {"type": "url", "url": "https://x.test/a.jpg"}},
            ],
        }
    ]
    out = anthropic_request_to_openai(base_request(messages=msgs))
    assert out["messages"][0]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://x.test/a.jpg"}},
    ]
    bad = [
        {"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}
    ]
    raises_invalid(anthropic_request_to_openai, base_request(messages=bad), match="image source")


def test_documents() -> None:
    msgs = [
        {
            "role": "user",
            "content": [
                {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": "doc"},
                },
                {
                    "type": "document",
                    "title": "r.pdf",
                    "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"},
                },
            ],
        }
    ]
    out = anthropic_request_to_openai(base_request(messages=msgs))
    assert out["messages"][0]["content"] == [
        {"type": "text", "text": "doc"},
        {
            "type": "file",
            "file": {"filename": "r.pdf", "file_data": "data:application/pdf;base64,JVBE"},
        },
    ]
    bad = [
        {"role": "user", "content": [{"type": "document", "source": {"type": "url", "url": "u"}}]}
    ]
    raises_invalid(anthropic_request_to_openai, base_request(messages=bad), match="document source")


TOOL_HISTORY = [
    {"role": "user", "content": "weather in Paris and Rome?"},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "two calls", "signature": "sig"},
            {"type": "redacted_thinking", "data": "xyz"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
            {
                "type": "tool_use",
                "id": "toolu_2",
                "name": "weather",
                "input": {"city": "Rome", "n": [1, 2.5]},
            },
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
            {
                "type": "tool_result",
                "tool_use_id": "toolu_2",
                "is_error": True,
                "content": [{"type": "text", "text": "timeout"}, {"type": "text", "text": "retry"}],
            },
            {"type": "text", "text": "thanks"},
        ],
    },
]


def test_tool_use_and_tool_result_mapping() -> None:
    body = base_request(messages=TOOL_HISTORY)
    before = copy.deepcopy(body)
    out = anthropic_request_to_openai(body)
    assert body == before  # never mutated; thinking blocks untouched in the input
    assert out["messages"] == [
        {"role": "user", "content": "weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city":"Paris"}'},
                },
                {
                    "id": "toolu_2",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city":"Rome","n":[1,2.5]}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "[tool error] timeout\nretry"},
        {"role": "user", "content": "thanks"},
    ]


def test_tool_only_assistant_has_null_content_and_text_before_results_moves_after() -> None:
    msgs = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "note"},
                {"type": "tool_result", "tool_use_id": "t1"},
            ],
        },
    ]
    out = anthropic_request_to_openai(base_request(messages=msgs))["messages"]
    assert out[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    # tool messages must directly follow the assistant's tool_calls
    assert out[2] == {"role": "tool", "tool_call_id": "t1", "content": ""}
    assert out[3] == {"role": "user", "content": "note"}


def test_tool_result_images_follow_in_a_user_message() -> None:
    msgs = [
        {"role": "user", "content": "shot"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "snap", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [
                        {"type": "text", "text": "here"},
                        {"type": "image", "source": {"type": "url", "url": "https://x.test/s.png"}},
                    ],
                }
            ],
        },
    ]
    out = anthropic_request_to_openai(base_request(messages=msgs))["messages"]
    assert out[2] == {"role": "tool", "tool_call_id": "t1", "content": "here"}
    assert out[3]["role"] == "user"
    assert out[3]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "https://x.test/s.png"},
    }
    assert "t1" in out[3]["content"][0]["text"]


def test_tools_mapping() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    body = base_request(
        tools=[
            {"name": "weather", "description": "Get weather", "input_schema": schema},
            {"name": "noop", "input_schema": {"type": "object"}, "strict": True, "type": "custom"},
        ]
    )
    out = anthropic_request_to_openai(body)
    assert out["tools"] == [
        {
            "type": "function",
            "function": {"name": "weather", "description": "Get weather", "parameters": schema},
        },
        {
            "type": "function",
            "function": {"name": "noop", "parameters": {"type": "object"}, "strict": True},
        },
    ]
    out["tools"][0]["function"]["parameters"]["x"] = 1
    assert "x" not in schema  # deep-copied
    server = base_request(tools=[{"type": "web_search_20250305", "name": "web_search"}])
    raises_invalid(anthropic_request_to_openai, server, match="web_search_20250305")


TOOLS = [{"name": "f", "input_schema": {"type": "object"}}]


@pytest.mark.parametrize(
    ("choice", "expected", "parallel"),
    [
        ({"type": "auto"}, "auto", None),
        ({"type": "any"}, "required", None),
        ({"type": "none"}, "none", None),
        ({"type": "tool", "name": "f"}, {"type": "function", "function": {"name": "f"}}, None),
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto", False),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
        (
            {"type": "tool", "name": "f", "disable_parallel_tool_use": True},
            {"type": "function", "function": {"name": "f"}},
            False,
        ),
        ({"type": "auto", "disable_parallel_tool_use": False}, "auto", None),
    ],
)
def test_tool_choice(choice: dict, expected: Any, parallel: bool | None) -> None:
    out = anthropic_request_to_openai(base_request(tools=TOOLS, tool_choice=choice))
    assert out["tool_choice"] == expected
    assert out.get("parallel_tool_calls") == parallel


def test_tool_choice_without_tools_is_dropped() -> None:
    out = anthropic_request_to_openai(base_request(tool_choice={"type": "auto"}))
    assert "tool_choice" not in out and "tools" not in out


def test_system_role_message_extension() -> None:
    msgs = [
        {"role": "user", "content": "a"},
        {"role": "system", "content": [{"type": "text", "text": "mid"}]},
        {"role": "user", "content": "b"},
    ]
    out = anthropic_request_to_openai(base_request(messages=msgs))
    assert out["messages"][1] == {"role": "system", "content": "mid"}


def test_untranslatable_block_types_raise() -> None:
    msgs = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": [{"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}}],
        },
    ]
    raises_invalid(
        anthropic_request_to_openai, base_request(messages=msgs), match="server_tool_use"
    )


# ----------------------------------------------------------------------------------------
# Direction 1: validation
# ----------------------------------------------------------------------------------------


def _without(key: str) -> dict[str, Any]:
    body = base_request()
    del body[key]
    return body


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ([], "JSON object"),
        (_without("model"), "model"),
        (base_request(model=""), "model"),
        (_without("max_tokens"), "max_tokens"),
        (base_request(max_tokens="100"), "max_tokens"),
        (base_request(max_tokens=1.5), "max_tokens"),
        (base_request(max_tokens=True), "max_tokens"),
        (base_request(max_tokens=-1), "max_tokens"),
        (_without("messages"), "messages"),
        (base_request(messages=[]), "messages"),
        (base_request(messages={"role": "user"}), "messages"),
        (base_request(messages=["hi"]), r"messages\[0\]"),
        (base_request(messages=[{"role": "tool", "content": "x"}]), "role"),
        (base_request(messages=[{"role": "user"}]), "content"),
        (base_request(messages=[{"role": "user", "content": 5}]), "content"),
        (base_request(messages=[{"role": "user", "content": {"type": "text"}}]), "content"),
        (base_request(messages=[{"role": "user", "content": ["hi"]}]), "content block"),
        (base_request(messages=[{"role": "user", "content": [{"text": "x"}]}]), "type"),
        (
            base_request(messages=[{"role": "user", "content": [{"type": "txt", "text": "x"}]}]),
            "unknown",
        ),
        (
            base_request(messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}]),
            "text",
        ),
        (
            base_request(
                messages=[{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]
            ),
            "tool_use_id",
        ),
        (
            base_request(
                messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": ""}]}]
            ),
            "tool_use_id",
        ),
        (
            base_request(
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t", "content": 3}],
                    }
                ]
            ),
            "content",
        ),
        (
            base_request(
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t",
                                "content": [{"type": "bogus"}],
                            }
                        ],
                    }
                ]
            ),
            "unknown",
        ),
        (
            base_request(
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
                    }
                ]
            ),
            "assistant",
        ),
        (
            base_request(
                messages=[
                    {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}
                ]
            ),
            "user messages",
        ),
        (
            base_request(
                messages=[
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": []}],
                    }
                ]
            ),
            "input",
        ),
        (
            base_request(
                messages=[
                    {"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}
                ]
            ),
            "base64",
        ),
        (base_request(tools=[{"name": "f", "input_schema": []}]), "input_schema"),
        (base_request(tools=[{"name": "f", "input_schema": {"type": "string"}}]), "input_schema"),
        (base_request(tools=[{"name": "f"}]), "input_schema"),
        (base_request(tools=[{"input_schema": {"type": "object"}}]), "name"),
        (base_request(tools={"name": "f"}), "tools"),
        (base_request(tool_choice={"type": "sometimes"}), "tool_choice"),
        (base_request(tool_choice={"type": "tool"}), "name"),
        (base_request(tool_choice="auto"), "tool_choice"),
        (base_request(system=5), "system"),
        (base_request(system=[{"type": "image"}]), "system"),
        (base_request(stop_sequences="END"), "stop_sequences"),
        (base_request(temperature="hot"), "temperature"),
        (base_request(stream="yes"), "stream"),
    ],
)
def test_validation_rejects(body: Any, match: str) -> None:
    err = raises_invalid(validate_anthropic_request, body, match=match)
    assert ANTHROPIC.error_body(err)["error"]["type"] == "invalid_request_error"
    # on the way to an OpenAI upstream the dialect validates once; the translator trusts it
    raises_invalid(validated_to_openai, body, match=match)


def test_validation_accepts_full_request() -> None:
    body = base_request(
        system=[{"type": "text", "text": "s"}],
        messages=TOOL_HISTORY,
        tools=[{"name": "weather", "input_schema": {"type": "object"}}],
        tool_choice={"type": "auto"},
        max_tokens=0,
    )
    validate_anthropic_request(body)
    # server-side block types are valid Anthropic even though they cannot be translated
    body["messages"].append(
        {
            "role": "assistant",
            "content": [{"type": "server_tool_use", "id": "s", "name": "w", "input": {}}],
        }
    )
    validate_anthropic_request(body)


# ----------------------------------------------------------------------------------------
# Direction 1: responses
# ----------------------------------------------------------------------------------------


def test_openai_response_to_anthropic_full() -> None:
    resp = oa_response(
        "Sure.",
        [("call_1", "weather", '{"city": "Paris"}'), ("call_2", "time", "{}")],
        "tool_calls",
        USAGE,
    )
    msg = openai_response_to_anthropic(resp, request_model="claude-x")
    assert msg == {
        "id": "msg_chatcmpl-abc",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [
            {"type": "text", "text": "Sure."},
            {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "call_2", "name": "time", "input": {}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 20,
            "output_tokens": 15,
            "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 0,
        },
    }
    as_message(msg)  # a valid anthropic Message


def test_openai_response_empty_text_omitted_and_missing_usage_is_zero() -> None:
    msg = openai_response_to_anthropic(
        oa_response("", [("c", "f", "{}")], "tool_calls"), request_model="m"
    )
    assert [b["type"] for b in msg["content"]] == ["tool_use"]
    assert msg["usage"] == {
        "input_tokens": 0,
        "output_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }
    msg = openai_response_to_anthropic(oa_response(None), request_model="m")
    assert msg["content"] == []


@pytest.mark.parametrize(
    ("finish", "tools", "expected"),
    [
        ("stop", False, "end_turn"),
        ("tool_calls", True, "tool_use"),
        ("function_call", True, "tool_use"),
        ("length", False, "max_tokens"),
        ("length", True, "max_tokens"),
        ("content_filter", False, "refusal"),
        ("stop", True, "tool_use"),  # some local servers say "stop" with tool calls
        (None, False, "end_turn"),
        (None, True, "tool_use"),
    ],
)
def test_stop_reason_mapping(finish: str | None, tools: bool, expected: str) -> None:
    calls = [("c1", "f", "{}")] if tools else []
    msg = openai_response_to_anthropic(oa_response("x", calls, finish), request_model="m")
    assert msg["stop_reason"] == expected
    assert msg["stop_sequence"] is None


def test_vllm_matched_stop_string_gives_stop_sequence() -> None:
    resp = oa_response("x", finish="stop")
    resp["choices"][0]["stop_reason"] = "END"
    msg = openai_response_to_anthropic(resp, request_model="m")
    assert (msg["stop_reason"], msg["stop_sequence"]) == ("stop_sequence", "END")


def test_usage_cache_arithmetic() -> None:
    msg = openai_response_to_anthropic(
        oa_response("x", usage={"prompt_tokens": 50, "completion_tokens": 7}), request_model="m"
    )
    assert msg["usage"]["input_tokens"] == 50 and msg["usage"]["cache_read_input_tokens"] == 0
    deepseek = {"prompt_tokens": 50, "completion_tokens": 7, "prompt_cache_hit_tokens": 40}
    msg = openai_response_to_anthropic(oa_response("x", usage=deepseek), request_model="m")
    assert msg["usage"]["input_tokens"] == 10 and msg["usage"]["cache_read_input_tokens"] == 40


def test_invalid_tool_arguments_are_repaired_with_raw() -> None:
    msg = openai_response_to_anthropic(
        oa_response(
            None, [("c1", "f", '{"path": "/tmp/x", "n": 1'), ("c2", "g", "not json")], "length"
        ),
        request_model="m",
    )
    assert msg["content"][0]["input"] == {
        "path": "/tmp/x",
        "n": 1,
        "_raw": '{"path": "/tmp/x", "n": 1',
    }
    assert msg["content"][1]["input"] == {"_raw": "not json"}
    assert msg["stop_reason"] == "max_tokens"


def test_missing_tool_call_id_is_synthesized_stably() -> None:
    resp = oa_response(None, [(None, "f", "{}"), (None, "g", "{}")], "tool_calls")
    a = openai_response_to_anthropic(resp, request_model="m")
    b = openai_response_to_anthropic(resp, request_model="m")
    ids = [blk["id"] for blk in a["content"]]
    assert ids == [blk["id"] for blk in b["content"]]
    assert len(set(ids)) == 2 and all(i.startswith("toolu_") for i in ids)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ("", {}),
        ("  \n", {}),
        ("{}", {}),
        ('{"a": "x\ny"}', {"a": "x\ny"}),  # raw control character tolerated
        ('"{\\"a\\": 1}"', {"a": 1}),  # double-encoded
        ('{"a":1}{"b":2}', {"a": 1, "_raw": '{"a":1}{"b":2}'}),
        ('{"a":1,}', {"a": 1, "_raw": '{"a":1,}'}),
        ("[1, 2]", {"_raw": "[1, 2]"}),
        ("null", {"_raw": "null"}),
        ('{"a": tru', {"a": None, "_raw": '{"a": tru'}),
        ('{"a": 1.', {"a": None, "_raw": '{"a": 1.'}),
        ('{"a": 12', {"a": 12, "_raw": '{"a": 12'}),
        ('{"k', {"k": None, "_raw": '{"k'}),
        ('{"a":{"b":[1,', {"a": {"b": [1]}, "_raw": '{"a":{"b":[1,'}),
        ('{"a": "\\ud83d\\ude00"}', {"a": "\U0001f600"}),
        ('{"a": "\\ud83d"}', {"a": "", "_raw": '{"a": "\\ud83d"}'}),
        ('{"a": NaN}', {"a": None, "_raw": '{"a": NaN}'}),
    ],
)
def test_parse_tool_arguments(raw: str, expected: dict) -> None:
    assert parse_tool_arguments(raw) == expected


# ----------------------------------------------------------------------------------------
# Direction 1: stream
# ----------------------------------------------------------------------------------------


def test_stream_exact_event_sequence_for_text() -> None:
    t, body = run_openai_stream(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Hel"}),
            chunk({"content": "lo"}),
            chunk({}, "stop"),
            usage_chunk(USAGE),
        ]
    )
    evs = events(body)
    assert [e for e, _ in evs] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(d["type"] == e for e, d in evs)
    start = evs[0][1]["message"]
    assert start["id"] == "msg_chatcmpl-abc" and start["model"] == "claude-test"
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == 0
    assert evs[2][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    assert evs[3][1]["delta"] == {"type": "text_delta", "text": "Hel"}
    assert evs[6][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {
            "input_tokens": 20,
            "output_tokens": 15,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 100,
        },
    }
    assert t.text == "Hello" and t.stop_reason == "end_turn" and t.tool_calls == []
    assert t.usage == USAGE and t.client_usage == evs[6][1]["usage"]
    final = sdk_message(body)
    assert final == as_message(
        openai_response_to_anthropic(oa_response("Hello", usage=USAGE), request_model="claude-test")
    )


def test_stream_parallel_tool_calls_after_text() -> None:
    t, body = run_openai_stream(
        [
            chunk({"role": "assistant", "content": None}),
            chunk({"content": "Two calls."}),
            tc_delta(0, id="call_a", name="weather", args=""),
            tc_delta(0, args='{"city":'),
            tc_delta(0, args=' "Paris"}'),
            tc_delta(1, id="call_b", name="weather", args='{"city": "Rome"}'),
            chunk({}, "tool_calls"),
            usage_chunk(USAGE),
        ]
    )
    evs = events(body)
    starts = [d for e, d in evs if e == "content_block_start"]
    assert [s["index"] for s in starts] == [0, 1, 2]
    assert starts[1]["content_block"] == {
        "type": "tool_use",
        "id": "call_a",
        "name": "weather",
        "input": {},
    }
    assert starts[2]["content_block"]["id"] == "call_b"
    deltas = [
        d for e, d in evs if e == "content_block_delta" and d["delta"]["type"] == "input_json_delta"
    ]
    assert {d["index"] for d in deltas} == {1, 2}
    assert (
        "".join(d["delta"]["partial_json"] for d in deltas if d["index"] == 1) == '{"city":"Paris"}'
    )
    # blocks are strictly sequential: each stop precedes the next start
    order = [(e, d.get("index")) for e, d in evs if e and e.startswith("content_block_")]
    open_idx = None
    for e, i in order:
        if e == "content_block_start":
            assert open_idx is None
            open_idx = i
        elif e == "content_block_stop":
            assert open_idx == i
            open_idx = None
        else:
            assert open_idx == i
    assert t.tool_calls == [
        ("call_a", "weather", '{"city":"Paris"}'),
        ("call_b", "weather", '{"city":"Rome"}'),
    ]
    assert t.stop_reason == "tool_use"
    expected = oa_response(
        "Two calls.",
        [("call_a", "weather", '{"city": "Paris"}'), ("call_b", "weather", '{"city": "Rome"}')],
        "tool_calls",
        USAGE,
    )
    assert sdk_message(body) == as_message(
        openai_response_to_anthropic(expected, request_model="claude-test")
    )


def test_stream_arguments_before_id_and_name_are_buffered() -> None:
    t, body = run_openai_stream(
        [
            tc_delta(0, args='{"q"'),
            tc_delta(1, args='{"n": 1'),
            tc_delta(0, args=': "x"'),
            tc_delta(0, id="call_a", name="search"),
            tc_delta(0, args="}"),
            tc_delta(1, id="call_b", name="count", args="}"),
            chunk({}, "tool_calls"),
        ]
    )
    assert t.tool_calls == [("call_a", "search", '{"q":"x"}'), ("call_b", "count", '{"n":1}')]
    final = sdk_message(body)
    assert [(b["id"], b["input"]) for b in final["content"]] == [
        ("call_a", {"q": "x"}),
        ("call_b", {"n": 1}),
    ]
    assert final["stop_reason"] == "tool_use"


def test_stream_name_without_id_and_missing_index() -> None:
    # a server that never sends ids nor indexes: ids are synthesized exactly as unstreamed
    chunks = [
        chunk({"tool_calls": [{"function": {"name": "f", "arguments": '{"a":'}}]}),
        chunk({"tool_calls": [{"function": {"arguments": "1}"}}]}),
        chunk({}, "tool_calls"),
    ]
    t, body = run_openai_stream(chunks)
    final = sdk_message(body)
    expected = openai_response_to_anthropic(
        oa_response(None, [(None, "f", '{"a":1}')], "tool_calls"), request_model="claude-test"
    )
    assert final == as_message(expected)
    # indexless with ids: a new id starts a new call
    chunks = [
        chunk({"tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]}),
        chunk({"tool_calls": [{"id": "c2", "function": {"name": "g", "arguments": '{"x":'}}]}),
        chunk({"tool_calls": [{"function": {"arguments": "2}"}}]}),
    ]
    t, body = run_openai_stream(chunks)
    assert t.tool_calls == [("c1", "f", "{}"), ("c2", "g", '{"x":2}')]


def test_stream_without_usage_and_without_finish_reason() -> None:
    t, body = run_openai_stream([chunk({"content": "hi"})])
    evs = events(body)
    assert evs[-2][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": 0},
    }
    assert t.usage is None
    assert sdk_message(body) == as_message(
        openai_response_to_anthropic(oa_response("hi", finish=None), request_model="claude-test")
    )


def test_stream_finish_without_chunks_is_well_formed() -> None:
    t = OpenAIStreamToAnthropic("m", message_id="msg_fixed")
    body = b"".join(t.finish())
    assert [e for e, _ in events(body)] == [
        "message_start",
        "ping",
        "message_delta",
        "message_stop",
    ]
    assert events(body)[0][1]["message"]["id"] == "msg_fixed"
    assert sdk_message(body)["content"] == []
    assert t.finish() == [] and t.feed(chunk({"content": "late"})) == []


def test_stream_error_event() -> None:
    t = OpenAIStreamToAnthropic("m")
    head = b"".join(t.feed(chunk({"content": "partial"})))
    err = t.error("upstream went away")
    assert err == (
        b"event: error\n"
        b'data: {"type":"error","error":{"type":"api_error","message":"upstream went away"}}\n\n'
    )
    assert t.finish() == []
    with pytest.raises(anthropic.APIStatusError, match="upstream went away"):
        sdk_message(head + err)
    t2 = OpenAIStreamToAnthropic("m")
    out = t2.feed({"error": {"message": "overloaded"}})
    assert events(b"".join(out))[-1] == (
        "error",
        {"type": "error", "error": {"type": "api_error", "message": "overloaded"}},
    )
    t3 = OpenAIStreamToAnthropic("m")
    e = events(t3.error(ProxyError("overloaded", "busy")))[0]
    assert e == (
        "error",
        {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}},
    )


def test_stream_refusal_and_content_filter() -> None:
    _, body = run_openai_stream([chunk({"refusal": "I can't."}), chunk({}, "content_filter")])
    final = sdk_message(body)
    assert final["content"] == [{"type": "text", "text": "I can't."}]
    assert final["stop_reason"] == "refusal"
    resp = oa_response(None, finish="content_filter")
    resp["choices"][0]["message"]["refusal"] = "I can't."
    assert final == as_message(openai_response_to_anthropic(resp, request_model="claude-test"))


def test_stream_text_after_tool_call_opens_new_block() -> None:
    t, body = run_openai_stream(
        [
            tc_delta(0, id="c", name="f", args="{}"),
            chunk({"content": "after"}),
            chunk({}, "tool_calls"),
        ]
    )
    final = sdk_message(body)
    assert [b["type"] for b in final["content"]] == ["tool_use", "text"]
    assert t.text == "after"


@pytest.mark.parametrize("order", PARALLEL_CALL_ORDERS)
def test_stream_parallel_calls_get_every_argument_however_interleaved(order: str) -> None:
    """Some servers name every call before their arguments, or interleave the pieces: an
    earlier call's arguments after a later call began went nowhere (its input was {})."""
    chunks = parallel_call_pieces(order, tc_delta)
    t, body = run_openai_stream([*chunks, chunk({}, "tool_calls")])
    final = sdk_message(body)
    assert [(c["name"], c["input"]) for c in final["content"]] == [
        ("f", {"path": "/etc/hosts"}),
        ("g", {"n": 2}),
    ]
    assert t.late_arguments == {} and final["stop_reason"] == "tool_use"


def test_stream_late_arguments_for_a_call_closed_by_text_are_kept_aside() -> None:
    t, body = run_openai_stream(
        [
            tc_delta(0, id="a", name="f", args='{"x":1'),
            chunk({"content": "and then"}),
            tc_delta(0, args=',"y":2}'),
        ]
    )
    assert t.late_arguments == {"a": ',"y":2}'}
    final = sdk_message(body)  # still a well-formed stream
    assert final["content"][0]["input"] == {"x": 1, "_raw": '{"x":1'}


def test_stream_truncated_arguments_match_unstreamed() -> None:
    args = '{"path": "/a/b", "content": "line1\\nli'
    chunks = [
        tc_delta(0, id="c", name="write", args=args[:10]),
        tc_delta(0, args=args[10:]),
        chunk({}, "length"),
    ]
    _, body = run_openai_stream(chunks)
    expected = openai_response_to_anthropic(
        oa_response(None, [("c", "write", args)], "length"), request_model="claude-test"
    )
    assert sdk_message(body) == as_message(expected)
    assert expected["content"][0]["input"]["path"] == "/a/b"
    assert expected["content"][0]["input"]["_raw"] == args


# ----------------------------------------------------------------------------------------
# Direction 2: requests
# ----------------------------------------------------------------------------------------


def oa_request(messages: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "claude-up", "messages": messages}
    body.update(kw)
    return body


def test_openai_request_to_anthropic_conversation() -> None:
    body = oa_request(
        [
            {"role": "system", "content": "S1"},
            {"role": "developer", "content": [{"type": "text", "text": "S2"}]},
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "w", "arguments": '{"c": "P"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "w", "arguments": ""},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
            {
                "role": "tool",
                "tool_call_id": "call_2",
                "content": [{"type": "text", "text": "20C"}],
            },
            {"role": "user", "content": "thanks"},
            {"role": "user", "content": [{"type": "text", "text": "more"}]},
        ],
        max_tokens=50,
    )
    before = copy.deepcopy(body)
    out = openai_request_to_anthropic(body)
    assert body == before
    assert out == {
        "model": "claude-up",
        "max_tokens": 50,
        "system": "S1\n\nS2",
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "call_1", "name": "w", "input": {"c": "P"}},
                    {"type": "tool_use", "id": "call_2", "name": "w", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "18C"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_2",
                        "content": [{"type": "text", "text": "20C"}],
                    },
                    {"type": "text", "text": "thanks"},
                    {"type": "text", "text": "more"},
                ],
            },
        ],
    }


def test_openai_request_images_and_files() -> None:
    out = openai_request_to_anthropic(
        oa_request(
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "see"},
                        {
                            "type": "image_url",
                            "image_url": {"url": "data:image/jpeg;base64,/9j/4A=="},
                        },
                        {
                            "type": "image_url",
                            "image_url": {"url": "https://x.test/i.png", "detail": "low"},
                        },
                        {
                            "type": "file",
                            "file": {
                                "filename": "a.pdf",
                                "file_data": "data:application/pdf;base64,JVBE",
                            },
                        },
                    ],
                }
            ]
        )
    )
    assert out["messages"][0]["content"] == [
        {"type": "text", "text": "see"},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4A=="},
        },
        {"type": "image", "source": {"type": "url", "url": "https://x.test/i.png"}},
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"},
            "title": "a.pdf",
        },
    ]
    audio = oa_request([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}])
    raises_invalid(openai_request_to_anthropic, audio, match="input_audio")


def test_openai_request_params() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "description": "d",
                "parameters": {"type": "object", "properties": {}},
            },
        },
        {"type": "function", "function": {"name": "g"}},
    ]
    out = openai_request_to_anthropic(
        oa_request(
            [{"role": "user", "content": "x"}],
            max_tokens=10,
            max_completion_tokens=20,
            temperature=1.7,
            top_p=0.5,
            stop="END",
            stream=True,
            stream_options={"include_usage": True},
            user="u-1",
            tools=tools,
            tool_choice="required",
            parallel_tool_calls=False,
            seed=3,
            presence_penalty=0.1,
        )
    )
    assert out == {
        "model": "claude-up",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 20,
        "temperature": 1.0,
        "top_p": 0.5,
        "stop_sequences": ["END"],
        "stream": True,
        "metadata": {"user_id": "u-1"},
        "tools": [
            {"name": "f", "description": "d", "input_schema": {"type": "object", "properties": {}}},
            {"name": "g", "input_schema": {"type": "object", "properties": {}}},
        ],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
    }
    assert (
        openai_request_to_anthropic(oa_request([{"role": "user", "content": "x"}]))["max_tokens"]
        == 4096
    )


@pytest.mark.parametrize(
    ("model", "streamed", "not_streamed"),
    [
        ("claude-opus-4-6", 128_000, 4096),
        ("claude-sonnet-4-6", 64_000, 4096),
        ("claude-sonnet-4-5-20250929", 64_000, 4096),
        ("anthropic/claude-haiku-4-5", 64_000, 4096),
        ("anthropic.claude-opus-4-5-20251101-v1:0", 64_000, 4096),
        ("claude-opus-4-1-20250805", 32_000, 4096),
        ("claude-opus-4-20250514", 32_000, 4096),  # not read as a 4.2 and later
        ("claude-sonnet-4-20250514", 64_000, 4096),
        ("claude-3-7-sonnet-latest", 64_000, 4096),
        ("claude-3-5-haiku-20241022", 8_192, 4096),
        ("claude-3-haiku-20240307", 4096, 4096),
        ("claude-up", 4096, 4096),  # unknown: its maximum may be lower
    ],
)
def test_a_request_without_an_output_limit_streams_up_to_the_models_maximum(
    model: str, streamed: int, not_streamed: int
) -> None:
    """OpenAI reads no limit as the model's own maximum; Messages requires one. A streamed
    request gets the model's maximum output where it is known, a non-streamed one (which
    arrives whole at the end) and an unknown model 4,096; a limit the client set goes as
    it is."""
    ask = [{"role": "user", "content": "x"}]
    assert (
        openai_request_to_anthropic(oa_request(ask, model=model, stream=True))["max_tokens"]
        == streamed
    )
    assert openai_request_to_anthropic(oa_request(ask, model=model))["max_tokens"] == not_streamed
    for field in ("max_tokens", "max_completion_tokens"):
        set_by_client = oa_request(ask, model=model, stream=True, **{field: 300})
        assert openai_request_to_anthropic(set_by_client)["max_tokens"] == 300


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        ("auto", None, {"type": "auto"}),
        ("none", None, {"type": "none"}),
        ("required", None, {"type": "any"}),
        ({"type": "function", "function": {"name": "f"}}, None, {"type": "tool", "name": "f"}),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
        ("none", False, {"type": "none"}),
        (None, None, None),
    ],
)
def test_openai_tool_choice(choice: Any, parallel: bool | None, expected: Any) -> None:
    kw: dict[str, Any] = {"tools": [{"type": "function", "function": {"name": "f"}}]}
    if choice is not None:
        kw["tool_choice"] = choice
    if parallel is not None:
        kw["parallel_tool_calls"] = parallel
    out = openai_request_to_anthropic(oa_request([{"role": "user", "content": "x"}], **kw))
    assert out.get("tool_choice") == expected


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (oa_request([]), "messages"),
        (oa_request([{"role": "system", "content": "only"}]), "non-system"),
        (oa_request([{"role": "user", "content": "x"}], n=2), "n"),
        (oa_request([{"role": "user", "content": "x"}], functions=[{"name": "f"}]), "functions"),
        (oa_request([{"role": "tool", "content": "x"}]), "tool_call_id"),
        (oa_request([{"role": "wizard", "content": "x"}]), "role"),
        (oa_request([{"role": "user", "content": 4}]), "content"),
        (
            oa_request(
                [
                    {
                        "role": "assistant",
                        "tool_calls": [{"type": "function", "function": {"name": "f"}}],
                    }
                ]
            ),
            "id",
        ),
        (
            oa_request(
                [{"role": "user", "content": "x"}], tools=[{"type": "custom", "custom": {}}]
            ),
            "tools",
        ),
        (
            oa_request(
                [{"role": "user", "content": "x"}],
                tools=[{"type": "function", "function": {"name": "f"}}],
                tool_choice="sometimes",
            ),
            "tool_choice",
        ),
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
    ],
)
def test_openai_request_rejects(body: dict, match: str) -> None:
    raises_invalid(validated_to_anthropic, body, match=match)


# ----------------------------------------------------------------------------------------
# Direction 2: responses and stream
# ----------------------------------------------------------------------------------------

A_USAGE = {
    "input_tokens": 10,
    "output_tokens": 5,
    "cache_read_input_tokens": 100,
    "cache_creation_input_tokens": 7,
}


def an_response(content: list[dict], stop: str = "end_turn", usage: dict | None = None) -> dict:
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-up",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage or A_USAGE,
    }


def test_anthropic_response_to_openai() -> None:
    resp = an_response(
        [
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "text", "text": "Let me "},
            {"type": "text", "text": "look."},
            {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"c": "P", "ü": [1]}},
        ],
        "tool_use",
    )
    out = anthropic_response_to_openai(resp, created=5)
    assert out == {
        "id": "chatcmpl-msg_01",
        "object": "chat.completion",
        "created": 5,
        "model": "claude-up",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Let me look.",
                    "refusal": None,
                    "tool_calls": [
                        {
                            "id": "toolu_1",
                            "type": "function",
                            "function": {"name": "w", "arguments": '{"c":"P","ü":[1]}'},
                        }
                    ],
                },
                "logprobs": None,
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {
            "prompt_tokens": 117,
            "completion_tokens": 5,
            "total_tokens": 122,
            "prompt_tokens_details": {"cached_tokens": 100, "cache_write_tokens": 7},
        },
    }
    openai.types.chat.ChatCompletion.model_validate(out)
    only_tool = anthropic_response_to_openai(
        an_response([{"type": "tool_use", "id": "t", "name": "f", "input": {}}], "tool_use")
    )
    assert only_tool["choices"][0]["message"]["content"] is None
    assert anthropic_response_to_openai(an_response([]), model="gpt-x")["model"] == "gpt-x"


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("pause_turn", "stop"),
        ("refusal", "content_filter"),
        ("model_context_window_exceeded", "length"),
    ],
)
def test_finish_reason_mapping(stop: str, finish: str) -> None:
    out = anthropic_response_to_openai(an_response([{"type": "text", "text": "x"}], stop))
    assert out["choices"][0]["finish_reason"] == finish


def anthropic_events(resp: dict[str, Any], cuts: int = 3) -> list[tuple[str, dict]]:
    """The event stream Anthropic would send for `resp`, deltas cut into pieces."""
    start_usage = {**resp["usage"], "output_tokens": 1}
    evs: list[tuple[str, dict]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {**resp, "content": [], "stop_reason": None, "usage": start_usage},
            },
        ),
        ("ping", {"type": "ping"}),
    ]
    for i, block in enumerate(resp["content"]):
        if block["type"] == "text":
            evs.append(
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": i,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
            )
            pieces = _cut(block["text"], cuts)
            evs += [
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": i,
                        "delta": {"type": "text_delta", "text": p},
                    },
                )
                for p in pieces
            ]
        else:
            evs.append(
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": i,
                        "content_block": {**block, "input": {}},
                    },
                )
            )
            text = json.dumps(block["input"]) if block["input"] else ""
            pieces = _cut(text, cuts) or [""]
            evs += [
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": i,
                        "delta": {"type": "input_json_delta", "partial_json": p},
                    },
                )
                for p in pieces
            ]
        evs.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    evs.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": resp["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": resp["usage"]["output_tokens"]},
            },
        )
    )
    evs.append(("message_stop", {"type": "message_stop"}))
    return evs


def _cut(text: str, n: int) -> list[str]:
    if not text:
        return []
    step = max(1, len(text) // n)
    return [text[i : i + step] for i in range(0, len(text), step)]


def run_anthropic_stream(
    evs: list[tuple[str, dict]], include_usage: bool = True
) -> tuple[AnthropicStreamToOpenAI, bytes]:
    t = AnthropicStreamToOpenAI("gpt-client", include_usage, created=1)
    out: list[bytes] = []
    for name, data in evs:
        out.extend(t.feed(name, data))
    out.extend(t.finish())
    return t, b"".join(out)


def comparable_completion(c: dict[str, Any]) -> dict[str, Any]:
    msg = c["choices"][0]["message"]
    return {
        "content": msg.get("content"),
        "tool_calls": [
            (tc["id"], tc["function"]["name"], json.loads(tc["function"]["arguments"]))
            for tc in msg.get("tool_calls") or []
        ],
        "finish_reason": c["choices"][0]["finish_reason"],
        "usage": c.get("usage"),
    }


def test_anthropic_stream_to_openai_chunks() -> None:
    resp = an_response(
        [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"c": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "noargs", "input": {}},
        ],
        "tool_use",
    )
    t, body = run_anthropic_stream(anthropic_events(resp))
    evs = events(body)
    assert all(e is None for e, _ in evs)
    assert evs[-1] == (None, "[DONE]")
    datas = [d for _, d in evs[:-1]]
    assert datas[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert all(
        d["object"] == "chat.completion.chunk" and d["id"] == "chatcmpl-msg_01" for d in datas
    )
    assert all(d["model"] == "gpt-client" and d["created"] == 1 for d in datas)
    tool_deltas = [
        d["choices"][0]["delta"]["tool_calls"][0]
        for d in datas
        if d["choices"] and "tool_calls" in d["choices"][0]["delta"]
    ]
    assert tool_deltas[0] == {
        "index": 0,
        "id": "toolu_1",
        "type": "function",
        "function": {"name": "w", "arguments": ""},
    }
    assert all(set(td) == {"index", "function"} for td in tool_deltas[1:] if "id" not in td)
    assert tool_deltas[-1] == {"index": 1, "function": {"arguments": "{}"}}
    assert datas[-2]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "tool_calls",
    }
    assert datas[-1]["choices"] == [] and datas[-1]["usage"]["prompt_tokens"] == 117
    assert all(d["usage"] is None for d in datas[:-1])
    assert t.text == "Checking."
    assert t.tool_calls == [("toolu_1", "w", '{"c": "Paris"}'), ("toolu_2", "noargs", "{}")]
    assert t.usage == A_USAGE and t.client_usage == datas[-1]["usage"]
    assert t.finish_reason == "tool_calls" and t.stop_reason == "tool_use"
    assert comparable_completion(sdk_completion(body)) == comparable_completion(
        anthropic_response_to_openai(resp)
    )


def test_anthropic_stream_without_usage_option() -> None:
    _, body = run_anthropic_stream(
        anthropic_events(an_response([{"type": "text", "text": "hi"}])), include_usage=False
    )
    datas = [d for _, d in events(body)[:-1]]
    assert all("usage" not in d for d in datas)
    assert datas[-1]["choices"][0]["finish_reason"] == "stop"


def test_anthropic_stream_errors() -> None:
    t = AnthropicStreamToOpenAI("gpt", True)
    err = t.error("boom")
    assert json.loads(err[len(b"data: ") :]) == {
        "error": {"message": "boom", "type": "api_error", "param": None, "code": None}
    }
    assert t.finish() == []
    t = AnthropicStreamToOpenAI("gpt", False)
    out = t.feed(
        "error", {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    )
    assert events(b"".join(out))[-1][1]["error"]["type"] == "overloaded_error"
    assert t.feed("message_stop", {"type": "message_stop"}) == []


# ----------------------------------------------------------------------------------------
# Property tests
# ----------------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4)
    ),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=5)


@st.composite
def serialized_object(draw: st.DrawFn) -> tuple[dict, str]:
    obj = draw(json_objects)
    indent = draw(st.sampled_from([None, 0, 2]))
    seps = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,", " :  ")]))
    text = json.dumps(
        obj,
        indent=indent,
        separators=seps if indent is None else None,
        ensure_ascii=draw(st.booleans()),
    )
    return obj, text


def split(draw: st.DrawFn, text: str) -> list[str]:
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=6)))
    pieces, last = [], 0
    for c in [*cuts, len(text)]:
        pieces.append(text[last:c])
        last = c
    return pieces


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_tool_args_stream_valid_objects_any_split(data: st.DataObject) -> None:
    obj, text = data.draw(serialized_object())
    pieces = split(data.draw, text)
    stream = ToolArgsStream()
    sent = ""
    for p in pieces:
        sent += stream.push(p)
        if sent:
            from_json(sent.encode(), partial_mode=True)  # what the anthropic SDK does per delta
    sent += stream.finish()
    assert json.loads(sent) == obj
    assert from_json(sent.encode()) == obj
    assert not stream.repaired
    assert parse_tool_arguments(text) == obj


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_tool_args_stream_arbitrary_text_any_split(data: st.DataObject) -> None:
    text = data.draw(
        st.one_of(
            st.text(max_size=30),
            serialized_object()
            .map(lambda ot: ot[1])
            .flatmap(
                lambda t: st.integers(0, len(t)).map(lambda k: t[:k])  # truncations
            ),
            st.text(alphabet='{}[]":,0123456789.eE+-tfnrulase\\ \n', max_size=30),
        )
    )
    pieces = split(data.draw, text)
    stream = ToolArgsStream()
    sent = ""
    for p in pieces:
        sent += stream.push(p)
        if sent:
            from_json(sent.encode(), partial_mode=True)
    sent += stream.finish()
    value = json.loads(sent)
    assert isinstance(value, dict)
    assert from_json(sent.encode()) == value
    assert parse_tool_arguments(text) == value  # split-independent


@st.composite
def scripted_reply(draw: st.DrawFn) -> dict[str, Any]:
    text = draw(st.text(max_size=40))
    n_calls = draw(st.integers(0, 3))
    calls = []
    for i in range(n_calls):
        kind = draw(st.sampled_from(["valid", "valid", "valid", "empty", "junk"]))
        if kind == "valid":
            args = draw(serialized_object())[1]
        elif kind == "empty":
            args = ""
        else:
            args = draw(st.text(max_size=20))
        calls.append(
            {
                "id": draw(st.sampled_from([f"call_{i}", None])) if i else f"call_{i}",
                "name": draw(st.sampled_from(["read", "write", "search_files"])),
                "args": args,
                "early_args": draw(st.booleans()),  # fragments before id/name
            }
        )
    finish = draw(st.sampled_from(["stop", "tool_calls", "length", None]))
    usage = draw(
        st.none()
        | st.builds(
            lambda p, c, k: {
                "prompt_tokens": p + k,
                "completion_tokens": c,
                "total_tokens": p + k + c,
                "prompt_tokens_details": {"cached_tokens": k},
            },
            st.integers(0, 10**6),
            st.integers(0, 10**5),
            st.integers(0, 10**6),
        )
    )
    return {"text": text, "calls": calls, "finish": finish, "usage": usage}


def chunks_for(draw: st.DrawFn, reply: dict[str, Any]) -> list[dict[str, Any]]:
    out = [chunk({"role": "assistant", "content": ""})]
    for piece in split(draw, reply["text"]):
        if piece:
            out.append(chunk({"content": piece}))
    for i, call in enumerate(reply["calls"]):
        pieces = split(draw, call["args"])
        if call["early_args"] and len(pieces) > 1:
            out.append(tc_delta(i, args=pieces[0]))
            pieces = pieces[1:]
        out.append(
            tc_delta(i, id=call["id"], name=call["name"], args=pieces[0])
            if call["id"]
            else tc_delta(i, name=call["name"], args=pieces[0])
        )
        out.extend(tc_delta(i, args=p) for p in pieces[1:] if p)
    out.append(chunk({}, reply["finish"]))
    if reply["usage"] is not None:
        out.append(usage_chunk(reply["usage"]))
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_streamed_reply_equals_unstreamed_through_anthropic_sdk(data: st.DataObject) -> None:
    reply = data.draw(scripted_reply())
    resp = oa_response(
        reply["text"] or None,
        [(c["id"], c["name"], c["args"]) for c in reply["calls"]],
        reply["finish"],
        reply["usage"],
    )
    expected = openai_response_to_anthropic(resp, request_model="claude-test")
    t, body = run_openai_stream(chunks_for(data.draw, reply))
    assert sdk_message(body) == as_message(expected)
    assert t.text == reply["text"]
    assert [(i, n, json.loads(a)) for i, n, a in t.tool_calls] == [
        (b["id"], b["name"], b["input"]) for b in expected["content"] if b["type"] == "tool_use"
    ]
    assert t.stop_reason == expected["stop_reason"]


@st.composite
def anthropic_reply(draw: st.DrawFn) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    text = draw(st.text(max_size=40))
    if text:
        content.append({"type": "text", "text": text})
    for i in range(draw(st.integers(0, 3))):
        content.append(
            {
                "type": "tool_use",
                "id": f"toolu_{i}",
                "name": f"tool{i}",
                "input": draw(json_objects),
            }
        )
    stop = (
        "tool_use"
        if len(content) > (1 if text else 0)
        else draw(st.sampled_from(["end_turn", "max_tokens", "stop_sequence"]))
    )
    usage = {
        "input_tokens": draw(st.integers(0, 10**6)),
        "output_tokens": draw(st.integers(0, 10**5)),
        "cache_read_input_tokens": draw(st.integers(0, 10**6)),
        "cache_creation_input_tokens": draw(st.integers(0, 10**5)),
    }
    return an_response(content, stop, usage)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(anthropic_reply(), st.integers(1, 5))
def test_anthropic_stream_equals_unstreamed_through_openai_sdk(resp: dict, cuts: int) -> None:
    _, body = run_anthropic_stream(anthropic_events(resp, cuts))
    assert comparable_completion(sdk_completion(body)) == comparable_completion(
        anthropic_response_to_openai(resp)
    )


@st.composite
def anthropic_conversation(draw: st.DrawFn) -> dict[str, Any]:
    names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": draw(st.text(min_size=1, max_size=10))}
    ]
    n = 0
    for _ in range(draw(st.integers(1, 4))):
        blocks: list[dict[str, Any]] = []
        if draw(st.booleans()):
            blocks.append({"type": "text", "text": draw(st.text(min_size=1, max_size=10))})
        if draw(st.booleans()):
            blocks.append({"type": "thinking", "thinking": "t", "signature": "s"})
        uses = []
        for _ in range(draw(st.integers(1, 3))):
            uses.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_{n}",
                    "name": draw(names),
                    "input": draw(json_objects),
                }
            )
            n += 1
        messages.append({"role": "assistant", "content": blocks + uses})
        results: list[dict[str, Any]] = [
            {"type": "tool_result", "tool_use_id": u["id"], "content": draw(st.text(max_size=10))}
            for u in uses
        ]
        if draw(st.booleans()):
            results.append({"type": "text", "text": draw(st.text(min_size=1, max_size=10))})
        messages.append({"role": "user", "content": results})
    return base_request(messages=messages)


def _anthropic_tool_facts(body: dict[str, Any]) -> tuple[list, list]:
    uses, results = [], []
    for m in body["messages"]:
        for b in m["content"] if isinstance(m["content"], list) else []:
            if b["type"] == "tool_use":
                uses.append((b["id"], b["name"], b["input"]))
            elif b["type"] == "tool_result":
                results.append((b["tool_use_id"], b.get("content")))
    return uses, results


@settings(max_examples=75, deadline=None)
@given(anthropic_conversation())
def test_roundtrip_anthropic_openai_anthropic_keeps_tools(body: dict) -> None:
    back = openai_request_to_anthropic(anthropic_request_to_openai(body))
    assert _anthropic_tool_facts(back) == _anthropic_tool_facts(body)


@st.composite
def openai_conversation(draw: st.DrawFn) -> dict[str, Any]:
    names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "go"},
    ]
    n = 0
    for _ in range(draw(st.integers(1, 4))):
        calls = []
        for _ in range(draw(st.integers(1, 3))):
            _, text = draw(serialized_object())
            calls.append(
                {
                    "id": f"call_{n}",
                    "type": "function",
                    "function": {"name": draw(names), "arguments": text},
                }
            )
            n += 1
        content = draw(st.sampled_from([None, "", "thinking aloud"]))
        messages.append({"role": "assistant", "content": content, "tool_calls": calls})
        for c in calls:
            messages.append(
                {"role": "tool", "tool_call_id": c["id"], "content": draw(st.text(max_size=10))}
            )
        if draw(st.booleans()):
            messages.append({"role": "user", "content": draw(st.text(min_size=1, max_size=10))})
    return {"model": "m", "messages": messages, "max_tokens": 99}


def _openai_tool_facts(body: dict[str, Any]) -> tuple[list, list]:
    calls, results = [], []
    for m in body["messages"]:
        for c in m.get("tool_calls") or []:
            calls.append((c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])))
        if m["role"] == "tool":
            results.append((m["tool_call_id"], m["content"]))
    return calls, results


@settings(max_examples=75, deadline=None)
@given(openai_conversation())
def test_roundtrip_openai_anthropic_openai_keeps_tools(body: dict) -> None:
    back = anthropic_request_to_openai(openai_request_to_anthropic(body))
    assert _openai_tool_facts(back) == _openai_tool_facts(body)
    # tool messages still directly follow their assistant message
    msgs = back["messages"]
    for i, m in enumerate(msgs):
        if m.get("tool_calls"):
            ids = [c["id"] for c in m["tool_calls"]]
            follow = msgs[i + 1 : i + 1 + len(ids)]
            assert [f["role"] for f in follow] == ["tool"] * len(ids)
            assert [f["tool_call_id"] for f in follow] == ids


# ----------------------------------------------------------------------------------------
# structured outputs: response_format json_schema <-> output_config.format
# ----------------------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_openai_json_schema_becomes_output_config_format() -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "A", "schema": SCHEMA, "strict": True}}
    out = openai_request_to_anthropic(oa_request([{"role": "user", "content": "x"}],
                                                 response_format=fmt))  # fmt: skip
    assert out["output_config"] == {"format": {"type": "json_schema", "schema": SCHEMA}}
    # JSON mode has no Anthropic equivalent; text is the default anyway.
    for other in ({"type": "json_object"}, {"type": "text"}):
        out = openai_request_to_anthropic(oa_request([{"role": "user", "content": "x"}],
                                                     response_format=other))  # fmt: skip
        assert "output_config" not in out
    with pytest.raises(ProxyError, match=r"json_schema\.schema"):
        openai_request_to_anthropic(
            oa_request([{"role": "user", "content": "x"}],
                       response_format={"type": "json_schema", "json_schema": {"name": "A"}})
        )  # fmt: skip


def test_anthropic_output_config_becomes_a_json_schema_response_format() -> None:
    fmt = {"type": "json_schema", "schema": SCHEMA}
    expected = {"type": "json_schema", "json_schema": {"name": "output", "schema": SCHEMA}}
    out = anthropic_request_to_openai(base_request(output_config={"format": fmt}))
    assert out["response_format"] == expected
    out = anthropic_request_to_openai(base_request(output_format=fmt))  # the beta name
    assert out["response_format"] == expected
    assert "response_format" not in anthropic_request_to_openai(base_request())


def test_strict_only_when_openai_strict_mode_accepts_the_schema() -> None:
    closed = {
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "b": {"type": "array", "items": {"$ref": "#/$defs/B"}},
        },
        "required": ["a", "b"],
        "additionalProperties": False,
        "$defs": {
            "B": {"type": "object", "properties": {"c": {"type": "string"}},
                  "required": ["c"], "additionalProperties": False},
        },
    }  # fmt: skip
    open_def = copy.deepcopy(closed)
    open_def["$defs"]["B"]["required"] = []  # an optional member deep down
    for schema, strict in ((closed, True), (open_def, False), (SCHEMA, False)):
        fmt = {"type": "json_schema", "schema": schema}
        spec = anthropic_request_to_openai(base_request(output_config={"format": fmt}))[
            "response_format"
        ]["json_schema"]
        assert spec.get("strict", False) is strict


# ----------------------------------------------------------------------------------------
# Refusals and text joins
# ----------------------------------------------------------------------------------------


def refused(text: str | None = None, refusal: str = "I can't help with that.") -> dict:
    """A chat reply that refuses (OpenAI's structured-outputs safety refusal: ``content``
    null, the ``refusal`` member, ``finish_reason`` ``stop``)."""
    resp = oa_response(text, finish="stop")
    resp["choices"][0]["message"]["refusal"] = refusal
    return resp


def test_a_chat_refusal_is_a_messages_refusal_json_and_streamed() -> None:
    """OpenAI's ``message.refusal`` is the model declining for safety, which Messages says
    with ``stop_reason: "refusal"`` (its structured outputs' safety refusal): the text the
    model said stays, streamed or not (before: ``end_turn``, a refusal passed off as an
    answer)."""
    msg = openai_response_to_anthropic(refused(), request_model="claude-test")
    assert msg["content"] == [{"type": "text", "text": "I can't help with that."}]
    assert (msg["stop_reason"], msg["stop_sequence"]) == ("refusal", None)
    t, body = run_openai_stream(
        [
            chunk({"role": "assistant", "content": None, "refusal": None}),
            chunk({"refusal": "I can't "}),
            chunk({"refusal": "help with that."}),
            chunk({}, "stop"),
        ]
    )
    assert sdk_message(body) == as_message(msg)
    assert t.stop_reason == "refusal"


def test_a_refusal_part_refuses_and_a_tool_call_or_a_cut_keeps_its_stop_reason() -> None:
    as_parts = oa_response(None)
    as_parts["choices"][0]["message"]["content"] = [{"type": "refusal", "refusal": "No."}]
    msg = openai_response_to_anthropic(as_parts, request_model="m")
    assert (msg["content"], msg["stop_reason"]) == ([{"type": "text", "text": "No."}], "refusal")
    cut = refused()
    cut["choices"][0]["finish_reason"] = "length"
    assert openai_response_to_anthropic(cut, request_model="m")["stop_reason"] == "max_tokens"
    calls = oa_response(None, [("c1", "f", "{}")], "tool_calls")
    calls["choices"][0]["message"]["refusal"] = "No."
    assert openai_response_to_anthropic(calls, request_model="m")["stop_reason"] == "tool_use"
    empty = refused(refusal="")  # an empty refusal refuses nothing
    assert openai_response_to_anthropic(empty, request_model="m")["stop_reason"] == "end_turn"


def test_a_system_message_of_several_parts_is_not_run_together() -> None:
    """A system or developer message's text parts are system texts, joined as the others
    are (a blank line), to Messages' ``system``; and a Messages mid-conversation system
    message's blocks to chat as its system prompt's blocks are (before: "ab")."""
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": parts},
            {"role": "developer", "content": parts},
            {"role": "user", "content": "hi"},
        ],
    }
    assert validated_to_anthropic(body)["system"] == "a\n\nb\n\na\n\nb"
    body = base_request(
        system=parts,
        messages=[{"role": "user", "content": "hi"}, {"role": "system", "content": parts}],
    )
    sent = validated_to_openai(body)["messages"]
    assert sent[0] == {"role": "system", "content": "a\n\nb"}
    assert sent[2] == {"role": "system", "content": "a\n\nb"}


def test_a_content_documents_chunks_go_one_a_line() -> None:
    chunks = [{"type": "text", "text": "First chunk."}, {"type": "text", "text": "Second."}]
    doc = {"type": "document", "source": {"type": "content", "content": chunks}}
    body = base_request(
        messages=[{"role": "user", "content": [doc, {"type": "text", "text": "Summarise."}]}]
    )
    parts = validated_to_openai(body)["messages"][0]["content"]
    assert parts[0] == {"type": "text", "text": "First chunk.\nSecond."}
