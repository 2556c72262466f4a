"""A passthrough turn goes upstream as the client's own bytes (decoded, when the client
compressed them), with what the proxy adds written after them (a prompt cache key, a
stream's usage option); a turn held to a budget goes as the proxy's serialisation of what
it read."""

from __future__ import annotations

import gzip
from typing import Any

import orjson

from tests.conftest import StartProxy
from tests.fakeprovider import FakeProvider
from tests.helpers import SESSION_HEADER

# Spacing, key order, an escaped non-ASCII character: what a re-serialisation would change.
CLIENT_BYTES = (
    b'{ "messages" : [ {"role": "user", "content": "caf\\u00e9 \\/ ok"} ],\n'
    b'  "model": "m",  "temperature": 0.50 }'
)
PASS = {"content-type": "application/json", "x-skillstate-mode": "passthrough"}


def sent(fake: FakeProvider) -> bytes:
    return fake.requests[-1].body


def test_an_unchanged_body_goes_upstream_as_the_clients_bytes(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(fake.url + "/v1")
    r = proxy.http.post(proxy.v1 + "/chat/completions", content=CLIENT_BYTES, headers=PASS)
    assert r.status_code == 200, r.text
    assert sent(fake) == CLIENT_BYTES
    assert "content-encoding" not in fake.requests[-1].headers
    # Compressed: decoded (and bounded) as before, then the client's JSON text as it was.
    zipped = {**PASS, "content-encoding": "gzip"}
    r = proxy.http.post(
        proxy.v1 + "/chat/completions", content=gzip.compress(CLIENT_BYTES), headers=zipped
    )
    assert r.status_code == 200, r.text
    assert sent(fake) == CLIENT_BYTES
    assert "content-encoding" not in fake.requests[-1].headers
    # A session the client named: its prompt cache key follows the client's own bytes.
    named = {**PASS, SESSION_HEADER: "agent-1"}
    r = proxy.http.post(proxy.v1 + "/chat/completions", content=CLIENT_BYTES, headers=named)
    assert r.status_code == 200, r.text
    assert sent(fake).startswith(CLIENT_BYTES.rstrip()[:-1].rstrip() + b',"prompt_cache_key":')
    assert orjson.loads(sent(fake))["prompt_cache_key"]


def test_what_the_proxy_adds_follows_and_a_budget_holds_what_it_read(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    prices = {"m": {"input_per_mtok": 0, "output_per_mtok": 1}}
    proxy = start_proxy(fake.url + "/v1", config={"prices": prices})
    parsed: dict[str, Any] = orjson.loads(CLIENT_BYTES)
    # A stream: the proxy asks for usage in the last chunk (for the ledger).
    streamed = CLIENT_BYTES.replace(b'"model"', b'"stream": true, "model"')
    r = proxy.http.post(proxy.v1 + "/chat/completions", content=streamed, headers=PASS)
    assert r.status_code == 200, r.text
    assert sent(fake).startswith(streamed.rstrip()[:-1].rstrip() + b",")
    assert orjson.loads(sent(fake)) == {
        **parsed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    # Under a session budget: what the proxy read (and held the worst case of) is sent.
    budget = {**PASS, SESSION_HEADER: "held", "x-skillstate-budget-usd": "5"}
    r = proxy.http.post(proxy.v1 + "/chat/completions", content=CLIENT_BYTES, headers=budget)
    assert r.status_code == 200, r.text
    got = orjson.loads(sent(fake))
    assert sent(fake) == orjson.dumps(got)  # the proxy's serialisation, not the client's
    assert {k: v for k, v in got.items() if k != "prompt_cache_key"} == parsed
