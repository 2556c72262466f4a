"""Incremental Server-Sent Events parsing and encoding.

The parser keeps each event's raw bytes so that a same-dialect stream can be forwarded
byte-for-byte while its content is still inspected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class SSEEvent:
    event: str | None
    data: str
    raw: bytes  # the event exactly as received, including its terminating blank line


# Bytes of one event the parser holds while waiting for its end. Provider events are a few
# hundred bytes; an upstream that never ends one (no blank line, ever) must not take memory
# without bound.
MAX_EVENT_BYTES = 16 * 1024 * 1024


class SSEParser:
    """Feed bytes as they arrive; get back complete events. Accepts \\n, \\r\\n and \\r."""

    def __init__(self) -> None:
        self._buf = b""
        self._cr = False  # the last read ended in \r; its \n may open the next read

    @property
    def pending(self) -> int:
        """Bytes held of an event not ended yet (see ``MAX_EVENT_BYTES``)."""
        return len(self._buf)

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if self._cr:
            chunk, self._cr = b"\r" + chunk, False
        if b"\r" in chunk:
            if chunk.endswith(b"\r"):
                # A \r\n split across two reads must stay one line break, not two.
                chunk, self._cr = chunk[:-1], True
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf + chunk
        events: list[SSEEvent] = []
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            events.append(_parse_block(buf[start : end + 2]))
            start = end + 2
        # The rest is kept once per read (slicing per event made a read of many events
        # quadratic in its size).
        self._buf = buf[start:]
        return events

    def flush(self) -> list[SSEEvent]:
        """A final event that the upstream did not terminate with a blank line."""
        raw, self._buf = self._buf + (b"\n" if self._cr else b""), b""
        self._cr = False
        if not raw.strip():
            return []
        return [_parse_block(raw + b"\n\n" if not raw.endswith(b"\n") else raw + b"\n")]


def _parse_block(raw: bytes) -> SSEEvent:
    event: str | None = None
    data_lines: list[str] = []
    for line in raw.decode("utf-8", errors="replace").split("\n"):
        if not line or line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "event":
            event = value
        elif field == "data":
            data_lines.append(value)
    return SSEEvent(event=event, data="\n".join(data_lines), raw=raw)


def encode(data: Any, event: str | None = None) -> bytes:
    """One SSE event. `data` may be bytes/str (sent as is) or any JSON-serialisable value."""
    if isinstance(data, bytes):
        payload = data
    elif isinstance(data, str):
        payload = data.encode()
    else:
        payload = orjson.dumps(data)
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + payload + b"\n\n"


def comment(text: str) -> bytes:
    """An SSE comment line; SDK parsers ignore it."""
    return b": " + text.replace("\n", " ").encode() + b"\n\n"
