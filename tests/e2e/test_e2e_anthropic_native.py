"""What Anthropic-native agents (Claude Code 2.1.x, the anthropic SDKs) rely on, through the
proxy to an Anthropic-kind upstream (the fake provider): protocol headers, the ``?beta=true``
query, a ``role: "system"`` message inside ``messages``, body fields the proxy does not model,
thinking blocks sent back byte-exact, the client's ``cache_control``, upstream error bodies
and stream events relayed as they came. Requests are raw bytes, so the tests control them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply, ToolCall
from tests.helpers import SESSION_HEADER

BETA = "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27"
ENVELOPE = '```json\n{"state_patch": {"notes": "n"}, "action": "a"}\n```'
# Signed thinking and redacted thinking with awkward characters: a tab, quotes, a backslash,
# a control character, U+2028, non-ASCII and an astral character.
THINKING = [
    {
        "type": "thinking",
        "thinking": 'Read\tthe "notes" \\ \x01 \u2028 café 😀',
        "signature": "EqQBCkYIBxgCKkDs+/sig==",
    },
    {"type": "redacted_thinking", "data": "RU5DUllQVEVE"},
]
SYSTEM_MSG = {"role": "system", "content": "# Environment\n - cwd: /tmp/work"}
TOOLS = [
    {
        "name": "Read",
        "description": "read a file",
        "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}},
        "strict": True,
    },
    {
        "name": "Later",
        "description": "deferred",
        "input_schema": {"type": "object"},
        "defer_loading": True,
    },
]
# Fields the proxy does not model, as Claude Code sends them, plus a future one.
UNMODELLED: dict[str, Any] = {
    "thinking": {"type": "adaptive", "display": "omitted"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "medium"},
    "metadata": {"user_id": '{"device_id":"d1","session_id":"s1"}'},
    "diagnostics": {"client": "cli"},
    "some_future_field": {"nested": [1, "two", None]},
}


def js_json(value: Any) -> bytes:
    """``JSON.stringify(value)``: compact, raw UTF-8, key order kept (what Claude Code sends)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def tool_loop_body(**extra: Any) -> dict[str, Any]:
    """Turn 2 of a Claude Code run: task, environment, the call (with thinking), the result."""
    return {
        "model": "claude-test",
        "max_tokens": 1024,
        "system": [
            {"type": "text", "text": "You are a CLI.", "cache_control": {"type": "ephemeral"}}
        ],
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What do the notes say?"}]},
            SYSTEM_MSG,
            {
                "role": "assistant",
                "content": [
                    *THINKING,
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "Read",
                        "input": {"file_path": "n"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "tool_use_id": "toolu_1",
                        "type": "tool_result",
                        "content": "1\tthe answer is 42\n",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
        ],
        **UNMODELLED,
        **extra,
    }


def anthropic_proxy(start_proxy: StartProxy, fake: FakeProvider, mode: str, **up: Any) -> Proxy:
    upstream = {"name": "up", "url": fake.url, "kind": "anthropic", "api_key": "sk-up", **up}
    return start_proxy(None, config={"mode": mode, "schema": ["notes"], "upstreams": [upstream]})


def post(
    p: Proxy, body: dict[str, Any], headers: dict[str, str] | None = None, query: str = ""
) -> Any:
    h = {"content-type": "application/json", SESSION_HEADER: "s1"}
    h.setdefault("anthropic-version", "2023-06-01")
    return p.http.post(
        p.v1 + "/messages" + query, content=js_json(body), headers={**h, **(headers or {})}
    )


@pytest.mark.parametrize("mode", ["state", "passthrough"])
def test_protocol_headers_forwarded_verbatim_client_value_wins(
    fake: FakeProvider, start_proxy: StartProxy, mode: str
) -> None:
    p = anthropic_proxy(
        start_proxy,
        fake,
        mode,
        anthropic_version="2023-01-01",
        headers={"anthropic-beta": "configured-beta"},
    )
    fake.enqueue(Reply(text=ENVELOPE))
    sent = {"anthropic-version": "2023-06-01", "anthropic-beta": BETA}
    r = post(
        p, {"model": "m", "max_tokens": 256, "messages": [{"role": "user", "content": "hi"}]}, sent
    )
    assert r.status_code == 200, r.text
    assert fake.last.headers["anthropic-version"] == "2023-06-01"
    assert fake.last.headers["anthropic-beta"] == BETA
    # Without the client's values, the configured defaults go.
    fake.enqueue(Reply(text=ENVELOPE))
    r = p.http.post(
        p.v1 + "/messages",
        json={"model": "m", "max_tokens": 256, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": "k"},
    )
    assert r.status_code == 200, r.text
    assert fake.last.headers["anthropic-version"] == "2023-01-01"
    assert fake.last.headers["anthropic-beta"] == "configured-beta"


def test_beta_query_is_accepted(fake: FakeProvider, start_proxy: StartProxy) -> None:
    p = anthropic_proxy(start_proxy, fake, "state")
    fake.enqueue(Reply(text=ENVELOPE))
    body = {"model": "m", "max_tokens": 256, "messages": [{"role": "user", "content": "hi"}]}
    r = post(p, body, query="?beta=true")
    assert r.status_code == 200, r.text
    assert r.json()["type"] == "message"
    assert fake.last.path == "/v1/messages"


@pytest.mark.parametrize("mode", ["state", "auto", "mask", "passthrough"])
def test_system_message_and_unmodelled_fields_reach_the_upstream(
    fake: FakeProvider, start_proxy: StartProxy, mode: str
) -> None:
    p = anthropic_proxy(start_proxy, fake, mode)
    fake.enqueue(Reply(text=f"The answer is 42.\n{ENVELOPE}"))
    r = post(p, tool_loop_body(), {"anthropic-beta": BETA})
    assert r.status_code == 200, r.text
    sent = fake.last.json
    for key, value in UNMODELLED.items():
        assert sent[key] == value, key
    assert sent["tools"] == TOOLS  # strict and defer_loading kept
    assert SYSTEM_MSG in sent["messages"]
    roles = [m["role"] for m in sent["messages"]]
    assert roles == ["user", "system", "assistant", "user"]


def test_system_message_first_turn_in_state_mode(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """Turn 1 of Claude Code: the task, then the environment as a system message with a list
    content and a breakpoint."""
    p = anthropic_proxy(start_proxy, fake, "state")
    env = {
        "role": "system",
        "content": [{"type": "text", "text": "# Env", "cache_control": {"type": "ephemeral"}}],
    }
    body = {
        "model": "m",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "task"}]}, env],
    }
    fake.enqueue(Reply(text=ENVELOPE))
    r = post(p, body)
    assert r.status_code == 200, r.text
    msgs = fake.last.json["messages"]
    assert msgs[-1] == env
    assert msgs[0]["role"] == "user" and msgs[0]["content"][0]["text"] == "task"


