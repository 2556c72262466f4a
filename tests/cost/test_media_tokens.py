"""Inline base64 images and PDFs count what a provider bills for them, not their base64's
bytes (``skillstate.cost.media``), in every wire shape, through ``estimate_tokens`` and the
helpers that must agree with it (``ListSize``, ``request_tokens``' ``known``, ``json_size``).

The images are built here byte by byte (PNG with struct/zlib, JPEG, GIF and WebP headers)
with known dimensions, and padded so that their base64 passes the 8,192 characters below
which base64 stays text."""

from __future__ import annotations

import base64
import math
import os
import struct
import zlib
from typing import Any

import orjson
import pytest

from skillstate.cost.tokens import (
    BYTES_PER_TOKEN,
    MESSAGE_OVERHEAD_TOKENS,
    ListSize,
    estimate_tokens,
    request_parts,
    request_tokens,
)

PAD = 12_000  # raw bytes: 16,000 characters of base64


# -- files with known dimensions -------------------------------------------------------------


def png(width: int, height: int, pad: int = PAD) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00" * (1 + 3 * min(width, 4)))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"tEXt", b"pad\x00" + os.urandom(pad))
        + chunk(b"IDAT", pixels)
        + chunk(b"IEND", b"")
    )


def jpeg(width: int, height: int, exif: int = 20_000) -> bytes:
    """A JPEG whose frame header comes after a JFIF segment and EXIF-sized segments (which
    the estimator must skip by their lengths, not decode)."""

    def segment(marker: int, body: bytes) -> bytes:
        return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body

    out = b"\xff\xd8" + segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
    while exif > 0:
        n = min(exif, 60_000)
        out += segment(0xE1, b"Exif\x00\x00" + os.urandom(n))
        exif -= n
    sof = struct.pack(">BHHB", 8, height, width, 3) + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    return out + segment(0xC0, sof) + segment(0xFE, b"scan data follows") + os.urandom(500)


def gif(width: int, height: int, pad: int = PAD) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\xf7\x00\x00" + os.urandom(pad)


def webp(width: int, height: int, kind: str, pad: int = PAD) -> bytes:
    if kind == "VP8 ":
        body = b"\x10\x02\x00" + b"\x9d\x01\x2a" + struct.pack("<HH", width, height)
    elif kind == "VP8L":
        bits = (width - 1) | ((height - 1) << 14)
        body = b"\x2f" + bits.to_bytes(4, "little")
    else:  # VP8X
        body = b"\x00\x00\x00\x00" + (width - 1).to_bytes(3, "little")
        body += (height - 1).to_bytes(3, "little")
    body += os.urandom(pad)
    chunk = kind.encode() + struct.pack("<I", len(body)) + body
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


def pdf(streams: int, stream_bytes: int) -> bytes:
    out = b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n"
    for k in range(streams):
        data = os.urandom(stream_bytes)
        out += b"%d 0 obj\n<< /Length %d >>\nstream\n" % (k + 1, len(data))
        out += data + b"\nendstream\nendobj\n"
    return out + b"trailer\n<< /Size 1 >>\n%%EOF\n"


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


# -- the wire shapes --------------------------------------------------------------------------


def anthropic_image(data: str, media_type: str = "image/png") -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def anthropic_document(data: str) -> dict[str, Any]:
    source = {"type": "base64", "media_type": "application/pdf", "data": data}
    return {"type": "document", "source": source, "title": "report"}


def chat_image(data: str, detail: str | None = None, mime: str = "image/png") -> dict[str, Any]:
    image: dict[str, Any] = {"url": f"data:{mime};base64,{data}"}
    if detail is not None:
        image["detail"] = detail
    return {"type": "image_url", "image_url": image}


def chat_file(data: str) -> dict[str, Any]:
    file = {"file_data": f"data:application/pdf;base64,{data}", "filename": "report.pdf"}
    return {"type": "file", "file": file}


def responses_image(data: str, detail: str = "auto") -> dict[str, Any]:
    return {"type": "input_image", "image_url": f"data:image/png;base64,{data}", "detail": detail}


def responses_file(data: str) -> dict[str, Any]:
    file_data = f"data:application/pdf;base64,{data}"
    return {"type": "input_file", "file_data": file_data, "filename": "report.pdf"}


def user(*parts: Any) -> dict[str, Any]:
    return {"role": "user", "content": list(parts)}


