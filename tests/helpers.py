"""What many tests need alike: the session header, a reply carrying the state envelope, the
clients that talk to a proxy, Codex's apply_patch custom tool, and a SQLite database held
locked by another process. Spelled out once here, so that a test says what it checks
rather than how a header is named or an envelope is fenced.

The header's name is written out here, not imported from the proxy: a rename in the proxy
must fail the tests, not follow silently."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import anthropic
import openai

SESSION_HEADER = "x-skillstate-session"


class _HasURL(Protocol):
    url: str


def session(sid: str) -> dict[str, str]:
    """The headers that name session ``sid``."""
    return {SESSION_HEADER: sid}


def envelope(patch: Any, action: str = "next", prefix: str = "ok") -> str:
    """A model reply: ``prefix``, then the fenced state envelope (``state_patch`` and
    ``action``) as the proxy asks the model to write it."""
    return f"{prefix}\n```json\n{json.dumps({'state_patch': patch, 'action': action})}\n```"


# One TLS context for every SDK client the tests make: each new client otherwise builds its
# own and loads the CA bundle into it (about 35 ms of CPU, against 0.3 ms with this one),
# for plain HTTP on loopback. Each client still has its own connections; the SDK's own
# default transport (DefaultHttpxClient: its timeout, limits, redirects), only the context
# is shared.
_TLS = ssl.create_default_context()


def oai(proxy: _HasURL, key: str = "sk-client", **kw: Any) -> openai.OpenAI:
    """An OpenAI SDK client of the proxy's /v1 that does not retry (a test sees each answer)."""
    kw.setdefault("http_client", openai.DefaultHttpxClient(verify=_TLS))
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0, **kw)


def ant(proxy: _HasURL, key: str = "sk-client", **kw: Any) -> anthropic.Anthropic:
    """An Anthropic SDK client of the proxy that does not retry."""
    kw.setdefault("http_client", anthropic.DefaultHttpxClient(verify=_TLS))
    return anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0, **kw)


# Tool definitions of ~1,500 tokens (the fake tokenizer's) for a short request: over the
# caches' 1,024-token minimum by themselves, as an agent's tools are. One list per format.
_HEAVY_DESCRIPTION = "Looks things up in the inventory and returns the matching records. " * 9
HEAVY_CHAT_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": f"lookup_{i}",
            "description": _HEAVY_DESCRIPTION,
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
    for i in range(8)
]
HEAVY_RESPONSES_TOOLS: list[Any] = [{"type": "function", **t["function"]} for t in HEAVY_CHAT_TOOLS]
HEAVY_ANTHROPIC_TOOLS: list[Any] = [
    {"name": f["name"], "description": f["description"], "input_schema": f["parameters"]}
    for f in (t["function"] for t in HEAVY_CHAT_TOOLS)
]


# Codex's freeform ``apply_patch`` as a Responses custom tool: free text under a Lark grammar
# (the grammar cut to its first rules).
PATCH_GRAMMAR = 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\n'
APPLY_PATCH: dict[str, Any] = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Use the `apply_patch` tool to edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": PATCH_GRAMMAR},
}
# The same grammar as chat completions' custom tool carries it (nested one level deeper).
CHAT_PATCH_FORMAT = {"type": "grammar", "grammar": {"syntax": "lark", "definition": PATCH_GRAMMAR}}

_LOCK_DB = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
db.execute("ROLLBACK")
"""


@contextmanager
def locked_by_another_process(db: Path, timeout: float = 30) -> Iterator[None]:
    """The SQLite database ``db`` held by another process's write transaction (BEGIN
    IMMEDIATE) for the block; released when it ends."""
    other = subprocess.Popen(
        [sys.executable, "-c", _LOCK_DB, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert other.stdout is not None and other.stdout.readline() == b"locked\n"
        yield
    finally:
        other.communicate(b"\n", timeout=timeout)


def listed_rates(provider: str, model: str, when: dict[str, str] | None) -> tuple[float, float]:
    """(input, output) USD per million tokens of ``model`` in the installed genai-prices'
    bundled list, at the price variant ``when`` selects; the standard rates when ``when`` is
    None or the list has no such variant (an older genai-prices: the one CPython 3.10 gets)."""
    from genai_prices.data import providers

    info = next(p for p in providers if p.id == provider).find_model(model)
    assert info is not None, model
    prices = info.prices if not isinstance(info.prices, list) else info.prices[-1].prices
    for variant in info.price_variants or ():
        if when is not None and variant.when == when:
            prices = variant.prices
    return float(prices.input_mtok), float(prices.output_mtok)


# The orders a chat stream may send two parallel tool calls' pieces in: each call whole, one
# after the other (OpenAI's); every call named before any arguments; the pieces interleaved.
PARALLEL_CALL_ORDERS = ("one after the other", "names first", "interleaved")


def parallel_call_pieces(order: str, piece: Any) -> list[Any]:
    """Two parallel calls, ``f`` with ``{"path": "/etc/hosts"}`` and ``g`` with ``{"n": 2}``,
    as stream pieces in ``order`` (``piece(index, id=, name=, args=)`` makes one)."""
    heads = [piece(0, id="a", name="f"), piece(1, id="b", name="g")]
    a = [piece(0, args='{"path":'), piece(0, args=' "/etc/hosts"}')]
    b = [piece(1, args='{"n":'), piece(1, args=" 2}")]
    orders = {
        "one after the other": [heads[0], *a, heads[1], *b],
        "names first": [*heads, *a, *b],
        "interleaved": [*heads, a[0], b[0], a[1], b[1]],
    }
    return orders[order]
