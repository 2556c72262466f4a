"""The Idempotency-Key fingerprint (skillstate.turn.idempotency): one request, however its
JSON objects are ordered (RFC 8259: an object is unordered); another request when an array
is in another order, or the route differs. A key kept under the fingerprint releases made
before it was canonical (the members in the order they came) still answers the same bytes."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from skillstate.errors import ProxyError
from skillstate.store import KeptReply
from skillstate.turn.idempotency import idempotency_of

BODY: dict[str, Any] = {
    "model": "m",
    "max_tokens": 100,
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"a": 1, "b": 2}}}],
    "metadata": {"z": "1", "a": "2"},
}


def reordered(value: Any) -> Any:
    """``value`` with the members of every object in reverse order (arrays as they are)."""
    if isinstance(value, dict):
        return {k: reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reordered(v) for v in value]
    return value


def fingerprint(body: dict[str, Any], route: str = "openai") -> str:
    return idempotency_of("k-1", "s1", route, body).fingerprint


def legacy(body: dict[str, Any], route: str = "openai") -> str:
    """The fingerprint as releases before the canonical one made it."""
    return hashlib.sha256(route.encode() + b"\n" + orjson.dumps(body)).hexdigest()


def kept(fp: str) -> KeptReply:
    return KeptReply("s1", "k-1", fp, "s1", 0.0, 200, False, {}, b"{}", 1)


def test_members_in_another_order_at_any_depth_are_the_same_request_arrays_not() -> None:
    again = reordered(BODY)
    assert json.dumps(again) != json.dumps(BODY)  # other bytes, top level and nested
    assert list(again) != list(BODY) and list(again["metadata"]) != list(BODY["metadata"])
    assert fingerprint(again) == fingerprint(BODY)
    # An array in another order, another route or another value is another request.
    swapped = {**BODY, "messages": list(reversed(BODY["messages"]))}
    assert fingerprint(swapped) != fingerprint(BODY)
    assert fingerprint(BODY, "anthropic") != fingerprint(BODY)
    assert fingerprint({**BODY, "stream": True}) != fingerprint(BODY)
    assert fingerprint({**BODY, "max_tokens": 101}) != fingerprint(BODY)


def test_a_retry_in_another_order_replays_and_another_body_is_a_422() -> None:
    idem = idempotency_of("k-1", "s1", "openai", reordered(BODY))
    first = kept(fingerprint(BODY))
    assert idem.replay(first) is first
    other = idempotency_of("k-1", "s1", "openai", {**BODY, "max_tokens": 1})
    with pytest.raises(ProxyError) as e:
        other.replay(first)
    assert e.value.status == 422 and e.value.code == "idempotency_key_reused"


def test_a_key_kept_before_the_upgrade_answers_the_same_bytes_and_only_them() -> None:
    before = kept(legacy(BODY))  # kept by the earlier release (or replica) under its hash
    assert before.fingerprint != fingerprint(BODY)
    assert idempotency_of("k-1", "s1", "openai", BODY).replay(before) is before
    # Its parts (a compaction's checkpoint) too.
    part = idempotency_of("k-1", "s1", "openai", BODY).part("checkpoint", only_valid=True)
    assert part.replay(before) is before
    # The old hash named the bytes' order: a retry in another order was never its request.
    with pytest.raises(ProxyError) as e:
        idempotency_of("k-1", "s1", "openai", reordered(BODY)).replay(before)
    assert e.value.code == "idempotency_key_reused"
    with pytest.raises(ProxyError):
        idempotency_of("k-1", "s1", "anthropic", BODY).replay(before)


# Strings as a parsed body has them: no lone surrogate (skillstate.jsontext makes each U+FFFD).
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=5)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner),
    max_leaves=20,
)


@given(st.dictionaries(TEXT, JSON, max_size=6))
def test_any_object_reordered_has_the_same_fingerprint(body: dict[str, Any]) -> None:
    assert fingerprint(reordered(body)) == fingerprint(body)
    assert fingerprint(json.loads(json.dumps(body, indent=2))) == fingerprint(body)