def expected(obj: Any, media: list[tuple[str, int]], messages: int) -> int:
    """The estimate of ``obj`` when each of ``media``'s strings (a block's data or data URL)
    counts its tokens instead of its JSON string's bytes."""
    n = len(orjson.dumps(obj))
    for payload, tokens in media:
        n += BYTES_PER_TOKEN * tokens - len(payload) - 2
    return math.ceil(n / BYTES_PER_TOKEN) + MESSAGE_OVERHEAD_TOKENS * messages


def anthropic_tokens(width: int, height: int) -> int:
    """The documented rule, written out again: long edge to 1,568, w*h/750, at most 1,600."""
    scale = min(1.0, 1568 / max(width, height))
    return min(1600, math.ceil(width * scale * height * scale / 750))


# -- images: Anthropic ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("width", "height", "tokens"),
    [(1092, 1092, 1590), (200, 200, 54), (1000, 1000, 1334), (3000, 2000, 1600), (784, 1568, 1600)],
)
def test_an_anthropic_image_counts_its_pixels(width: int, height: int, tokens: int) -> None:
    assert anthropic_tokens(width, height) == tokens  # the docs' own figures
    data = b64(png(width, height))
    msgs = [user(anthropic_image(data), {"type": "text", "text": "What is on the screen?"})]
    assert estimate_tokens(msgs) == expected(msgs, [(data, tokens)], 1)


def test_a_screenshot_in_a_tool_result_counts_its_pixels_not_its_base64() -> None:
    data = b64(png(1280, 800, pad=600_000))  # an 800 KB base64 screenshot
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [anthropic_image(data)]}
    msgs = [
        {"role": "user", "content": "Click through the settings pages."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "shot"}]},
        {"role": "user", "content": [result]},
    ]
    est = estimate_tokens(msgs)
    assert est == expected(msgs, [(data, math.ceil(1280 * 800 / 750))], 3)
    assert est < 1_500  # was ~200,000
    body = {"model": "claude-x", "system": "You test UIs.", "messages": msgs}
    assert estimate_tokens(body) == expected(body, [(data, 1366)], 4)


@pytest.mark.parametrize(
    ("raw", "width", "height"),
    [
        (jpeg(1600, 1200), 1600, 1200),
        (jpeg(640, 480, exif=70_000), 640, 480),  # two EXIF segments before the frame
        (gif(320, 240), 320, 240),
        (webp(1024, 768, "VP8 "), 1024, 768),
        (webp(1024, 768, "VP8L"), 1024, 768),
        (webp(3000, 500, "VP8X"), 3000, 500),
    ],
)
def test_jpeg_gif_and_webp_headers_are_read(raw: bytes, width: int, height: int) -> None:
    data = b64(raw)
    msgs = [user(anthropic_image(data, "image/jpeg"))]
    assert estimate_tokens(msgs) == expected(msgs, [(data, anthropic_tokens(width, height))], 1)


# -- images: OpenAI -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("width", "height", "tokens"),
    [
        (1024, 1024, 765),  # OpenAI's example: 768 x 768, four tiles
        (2048, 4096, 1105),  # 1024 x 2048, then 768 x 1536: six tiles
        (4096, 1536, 1445),  # 2048 x 768: four tiles by two, the most there can be
        (4096, 1024, 765),  # 2048 x 512: four tiles by one
        (512, 512, 255),
        (300, 100, 255),
    ],
)
def test_an_openai_image_counts_its_tiles(width: int, height: int, tokens: int) -> None:
    data = b64(png(width, height))
    for part in (chat_image(data, "high"), chat_image(data), responses_image(data)):
        msgs = [user(part)]
        payload = part["image_url"]["url"] if part["type"] == "image_url" else part["image_url"]
        assert estimate_tokens(msgs) == expected(msgs, [(payload, tokens)], 1), part["type"]


def test_a_low_detail_openai_image_is_85() -> None:
    data = b64(png(4000, 3000))
    for part in (chat_image(data, "low"), responses_image(data, "low")):
        payload = part["image_url"]["url"] if part["type"] == "image_url" else part["image_url"]
        assert estimate_tokens([user(part)]) == expected([user(part)], [(payload, 85)], 1)


