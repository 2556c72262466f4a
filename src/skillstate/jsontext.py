"""Reading an upstream's JSON: orjson, and what orjson refuses but JSON allows.

JSON text may escape a lone UTF-16 surrogate (``"\\ud83d"``): RFC 8259 lets a string hold
one, and a JavaScript server that cuts a string by UTF-16 index writes one (an emoji split
across two stream events). orjson refuses such text, so a reply or a stream event holding one
failed its turn (a 502, or a stream ended as unreadable) though the client's own SDK reads it.
Here orjson reads what it can (every reply, in practice, at no extra cost); text it refuses
that escapes a surrogate is read by the standard library's parser, and each lone surrogate
becomes U+FFFD, so that what the proxy writes from it (a translation, a stripped event, the
store) is UTF-8. Bytes relayed as they came are not touched.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

__all__ = ["loads", "without_lone_surrogates"]

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
