"""Hostile upstream bytes: whatever an upstream answers, the client gets the reply or a clear
error in its own dialect (a 502 naming the upstream), never a 500, and nothing is committed
from a reply the client could not be given."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply, ToolCall
from tests.helpers import SESSION_HEADER, envelope

DEEP = 300  # past orjson's 255 levels, under its parser's 1,024


def _nested(depth: int) -> str:
    return '{"a":' + "[" * depth + "]" * depth + "}"


def _proxy(start_proxy: StartProxy, fake: FakeProvider, kind: str, mode: str) -> Proxy:
    up = {"name": "up", "url": fake.url, "kind": kind, "api_key": "k"}
    return start_proxy(None, "--mode", mode, config={"upstreams": [up]})


def _turn(p: Proxy, client: str, session: str = "s1") -> Any:
    if client == "anthropic":
        body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
        headers = {SESSION_HEADER: session, "anthropic-version": "2023-06-01"}
        return p.http.post(p.url + "/v1/messages", json=body, headers=headers)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return p.http.post(p.url + "/v1/chat/completions", json=body, headers={SESSION_HEADER: session})


def _assert_502_in_dialect(r: Any, client: str) -> str:
    assert r.status_code == 502, r.text
    body = r.json()
    if client == "anthropic":
        assert body["type"] == "error"
    message = body["error"]["message"]
    assert "upstream up" in message
    return str(message)


@pytest.mark.parametrize("mode", ["state", "passthrough"])
@pytest.mark.parametrize("depth", [DEEP, 2000])
def test_deep_tool_arguments_translated_for_anthropic_are_a_502(
    fake: FakeProvider, start_proxy: StartProxy, mode: str, depth: int
) -> None:
    """OpenAI arguments are JSON text; an Anthropic client gets them parsed as ``input``,
    which past 255 levels orjson cannot write (and past ~1,000 Python cannot parse)."""
    p = _proxy(start_proxy, fake, "openai", mode)
    fake.enqueue(Reply(tool_calls=[ToolCall("f", _nested(depth))]))
    message = _assert_502_in_dialect(_turn(p, "anthropic"), "anthropic")
    assert "128 levels" in message
    # Nothing was committed, and the session's next turn is ordinary.
    fake.enqueue(Reply(text="fine"))
    r = _turn(p, "anthropic")
    assert r.status_code == 200, r.text
    if mode == "state":
        assert p.state("s1")["step"] == 1


@pytest.mark.parametrize("client", ["openai", "anthropic"])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_reply_nested_past_the_depth_limit_is_a_502(
    fake: FakeProvider, start_proxy: StartProxy, client: str, kind: str
) -> None:
    """One depth limit for JSON from outside: an upstream's reply is held to it too."""
    p = _proxy(start_proxy, fake, kind, "state")
    reply = {"openai": {"choices": [], "junk": json.loads(_nested(DEEP))}}
    reply["anthropic"] = {"type": "message", "content": [], "junk": json.loads(_nested(DEEP))}
    fake.enqueue(Reply(raw_body=json.dumps(reply[kind]).encode()))
    _assert_502_in_dialect(_turn(p, client), client)
    assert p.get("/state", params={"session": "s1"}).status_code == 404


@pytest.mark.parametrize(
    ("digits", "read_as"),
    [
        ("123456789012345678901234567890", 1.2345678901234568e29),
        # Past the float range (Python's int -> float: OverflowError, a 500 before) and past
        # Python's 4,300-digit int conversion limit (ValueError, a 500 before): orjson's
        # reading of such a number is an infinity, which JSON writes as null.
        ("9" * 400, None),
        ("9" * 5000, None),
    ],
)
def test_huge_integer_arguments_translate_for_anthropic(
    fake: FakeProvider, start_proxy: StartProxy, digits: str, read_as: float | None
) -> None:
    """An integer past 64 bits in OpenAI arguments reaches an Anthropic client (as orjson
    would read it: a float) instead of failing to serialise."""
    p = _proxy(start_proxy, fake, "openai", "passthrough")
    fake.enqueue(Reply(tool_calls=[ToolCall("f", '{"n": ' + digits + "}")]))
    r = _turn(p, "anthropic")
    assert r.status_code == 200, r.text
    (block,) = [b for b in r.json()["content"] if b["type"] == "tool_use"]
    assert block["input"] == {"n": read_as}


