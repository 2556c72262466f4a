from __future__ import annotations

import math
import time

import orjson
from hypothesis import given
from hypothesis import strategies as st

from skillstate.cost.tokens import (
    BYTES_PER_TOKEN,
    MESSAGE_OVERHEAD_TOKENS,
    estimate_text_tokens,
    estimate_tokens,
)


def _ceil4(n: int) -> int:
    return math.ceil(n / BYTES_PER_TOKEN)


def test_text_tokens_is_utf8_bytes_over_4() -> None:
    assert estimate_text_tokens("") == 0
    assert estimate_text_tokens("abc") == 1
    assert estimate_text_tokens("abcd") == 1
    assert estimate_text_tokens("abcde") == 2
    # "é" is 2 UTF-8 bytes, "漢" is 3
    assert estimate_text_tokens("éé") == 1
    assert estimate_text_tokens("漢漢漢") == 3  # 9 bytes


def test_messages_list_is_compact_json_plus_overhead() -> None:
    msgs = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hello there"},
    ]
    expected = _ceil4(len(orjson.dumps(msgs))) + 2 * MESSAGE_OVERHEAD_TOKENS
    assert estimate_tokens(msgs) == expected


def test_body_counts_messages_input_and_system() -> None:
    body = {"model": "m", "system": "be brief", "messages": [{"role": "user", "content": "x"}]}
    assert estimate_tokens(body) == _ceil4(len(orjson.dumps(body))) + 2 * MESSAGE_OVERHEAD_TOKENS
    responses = {"model": "m", "input": [{"role": "user", "content": "x"}] * 3}
    assert estimate_tokens(responses) == (
        _ceil4(len(orjson.dumps(responses))) + 3 * MESSAGE_OVERHEAD_TOKENS
    )


def test_raw_bytes_are_parsed_so_whitespace_does_not_count() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    pretty = orjson.dumps(body, option=orjson.OPT_INDENT_2)
    assert estimate_tokens(pretty) == estimate_tokens(body)
    assert estimate_tokens(b"not json at all") == _ceil4(15)


def test_none_and_str() -> None:
    assert estimate_tokens(None) == 0
    assert estimate_tokens("abcdefgh") == 2


def test_never_raises_on_odd_values() -> None:
    assert estimate_tokens({1: "a"}) > 0  # non-string key
    assert estimate_tokens({"n": 2**70}) > 0  # beyond orjson's 64-bit ints
    assert estimate_tokens(["\ud800"]) > 0  # lone surrogate
    assert estimate_tokens({"o": object()}) > 0  # str() fallback


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@given(json_values)
def test_estimate_is_a_nonnegative_int(value: object) -> None:
    n = estimate_tokens(value)
    assert isinstance(n, int)
    assert n >= 0


@given(st.lists(st.text(), max_size=10), st.lists(st.text(), min_size=1, max_size=10))
def test_more_messages_never_estimate_fewer_tokens(a: list[str], b: list[str]) -> None:
    ma = [{"role": "user", "content": t} for t in a]
    mb = [{"role": "user", "content": t} for t in b]
    assert estimate_tokens(ma + mb) > estimate_tokens(ma)


def test_100kb_messages_list_is_fast() -> None:
    msgs = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": ("lorem ipsum " * 42)[:500]}
        for i in range(190)
    ]
    size = len(orjson.dumps(msgs))
    assert 95_000 < size < 110_000
    estimate_tokens(msgs)
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        estimate_tokens(msgs)
    per_call = (time.perf_counter() - t0) / n
    # ~55 µs on the dev box; a generous bound so slow CI machines do not flake.
    assert per_call < 0.005, f"estimate_tokens took {per_call * 1e6:.0f} µs for {size} bytes"


def _nested_lists(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_nesting_deeper_than_any_encoder_is_still_counted() -> None:
    # orjson refuses more than 255 levels and a recursive encoder fails near 1,000: the
    # estimate must still be the compact JSON length of the value, with no RecursionError.
    for depth in (300, 5000):
        body = {"messages": [{"role": "user", "content": _nested_lists(depth)}]}
        compact = len('{"messages":[{"role":"user","content":}]}') + 2 * depth
        assert estimate_tokens(body) == _ceil4(compact) + MESSAGE_OVERHEAD_TOKENS


def test_the_iterative_fallback_agrees_with_orjson() -> None:
    # A >64-bit int sends the whole value down the fallback; everything else must measure
    # exactly as orjson would have serialised it.
    value = {"a": [1, {"b": None, "c": "é漢"}, [], {}], "n": 2**70, 3: [True, 1.5]}
    expected = orjson.dumps({**value, "n": 0}, option=orjson.OPT_NON_STR_KEYS)
    assert estimate_tokens(value) == _ceil4(len(expected) - 1 + len(str(2**70)))
