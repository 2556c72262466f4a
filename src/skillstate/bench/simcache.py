"""The simulated provider's prompt cache: which input tokens of a request it bills as cache
reads and cache writes, under one of three regimes, counted on the request it RECEIVED.

The benches' cost is what this says, so it is the provider's side of the bill, computed on
the bytes on the wire and independently of the proxy's own estimates (the proxy's ledger
models the baseline client's cache with :mod:`skillstate.cost.baseline`; the bench compares the
two). The rules are the real APIs':

* ``openai``: automatic prefix caching. The longest byte prefix of the request (tool
  definitions, system, then the messages) that one of the last ``HISTORY`` requests also
  had, sent within ``ttl_s``, is read from the cache, counted from ``min_tokens`` on in
  ``STEP_TOKENS`` steps (OpenAI caches in 128-token increments from 1,024 tokens). No writes
  are billed. Reported as ``usage.prompt_tokens_details.cached_tokens``.
* ``anthropic``: explicit breakpoints. A prefix is read only if an earlier request WROTE it at
  one of its ``cache_control`` breakpoints (within ``ttl_s`` of its last use); the part from
  there to this request's last breakpoint is written (when that prefix holds at least
  ``min_tokens``). These are :class:`skillstate.cost.baseline.PrefixCache`'s rules, applied to the
  received body's own boundaries (:func:`skillstate.cost.baseline.prefix_points`, markers
  ignored), cut at every content block (:func:`as_blocks`). Reported as
  ``cache_read_input_tokens`` / ``cache_creation_input_tokens``.
* ``none``: no cache; everything is input.

Prompt tokens are ``skillstate.cost.tokens`` estimates of the received messages, tool
definitions and (Anthropic) system; under ``anthropic``, summed over the content blocks
(4 bytes a token, 4 more per block; ``cache_control`` markers are not tokens), so that a
prefix read counts exactly the tokens that were written.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from skillstate.cost.baseline import (
    CACHE_PRICING,
    DEFAULT_MIN_TOKENS,
    DEFAULT_TTL_S,
    OPENAI_CACHE_STEP_TOKENS,
    CachePricing,
    CacheRegime,
    PrefixCache,
    openai_read,
    prefix_points,
)
from skillstate.cost.tokens import estimate_text_tokens, estimate_tokens

__all__ = [
    "HISTORY",
    "STEP_TOKENS",
    "CacheCount",
    "SimCache",
    "as_blocks",
    "prompt_bytes",
    "prompt_tokens_of",
]

HISTORY = 8  # openai: the requests whose prefixes stay in the simulated cache
STEP_TOKENS = OPENAI_CACHE_STEP_TOKENS  # openai: cached tokens are counted in these steps


@dataclass(frozen=True, slots=True)
class CacheCount:
    """One request's input tokens: ``prompt_tokens`` INCLUDES the reads and the writes."""

    prompt_tokens: int
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


def prompt_tokens_of(body: Mapping[str, Any]) -> int:
    """Estimated input tokens of a chat-completions or Messages request: the messages, the
    tool definitions and the top-level system."""
    tokens = estimate_tokens(body.get("messages") or [])
    tools = body.get("tools")
    if tools:
        tokens += estimate_tokens(tools)
    system = body.get("system")
    if isinstance(system, str) and system:
        tokens += estimate_text_tokens(system)
    elif system:
        tokens += estimate_tokens(system)
    return tokens


def as_blocks(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """``body`` cut at every content block, for the cache's boundaries: each block of each
    message becomes a one-block message of the same role (a string content is its one text
    block: the same tokens to the provider, so the same prefix), and a string system is one
    text block. Anthropic caches at block granularity: a breakpoint on the proxy's contract
    block inside a merged user message caches the prefix up to that block, not up to the
    message's end (:func:`skillstate.cost.baseline.prefix_points` cuts only at messages)."""

    def blocks(content: Any) -> list[Any]:
        if isinstance(content, str):
            return [{"type": "text", "text": content}]
        return list(content) if isinstance(content, list) else [content]

    out = dict(body)
    if isinstance(out.get("system"), str) and out["system"]:
        out["system"] = blocks(out["system"])
    messages = out.get("messages")
    if isinstance(messages, list):
        out["messages"] = [
            {**m, "content": [block]}
            for m in messages
            if isinstance(m, dict)
            for block in blocks(m.get("content"))
        ]
    return out


def prompt_bytes(body: Mapping[str, Any]) -> bytes:
    """What an automatic prefix cache sees: tool definitions, system, then the messages."""
    parts = [body.get("tools"), body.get("system"), body.get("messages")]
    return orjson.dumps(parts, option=orjson.OPT_NON_STR_KEYS, default=str)


def _common_prefix_len(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix of two byte strings (binary search, C-speed)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class SimCache:
    """The simulated provider's prompt cache (thread-safe). ``clock`` in seconds."""

    def __init__(
        self,
        pricing: CachePricing = "openai",
        *,
        ttl_s: float = DEFAULT_TTL_S,
        min_tokens: int = DEFAULT_MIN_TOKENS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if pricing not in CACHE_PRICING:
            raise ValueError(f"cache regime must be one of {', '.join(CACHE_PRICING)}")
        self.regime = CacheRegime(pricing, ttl_s, min_tokens)
        self._clock = clock
        self._lock = threading.Lock()
        self._history: list[tuple[bytes, float]] = []  # openai: (prompt bytes, sent at)
        self._written = PrefixCache()  # anthropic: the prefixes written at breakpoints

    @property
    def pricing(self) -> CachePricing:
        return self.regime.pricing

    def reset(self) -> None:
        """Forget everything cached (between benchmark arms)."""
        with self._lock:
            self._history = []
            self._written = PrefixCache()

    def count(self, body: Mapping[str, Any]) -> CacheCount:
        """Bill one received request, and remember it for the next ones."""
        now = self._clock()
        with self._lock:
            if self.pricing == "anthropic":
                points = prefix_points(as_blocks(body))
                prompt = points[-1].est_tokens if points else 0
                split = self._written.charge(points, prompt, now, self.regime)
                return CacheCount(prompt, split.cache_read_tokens, split.cache_write_tokens)
            prompt = prompt_tokens_of(body)
            if self.pricing == "openai":
                return CacheCount(prompt, self._openai(body, prompt, now))
        return CacheCount(prompt)

    def _openai(self, body: Mapping[str, Any], prompt: int, now: float) -> int:
        data = prompt_bytes(body)
        live = [(h, t) for h, t in self._history if now - t <= self.regime.ttl_s]
        best = max((_common_prefix_len(h, data) for h, _ in live), default=0)
        self._history = [*live[-(HISTORY - 1) :], (data, now)]
        tokens = min(best // 4, prompt)  # skillstate.cost.tokens: 4 bytes per token
        return openai_read(tokens, self.regime)
