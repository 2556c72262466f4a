"""Requests built for the provider's prompt cache (issue 14 §2). Pure, no I/O.

* OpenAI-kind upstreams cache prefixes automatically and route by ``prompt_cache_key``:
  :func:`with_prompt_cache_key` sends a hash of the session id, unless the client set a key,
  so one session's calls reach the same cache.
* Anthropic-kind upstreams cache only up to ``cache_control`` breakpoints:
  :func:`with_breakpoint` marks the end of the state context's stable prefix (the contract's
  text block, which follows the system text, tools and task; the state's in the window
  form) with one ``{"type": "ephemeral"}`` breakpoint, whichever format the client sent.
  The client's own breakpoints are kept; when they
  already use the 4 the API allows, none is added. The added breakpoint is a one-hour one
  (``"ttl": "1h"``) when a client breakpoint after it is: the API refuses a one-hour
  breakpoint that comes after a five-minute one ("a ttl='1h' cache_control block must not
  come after a ttl='5m' cache_control block"; tools, system, messages in that order), and
  Claude Code can mark its newest messages with one-hour breakpoints.

Both take the request in the upstream's format, after any translation, and return a new
body (the input is never mutated); the work is O(number of blocks of the first message).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Any

__all__ = [
    "MAX_BREAKPOINTS",
    "CacheHints",
    "count_breakpoints",
    "marked_message",
    "marks_one_hour_cache",
    "prompt_cache_key",
    "with_breakpoint",
    "with_prompt_cache_key",
]

MAX_BREAKPOINTS = 4  # cache_control markers the Anthropic API accepts in one request
EPHEMERAL = {"type": "ephemeral"}
ONE_HOUR = {"type": "ephemeral", "ttl": "1h"}


class CacheHints:
    """What the upstream layer needs to build a cache-friendly request for one turn.

    ``cache_key``: the ``prompt_cache_key`` for OpenAI-kind upstreams (None: send none).
    ``prefix_end``: the exact text of the block that ends the stable prefix (the contract),
    None when this turn has no stable prefix of the proxy's making. ``prefix_tokens``: the
    estimated tokens of that prefix, for the model's minimum cacheable length.

    ``find``: instead of the two, what finds them, called on the first read of either: only
    a breakpoint for an Anthropic-billed upstream reads them, and finding the prefix (the
    contract's text in the transcript, its tokens) is work that an OpenAI-kind call skips.
    """

    __slots__ = ("_find", "_prefix", "cache_key")

    def __init__(
        self,
        cache_key: str | None = None,
        prefix_end: str | None = None,
        prefix_tokens: int = 0,
        *,
        find: Callable[[], tuple[str | None, int]] | None = None,
    ) -> None:
        self.cache_key = cache_key
        self._prefix: tuple[str | None, int] | None = (
            None if find is not None else (prefix_end, prefix_tokens)
        )
        self._find = find

    @property
    def prefix_end(self) -> str | None:
        return self._stable_prefix()[0]

    @property
    def prefix_tokens(self) -> int:
        return self._stable_prefix()[1]

    def _stable_prefix(self) -> tuple[str | None, int]:
        if self._prefix is None:
            assert self._find is not None
            self._prefix, self._find = self._find(), None
        return self._prefix


@lru_cache(maxsize=4096)  # a pure function of the id, asked on every turn of the session
def prompt_cache_key(session: str) -> str:
    """A stable, opaque key for a session (the session id itself never leaves the proxy)."""
    return "skillstate-" + hashlib.sha256(session.encode()).hexdigest()[:32]


def with_prompt_cache_key(body: dict[str, Any], key: str) -> dict[str, Any]:
    """``body`` with ``prompt_cache_key`` set, unless the client set one."""
    if body.get("prompt_cache_key") is not None:
        return body
    return {**body, "prompt_cache_key": key}


def _markers(body: Mapping[str, Any]) -> Iterator[Any]:
    """The ``cache_control`` markers of an Anthropic request (top level, tools, system
    blocks, message content blocks), in the API's cache order."""
    holders: list[Any] = [body, *(body.get("tools") or ())]
    system = body.get("system")
    if isinstance(system, list):
        holders += system
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            holders += content
    return (h["cache_control"] for h in holders if isinstance(h, dict) and "cache_control" in h)


def count_breakpoints(body: dict[str, Any]) -> int:
    """The ``cache_control`` markers of an Anthropic request (top level, tools, system
    blocks, message content blocks)."""
    return sum(1 for _ in _markers(body))


def marks_one_hour_cache(body: Mapping[str, Any]) -> bool:
    """Whether an Anthropic request asks for a one-hour cache write (a marker with
    ``"ttl": "1h"``), which Anthropic bills at twice the input price."""
    return any(isinstance(m, dict) and m.get("ttl") == "1h" for m in _markers(body))


def with_breakpoint(body: dict[str, Any], prefix_end: str) -> dict[str, Any]:
    """``body`` (Anthropic Messages) with a breakpoint on the block that ends the stable
    prefix: among the user-side messages before the first assistant turn, the text block
    that is ``prefix_end`` or ends with it; or, where a block starts with ``prefix_end``
    and goes on (a chat-completions or Responses client's contract and state are one
    message, translated into one block: the state changes every turn), the block before it.
    Unchanged when there is no such block, it is already marked, or the request already
    has ``MAX_BREAKPOINTS``."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return body
    found = _prefix_end_block(messages, prefix_end)
    if found is None:
        return body
    i, blocks, at = found
    if "cache_control" in blocks[at] or count_breakpoints(body) >= MAX_BREAKPOINTS:
        return body
    later = [{"content": blocks[at + 1 :]}, *messages[i + 1 :]]
    blocks = list(blocks)
    blocks[at] = {**blocks[at], "cache_control": _breakpoint_before(later, body)}
    marked = {**messages[i], "content": blocks}
    return {**body, "messages": [*messages[:i], marked, *messages[i + 1 :]]}


def _prefix_end_block(
    messages: list[Any], prefix_end: str
) -> tuple[int, list[dict[str, Any]], int] | None:
    """(message index, its blocks, block index) of the block that ends the stable prefix
    (see :func:`with_breakpoint`); None when there is none."""
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") == "assistant":
            return None
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for at, block in enumerate(content):
            if not isinstance(block, dict) or block.get("type") != "text":
                continue
            text = block.get("text")
            if not isinstance(text, str):
                continue
            if text.endswith(prefix_end):
                return i, content, at
            if text.startswith(prefix_end):
                return (i, content, at - 1) if at > 0 else None
    return None


def _breakpoint_before(later: Sequence[Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """The marker for a breakpoint the proxy adds before the messages ``later`` of ``body``:
    one-hour when a breakpoint among them, or the top-level one (automatic caching marks the
    last block), is; else the five-minute default (see the module docstring)."""
    after = {"messages": later, "cache_control": body.get("cache_control")}
    return dict(ONE_HOUR if marks_one_hour_cache(after) else EPHEMERAL)


def marked_message(
    message: Any, later: Sequence[Any] = (), body: Mapping[str, Any] | None = None
) -> Any:
    """An Anthropic message with a breakpoint on its last content block (a string content
    becomes one text block); unchanged when that block is marked already or there is none.
    ``mask`` marks where its masked part ends, so that the next re-mask finds that prefix in
    the cache (Anthropic reads the cache only at breakpoints). ``later``: the messages after
    it, and ``body`` the request, whose breakpoints decide the marker's TTL."""
    if not isinstance(message, dict):
        return message
    content = message.get("content")
    if isinstance(content, str) and content:
        content = [{"type": "text", "text": content}]
    if not isinstance(content, list) or not content or not isinstance(content[-1], dict):
        return message
    if "cache_control" in content[-1]:
        return message
    return {
        **message,
        "content": [
            *content[:-1],
            {**content[-1], "cache_control": _breakpoint_before(later, body or {})},
        ],
    }
