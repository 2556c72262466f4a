"""A passthrough turn goes upstream as the client's own bytes (decoded, when the client
compressed them), with what the proxy adds written after them (a prompt cache key, a
stream's usage option), when the bytes are shown to hold every key once: a named session's
request that is its previous one's bytes around the transcript, with the new items after
it. Any other turn goes as the proxy's serialisation of what it read (a key twice reads
otherwise in other parsers: tests/e2e/test_e2e_duplicate_keys.py)."""

from __future__ import annotations

import gzip
from collections.abc import Iterator

import orjson

from tests.conftest import StartProxy
from tests.fakeprovider import FakeProvider
from tests.helpers import SESSION_HEADER

# Around the transcript (compact, as SDKs write it): spacing, an escaped non-ASCII character,
# a number written long; what a re-serialisation would change.
LEAD = b'{ "model" : "m",  "temperature": 0.50, "user": "caf\\u00e9 \\/ ok",\n  "messages": '
TAIL = b" }\n"
PASS = {"content-type": "application/json", "x-skillstate-mode": "passthrough"}


def turns(lead: bytes = LEAD) -> Iterator[bytes]:
    """A growing transcript's requests, one exchange more each time."""
    messages = [{"role": "user", "content": "fix the test"}]
    while True:
        yield lead + orjson.dumps(messages) + TAIL
        messages += [
            {"role": "assistant", "content": f"ran step {len(messages)}"},
            {"role": "user", "content": "go on"},
        ]


def sent(fake: FakeProvider) -> bytes:
    return fake.requests[-1].body


def own_bytes_then(raw: bytes, added: bytes) -> bytes:
    """``raw`` with members written before its closing brace, as the proxy adds them."""
    return raw.rstrip()[:-1].rstrip() + b"," + added


def test_an_unchanged_body_goes_upstream_as_the_clients_bytes(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(fake.url + "/v1")
    url = proxy.v1 + "/chat/completions"
    named = {**PASS, SESSION_HEADER: "agent-1"}
    body = turns()
    # The session's first request: nothing shows yet that its bytes hold every key once.
    first = next(body)
    r = proxy.http.post(url, content=first, headers=named)
    assert r.status_code == 200, r.text
    assert sent(fake) == orjson.dumps(orjson.loads(sent(fake)))  # the proxy's serialisation
    # The next ones: the client's bytes, the session's prompt cache key after them.
    raw = next(body)
    r = proxy.http.post(url, content=raw, headers=named)
    assert r.status_code == 200, r.text
    assert sent(fake).startswith(own_bytes_then(raw, b'"prompt_cache_key":'))
    assert orjson.loads(sent(fake))["prompt_cache_key"]
    assert "content-encoding" not in fake.requests[-1].headers
    # Compressed: decoded (and bounded) as before, then the client's JSON text as it was.
    raw = next(body)
    zipped = {**named, "content-encoding": "gzip"}
    r = proxy.http.post(url, content=gzip.compress(raw), headers=zipped)
    assert r.status_code == 200, r.text
    assert sent(fake).startswith(own_bytes_then(raw, b'"prompt_cache_key":'))
    assert "content-encoding" not in fake.requests[-1].headers
    # A session the client did not name: nothing is known of its bytes.
    r = proxy.http.post(url, content=raw, headers=PASS)
    assert r.status_code == 200, r.text
    assert sent(fake) == orjson.dumps(orjson.loads(raw))


def test_what_the_proxy_adds_follows_even_under_a_budget(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    prices = {"m": {"input_per_mtok": 0, "output_per_mtok": 1}}
    proxy = start_proxy(fake.url + "/v1", config={"prices": prices})
    url = proxy.v1 + "/chat/completions"
    # A stream: the proxy asks for usage in the last chunk (for the ledger). Under a session
    # budget too: bytes shown to hold every key once mean what the proxy held the worst case
    # of, to any parser; and a body that sets no output limit gets the one the budget held
    # (budget_max_tokens, 32,768 by default).
    budget = {**PASS, SESSION_HEADER: "held", "x-skillstate-budget-usd": "5"}
    body = turns(LEAD.replace(b'"model"', b'"stream": true, "model"'))
    for k in range(3):
        raw = next(body)
        r = proxy.http.post(url, content=raw, headers=budget)
        assert r.status_code == 200, r.text
        got = orjson.loads(sent(fake))
        assert got == {
            **orjson.loads(raw),
            "max_tokens": 32_768,
            "stream_options": {"include_usage": True},
            "prompt_cache_key": got["prompt_cache_key"],
        }
        if k:
            assert sent(fake).startswith(own_bytes_then(raw, b'"max_tokens":32768,"stream'))
