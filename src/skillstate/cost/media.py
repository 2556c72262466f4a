"""What an inline base64 image or document costs an upstream, for ``skillstate.cost.tokens``.

A provider bills an image by its pixels and a PDF by its pages, not by the length of its
base64, so ``estimate_tokens`` counts an inline one by these rules instead of by its text
(the rest of its block, such as ``media_type`` or ``filename``, stays text):

* **Anthropic ``image`` block** (``source.type: base64``): ``ceil(width * height / 750)``
  after a downscale to at most 1,568 px on the long edge, and at most 1,600
  (``IMAGE_MAX_TOKENS``), Anthropic's documented rule. Models with a larger native
  resolution bill more (third-party reports give Opus 4.7 2,576 px on the long edge, up to
  about three times this; not verified here).
* **OpenAI image** (chat ``image_url``, Responses ``input_image`` and
  ``computer_screenshot``, as a ``data:`` URL): ``detail: "low"`` is 85; otherwise the
  GPT-4o tile rule, ``85 + 170 * tiles`` of 512 px after fitting in 2,048 x 2,048 and then
  scaling the shortest side down to 768 (at most 1,445). Models that bill images by 32 px
  patches with a multiplier (gpt-4o-mini, gpt-4.1-mini, gpt-5-mini) are not told apart.
* Width and height come from the image's header (PNG, JPEG, GIF, WebP), decoded from a few
  dozen base64 characters at the offsets it needs; an image whose header cannot be read
  counts as ``IMAGE_MAX_TOKENS``.
* **PDF** (Anthropic ``document`` block with ``source.type: base64``, chat ``file`` part
  ``file_data``, Responses ``input_file`` ``file_data``): ``PDF_STREAM_TOKENS`` (3,000)
  per ``endstream`` in the decoded file. Pages are not cheaply countable (most PDFs since
  1.5 keep their page objects in compressed object streams), but every page with content
  has at least one content stream, so the streams bound its pages; Anthropic documents
  1,500-3,000 tokens of text per page plus the page's image. The caller keeps the lesser of
  this and the text count of the base64 (``cost.tokens``), so a PDF never counts more than
  it did as text: on text-dense PDFs (7-8 KB a page) the text count is the lesser and
  about right, on scans and picture-heavy ones the streams are. The count is kept per
  document (by its hash), as it reads the whole file.
* Anything else (a non-PDF file, a ``data:`` URL without ``;base64,``, a file by id or URL)
  stays text, as does base64 that does not begin with ``MIN_CHARS`` (8,192) characters of
  the alphabet: a file under 6 KB, which counts at most 2,048 tokens as text. That bound is
  what lets :func:`may_hold_media` rule out every payload that counts from every 128th
  byte of the JSON, three C-level calls, so a text-only request pays almost nothing for
  the rule.
"""

from __future__ import annotations

import binascii
import math
import re
import struct
from typing import Any

__all__ = [
    "IMAGE_MAX_TOKENS",
    "MIN_CHARS",
    "PDF_STREAM_TOKENS",
    "anthropic_image_tokens",
    "image_size",
    "may_hold_media",
    "media_block",
    "openai_image_tokens",
]

MIN_CHARS = 8192  # base64 shorter than this stays text (see may_hold_media)
IMAGE_MAX_TOKENS = 1_600  # an image whose size cannot be read; Anthropic's own maximum
ANTHROPIC_MAX_EDGE = 1_568
ANTHROPIC_PIXELS_PER_TOKEN = 750
OPENAI_LOW_TOKENS = 85
OPENAI_BASE_TOKENS = 85
OPENAI_TILE_TOKENS = 170
OPENAI_TILE = 512
OPENAI_BOX = 2_048
OPENAI_SHORT_SIDE = 768
PDF_STREAM_TOKENS = 3_000

_ANTHROPIC, _OPENAI, _DOCUMENT = 0, 1, 2
_OPENAI_IMAGE_TYPES = frozenset({"image_url", "input_image", "computer_screenshot"})
_KEYS = (b'"data":', b'"file_data":')  # the members a payload without a data: URL is in
_B64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
_ALPHABET_TABLE = bytes(0x61 if c in _ALPHABET else 0x20 for c in range(256))  # b"a" / b" "
_STRIDE = 128
_RUN = b"a" * (MIN_CHARS // _STRIDE)  # MIN_CHARS bytes hold exactly this many multiples
_JPEG_SOF = frozenset({*range(0xC0, 0xC4), *range(0xC5, 0xC8), *range(0xC9, 0xCC), 0xCD, 0xCE})
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD9)})
_JPEG_MAX_SEGMENTS = 64
_PDF_CACHE: dict[tuple[int, int], int] = {}
_PDF_CACHE_SIZE = 256


