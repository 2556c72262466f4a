"""Anthropic Messages through the real proxy: translated to llama.cpp's OpenAI endpoint, and
native to llama.cpp's own `/v1/messages` (an upstream of `kind: "anthropic"`)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import anthropic._base_client
import pytest

from tests.helpers import SESSION_HEADER
from tests.real.conftest import MAX_TOKENS, MODEL, Tap, Tee
from tests.real.wire import (
    anthropic_input_of_stream,
    check_anthropic_stream,
    check_commit,
    cost,
    fields,
    openai_usage_of_stream,
    sse_events,
)

pytestmark = pytest.mark.real

# The httpx flavour this anthropic SDK is built on (`httpx`, or its fork `httpx2` lately).
HTTPX = getattr(anthropic._base_client, "httpx2", None) or anthropic._base_client.httpx

TASK = "TASK: keep a short log of the deploy. Record each finished step in the state."
OBS = "Observation: the database migration finished; the cache warm-up is next."
MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": TASK},
    {"role": "assistant", "content": "Ready."},
    {"role": "user", "content": OBS},
]


def client(p, tee: Tee) -> anthropic.Anthropic:  # type: ignore[no-untyped-def]
    return anthropic.Anthropic(
        base_url=p.url, api_key="k", max_retries=0, http_client=tee.client(HTTPX)
    )


def params(session: str, constrain: bool = True) -> dict[str, Any]:
    headers = {SESSION_HEADER: session}
    if constrain:
        headers["x-skillstate-constrain"] = "json_schema"
    return {
        "model": MODEL,
        "max_tokens": MAX_TOKENS,
        "extra_body": {"temperature": 0},  # this SDK has no `temperature` parameter
        "system": "You are a deploy assistant. Be brief.",
        "messages": MESSAGES,
        "extra_headers": headers,
    }


def text_of(message: anthropic.types.Message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


# -- /v1/messages -> OpenAI upstream (translated both ways) -------------------------------------


def test_messages_translated_json(real_proxy, tap: Tap, tee: Tee) -> None:  # type: ignore[no-untyped-def]
    p = real_proxy()
    mark = tap.mark()
    raw = client(p, tee).messages.with_raw_response.create(**params("an-tr-json"))
    message = raw.parse()
    h = raw.headers

    [ex] = tap.generations(mark)
    assert ex.path == "/v1/chat/completions" and ex.status == 200
    sent = ex.request
    assert sent is not None
    assert sent["messages"][0] == {"role": "system", "content": params("x")["system"]}
    assert sent["response_format"]["type"] == "json_schema"  # the constraint survives translation
    assert "Ready." not in json.dumps(sent["messages"])

    assert message.type == "message" and message.role == "assistant"
    assert [b.type for b in message.content] == ["text"]
    assert message.stop_reason in ("end_turn", "max_tokens")
    up = json.loads(ex.body)
    assert message.content[0].text == up["choices"][0]["message"]["content"]
    assert h["x-skillstate-transition"] in ("valid", "invalid")
    assert h["x-skillstate-step"] == "1"
    assert h["x-skillstate-pricing"] == "override"
    check_commit(p, "an-tr-json", h["x-skillstate-transition"], 1, text_of(message))

    t = cost(p, "an-tr-json")
    assert t["input_tokens"] == up["usage"]["prompt_tokens"] > 0
    assert t["output_tokens"] == up["usage"]["completion_tokens"] == message.usage.output_tokens
    assert t["cost_usd"] == 0.0


def test_messages_translated_stream(real_proxy, tap: Tap, tee: Tee) -> None:  # type: ignore[no-untyped-def]
    p = real_proxy()
    mark = tap.mark()
    events = list(client(p, tee).messages.create(stream=True, **params("an-tr-stream")))
    [ex] = tap.generations(mark)
    assert ex.path == "/v1/chat/completions" and ex.request is not None
    assert ex.request["stream"] is True
    assert ex.request["stream_options"] == {"include_usage": True}
    assert ex.request["response_format"]["type"] == "json_schema"
    upstream = sse_events(ex.body)
    assert upstream[-1] == b"data: [DONE]\n\n"
    usage = openai_usage_of_stream(upstream)

    client_events, note = check_anthropic_stream(bytes(tee.bodies[-1]))
    assert events[0].type == "message_start"
    assert events[-1].type == "message_stop"
    text = "".join(
        e.delta.text
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    upstream_text = "".join(
        (json.loads(fields(e)["data"])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
        for e in upstream[:-1]
    )
    assert text == upstream_text
    assert note["step"] == "1" and note["pricing"] == "override"
    check_commit(p, "an-tr-stream", note["transition"], 1, text)
    _, out = anthropic_input_of_stream(client_events)
    assert out == usage["completion_tokens"]
    t = cost(p, "an-tr-stream")
    assert t["input_tokens"] == usage["prompt_tokens"] > 0
    assert t["output_tokens"] == usage["completion_tokens"]


# -- /v1/messages -> llama.cpp's native /v1/messages (kind: anthropic) ---------------------------


def test_messages_native_json(real_proxy, tap: Tap, tee: Tee) -> None:  # type: ignore[no-untyped-def]
    p = real_proxy(kind="anthropic")
    mark = tap.mark()
    # llama.cpp's /v1/messages ignores response_format; the proxy sends none to it anyway.
    raw = client(p, tee).messages.with_raw_response.create(**params("an-na-json"))
    message = raw.parse()
    h = raw.headers
    [ex] = tap.generations(mark)
    assert ex.path == "/v1/messages" and ex.status == 200 and ex.request is not None
    assert "response_format" not in ex.request
    assert ex.request["system"] == params("x")["system"]
    assert "Ready." not in json.dumps(ex.request["messages"])
    assert bytes(tee.bodies[-1]) == ex.body  # llama.cpp's body, untouched
    assert h["x-skillstate-transition"] in ("valid", "invalid")
    assert h["x-skillstate-step"] == "1"
    check_commit(p, "an-na-json", h["x-skillstate-transition"], 1, text_of(message))
    u = json.loads(ex.body)["usage"]
    t = cost(p, "an-na-json")
    # Anthropic's input_tokens excludes cache reads; the ledger counts the whole prompt.
    assert t["input_tokens"] == u["input_tokens"] + u.get("cache_read_input_tokens", 0) > 0
    assert t["output_tokens"] == u["output_tokens"] > 0
    assert t["cost_usd"] == 0.0


def test_messages_native_stream(real_proxy, tap: Tap, tee: Tee) -> None:  # type: ignore[no-untyped-def]
    p = real_proxy(kind="anthropic")
    mark = tap.mark()
    events = list(client(p, tee).messages.create(stream=True, **params("an-na-stream")))
    [ex] = tap.generations(mark)
    assert ex.path == "/v1/messages" and ex.content_type.startswith("text/event-stream")
    client_events, note = check_anthropic_stream(bytes(tee.bodies[-1]))
    assert client_events == sse_events(ex.body)  # byte for byte, only the comment added
    assert events[-1].type == "message_stop"
    text = "".join(
        e.delta.text
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    assert note["step"] == "1" and note["pricing"] == "override"
    check_commit(p, "an-na-stream", note["transition"], 1, text)
    total_in, out = anthropic_input_of_stream(client_events)
    t = cost(p, "an-na-stream")
    assert t["input_tokens"] == total_in > 0
    assert t["output_tokens"] == out > 0


def test_count_tokens_native(real_proxy, tap: Tap, tee: Tee) -> None:  # type: ignore[no-untyped-def]
    p = real_proxy(kind="anthropic")
    mark = tap.mark()
    c = client(p, tee)
    hdr = {SESSION_HEADER: "an-count"}
    kw: dict[str, Any] = {"model": MODEL, "system": params("x")["system"], "messages": MESSAGES}
    raw = c.messages.with_raw_response.count_tokens(**kw, extra_headers=hdr)
    counted = raw.parse().input_tokens
    full = c.messages.count_tokens(
        **kw, extra_headers={**hdr, "x-skillstate-mode": "passthrough"}
    ).input_tokens
    state_ex, full_ex = [e for e in tap.since(mark) if e.path == "/v1/messages/count_tokens"]
    assert state_ex.status == full_ex.status == 200
    # llama.cpp's own counts, relayed; in state mode of the compact context, else of the transcript
    assert json.loads(state_ex.body)["input_tokens"] == counted > 0
    assert json.loads(full_ex.body)["input_tokens"] == full > 0
    assert state_ex.request is not None and full_ex.request is not None
    assert "Ready." not in json.dumps(state_ex.request["messages"])
    assert full_ex.request["messages"] == MESSAGES
    assert set(state_ex.request) <= {"model", "system", "messages", "tools", "tool_choice"}
    assert raw.headers["x-skillstate-upstream"] == "llama"
    assert "x-skillstate-token-count" not in raw.headers
