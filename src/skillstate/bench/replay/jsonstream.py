"""Reading log files without holding them whole: JSON lines one at a time, and the
elements of a top-level JSON array one at a time (the decoder is the standard library's,
fed a growing window of the file until an element parses)."""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from typing import IO, Any

import orjson

__all__ = ["EmptyLog", "LogError", "iter_json_array", "iter_json_lines"]

CHUNK = 1 << 20  # bytes read at a time


class LogError(Exception):
    """A file that cannot be replayed (or not wholly): the one line that says why."""


class EmptyLog(LogError):
    """A log with no model call in it and nothing wrong with it (a session opened and closed,
    a summary or snapshot file the agent wrote): nothing to replay, a note and not a
    failure."""


def iter_json_lines(f: IO[bytes], skipped: list[str] | None = None) -> Iterator[tuple[int, Any]]:
    """(line number, value) per non-blank line. A line that does not parse (a last line cut
    mid-way: the file is truncated) is a LogError naming it, or, given ``skipped``, one
    entry there and the reading goes on."""
    for lineno, raw in enumerate(f, 1):
        if not raw.strip():
            continue
        try:
            yield lineno, orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            if not raw.endswith(b"\n") and not f.read(1):
                why = f"truncated: line {lineno} ends mid-record"
            else:
                why = f"line {lineno} is not JSON ({_reason(e)})"
            if skipped is None:
                raise LogError(why) from None
            skipped.append(why)


def _reason(e: Exception) -> str:
    return str(e).split(":", 1)[0]


class _Window:
    """A text window over a binary file: ``text[pos:]`` is what is not consumed yet."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="strict")
        self.text = ""
        self.pos = 0
        self.eof = False
        self.consumed = 0  # characters dropped before ``text``

    def more(self, at_least: int = CHUNK) -> bool:
        """Read at least ``at_least`` more bytes (False at the end of the file)."""
        if self.eof:
            return False
        data = self._f.read(max(at_least, CHUNK))
        try:
            chunk = self._utf8.decode(data, final=not data)
        except UnicodeDecodeError:
            raise LogError("not UTF-8 text") from None
        if not data:
            self.eof = True
        self.consumed += self.pos
        self.text = self.text[self.pos :] + chunk
        self.pos = 0
        return bool(data)

    def skip_space(self) -> str:
        """The next non-blank character (``""`` at the end of the file)."""
        while True:
            text, pos = self.text, self.pos
            n = len(text)
            while pos < n and text[pos] in " \t\r\n":
                pos += 1
            self.pos = pos
            if pos < n:
                return text[pos]
            if not self.more():
                return ""


def iter_json_array(f: IO[bytes]) -> Iterator[Any]:
    """The elements of the top-level JSON array in ``f``, one at a time. A malformed or
    truncated array is a LogError (the elements before it were yielded)."""
    decoder = json.JSONDecoder()
    w = _Window(f)
    if w.skip_space() != "[":
        raise LogError("not a JSON array")
    w.pos += 1
    index = 0
    if w.skip_space() == "]":
        return
    want = CHUNK
    while True:
        if w.skip_space() == "":
            raise LogError(f"truncated: element {index + 1} is cut off")
        try:
            value, end = decoder.raw_decode(w.text, w.pos)
        except json.JSONDecodeError as e:
            cut = e.pos >= len(w.text) - 1 or e.msg.startswith("Unterminated string")
            if cut and w.more(want):
                want *= 2  # an element longer than the window: read more at a time
                continue
            if cut:
                raise LogError(f"truncated: element {index + 1} is cut off") from None
            raise LogError(f"element {index + 1} is not JSON ({e.msg})") from None
        except RecursionError:
            # The standard library's decoder recurses per nesting level; orjson's limit
            # (1,024) says the same of a JSON lines or a single-transcript file.
            raise LogError(f"element {index + 1} is not JSON (depth limit exceeded)") from None
        if end == len(w.text) and not w.eof and not isinstance(value, (dict, list, str)):
            w.more()  # a number could go on in the next chunk
            continue
        want = CHUNK
        w.pos = end
        index += 1
        yield value
        sep = w.skip_space()
        if sep == "]":
            w.pos += 1
            if w.skip_space() != "":
                raise LogError("text after the JSON array")
            return
        if sep != ",":
            what = "cut off" if sep == "" else f"followed by {sep!r}"
            raise LogError(
                f"truncated: element {index} is {what}"
                if sep == ""
                else f"element {index} is {what}, not ',' or ']'"
            )
        w.pos += 1