def may_hold_media(dumped: bytes) -> bool:
    """Whether compact JSON ``dumped`` may hold a payload :func:`media_block` counts: False
    means it holds none; True, that the value needs a look (a false alarm only costs that).

    A payload counted is a JSON string that starts with ``data:`` or is the value of a
    ``data`` or ``file_data`` member, whose base64 (after a ``data:`` URL's ``;base64,``)
    begins with ``MIN_CHARS`` characters of the base64 alphabet, without a ``"`` before
    them. Those are ``MIN_CHARS`` consecutive bytes of ``dumped``, so every ``_STRIDE``-th
    byte of ``dumped`` (``dumped[::_STRIDE]``, C-level, ``len / 128`` bytes) has a run of
    ``_RUN`` base64 characters there. Text rarely does (a space or a quote breaks it), and
    where it does, the last quote before the run tells whether that string is one."""
    sampled = dumped[::_STRIDE].translate(_ALPHABET_TABLE)
    i = sampled.find(_RUN)
    while i >= 0:
        # The run's last sampled byte: in a payload's first MIN_CHARS bytes when the run
        # reaches them (it may begin earlier: the samples can step over the quotes before
        # it), and in the long string, not before it, when that is no payload.
        p = (i + len(_RUN) - 1) * _STRIDE
        q = dumped.rfind(b'"', 0, p + 1)
        if q >= 0 and (dumped.startswith(b"data:", q + 1) or dumped.endswith(_KEYS, 0, q)):
            return True
        e = dumped.find(b'"', p + 1)  # that string is no payload: go on after its end
        if e < 0:
            return False
        i = sampled.find(_RUN, e // _STRIDE + 1)
    return False


def media_block(block: dict[Any, Any]) -> tuple[str, int, bool] | None:
    """``(payload, tokens, at_most_text)`` when ``block`` is an inline base64 image or PDF
    that counts by its own rule (see the module docstring): ``payload`` is the string that
    stands for it in the JSON (the ``data:`` URL or the base64), ``tokens`` what it is
    billed as, ``at_most_text`` whether the caller keeps the text count of ``payload`` when
    that is less (a PDF's). None for anything else, including base64 that does not begin
    with ``MIN_CHARS`` characters of the alphabet (it stays text)."""
    kind = dict.get(block, "type")
    if not isinstance(kind, str):
        return None
    payload: Any
    detail: Any = None
    if kind == "image" or kind == "document":
        source = dict.get(block, "source")
        if not isinstance(source, dict) or dict.get(source, "type") != "base64":
            return None
        payload = dict.get(source, "data")
        rule = _ANTHROPIC if kind == "image" else _DOCUMENT
    elif kind in _OPENAI_IMAGE_TYPES:
        payload = dict.get(block, "image_url")
        detail = dict.get(block, "detail")
        if isinstance(payload, dict):  # chat: {"url": ..., "detail": ...}
            detail = dict.get(payload, "detail")
            payload = dict.get(payload, "url")
        rule = _OPENAI
    elif kind == "file" or kind == "input_file":
        holder = dict.get(block, "file") if kind == "file" else block
        if not isinstance(holder, dict):
            return None
        payload = dict.get(holder, "file_data")
        rule = _DOCUMENT
    else:
        return None
    if not isinstance(payload, str) or len(payload) < MIN_CHARS:
        return None
    start = _payload_start(payload, rule)
    if start < 0 or not _findable(payload, start):
        return None
    if rule == _DOCUMENT:
        pdf = _pdf_tokens(payload, start)
        return None if pdf is None else (payload, pdf, True)
    if rule == _OPENAI and detail == "low":
        return payload, OPENAI_LOW_TOKENS, False
    size = image_size(payload, start)
    if size is None:
        return payload, IMAGE_MAX_TOKENS, False
    if rule == _ANTHROPIC:
        return payload, anthropic_image_tokens(*size), False
    return payload, openai_image_tokens(*size), False


def _findable(payload: str, start: int) -> bool:
    """Whether :func:`may_hold_media` finds ``payload`` in any JSON: its base64 begins with
    ``MIN_CHARS`` characters of the alphabet, and no ``"`` comes before them. (One pass
    over ``MIN_CHARS`` characters, a few µs.)"""
    head = payload[start : start + MIN_CHARS]
    if len(head) < MIN_CHARS or not head.isascii() or payload.find('"', 0, start) >= 0:
        return False
    return not head.encode("ascii").translate(None, _ALPHABET)


def _payload_start(payload: str, rule: int) -> int:
    """Where the base64 starts in ``payload``: after a ``data:`` URL's ``;base64,``, or 0
    for bare base64 where the member takes it (Anthropic's ``data``, ``file_data``); -1
    when it is not base64."""
    if payload.startswith("data:"):
        marker = payload.find(";base64,", 5, 256)
        return -1 if marker < 0 else marker + 8
    return -1 if rule == _OPENAI else 0  # an image URL that is no data: URL is a link


def anthropic_image_tokens(width: int, height: int) -> int:
    """Anthropic's ``width * height / 750`` (rounded up) after the downscale to 1,568 px on
    the long edge, at most ``IMAGE_MAX_TOKENS``."""
    w, h = float(width), float(height)
    edge = max(w, h)
    if edge > ANTHROPIC_MAX_EDGE:
        w, h = w * ANTHROPIC_MAX_EDGE / edge, h * ANTHROPIC_MAX_EDGE / edge
    return max(1, min(IMAGE_MAX_TOKENS, math.ceil(w * h / ANTHROPIC_PIXELS_PER_TOKEN)))


def openai_image_tokens(width: int, height: int) -> int:
    """OpenAI's high-detail rule (GPT-4o): fit in 2,048 x 2,048, scale the shortest side
    down to 768, then 85 + 170 per 512 px tile."""
    w, h = float(width), float(height)
    edge = max(w, h)
    if edge > OPENAI_BOX:
        w, h = w * OPENAI_BOX / edge, h * OPENAI_BOX / edge
    short = min(w, h)
    if short > OPENAI_SHORT_SIDE:
        w, h = w * OPENAI_SHORT_SIDE / short, h * OPENAI_SHORT_SIDE / short
    tiles = math.ceil(w / OPENAI_TILE) * math.ceil(h / OPENAI_TILE)
    return OPENAI_BASE_TOKENS + OPENAI_TILE_TOKENS * tiles


def _decoded(payload: str, start: int, offset: int, n: int) -> bytes | None:
    """Bytes ``offset`` to ``offset + n`` of the file whose base64 starts at ``start`` of
    ``payload``, decoding only the characters that hold them; None if they are not there
    or not base64."""
    group = offset // 3
    first = start + 4 * group
    chunk = payload[first : start + 4 * -(-(offset + n) // 3)]
    if not _B64.fullmatch(chunk):
        return None
    try:
        raw = binascii.a2b_base64(chunk)
    except (binascii.Error, ValueError):
        return None
    skip = offset - 3 * group
    out = raw[skip : skip + n]
    return out if len(out) == n else None


def image_size(payload: str, start: int = 0) -> tuple[int, int] | None:
    """``(width, height)`` from the header of the PNG, JPEG, GIF or WebP whose base64
    starts at ``start`` of ``payload``; None when it is none of them or cannot be read."""
    head = _decoded(payload, start, 0, 30) or _decoded(payload, start, 0, 10)  # a tiny GIF
    if head is None:
        return None
    size: tuple[int, int] | None = None
    if head.startswith(b"\x89PNG\r\n\x1a\n") and head[12:16] == b"IHDR" and len(head) >= 24:
        size = struct.unpack(">II", head[16:24])
    elif head[:6] in (b"GIF87a", b"GIF89a"):
        size = struct.unpack("<HH", head[6:10])
    elif head[:4] == b"RIFF" and head[8:12] == b"WEBP" and len(head) >= 30:
        size = _webp_size(head)
    elif head[:2] == b"\xff\xd8":
        size = _jpeg_size(payload, start)
    if size is None or size[0] <= 0 or size[1] <= 0:
        return None
    return size


def _webp_size(head: bytes) -> tuple[int, int] | None:
    chunk = head[12:16]
    if chunk == b"VP8 " and head[23:26] == b"\x9d\x01\x2a":
        w, h = struct.unpack("<HH", head[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L" and head[20] == 0x2F:
        bits = int.from_bytes(head[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        return int.from_bytes(head[24:27], "little") + 1, int.from_bytes(head[27:30], "little") + 1
    return None


def _jpeg_size(payload: str, start: int) -> tuple[int, int] | None:
    """The frame size of a JPEG's SOF segment, hopping from segment to segment (an EXIF or
    ICC segment before it is skipped by its length, not decoded)."""
    pos = 2
    for _ in range(_JPEG_MAX_SEGMENTS):
        seg = _decoded(payload, start, pos, 9)
        if seg is None or seg[0] != 0xFF:
            return None
        marker = seg[1]
        if marker == 0xFF:  # fill byte
            pos += 1
        elif marker in _JPEG_SOF:
            height, width = struct.unpack(">HH", seg[5:9])
            return width, height
        elif marker in _JPEG_STANDALONE:
            pos += 2
        else:
            pos += 2 + int.from_bytes(seg[2:4], "big")
    return None


def _pdf_tokens(payload: str, start: int) -> int | None:
    """``PDF_STREAM_TOKENS`` per stream of the PDF whose base64 starts at ``start`` of
    ``payload`` (at least one); None when it is no PDF or cannot be decoded."""
    if _decoded(payload, start, 0, 5) != b"%PDF-":
        return None
    key = (len(payload), hash(payload))  # a str keeps its hash: once per object
    streams = _PDF_CACHE.get(key)
    if streams is None:
        try:
            raw = binascii.a2b_base64(payload[start:] if start else payload)
        except (binascii.Error, ValueError):
            return None
        streams = raw.count(b"endstream")
        if len(_PDF_CACHE) >= _PDF_CACHE_SIZE:
            _PDF_CACHE.clear()
        _PDF_CACHE[key] = streams
    return PDF_STREAM_TOKENS * max(streams, 1)
