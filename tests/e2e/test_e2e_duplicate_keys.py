"""A body with a key twice in one object, at any depth, sent as raw bytes (an SDK cannot send
one) through a real proxy to the fake provider, on chat completions, Messages and Responses.

orjson keeps the last value of a repeated key; a provider's parser may keep the first or
refuse the body. The proxy routes, checks and bills what it read, so the upstream must get
bytes that mean exactly that to any parser: every key once. Passthrough (and auto in its
passthrough form) sent the client's own bytes, duplicates and all: ``{"model": "big",
"model": "m"}`` went upstream as it came, read as model ``m`` by the proxy and ``big`` by a
first-wins parser. The client's own bytes now go only when shown to hold every key once (a
named session's compact request spliced on its previous one); anything else is the proxy's
serialisation of what it read."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from tests.conftest import InProcessProxy, StartProxy
from tests.fakeprovider import FakeProvider, RecordedRequest
from tests.helpers import SESSION_HEADER

ROUTES = {
    "openai": "/v1/chat/completions",
    "anthropic": "/v1/messages",
    "openai-responses": "/v1/responses",
}
TRANSCRIPT = {"openai": "messages", "anthropic": "messages", "openai-responses": "input"}

# Per route: the transcript (compact JSON, as SDKs write it), each item holding a key twice
# somewhere (a message, a content block, a tool call), the top level too ("\u006dodel" is
# "model" escaped: the same key to every parser).
CHAT_LIKE = {  # the same on chat completions and Responses
    "escaped key": (b'"\\u006dodel":"big","model":"m",', b""),
    "message": (b'"model":"m",', b'{"role":"user","content":"SECRET","content":"hi"}'),
}
CASES: dict[str, dict[str, tuple[bytes, bytes]]] = {
    "openai": {
        "top level": (b'"model":"big","max_tokens":9000,"model":"m","max_tokens":50,', b""),
        **CHAT_LIKE,
        "tool call": (
            b'"model":"m",',
            b'{"role":"user","content":"go"},{"role":"assistant","content":null,"tool_calls":'
            b'[{"id":"c1","type":"function","function":{"name":"rm","arguments":"{}",'
            b'"name":"sh"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"},'
            b'{"role":"user","content":"next"}',
        ),
    },
    "anthropic": {
        "top level": (b'"model":"big","max_tokens":9000,"model":"m","max_tokens":50,', b""),
        "escaped key": (b'"model":"big","\\u006dodel":"m","max_tokens":50,', b""),
        "content block": (
            b'"model":"m","max_tokens":50,',
            b'{"role":"user","content":[{"type":"text","text":"SECRET","text":"hi"}]}',
        ),
        "tool use": (
            b'"model":"m","max_tokens":50,',
            b'{"role":"user","content":"go"},{"role":"assistant","content":[{"type":"tool_use",'
            b'"id":"t1","name":"sh","input":{"cmd":"rm -rf /","cmd":"ls"}}]},{"role":"user",'
            b'"content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}',
        ),
    },
    "openai-responses": {
        "top level": (b'"model":"big","model":"m",', b""),
        **CHAT_LIKE,
        "function call": (
            b'"model":"m",',
            b'{"role":"user","content":"go"},{"type":"function_call","call_id":"c1",'
            b'"name":"rm","arguments":"{}","name":"sh"},{"type":"function_call_output",'
            b'"call_id":"c1","output":"ok"}',
        ),
    },
}
USER = b'{"role":"user","content":"hi"}'


def start(fake: FakeProvider, start_proxy: StartProxy, kind: str) -> InProcessProxy:
    url = fake.url if kind == "anthropic" else fake.url + "/v1"
    up = {"name": "up", "url": url, "kind": kind, "api_key": "sk-upstream", "models": ["m"]}
    return start_proxy(None, config={"upstreams": [up], "schema": ["facts"]})


def body(kind: str, lead: bytes, items: bytes) -> bytes:
    """The request's bytes: ``lead`` members, then the transcript of ``items``."""
    return b"{" + lead + b'"' + TRANSCRIPT[kind].encode() + b'":[' + items + b"]}"