def test_a_computer_use_screenshot_on_the_responses_api() -> None:
    data = b64(png(1024, 768))
    item = {
        "type": "computer_call_output",
        "call_id": "call_1",
        "output": {"type": "computer_screenshot", "image_url": f"data:image/png;base64,{data}"},
    }
    tiles = 85 + 170 * 4  # 1024 x 768: two tiles by two
    assert estimate_tokens([item]) == expected(
        [item], [(f"data:image/png;base64,{data}", tiles)], 1
    )


def test_a_function_call_output_with_an_image_counts_it_by_tiles() -> None:
    data = b64(png(1024, 1024))
    url = f"data:image/png;base64,{data}"
    out = {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": [{"type": "input_text", "text": "screen"}, responses_image(data, "high")],
    }
    body = {"model": "gpt-5", "input": [{"role": "user", "content": "look"}, out]}
    assert estimate_tokens(body) == expected(body, [(url, 765)], 2)


# -- images whose size cannot be read --------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        os.urandom(PAD),  # no known header at all
        b"\x89PNG\r\n\x1a\n" + b"\x00" * 8 + os.urandom(PAD),  # PNG without its IHDR
        b"\xff\xd8" + b"\x00" * PAD,  # JPEG whose segments make no sense
        png(0, 100),  # a zero width
        b"\xff\xd8" + (b"\xff\xe1\x00\x04xx" * 100) + os.urandom(PAD),  # 100 segments, no frame
    ],
)
def test_an_unreadable_image_counts_the_upper_bound(raw: bytes) -> None:
    data = b64(raw)
    ant = [user(anthropic_image(data))]
    assert estimate_tokens(ant) == expected(ant, [(data, 1600)], 1)
    chat = [user(chat_image(data, "high"))]
    assert estimate_tokens(chat) == expected(chat, [(f"data:image/png;base64,{data}", 1600)], 1)


def test_a_header_with_characters_outside_base64_counts_the_upper_bound() -> None:
    data = b64(png(640, 480))
    broken = "iVBO*" + data[5:]  # not base64 in the header (and so not findable: text)
    msgs = [user(anthropic_image(broken))]
    assert estimate_tokens(msgs) == expected(msgs, [], 1)  # too broken to be sought: text
    late = data[:9000] + "*" + data[9001:]  # broken only after the 8,192 characters sought
    msgs = [user(anthropic_image(late))]
    assert estimate_tokens(msgs) == expected(msgs, [(late, anthropic_tokens(640, 480))], 1)
    header_only = "iVBORw0KGgo=" + data[12:]  # padding inside the header: not decodable
    msgs = [user(anthropic_image(header_only))]
    assert estimate_tokens(msgs) == expected(msgs, [(header_only, 1600)], 1)


# -- documents --------------------------------------------------------------------------------


def test_a_pdf_counts_per_stream_in_every_shape() -> None:
    data = b64(pdf(streams=2, stream_bytes=150_000))  # a scan: two big images, 400 KB base64
    tokens = 2 * 3_000
    for part, payload in (
        (anthropic_document(data), data),
        (chat_file(data), f"data:application/pdf;base64,{data}"),
        (responses_file(data), f"data:application/pdf;base64,{data}"),
    ):
        msgs = [user(part)]
        assert estimate_tokens(msgs) == expected(msgs, [(payload, tokens)], 1), part["type"]
        assert estimate_tokens(msgs) < 7_000  # was ~100,000


def test_a_pdf_never_counts_more_than_its_text() -> None:
    dense = b64(pdf(streams=40, stream_bytes=300))  # 40 small streams: 3,000 each is more
    assert len(dense) / 4 < 40 * 3_000
    scan = b64(pdf(streams=1, stream_bytes=100_000))
    msgs = [user(anthropic_document(dense)), user(anthropic_document(scan))]
    assert estimate_tokens(msgs) == expected(msgs, [(scan, 3_000)], 2)


def test_a_document_that_is_no_pdf_stays_text_beside_one_that_is() -> None:
    text = b64(b"plain text file, not a PDF\n" * 600)
    source = {"type": "base64", "media_type": "application/pdf", "data": b64(os.urandom(PAD))}
    real = b64(pdf(streams=1, stream_bytes=30_000))
    msgs = [
        user(chat_file(text), responses_file(text)),
        user({"type": "document", "source": source}),  # says PDF, is not one
        user(anthropic_document(real)),
    ]
    assert estimate_tokens(msgs) == expected(msgs, [(real, 3_000)], 3)


