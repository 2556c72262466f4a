"""skillstate.jsonkeys: whether JSON text holds each object's keys once, at any depth, keys
compared as decoded (the same key to every parser however it is escaped)."""

from __future__ import annotations

import json

import orjson
import pytest

from skillstate.bench.overhead.transcripts import transcript
from skillstate.jsonkeys import keys_once

REPEATED = [
    b'{"model":"big","model":"m"}',
    b'{"a":1,"b":2,"a":1}',  # the same value twice is still a key twice
    b'{"messages":[{"role":"user","content":"x","content":"y"}]}',
    b'{"m":[{"c":[{"type":"text","text":"x","text":"y"}]}]}',
    b'{"tool_calls":[{"function":{"name":"a","arguments":"{}","name":"b"}}]}',
    b'[1,{"x":{"y":{"z":[{"k":0,"k":1}]}}}]',  # deep inside a list at the top
    b'{"a":1,"\\u0061":2}',  # "\u0061" is "a"
    b'{"\\u006dodel":"big","model":"m"}',
    b'{"caf\\u00e9":1,"caf\xc3\xa9":2}',  # escaped and raw UTF-8: one key
    b'{"\\ud83d\\ude00":1,"\xf0\x9f\x98\x80":2}',  # a surrogate pair and the raw emoji
    b'{"\\/":1,"/":2}',
    b'{ "a" : 1 ,\n "a"\t: 2 }',
    b'{"":1,"":2}',
]
ONCE = [
    b"{}",
    b"[]",
    b'"text"',
    b'{"a":1,"b":{"a":1},"c":[{"a":1},{"a":2}]}',  # the same key in different objects
    b'{"a":1,"A":2,"a ":3,"\\u0061\\u0061":4}',
    b'{"s":"\\"a\\":1,\\"a\\":2"}',  # a key twice inside a string is text
    b'{"k\\\\":1,"k":2}',  # "k\\" is k and a backslash
]


@pytest.mark.parametrize("text", REPEATED)
def test_a_key_twice_in_an_object_is_found(text: bytes) -> None:
    assert orjson.loads(text) is not None  # valid JSON, which orjson reads (the last wins)
    assert not keys_once(text)


@pytest.mark.parametrize("text", ONCE)
def test_keys_once_per_object(text: bytes) -> None:
    orjson.loads(text)
    assert keys_once(text)


@pytest.mark.parametrize("text", [b"", b"{", b'{"a":1}x', b'{"a":"\xff"}', b"[" * 100_000])
def test_what_it_cannot_read_shows_nothing(text: bytes) -> None:
    assert not keys_once(text)


def test_a_large_body_with_one_key_twice_deep_in_it() -> None:
    body = {"model": "m", "messages": transcript(300 * 1024), "max_tokens": 256}
    raw = orjson.dumps(body)
    assert len(raw) > 300 * 1024 and keys_once(raw)
    assert keys_once(json.dumps(body, indent=2).encode())
    last = raw.rindex(b'"role":')
    repeated = raw[:last] + b'"role":"user",' + raw[last:]
    assert orjson.loads(repeated) == body
    assert not keys_once(repeated)
