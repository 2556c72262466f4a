"""Tokenizer-free token estimates, used for BOTH sides of every savings ratio.

Method (deliberately simple, deterministic and O(size)):

* ``estimate_tokens(obj)`` serialises ``obj`` as compact JSON with orjson (no spaces, UTF-8,
  non-ASCII not escaped) and counts ``ceil(bytes / 4)`` tokens (``BYTES_PER_TOKEN``), then adds
  ``MESSAGE_OVERHEAD_TOKENS`` (4) per chat message to stand for the role/turn markers a chat
  template adds. Messages are the dict items of a top-level list, or of the ``messages`` (chat
  completions / Anthropic) or ``input`` (OpenAI Responses) list of a request body, plus one for
  a non-empty Anthropic top-level ``system``.
* An inline base64 image or PDF (an Anthropic ``image`` or ``document`` block, a chat
  ``image_url`` or ``file`` part, a Responses ``input_image``, ``computer_screenshot`` or
  ``input_file``) counts what the provider bills for it instead of its base64's bytes:
  an image by its pixels (Anthropic) or 512 px tiles (OpenAI), read from its header, at
  most 1,600 when the header cannot be read; a PDF 3,000 per stream in the file, never more
  than its base64 counted as text. Base64 shorter than 8,192 characters stays text.
  ``skillstate.cost.media`` has the rules and why. In bytes, the payload's JSON string is
  replaced by ``BYTES_PER_TOKEN`` times its tokens, so a JSON length stays additive (what
  :class:`ListSize` and ``request_tokens``' ``known`` rely on).
* ``estimate_text_tokens(s)`` is ``ceil(utf8_bytes(s) / 4)``.

The absolute numbers are rough (real tokenizers give ~3-5 bytes per token for English and
code, fewer for CJK), but the proxy never uses them as token counts: it only uses the RATIO
``estimate(client transcript) / estimate(what we sent)`` to scale the upstream's *reported*
input tokens into a baseline (see ``skillstate.cost.ledger.baseline_input_tokens``). Because both
sides go through the same function, the bias of the estimate largely cancels in that ratio.
The window's bounds (``window_max_tokens``, the model's context) are compared with them too,
which is why an 800 KB screenshot must not count as 200,000 tokens when it is billed ~1,600.

Anything orjson cannot serialise (non-string keys are allowed; other objects fall back to
``str()``; integers beyond 64 bits, lone surrogates and nesting past orjson's 255 levels are
measured by an iterative walk) is still counted, so the estimator never raises for a JSON-like
value, however deep.

Cost: one orjson dump plus a pass over the message list; about 55 µs for a 100 KB messages
list (186 messages) on the dev box, i.e. negligible next to an upstream call. The media rule
adds a look at every 128th byte of a dump longer than 8 KB (three C-level calls, 4-5 µs at
100-300 KB on a loaded dev box, where the dump takes 40-110 µs;
``skillstate.cost.media.may_hold_media``), and a walk of the value only when that finds a
string that may be an inline payload (docs/benchmarks.md, *Inline images and PDFs*).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from .media import MIN_CHARS, may_hold_media, media_block

__all__ = [
    "BYTES_PER_TOKEN",
    "MESSAGE_OVERHEAD_TOKENS",
    "ListSize",
    "estimate_text_tokens",
    "estimate_tokens",
    "json_size",
    "request_parts",
    "request_tokens",
]

BYTES_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4


def _ceil_tokens(nbytes: int) -> int:
    return (nbytes + BYTES_PER_TOKEN - 1) // BYTES_PER_TOKEN


def _utf8_len(s: str) -> int:
    if s.isascii():
        return len(s)
    return len(s.encode("utf-8", "surrogatepass"))


def estimate_text_tokens(s: str) -> int:
    """``ceil(len(s encoded as UTF-8) / 4)``; 0 for the empty string."""
    return _ceil_tokens(_utf8_len(s))


def _dumps_len(obj: Any) -> int:
    """The length :func:`estimate_tokens` counts of ``obj``: its compact JSON's, with inline
    media by their own rule (:func:`json_size`)."""
    try:
        dumped = orjson.dumps(obj, default=str)
    except orjson.JSONEncodeError:
        try:  # non-string keys: the option makes every dump ~40% slower, so only on demand
            dumped = orjson.dumps(obj, default=str, option=orjson.OPT_NON_STR_KEYS)
        except orjson.JSONEncodeError:
            # >64-bit ints, lone surrogates, nesting past 255: rare, slower, still O(size).
            return _walk_len(obj) + _media_delta(obj)
    n = len(dumped)
    if n > MIN_CHARS and may_hold_media(dumped):  # (inline: this runs for every message)
        n += _media_delta(obj)
    return n


def json_size(obj: Any, dumped: bytes) -> int:
    """The length :func:`estimate_tokens` counts of ``obj`` (before the division by
    ``BYTES_PER_TOKEN`` and the per-message overhead), given ``dumped``, its compact JSON
    as orjson writes it (the bytes already at hand): ``len(dumped)``, less each inline
    base64 image or PDF's string plus ``BYTES_PER_TOKEN`` times its tokens."""
    n = len(dumped)
    if n > MIN_CHARS and may_hold_media(dumped):
        n += _media_delta(obj)
    return n


