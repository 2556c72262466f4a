"""Client or model text made safe to show: in a header value, a log line or a terminal."""

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


def printable(text: str) -> str:
    """``text`` for a log line or a terminal: each character that is not printable (a new
    line, a terminal's escape sequence) written as its Python escape (``\\n``, ``\\x1b``), so
    a client's text can neither start a forged line nor drive the terminal."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