# -- what stays text --------------------------------------------------------------------------


def test_text_that_quotes_a_data_url_stays_text_beside_a_real_image() -> None:
    data = b64(png(800, 600))
    quoted = f'<img src="data:image/png;base64,{data}">'  # an HTML file a tool printed
    msgs = [
        {"role": "tool", "tool_call_id": "c1", "content": quoted},
        {"role": "user", "content": [{"type": "text", "text": f"data:image/png;base64,{data}"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"arguments": {"data": data}}]},
        user(chat_image(data, "high")),
        user({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}),
        user(anthropic_image(b64(png(800, 600, pad=100)))),  # small: its base64 is text
    ]
    url = f"data:image/png;base64,{data}"
    assert estimate_tokens(msgs) == expected(msgs, [(url, 85 + 170 * 4)], 6)


def test_long_base64_outside_media_blocks_stays_text() -> None:
    blob = b64(os.urandom(30_000))
    items = [
        {"type": "reasoning", "encrypted_content": blob, "summary": []},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": blob}]},
        {"type": "input_image", "image_url": "https://example.com/" + blob},  # a link
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": 7}},
    ]
    assert estimate_tokens(items) == expected(items, [], 5)
    data = b64(png(1092, 1092))
    with_image = [*items, user(anthropic_image(data))]
    assert estimate_tokens(with_image) == expected(with_image, [(data, 1590)], 6)


# -- one definition: the incremental and known-length paths agree ------------------------------


def transcript() -> list[Any]:
    shot = b64(png(1280, 800, pad=60_000))
    pages = b64(pdf(streams=3, stream_bytes=20_000))
    return [
        {"role": "user", "content": "Check the settings pages."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot"}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [anthropic_image(shot)]}
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "It renders."}]},
        user(anthropic_document(pages), {"type": "text", "text": "and this report?"}),
        {"role": "assistant", "content": "Read it."},
    ]


def test_list_size_known_lengths_and_json_size_agree_with_estimate_tokens() -> None:
    from skillstate.cost.tokens import json_size  # (new with the media rule)

    msgs = transcript()
    body = {"model": "claude-x", "system": "S", "messages": msgs, "tools": [{"name": "shot"}]}
    plain = estimate_tokens(request_parts(body))
    sizes = ListSize()
    grown = sizes.size(msgs[:3], 0)
    assert grown == json_size(msgs[:3], orjson.dumps(msgs[:3]))
    length = sizes.size(msgs, 3)  # only the new messages measured
    assert length == json_size(msgs, orjson.dumps(msgs)) < len(orjson.dumps(msgs)) // 3
    assert request_tokens(body, (msgs, length)) == request_tokens(body) == plain
    assert plain < 12_000  # the base64 alone is ~40,000 tokens of text


def test_each_part_counts_the_same_alone_as_inside_the_whole() -> None:
    from skillstate.cost.tokens import json_size

    msgs = transcript()
    whole = estimate_tokens(msgs) - MESSAGE_OVERHEAD_TOKENS * len(msgs)
    parts = sum(json_size(m, orjson.dumps(m)) for m in msgs) + len(msgs) + 1
    assert whole == math.ceil(parts / BYTES_PER_TOKEN)


def test_the_iterative_fallback_counts_media_too() -> None:
    data = b64(png(1092, 1092))
    block = anthropic_image(data)
    deep: Any = [block]
    for _ in range(300):  # past orjson's 255 levels
        deep = [deep]
    msgs = [{"role": "user", "content": deep}]
    compact = len('[{"role":"user","content":}]') + 2 * 301 + len(orjson.dumps(block))
    n = compact + BYTES_PER_TOKEN * 1590 - len(data) - 2
    assert estimate_tokens(msgs) == math.ceil(n / BYTES_PER_TOKEN) + MESSAGE_OVERHEAD_TOKENS
    odd = {1: user(anthropic_image(data)), "n": 2**70}  # non-string key and a big int
    assert estimate_tokens(odd) < 1_700


def test_raw_json_bytes_count_media_the_same() -> None:
    msgs = transcript()
    parsed = estimate_tokens({"messages": msgs})
    assert estimate_tokens(orjson.dumps({"messages": msgs}, option=orjson.OPT_INDENT_2)) == parsed
    assert parsed < 12_000