def _media_delta(obj: Any) -> int:
    """What the inline media of ``obj`` change of its JSON length: for each block
    ``skillstate.cost.media.media_block`` counts, ``BYTES_PER_TOKEN`` times its tokens less
    the length of its payload's JSON string (for a PDF never more than 0: it never counts
    more than its text). Iterative, as :func:`_walk_len`."""
    delta = 0
    stack = [obj]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            found = media_block(value)
            if found is not None:
                payload, tokens, at_most_text = found
                change = BYTES_PER_TOKEN * tokens - _utf8_len(payload) - 2
                delta += min(change, 0) if at_most_text else change
                continue
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
    return delta


def _walk_len(obj: Any) -> int:
    """The length of ``obj`` as compact JSON, by an explicit stack instead of recursion (a
    recursive encoder fails near 1,000 levels, and orjson refuses more than 255)."""
    total = 0
    stack = [obj]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            total += 1 + max(len(value), 1)  # braces and the commas between members
            for key, item in value.items():
                total += _scalar_len(key if isinstance(key, str) else str(key)) + 1  # colon
                stack.append(item)
        elif isinstance(value, (list, tuple)):
            total += 1 + max(len(value), 1)  # brackets and the commas between items
            stack.extend(value)
        else:
            total += _scalar_len(value)
    return total


def _scalar_len(value: Any) -> int:
    try:
        return len(orjson.dumps(value, default=str))
    except orjson.JSONEncodeError:  # >64-bit int or lone surrogate
        return _utf8_len(json.dumps(value, ensure_ascii=False, default=str))


def _count_dicts(seq: Any) -> int:
    if not isinstance(seq, list):
        return 0
    # isinstance(x, dict), not Mapping: the ABC check is ~10x slower per message.
    return sum(1 for item in seq if isinstance(item, dict))


def _count_messages(obj: Any) -> int:
    if isinstance(obj, list):
        return _count_dicts(obj)
    if isinstance(obj, dict):
        n = _count_dicts(obj.get("messages")) + _count_dicts(obj.get("input"))
        if obj.get("system"):
            n += 1
        return n
    return 0


def estimate_tokens(obj: Any) -> int:
    """Estimate the tokens of a request body or a messages list (see module docstring).

    ``obj`` may be a parsed body (dict), a messages list, raw JSON ``bytes`` (parsed first, so
    whitespace in the raw body does not count), or a ``str`` (treated as plain text).
    ``None`` is 0.
    """
    if obj is None:
        return 0
    if isinstance(obj, str):
        return estimate_text_tokens(obj)
    if isinstance(obj, (bytes, bytearray, memoryview)):
        try:
            obj = orjson.loads(obj)
        except orjson.JSONDecodeError:
            return _ceil_tokens(len(obj))
    return _ceil_tokens(_dumps_len(obj)) + MESSAGE_OVERHEAD_TOKENS * _count_messages(obj)


def request_parts(body: Mapping[str, Any]) -> list[Any]:
    """What an upstream reads of a request: system, messages and tool definitions (and a
    Responses API body's instructions and input items)."""
    parts = [body.get("system"), body.get("messages"), body.get("tools")]
    if "instructions" in body:  # (no comprehension: this runs twice a turn)
        parts.append(body["instructions"])
    if "input" in body:
        parts.append(body["input"])
    return parts


def request_tokens(body: Mapping[str, Any], known: tuple[Any, int] | None = None) -> int:
    """Tokens of what an upstream would read of a request body: ``estimate_tokens`` of
    :func:`request_parts`. ``known``: one of the parts (by identity,
    e.g. the transcript) and its length as :func:`estimate_tokens` counts it, already
    measured (:class:`ListSize`, or :func:`json_size` of its compact JSON; not the bare
    ``len`` of its JSON, which counts inline media by their base64), so that only the other
    parts are serialised."""
    parts = request_parts(body)
    if known is None:
        return estimate_tokens(parts)
    obj, length = known
    total = 1 + len(parts)  # the brackets, and the commas between the parts
    for part in parts:
        total += length if part is obj else _dumps_len(part)
    return _ceil_tokens(total) + MESSAGE_OVERHEAD_TOKENS * _count_messages(parts)


class ListSize:
    """The length of a list as compact JSON (what :func:`estimate_tokens` counts, inline
    media by their own rule), kept turn after turn for a transcript that grows: only the
    items that are new since the last call are serialised. The length of a list is its
    brackets, the commas between its items and the items' own lengths, so the sum over the
    items seen is all that is kept."""

    __slots__ = ("_count", "_sum")

    def __init__(self) -> None:
        self._count = 0  # items of the last call's list
        self._sum = 0  # their lengths as compact JSON

    def size(self, items: Sequence[Any], kept: int) -> int:
        """``json_size(items, orjson.dumps(items))``. ``kept``: 0, or the number of items of
        the last call, all of them equal to the first ones of ``items``."""
        if kept not in (0, self._count):
            raise ValueError(f"kept must be 0 or {self._count}, not {kept}")
        total = self._sum if kept else 0
        for k in range(kept, len(items)):
            total += _dumps_len(items[k])
        self._sum, self._count = total, len(items)
        return 2 + total + max(len(items) - 1, 0)
