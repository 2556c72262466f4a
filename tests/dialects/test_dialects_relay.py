"""Stream relays: what the state engine captures from a stream it forwards."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest

from skillstate.cost.usage import Usage
from skillstate.dialects import sse
from skillstate.dialects.registry import make_relay


def chunk(index: int, **delta: Any) -> bytes:
    body = {"id": "c", "object": "chat.completion.chunk", "model": "m"}
    return sse.encode({**body, "choices": [{"index": index, "delta": delta}]})


def test_with_n_choices_the_captured_text_is_choice_zero() -> None:
    # OpenAI interleaves the choices of an n > 1 stream.
    a = ['{"state_patch": {"x": ', '1}, "action": "a"}']
    b = ["other ", "text"]
    stream = b"".join(
        [
            chunk(0, content=a[0]),
            chunk(1, content=b[0]),
            chunk(1, tool_calls=[{"index": 0, "id": "t", "function": {"name": "f"}}]),
            chunk(0, content=a[1]),
            chunk(1, content=b[1]),
            b"data: [DONE]\n\n",
        ]
    )
    relay = make_relay(
        "openai", "openai", request_model="m", client_wants_usage=False, capture_limit=1 << 20
    )
    forwarded = [raw for e in sse.SSEParser().feed(stream) for raw in relay.feed(e)]
    assert b"".join([*forwarded, *relay.finish()]) == stream  # the client gets every choice
    assert json.loads(relay.text) == {"state_patch": {"x": 1}, "action": "a"}
    assert not relay.has_tool_calls  # choice 1's call is not choice 0's


def _openai_text_stream(pieces: int, piece: str) -> bytes:
    return b"".join(chunk(0, content=piece) for _ in range(pieces)) + b"data: [DONE]\n\n"


def _anthropic_text_stream(pieces: int, piece: str) -> bytes:
    head = [
        sse.encode(
            {"type": "message_start", "message": {"id": "m", "model": "m", "usage": {}}},
            event="message_start",
        ),
        sse.encode(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
            event="content_block_start",
        ),
    ]
    delta = sse.encode(
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}},
        event="content_block_delta",
    )
    tail = sse.encode({"type": "message_stop"}, event="message_stop")
    return b"".join([*head, *([delta] * pieces), tail])


@pytest.mark.parametrize(
    ("client", "upstream", "stream_of"),
    [
        ("anthropic", "openai", _openai_text_stream),
        ("openai", "anthropic", _anthropic_text_stream),
        ("openai", "openai", _openai_text_stream),
        ("anthropic", "anthropic", _anthropic_text_stream),
    ],
)
def test_a_long_stream_holds_no_more_text_than_the_capture_limit(
    client: str, upstream: str, stream_of: Any
) -> None:
    # Issue 13 item 11: across dialects the whole reply text was kept (and re-joined on every
    # chunk) whatever capture_limit said. 4 MiB of text through a 64 KiB capture: what the
    # relay holds must stay near the limit, not grow with the reply.
    limit, piece, pieces = 64 << 10, "x" * 1024, 4096
    stream = stream_of(pieces, piece)
    events = sse.SSEParser().feed(stream)
    relay = make_relay(
        client, upstream, request_model="m", client_wants_usage=False, capture_limit=limit
    )
    tracemalloc.start()
    try:
        for e in events:
            relay.feed(e)  # what the client is sent is dropped at once, as a socket would
        relay.finish()
        text = relay.text
        held = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert relay.complete
    assert text == piece * (limit // len(piece))  # a prefix of the reply, no holes
    assert held < 1 << 20, f"{held} bytes held for a {limit}-character capture"


def _anthropic_stream_with_one_hour_writes() -> bytes:
    """A Messages stream as the API sends it for a request marking ``"ttl": "1h"``: the writes'
    TTL split on message_start only; message_delta repeats the sums (MessageDeltaUsage has
    no ``cache_creation``)."""
    start_usage = {
        "input_tokens": 10,
        "cache_creation_input_tokens": 5_000,
        "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 2_000, "ephemeral_1h_input_tokens": 3_000},
        "output_tokens": 1,
    }
    delta_usage = {k: v for k, v in start_usage.items() if k != "cache_creation"}
    message = {"id": "m", "model": "m", "usage": start_usage}
    text = {"type": "text_delta", "text": "hi"}
    events = [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": text},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {**delta_usage, "output_tokens": 7},
        },
        {"type": "message_stop"},
    ]
    return b"".join(sse.encode(e, event=e["type"]) for e in events)


@pytest.mark.parametrize("client", ["anthropic", "openai"])
def test_a_streams_one_hour_cache_writes_reach_the_usage(client: str) -> None:
    """Native and translated alike (a Responses client's stream is the chat relay's, chained),
    the ledger's usage has the one-hour writes from message_start, though message_delta
    (which comes later) has only their sum."""
    relay = make_relay(
        client, "anthropic", request_model="m", client_wants_usage=True, capture_limit=1 << 20
    )
    forwarded = [
        raw
        for e in sse.SSEParser().feed(_anthropic_stream_with_one_hour_writes())
        for raw in relay.feed(e)
    ]
    forwarded += relay.finish()
    assert relay.usage == Usage(5_010, 7, 0, 5_000, cache_write_1h_tokens=3_000)
    if client == "openai":  # the chat client's usage is the sums, as before
        usage_chunks = [
            json.loads(raw.removeprefix(b"data: "))
            for raw in forwarded
            if raw.startswith(b"data: {") and b'"usage":{' in raw
        ]
        assert usage_chunks[-1]["usage"]["prompt_tokens_details"] == {
            "cached_tokens": 0,
            "cache_write_tokens": 5_000,
        }
