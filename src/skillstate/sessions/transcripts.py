"""Per-session results over a client's transcript, carried from one turn to the next, so
that a turn does work only on the messages that are new (issue 22).

Every state, auto and mask turn needs three things of the client's whole transcript: the
transcript without the proxy's envelopes (:class:`~skillstate.engine.stripper.TranscriptStripper`),
its estimated tokens (:class:`~skillstate.cost.tokens.ListSize`) and the hashes of its prefixes
for the baseline's cache model (:class:`~skillstate.cost.baseline.PrefixPointsMemo`). An
agent's transcript grows by an exchange per turn; each of the three keeps its results per
session and works only on the messages after the ``kept`` ones this module vouches for.

The check: the transcript serialised as compact JSON (one orjson call, at C speed) starts
with the previous turn's serialisation less its closing bracket, followed by a comma or the
closing bracket (so the previous last message ended where it did: a number cannot have
grown), and the pieces before the messages (tools, system) serialise the same. The same
JSON text is the same messages, so every result for them stands. Anything else (a message
edited, dropped or reordered, other tools or system, another dialect) takes the full path,
and that turn's transcript becomes the session's reference. What a turn costs beyond its new
messages: that serialisation and one comparison of bytes.

Memory: per session, the last transcript's serialisation and the stripped copies of its
messages that had an envelope, counted together as twice the serialisation. The least
recently used sessions are dropped beyond ``max_sessions`` sessions or ``max_bytes`` in all
(defaults: 1,000 and 128 MiB); a dropped session's next turn takes the full path. Only
sessions the client named are kept (a generated id is new on every request).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from ..cost.baseline import PrefixPoint, PrefixPointsMemo
from ..cost.tokens import ListSize, request_tokens
from ..engine.stripper import TranscriptStripper

if TYPE_CHECKING:
    from ..dialects.base import Dialect

__all__ = ["MAX_BYTES", "MAX_SESSIONS", "SessionTranscripts", "TranscriptView"]

MAX_SESSIONS = 1_000
MAX_BYTES = 128 * 1024 * 1024
_BOUNDARY = (ord(","), ord("]"))  # what may follow a complete item in a JSON list


@dataclass(frozen=True, slots=True)
class TranscriptView:
    """One turn's client transcript, as the plain definitions give it.

    ``clean``: the request without the proxy's envelopes (``Dialect.strip_request``; the
    body itself when it had none). ``est_tokens``: ``request_tokens(clean)``.
    ``points``: ``prefix_points(clean)``. ``kept``: the leading messages whose results
    came from the session's previous turn (0: the full path)."""

    clean: dict[str, Any]
    est_tokens: int
    points: list[PrefixPoint]
    kept: int


class _Memo:
    """One session's reference transcript and the results kept for it."""

    __slots__ = ("blob", "count", "dialect", "head", "points", "sizes", "strip")

    def __init__(self, dialect: str, text_type: str) -> None:
        self.dialect = dialect
        self.head = b""  # tools and system, as compact JSON
        self.blob = b""  # the transcript, as compact JSON
        self.count = 0  # its messages
        self.strip = TranscriptStripper(text_type)
        self.sizes = ListSize()
        self.points = PrefixPointsMemo()

    @property
    def nbytes(self) -> int:
        return 2 * len(self.blob) + len(self.head)

    def kept(self, head: bytes, blob: bytes) -> int:
        """How many leading messages of the transcript serialised as ``blob`` are this
        memo's (all of them, or 0)."""
        old = self.blob
        end = len(old) - 1  # where the closing bracket was
        if not self.count or head != self.head or len(blob) <= end or blob[end] not in _BOUNDARY:
            return 0
        return self.count if blob.startswith(memoryview(old)[:end]) else 0


class SessionTranscripts:
    """The per-session memos of the transcripts (see the module docstring)."""

    def __init__(self, max_sessions: int = MAX_SESSIONS, max_bytes: int = MAX_BYTES) -> None:
        if max_sessions < 1 or max_bytes < 1:
            raise ValueError("max_sessions and max_bytes must be positive")
        self._max_sessions = max_sessions
        self._max_bytes = max_bytes
        self._memos: OrderedDict[str, _Memo] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._memos)

    @property
    def nbytes(self) -> int:
        """The memory counted against ``max_bytes``."""
        return self._bytes

    def view(self, session: str | None, dialect: Dialect, body: dict[str, Any]) -> TranscriptView:
        """This turn's transcript results; ``session`` None: nothing is kept."""
        key, text_type = dialect.transcript
        messages = body.get(key)
        items = messages if isinstance(messages, list) else []
        memo = self._take(session) if items is messages else None
        if memo is None or memo.dialect != dialect.name:
            memo = _Memo(dialect.name, text_type)
        kept = self._kept(memo, body, items) if session is not None else 0
        stripped = memo.strip.strip(items, kept)
        clean = body if stripped is None else {**body, key: stripped}
        transcript = items if stripped is None else stripped
        known = (transcript, memo.sizes.size(transcript, kept)) if items is messages else None
        est = request_tokens(clean, known)
        points = memo.points.points(clean, kept if key == "messages" else 0)
        if session is not None and items is messages and memo.blob:
            self._put(session, memo)
        return TranscriptView(clean, est, points, kept)

    @staticmethod
    def _kept(memo: _Memo, body: dict[str, Any], messages: list[Any]) -> int:
        """The messages ``memo`` vouches for, and ``messages`` made its reference."""
        try:
            head = orjson.dumps([body.get("tools"), body.get("system")])
            blob = orjson.dumps(messages)
        except orjson.JSONEncodeError:  # not from a JSON body: nothing to compare with
            memo.blob, memo.count = b"", 0
            return 0
        kept = memo.kept(head, blob)
        memo.head, memo.blob, memo.count = head, blob, len(messages)
        return kept

    def _take(self, session: str | None) -> _Memo | None:
        if session is None:
            return None
        memo = self._memos.pop(session, None)
        if memo is not None:
            self._bytes -= memo.nbytes
        return memo

    def _put(self, session: str, memo: _Memo) -> None:
        self._memos[session] = memo
        self._bytes += memo.nbytes
        while self._memos and (
            len(self._memos) > self._max_sessions or self._bytes > self._max_bytes
        ):
            _, dropped = self._memos.popitem(last=False)
            self._bytes -= dropped.nbytes
