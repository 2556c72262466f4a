"""Compressed request bodies: ``content-encoding`` gzip, deflate and zstd, decoded once.

Codex CLI compresses its Responses requests with zstd when its provider is OpenAI's, and
HTTP clients may gzip large bodies. The proxy reads the body itself and sends upstream its
own JSON uncompressed, so it decodes here, before the one parse. The decoded size is capped
by the same ``max_body_bytes`` as a plain body: a small compressed body that inflates past
it (a decompression bomb) is a 413 as soon as the cap is passed, without inflating the rest.
A gzip body may be several members one after another, a zstd body several frames (RFC 1952
2.2, RFC 8878 3: what ``gzip -d`` and ``zstd -d`` read whole); each is decoded in turn.
"""

from __future__ import annotations

import io
import zlib

import zstandard

from ..errors import ProxyError

SUPPORTED = ("gzip", "deflate", "zstd")
_IDENTITY = frozenset({"", "identity"})


def codings(header: str) -> list[str]:
    """The codings of a ``content-encoding`` value in the order they were applied, identity
    dropped; 415 for one the proxy cannot decode."""
    out = [c.strip().lower() for c in header.split(",")]
    out = [c if c != "x-gzip" else "gzip" for c in out if c not in _IDENTITY]
    for c in out:
        if c not in SUPPORTED:
            raise ProxyError(
                "invalid_request",
                f"content-encoding {c!r} is not supported (supported: {', '.join(SUPPORTED)},"
                " identity)",
                status=415,
                code="unsupported_media_type",
            )
    return out


def decode(raw: bytes, applied: list[str], max_bytes: int) -> bytes:
    """``raw`` with ``applied`` undone, last applied first; 413 past ``max_bytes`` decoded,
    400 for data that is not what its coding says."""
    for coding in reversed(applied):
        try:
            raw = _zstd(raw, max_bytes) if coding == "zstd" else _zlib(raw, coding, max_bytes)
        except (zlib.error, zstandard.ZstdError, EOFError) as e:
            raise ProxyError(
                "invalid_request", f"request body is not valid {coding} data: {e}"
            ) from None
    return raw


def too_large(max_bytes: int) -> ProxyError:
    return ProxyError(
        "request_too_large",
        f"request body exceeds max_body_bytes ({max_bytes} bytes)",
        code="request_too_large",
    )


def _zlib(raw: bytes, coding: str, max_bytes: int) -> bytes:
    if coding == "gzip":
        return _inflate(raw, 16 + zlib.MAX_WBITS, max_bytes, members=True)
    # deflate: RFC 9110 means the zlib wrapper, but some clients send a raw deflate stream.
    try:
        return _inflate(raw, zlib.MAX_WBITS, max_bytes)
    except zlib.error:
        return _inflate(raw, -zlib.MAX_WBITS, max_bytes)


def _inflate(raw: bytes, wbits: int, max_bytes: int, members: bool = False) -> bytes:
    """One zlib/deflate stream, or with ``members`` the gzip members that follow each other."""
    out: list[bytes] = []
    size = 0
    while True:
        d = zlib.decompressobj(wbits)
        part = d.decompress(raw, max_bytes + 1 - size)  # never 0 (zlib's "no limit")
        size += len(part)
        if size > max_bytes:
            raise too_large(max_bytes)
        if d.unconsumed_tail or not d.eof:
            raise zlib.error("truncated or trailing data")
        out.append(part)
        raw = d.unused_data
        if not raw:
            return b"".join(out)
        if not members:
            raise zlib.error("truncated or trailing data")


def _zstd(raw: bytes, max_bytes: int) -> bytes:
    # The reader stops at the cap (a bomb is never inflated whole) but says nothing of a frame
    # cut short; once the size is known to be in bounds, a decompressobj pass per frame checks
    # that.
    with zstandard.ZstdDecompressor().stream_reader(
        io.BytesIO(raw), read_across_frames=True
    ) as reader:
        if len(reader.read(max_bytes + 1)) > max_bytes:
            raise too_large(max_bytes)
    out: list[bytes] = []
    while True:
        d = zstandard.ZstdDecompressor().decompressobj()
        out.append(d.decompress(raw))
        if not d.eof:
            raise zstandard.ZstdError("truncated or trailing data")
        raw = d.unused_data
        if not raw:
            return b"".join(out)
