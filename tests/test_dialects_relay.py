"""Stream relays: what the state engine captures from a stream it forwards."""

from __future__ import annotations

import json
from typing import Any

from skillstate.dialects import sse
from skillstate.dialects.relay import make_relay


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