@pytest.mark.parametrize("client", ["openai", "anthropic"])
def test_reply_text_that_is_not_a_string_is_no_text(
    fake: FakeProvider, start_proxy: StartProxy, client: str
) -> None:
    """A same-dialect reply whose text is not a string is judged as no text, not a 500."""
    p = _proxy(start_proxy, fake, client, "state")
    bodies = {
        "anthropic": {"type": "message", "content": [{"type": "text", "text": [1]}]},
        "openai": {"choices": [{"index": 0, "message": {"content": [{"text": {"a": 1}}]}}]},
    }
    fake.enqueue(Reply(raw_body=json.dumps(bodies[client]).encode()))
    r = _turn(p, client)
    assert r.status_code == 200, r.text
    assert r.headers["x-skillstate-step"] == "1"
    assert p.state("s1")["step"] == 1


def test_deep_tool_arguments_from_an_openai_client_to_anthropic_are_a_400(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """The same arguments text in a client's transcript: its own fault, a 400 in its dialect,
    and nothing sent upstream."""
    p = _proxy(start_proxy, fake, "anthropic", "passthrough")
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": _nested(DEEP)}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    r = p.http.post(p.url + "/v1/chat/completions", json={"model": "m", "messages": messages})
    assert r.status_code == 400, r.text
    assert "arguments" in r.json()["error"]["message"]
    assert not fake.requests


def _openai_sse(*chunks: str) -> bytes:
    ok = '{"id":"x","model":"m","choices":[{"index":0,"delta":{"content":"hi"}}]}'
    end = '{"id":"x","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}'
    events = [ok, *chunks, end]
    return b"".join(f"data: {c}\n\n".encode() for c in events) + b"data: [DONE]\n\n"


def _anthropic_sse(*events: tuple[str, str]) -> bytes:
    start = '{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant",'
    start += '"model":"m","content":[],"usage":{"input_tokens":1,"output_tokens":0}}}'
    block = '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}'
    stop_delta = '{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{}}'
    all_events = [
        ("message_start", start),
        ("content_block_start", block),
        *events,
        ("content_block_stop", '{"type":"content_block_stop","index":0}'),
        ("message_delta", stop_delta),
        ("message_stop", '{"type":"message_stop"}'),
    ]
    return b"".join(f"event: {n}\ndata: {d}\n\n".encode() for n, d in all_events)


def _stream(p: Proxy, client: str, session: str) -> Any:
    if client == "anthropic":
        body = {"model": "m", "max_tokens": 10, "stream": True,
                "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
        headers = {SESSION_HEADER: session, "anthropic-version": "2023-06-01"}
        return p.http.post(p.url + "/v1/messages", json=body, headers=headers)
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    return p.http.post(p.url + "/v1/chat/completions", json=body, headers={SESSION_HEADER: session})


TEXT_A_LIST = '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":[1]}}'
HOSTILE_STREAMS = {
    "openai-choices-a-string": ("openai", _openai_sse('{"choices":"abc"}')),
    "openai-choice-a-list": ("openai", _openai_sse('{"choices":[[1]]}')),
    "openai-delta-a-list": ("openai", _openai_sse('{"choices":[{"index":0,"delta":[1]}]}')),
    "openai-model-a-list": ("openai", _openai_sse('{"model":["m"],"choices":[]}')),
    "anthropic-message-a-list": (
        "anthropic",
        _anthropic_sse(("message_start", '{"type":"message_start","message":[1]}')),
    ),
    "anthropic-model-a-list": (
        "anthropic",
        _anthropic_sse(("message_start", '{"type":"message_start","message":{"model":[1]}}')),
    ),
    "anthropic-text-a-list": ("anthropic", _anthropic_sse(("content_block_delta", TEXT_A_LIST))),
    "anthropic-error-a-string": ("anthropic", _anthropic_sse(("error", '{"error":"x"}'))),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_STREAMS))
@pytest.mark.parametrize("client", ["openai", "anthropic"])
def test_a_stream_event_of_a_shape_no_provider_sends_never_cuts_the_connection(
    fake: FakeProvider, start_proxy: StartProxy, case: str, client: str
) -> None:
    """A cut connection is retried by the SDKs (and billed again); an event the relay cannot
    read ends the stream with an error event in the client's dialect, or is ignored."""
    kind, raw = HOSTILE_STREAMS[case]
    p = _proxy(start_proxy, fake, kind, "state")
    fake.enqueue(Reply(raw_body=raw))
    r = _stream(p, client, "s1")  # a cut connection raises here
    assert r.status_code == 200
    assert "internal proxy error" not in r.text
    last = [line for line in r.text.splitlines() if line.startswith("data: ")][-1]
    # Either the relay ignores what it cannot use and the stream ends as usual, or the
    # stream ends with an error event naming the upstream.
    assert last in ("data: [DONE]", 'data: {"type":"message_stop"}') or "upstream up sent" in last
    fake.enqueue(Reply(text="fine"))
    assert _turn(p, client).status_code == 200  # the session goes on


def test_an_sse_event_that_never_ends_is_bounded(
    fake: FakeProvider, start_proxy: StartProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upstream that never ends an event (no blank line) cannot hold memory without bound:
    past MAX_EVENT_BYTES the stream ends with an error event."""
    from skillstate.dialects import sse

    monkeypatch.setattr(sse, "MAX_EVENT_BYTES", 64 * 1024, raising=False)
    p = _proxy(start_proxy, fake, "openai", "state")
    raw = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\ndata: ' + b"x" * 2**18
    fake.enqueue(Reply(raw_body=raw))
    r = _stream(p, "openai", "s1")
    assert r.status_code == 200
    assert f"an SSE event over {64 * 1024} bytes" in r.text


def test_a_reply_over_the_size_bound_is_a_failed_attempt(
    fake: FakeProvider, start_proxy: StartProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A non-streamed answer is read whole before it is judged: past MAX_REPLY_BYTES it is a
    failed attempt (retried, then a 502 naming the upstream), not memory taken without bound
    (before: a 2 GB answer took the proxy to 7 GB RSS)."""
    from skillstate.upstream import client as upstream_client

    monkeypatch.setattr(upstream_client, "MAX_REPLY_BYTES", 64 * 1024, raising=False)
    p = _proxy(start_proxy, fake, "openai", "passthrough")
    fake.enqueue(*[Reply(text="a" * (256 * 1024))] * 5)
    r = _turn(p, "openai")
    assert r.status_code == 502, r.text
    message = r.json()["error"]["message"]
    assert f"up: ReplyTooLarge: the answer is over {64 * 1024} bytes" in message


JUNK_USAGE = '{"prompt_tokens": "x", "completion_tokens": 123456789012345678901234567890}'


@pytest.mark.parametrize("mode", ["passthrough", "state"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_upstreams_junk_usage_reaches_a_responses_client_as_zero(
    fake: FakeProvider, start_proxy: StartProxy, mode: str, stream: bool
) -> None:
    """A chat upstream's usage becomes the Responses API's: a count that is a string was a
    500 (int("x"): ValueError; the connection reset for a stream), one past 64 bits a 500
    when the reply was written (orjson: Integer exceeds 64-bit range). Such a count is 0,
    as everywhere else usage is read."""
    p = _proxy(start_proxy, fake, "openai", mode)
    usage = json.loads(JUNK_USAGE)
    if stream:
        fake.enqueue(Reply(raw_body=_openai_sse(json.dumps({"choices": [], "usage": usage}))))
    else:
        message = {"role": "assistant", "content": envelope({})}  # judged valid: no re-ask
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        body = {"id": "c", "object": "chat.completion", "choices": [choice], "usage": usage}
        fake.enqueue(Reply(raw_body=json.dumps(body).encode()))
    r = p.http.post(
        p.url + "/v1/responses",
        json={"model": "m", "input": "hi", "stream": stream},
        headers={SESSION_HEADER: "s1"},
    )
    assert r.status_code == 200, r.text
    if stream:
        events = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
        assert events[-1]["type"] == "response.completed", events[-1]
        final = events[-1]["response"]
    else:
        final = r.json()
    assert final["usage"]["input_tokens"] == 0 and final["usage"]["output_tokens"] == 0
