"""skillstate.jsontext: an upstream's JSON as orjson reads it, and the JSON orjson refuses
but RFC 8259 allows (an escaped lone surrogate, as a JavaScript server that cuts a string by
UTF-16 index writes), read with U+FFFD in its place: through a reply and a stream too."""

from __future__ import annotations

import orjson
import pytest

from skillstate.dialects import sse
from skillstate.dialects.registry import read_reply
from skillstate.dialects.relay import OpenAIToAnthropicRelay
from skillstate.jsontext import integers_beyond_64_bits, large_floats, loads

LONE = b'{"content": "a\\ud83d", "\\udc00key": ["\\ude00b"]}'


def test_what_orjson_reads_is_orjson_s() -> None:
    text = b'{"a": [1, 2.5, "\\ud83d\\ude00", null], "b": {"c": true}}'
    assert (
        loads(text) == orjson.loads(text) == {"a": [1, 2.5, "\U0001f600", None], "b": {"c": True}}
    )
    assert loads(text.decode()) == orjson.loads(text)


def test_an_escaped_lone_surrogate_is_read_as_u_fffd() -> None:
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(LONE)
    value = loads(LONE)
    assert value == {"content": "a\ufffd", "\ufffdkey": ["\ufffdb"]}
    assert orjson.loads(orjson.dumps(value)) == value  # writable again
    assert loads(LONE.decode()) == value


@pytest.mark.parametrize("text", [b"", b"{", b'{"a": "\\ud83d"', b"not json \\ud83d", b"[1,]"])
def test_text_that_is_no_json_is_refused_as_orjson_refuses_it(text: bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError):
        loads(text)


def reply(content: str) -> bytes:
    message = b'{"role": "assistant", "content": "' + content.encode() + b'"}'
    return (
        b'{"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", '
        b'"choices": [{"index": 0, "message": ' + message + b', "finish_reason": "stop"}], '
        b'"usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}'
    )


def test_a_reply_with_a_lone_surrogate_is_relayed_as_it_came_or_translated() -> None:
    raw = reply("ok \\ud83d")
    same = read_reply(raw, "openai", "openai", "m")
    assert isinstance(same, tuple) and same[2] == raw  # passthrough: the bytes as they came
    translated = read_reply(raw, "openai", "anthropic", "m")
    assert isinstance(translated, tuple)
    assert translated[1]["content"][0]["text"] == "ok \ufffd"


def test_a_stream_that_splits_an_emoji_across_events_goes_on() -> None:
    relay = OpenAIToAnthropicRelay(request_model="m", capture_limit=1 << 20)
    pieces = ["a\\ud83d", "\\ude00b"]
    raw = b"".join(
        b'data: {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": '
        b'[{"index": 0, "delta": {"content": "' + p.encode() + b'"}, "finish_reason": null}]}\n\n'
        for p in pieces
    )
    out = b"".join(b for e in sse.SSEParser().feed(raw) for b in relay.feed(e))
    events = [orjson.loads(e.data) for e in sse.SSEParser().feed(out)]
    deltas = [e["delta"]["text"] for e in events if e["type"] == "content_block_delta"]
    assert "".join(deltas) == "a\ufffd\ufffdb"
    assert not any(e["type"] == "error" for e in events)


def test_an_integer_orjson_cannot_hold_is_told_from_a_float() -> None:
    # orjson reads an integer beyond -2**63 .. 2**64 - 1 as the nearest float, silently.
    text = (
        b'{"a": [123456789012345678901234567890, 1e30, 18446744073709551615],'
        b' "b": {"c": -9223372036854775809, "d": 9.3e18}}'
    )
    value = orjson.loads(text)
    assert value["a"][0] == 1.2345678901234568e29 and value["b"]["c"] == -(2.0**63)
    large = large_floats(value)
    assert sorted(large, key=str) == [("a", 0), ("a", 1), ("b", "c"), ("b", "d")]
    assert integers_beyond_64_bits(text, large) == [("a", 0), ("b", "c")]
    assert integers_beyond_64_bits(text.decode(), [("b", "c")]) == [("b", "c")]
    # What follows the first JSON value (a closing fence) is ignored; leading blanks too.
    assert integers_beyond_64_bits(b" \n[1e19, 18446744073709551616]```", [(0,), (1,)]) == [(1,)]
    assert integers_beyond_64_bits(text, []) == []
    assert integers_beyond_64_bits(text, [("nowhere",), ("a", 9), ("a", 0, 1)]) == []
    assert large_floats({"x": [1.0, 2**70, float(2**62)]}) == []  # ints are not floats here


def test_a_text_the_standard_parser_cannot_read_finds_no_integer() -> None:
    deep = b"[" * 2000 + b"1" + b"]" * 2000  # past the standard parser's recursion
    assert integers_beyond_64_bits(deep, [(0,)]) == []
    assert integers_beyond_64_bits(b"[1e30", [(0,)]) == []
    assert integers_beyond_64_bits(b"[\xff, 1e30]", [(1,)]) == []  # no UTF-8
