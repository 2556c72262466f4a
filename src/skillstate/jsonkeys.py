"""Whether JSON text holds each object's keys once.

orjson, which parses every body, keeps the last of a key written twice in one object
(``{"model": "a", "model": "b"}`` reads as model ``b``); other parsers keep the first or
refuse the text. So bytes with a key twice may mean something else to the upstream than
what the proxy read, checked and billed, and the proxy forwards a client's own bytes only
when they are shown to hold every key once (``sessions.transcripts``; otherwise it sends its
own serialisation of what it read).

orjson cannot report a repeated key, and the standard library's parser, which can (an
``object_pairs_hook`` sees each object's pairs), costs about 3-5x orjson's parse: 0.8-3.4 ms
for a 300 KB agent transcript (docs/benchmarks.md). That is why it is run only on the few
bytes nothing else vouches for, not on every body.
"""

from __future__ import annotations

import json

__all__ = ["keys_once"]


class _Repeated(Exception):
    """An object with a key twice: stops the parse at once."""


def _distinct(pairs: list[tuple[str, object]]) -> None:
    # Keys arrive decoded, so "a" and "\u0061" are the one key they are to every parser.
    # None, not a dict: the parse's result is thrown away, so nothing is built.
    if len(pairs) > 1 and len(pairs) != len(dict(pairs)):
        raise _Repeated


_DECODER = json.JSONDecoder(object_pairs_hook=_distinct)


def keys_once(text: bytes) -> bool:
    """True when ``text`` is JSON in which no object has a key twice. False when one has, and
    when ``text`` is nothing this can read (not JSON, not UTF-8, or nested past the
    interpreter's recursion limit): then nothing is shown."""
    try:
        _DECODER.decode(text.decode())
    except (_Repeated, ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError
        return False
    return True