def forward(
    fake: FakeProvider, p: InProcessProxy, kind: str, raw: bytes, mode: str, sid: str | None
) -> RecordedRequest:
    """``raw`` posted to the proxy's route for ``kind``: the one request the upstream got."""
    fake.reset()
    headers = {"content-type": "application/json", "x-skillstate-mode": mode}
    if kind == "anthropic":
        headers["anthropic-version"] = "2023-06-01"
    if sid is not None:
        headers[SESSION_HEADER] = sid
    r = p.http.post(p.url + ROUTES[kind], content=raw, headers=headers)
    assert r.status_code == 200, r.text
    (sent,) = fake.requests
    return sent


def first_wins(raw: bytes) -> Any:
    """``raw`` as a parser that keeps a repeated key's first value reads it."""

    def keep_first(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            out.setdefault(k, v)
        return out

    return json.loads(raw, object_pairs_hook=keep_first)


def repeated_keys(raw: bytes) -> list[str]:
    """The keys some object of ``raw`` holds more than once."""
    found: list[str] = []

    def note(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        found.extend(k for k in set(keys) if keys.count(k) > 1)
        return dict(pairs)

    json.loads(raw, object_pairs_hook=note)
    return found


def assert_means_what_the_proxy_read(sent: RecordedRequest, raw: bytes) -> None:
    """The upstream's bytes hold every key once, and read (first or last value kept) as
    the proxy read the client's bytes, plus only what the proxy adds of its own."""
    assert repeated_keys(sent.body) == [], sent.body
    read = orjson.loads(raw)
    got = first_wins(sent.body)
    assert got == orjson.loads(sent.body)
    assert {k: v for k, v in got.items() if k not in read} == {
        k: v for k, v in got.items() if k in ("prompt_cache_key", "stream_options")
    }
    assert {k: v for k, v in got.items() if k in read} == read


@pytest.mark.parametrize("mode", ["passthrough", "auto"])
@pytest.mark.parametrize("kind", list(ROUTES))
def test_a_key_twice_goes_upstream_as_the_proxy_read_it(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, mode: str
) -> None:
    p = start(fake, start_proxy, kind)
    for case, (name, (lead, items)) in enumerate(CASES[kind].items()):
        raw = body(kind, lead, items or USER)
        assert repeated_keys(raw), name  # the case has a key twice
        for sid in (None, f"s-{mode}-{case}"):
            sent = forward(fake, p, kind, raw, mode, sid)
            assert sent.body != raw, name
            assert_means_what_the_proxy_read(sent, raw)
            if kind == "openai" and "model" in name:
                assert first_wins(sent.body)["model"] == "m"  # routed, checked, billed as "m"


@pytest.mark.parametrize("kind", list(ROUTES))
def test_a_session_whose_bytes_repeat_a_key_around_its_transcript_gets_them_serialised(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    """A named session's compact request that repeats its previous one's bytes around the
    transcript (one exchange more) is the one whose own bytes may go upstream: with a key
    twice in them, the proxy's serialisation goes instead; without, the client's bytes."""
    p = start(fake, start_proxy, kind)
    lead = CASES[kind]["top level"][0]
    # spaced as orjson would not write it: the proxy's serialisation would show
    clean = b' "model": "m", ' + (b'"max_tokens": 50, ' if kind == "anthropic" else b"")
    reply = b'{"role":"assistant","content":"ok"}'
    for sid, members in (("repeats", lead), ("once", clean)):
        turns = [USER, USER + b"," + reply + b"," + USER]
        for k, items in enumerate(turns):
            raw = body(kind, members, items)
            sent = forward(fake, p, kind, raw, "passthrough", sid)
            if members is lead:
                assert_means_what_the_proxy_read(sent, raw)
            elif k:  # the second turn, spliced on the first: the client's own bytes
                assert sent.body.startswith(raw[:-1])
                assert_means_what_the_proxy_read(sent, raw)
