"""A screenshot agent in ``mode: window`` (probe report F3): the real proxy, the anthropic SDK,
the fake provider as an Anthropic upstream. Every tool result is a ~270 KB base64 PNG
screenshot (1280 x 800), which a provider bills ~1,366 tokens, not the ~67,000 its base64
counts as text. The window must see the former: one upstream call a turn (no fold of the
previous screenshot into the state), and every screenshot still in the window verbatim,
instead of a fold call on every turn and a window of one exchange."""

from __future__ import annotations

import base64
import json
import os
import struct
import zlib
from typing import Any

from skillstate.engine.context import CORRECTION_MARK
from skillstate.engine.window import CHECKPOINT_MARK
from tests.conftest import StartProxy
from tests.fakeprovider import FakeProvider, RecordedRequest, Reply
from tests.helpers import ant, envelope, session

SYSTEM = [
    {"type": "text", "text": "You are a UI tester. " * 300, "cache_control": {"type": "ephemeral"}}
]
TOOLS = [
    {
        "name": "Screenshot",
        "description": "Take a screenshot.",
        "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
    }
]
TURNS = 7
KEEP = 3


def screenshot(turn: int, width: int = 1280, height: int = 800) -> str:
    """A PNG of ``width`` x ``height`` whose file is ~200 KB (a text chunk of random bytes
    stands for the compressed pixels), as base64."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = b"turn %d\x00" % turn + os.urandom(200_000)
    raw = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"tEXt", pixels)
    return base64.b64encode(raw + chunk(b"IEND", b"")).decode()


def asks_checkpoint(req: RecordedRequest) -> bool:
    last = json.dumps(req.json["messages"][-1])[-3000:]
    return CHECKPOINT_MARK in last or CORRECTION_MARK in last


def model(req: RecordedRequest) -> Reply:
    """Takes a screenshot every turn; writes the envelope only when asked for it (a fold or a
    checkpoint)."""
    call = ("Screenshot", {"n": len(req.json["messages"])})
    if asks_checkpoint(req):
        return Reply(text=envelope({"notes": "checked a page"}), tool_calls=[call])
    return Reply(text="Looking at the page.", tool_calls=[call])


def images_in(value: Any) -> int:
    return json.dumps(value).count('"type": "image"')


def image_data(messages: list[Any]) -> list[str]:
    """The base64 of every image in ``messages``' tool results, in order."""
    return [
        image["source"]["data"]
        for m in messages
        if isinstance(m["content"], list)
        for block in m["content"]
        if block.get("type") == "tool_result"
        for image in block["content"]
    ]


def test_a_screenshot_agent_keeps_its_window_and_folds_nothing(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    up = {"name": "ant", "url": fake.url, "kind": "anthropic", "api_key": "sk-upstream"}
    config = {"upstreams": [up], "mode": "window", "schema": ["notes"]}
    config |= {"window_max_tokens": 32_000, "window_keep": KEEP}
    p = start_proxy(config=config)
    fake.responder = model
    client = ant(p, "k")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Check every settings page."}]
    calls, contexts = [], []
    for turn in range(TURNS):
        before = len(fake.requests)
        r = client.messages.with_raw_response.create(
            model="claude-sonnet-4-5",
            max_tokens=1024,
            system=SYSTEM,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            messages=messages,  # type: ignore[arg-type]
            extra_headers=session("screenshots"),
        )
        calls.append(len(fake.requests) - before)
        contexts.append(r.headers["x-skillstate-context"])
        reply = r.parse()
        content = [b.model_dump(exclude_none=True) for b in reply.content]
        messages.append({"role": "assistant", "content": content})
        source = {"type": "base64", "media_type": "image/png", "data": screenshot(turn)}
        image = {"type": "image", "source": source}
        results = [
            {"type": "tool_result", "tool_use_id": b["id"], "content": [image]}
            for b in content
            if b["type"] == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
    # one upstream call a turn: no turn folded the previous screenshots into the state first
    assert calls == [1] * TURNS, calls
    # the window checkpoints by its bill now and then (the envelope asked in the turn's own
    # call), never because a screenshot looked like 67,000 tokens
    assert set(contexts) <= {"window", "checkpoint"}, contexts
    first = contexts.index("checkpoint") if "checkpoint" in contexts else TURNS
    assert first >= 3, contexts
    shots = [images_in(r.json["messages"]) for r in fake.requests]
    for turn, n in enumerate(shots):
        if turn <= first:  # every screenshot so far, verbatim
            assert n == turn, shots
        else:  # after a checkpoint: the kept exchanges (window_keep) and the new ones
            assert n >= KEEP, shots
    last = min(first, TURNS - 1)  # the last request that carries every screenshot so far
    assert image_data(fake.requests[last].json["messages"]) == image_data(messages)[:last]
