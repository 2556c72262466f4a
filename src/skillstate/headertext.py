"""Header values made from model or client text."""

from __future__ import annotations

from urllib.parse import quote

HEADER_TEXT_MAX_CHARS = 200  # of a header value made from model or client text
RELAYED_HEADER_MAX_CHARS = 1024  # of an upstream response header relayed to the client
# Visible ASCII that stays as it is in such a header (quote() keeps letters, digits, "_.-~").
_HEADER_SAFE = " !\"#$&'()*+,/:;<=>?@[\\]^`{|}"


def header_safe(text: str, limit: int = HEADER_TEXT_MAX_CHARS) -> str:
    """A header value from model or client text: visible ASCII only, at most ``limit`` chars.

    Whitespace runs become one space; every other byte outside 0x20-0x7E (control characters,
    non-ASCII as UTF-8) and ``%`` itself are percent-encoded, so the value is readable and
    reversible. A value the server would refuse (a NUL, a CR/LF) must never be built: the
    client would get no reply for a turn that is already committed.
    """
    flat = quote(" ".join(text.split()), safe=_HEADER_SAFE)
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 3]
    tail = cut.rfind("%", len(cut) - 2)  # never leave half a %XX escape
    return (cut[:tail] if tail != -1 else cut) + "..."