@pytest.mark.parametrize("mode", ["state", "passthrough"])
def test_system_message_to_an_openai_upstream(
    fake: FakeProvider, start_proxy: StartProxy, mode: str
) -> None:
    up = {"name": "up", "url": fake.url + "/v1", "kind": "openai", "api_key": "sk-up"}
    p = start_proxy(None, config={"mode": mode, "schema": ["notes"], "upstreams": [up]})
    fake.enqueue(Reply(text=ENVELOPE))
    body = tool_loop_body()
    for key in ("thinking", "context_management", "output_config", "diagnostics"):
        body.pop(key)
    body.pop("some_future_field")
    r = post(p, body)
    assert r.status_code == 200, r.text
    sent = fake.last.json["messages"]
    assert {"role": "system", "content": SYSTEM_MSG["content"]} in sent
    call = next(i for i, m in enumerate(sent) if m.get("tool_calls"))
    assert sent[call + 1]["role"] == "tool" and sent[call + 1]["tool_call_id"] == "toolu_1"


@pytest.mark.parametrize("mode", ["state", "auto", "mask", "passthrough"])
def test_thinking_blocks_reach_the_upstream_byte_exact_in_order(
    fake: FakeProvider, start_proxy: StartProxy, mode: str
) -> None:
    p = anthropic_proxy(start_proxy, fake, mode)
    fake.enqueue(Reply(text=ENVELOPE))
    r = post(p, tool_loop_body())
    assert r.status_code == 200, r.text
    body = fake.last.body
    blocks = [js_json(b) for b in THINKING]
    assert b",".join(blocks) + b',{"type":"tool_use"' in body
    for b in blocks:
        assert body.count(b) == 1
    # The client's breakpoints are still there on the blocks that are still sent.
    sent = fake.last.json
    assert sent["messages"][-1]["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert sent["system"][0]["cache_control"] == {"type": "ephemeral"}


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_error_bodies_reach_the_client_unmodified(
    fake: FakeProvider, start_proxy: StartProxy, stream: bool
) -> None:
    p = anthropic_proxy(start_proxy, fake, "state")
    raw = (
        b'{"type":"error","error":{"type":"invalid_request_error",'
        b'"message":"prompt is too long: 250123 tokens > 200000 maximum"},'
        b'"request_id":"req_011CXYZ"}'
    )
    fake.enqueue(Reply(status=400, error_body=raw))
    r = post(p, {**tool_loop_body(), "stream": stream})
    assert r.status_code == 400
    assert r.content == raw


def test_stream_events_relayed_as_received(fake: FakeProvider, start_proxy: StartProxy) -> None:
    """ping, thinking_delta, signature_delta and message_delta's usage with the cache
    counts: the client's bytes are the upstream's, event for event (state mode)."""
    p = anthropic_proxy(start_proxy, fake, "state")
    fake.enqueue(
        Reply(
            thinking=THINKING,
            tool_calls=[ToolCall("Read", {"file_path": "n"}, id="toolu_2")],
            usage={"prompt_tokens": 100, "cache_read": 70, "cache_write": 20},
        )
    )
    r = post(p, {**tool_loop_body(), "stream": True})
    assert r.status_code == 200, r.text
    upstream = fake.last.response_body
    # The proxy adds one SSE comment (its transition summary), which clients skip.
    events = r.content.split(b"\n\n")
    ours = [e for e in events if e.startswith(b": skillstate ")]
    assert len(ours) == 1
    assert b"\n\n".join(e for e in events if e not in ours) == upstream
    for needle in (
        b"event: ping",
        b'"type":"thinking_delta"',
        b'"type":"signature_delta","signature":"EqQBCkYIBxgCKkDs+/sig=="',
        b'"type":"redacted_thinking","data":"RU5DUllQVEVE"',
        b'"cache_read_input_tokens":70',
    ):
        assert needle in upstream
    delta = next(
        json.loads(line[6:])
        for line in upstream.split(b"\n")
        if line.startswith(b"data: ") and b'"message_delta"' in line
    )
    assert delta["usage"]["cache_creation_input_tokens"] == 20
    cost = p.get("/cost", params={"session": "s1"}).json()["totals"]
    assert (cost["cache_read_tokens"], cost["cache_write_tokens"]) == (70, 20)
