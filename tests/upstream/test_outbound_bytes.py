"""What ``Outbound`` sends of a client's body: its own bytes while nothing changed it, its
own bytes with the members the proxy adds, else a serialisation of what it became."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from skillstate.config import Upstream
from skillstate.cost.cachehints import CacheHints
from skillstate.upstream.client import Outbound

RAW = b' {"model": "m" ,\n "messages": [{"role": "user", "content": "caf\\u00e9"}] }\n'


def outbound(raw: bytes = RAW, **kw: Any) -> Outbound:
    return Outbound("openai", orjson.loads(raw), False, 1, {}, raw=raw, **kw)


def test_the_clients_body_untouched_is_its_own_bytes() -> None:
    assert outbound().payload_for("openai") == RAW


def test_members_the_proxy_adds_follow_the_clients_own_bytes() -> None:
    out = outbound()
    streamed = Outbound("openai", out.body, True, 1, {}, raw=RAW)
    sent = streamed.payload_for("openai")  # a stream asks for usage in its last chunk
    assert sent.startswith(RAW.rstrip()[:-1].rstrip() + b',"stream_options":')
    assert orjson.loads(sent) == {**out.body, "stream_options": {"include_usage": True}}
    empty = Outbound("openai", {}, True, 1, {}, raw=b"{ }")
    assert empty.payload_for("openai") == b'{"stream_options":{"include_usage":true}}'


@pytest.mark.parametrize("stream_options", [None, {"include_obfuscation": False}])
def test_a_member_of_the_clients_that_changes_is_serialised(stream_options: Any) -> None:
    raw = RAW.replace(
        b'"model"', b'"stream_options": ' + orjson.dumps(stream_options) + b', "model"'
    )
    body = orjson.loads(raw)
    sent = Outbound("openai", body, True, 1, {}, raw=raw).payload_for("openai")
    assert sent == orjson.dumps(
        {**body, "stream_options": {**(stream_options or {}), "include_usage": True}}
    )


def test_another_format_or_no_client_bytes_is_serialised() -> None:
    assert outbound(raw=RAW).payload_for("anthropic") != RAW  # bridged: another body
    body = orjson.loads(RAW)
    assert Outbound("openai", body, False, 1, {}).payload_for("openai") == orjson.dumps(body)


def test_the_stable_prefix_is_found_only_for_an_upstream_that_takes_a_breakpoint() -> None:
    """Finding the cache breakpoint's place (the contract in the transcript, its tokens) is
    left to the first upstream that reads it: one billed like Anthropic's cache."""
    found: list[int] = []

    def find() -> tuple[str | None, int]:
        found.append(1)
        return None, 0

    hints = CacheHints("skillstate-key", find=find)
    out = outbound(cache_hints=hints)
    openai = Upstream(name="o", url="http://o.example", kind="openai")
    sent = out.payload_for_upstream(openai, "openai", "max_tokens")
    assert orjson.loads(sent)["prompt_cache_key"] == "skillstate-key"
    assert found == []
    anthropic = Upstream(name="a", url="http://a.example", kind="anthropic")
    out.payload_for_upstream(anthropic, "anthropic", "max_tokens")
    assert found == [1]
    assert (hints.prefix_end, hints.prefix_tokens) == (None, 0) and found == [1]  # once
