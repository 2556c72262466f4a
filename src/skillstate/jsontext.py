"""Reading an upstream's JSON: orjson, and what orjson refuses but JSON allows.

JSON text may escape a lone UTF-16 surrogate (``"\\ud83d"``): RFC 8259 lets a string hold
one, and a JavaScript server that cuts a string by UTF-16 index writes one (an emoji split
across two stream events). orjson refuses such text, so a reply or a stream event holding one
failed its turn (a 502, or a stream ended as unreadable) though the client's own SDK reads it.
Here orjson reads what it can (every reply, in practice, at no extra cost); text it refuses
that escapes a surrogate is read by the standard library's parser, and each lone surrogate
becomes U+FFFD, so that what the proxy writes from it (a translation, a stripped event, the
store) is UTF-8. Bytes relayed as they came are not touched.

orjson also reads an integer it cannot hold (beyond 64 bits) as the nearest float:
``123456789012345678901234567890`` becomes ``1.2345678901234568e+29``, another number, with
no error. Where that would change what the proxy keeps (a session's state), the text is read
again by the standard library, whose integers are exact, to tell such an integer from a float
the text wrote as one (``1e30``): :func:`large_floats` finds where to look (a float that large
is rare), :func:`integers_beyond_64_bits` looks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import orjson

__all__ = [
    "LARGE_FLOAT",
    "integers_beyond_64_bits",
    "large_floats",
    "loads",
    "without_lone_surrogates",
]

# An escape of a UTF-16 surrogate (D800-DFFF), which orjson refuses unless it is a valid pair.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def loads(data: bytes | str) -> Any:
    """``orjson.loads(data)``; text it refuses only for an escaped lone surrogate is read with
    each such surrogate as U+FFFD. orjson.JSONDecodeError for text that is no JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
        if not _SURROGATE_ESCAPE.search(raw):
            raise
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):
            raise orjson.JSONDecodeError("not JSON", raw.decode("utf-8", "replace"), 0) from None
        return _scrubbed(value)


def _scrubbed(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (keys too) as U+FFFD."""
    if isinstance(value, str):
        return without_lone_surrogates(value)
    if isinstance(value, list):
        return [_scrubbed(v) for v in value]
    if isinstance(value, dict):
        return {without_lone_surrogates(k): _scrubbed(v) for k, v in value.items()}
    return value


def without_lone_surrogates(text: str) -> str:
    """``text`` with each lone surrogate (not encodable in UTF-8) as U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
    return text


# orjson reads an integer from -2**63 to 2**64 - 1 as an int and any other as the nearest
# float, whose magnitude is then at least 2**63 (-2**63 - 1 rounds to -2**63): only a float
# of that size may have been such an integer.
LARGE_FLOAT = float(2**63)

_INT_LOW, _INT_END = -(2**63), 2**64
_INT_DIGITS = 20  # 2**64 has 20 digits: a longer integer (no JSON integer has a leading 0)
_BEYOND = object()  # what the second reading makes of an integer orjson cannot hold


def large_floats(value: Any) -> list[tuple[Any, ...]]:
    """Where in ``value`` (JSON as orjson read it) a float of magnitude ``LARGE_FLOAT`` or
    more is, as paths of keys and indexes: what :func:`integers_beyond_64_bits` looks at.
    Iterative (no depth limit of its own)."""
    found: list[tuple[Any, ...]] = []
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, float):
            if not -LARGE_FLOAT < node < LARGE_FLOAT:
                found.append(path)
        elif isinstance(node, dict):
            stack.extend((v, (*path, k)) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, (*path, i)) for i, v in enumerate(node))
    found.reverse()
    return found


def integers_beyond_64_bits(
    text: str | bytes, paths: Iterable[tuple[Any, ...]]
) -> list[tuple[Any, ...]]:
    """Those of ``paths`` (places of floats orjson read from ``text``: :func:`large_floats`)
    where ``text`` has an integer orjson cannot hold, and so read as a float: outside -2**63
    to 2**64 - 1. ``text`` is read again with the standard library's parser (its first JSON
    value: what follows, such as a closing fence, is ignored), its long integers never
    converted (``int()`` refuses more than 4,300 digits). Text that parser cannot read (it
    stops near 1,000 levels of nesting, orjson at 1,024) finds none: the numbers stay as
    orjson read them."""
    paths = list(paths)
    if not paths:
        return []
    try:
        if isinstance(text, bytes):
            text = text.decode()  # UTF-8, as orjson read it
        start = len(text) - len(text.lstrip(" \t\n\r"))
        exact, _ = _EXACT.raw_decode(text, start)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return []
    found: list[tuple[Any, ...]] = []
    for path in paths:
        node = exact
        try:
            for part in path:
                node = node[part]
        except (KeyError, IndexError, TypeError):
            continue
        if node is _BEYOND:
            found.append(path)
    return found


def _integer(digits: str) -> Any:
    """A JSON integer as the second reading keeps it: ``_BEYOND`` when orjson cannot hold it
    (the value of one it can is never looked at)."""
    if len(digits) - digits.startswith("-") > _INT_DIGITS:
        return _BEYOND
    return 0 if _INT_LOW <= int(digits) < _INT_END else _BEYOND


_EXACT = json.JSONDecoder(parse_int=_integer)
