"""Per-session results over a client's transcript, carried from one turn to the next, so
that a turn does work only on the messages that are new (issue 22).

Every turn checks the client's request (the nesting limit, the dialect's structural checks),
and every state, auto and mask turn also needs three things of the client's whole
transcript: the transcript without the proxy's envelopes
(:class:`~skillstate.engine.stripper.TranscriptStripper`), its estimated tokens
(:class:`~skillstate.cost.tokens.ListSize`) and the hashes of its prefixes for the baseline's
cache model (:class:`~skillstate.cost.baseline.PrefixPointsMemo`). An agent's transcript
grows by an exchange per turn; the checks skip the leading messages the session's previous
request passed (:meth:`SessionTranscripts.text`, :meth:`SessionTranscripts.passed`), and each
of the three results is kept per session and worked out only on the messages after the
``kept`` ones this module vouches for (:meth:`SessionTranscripts.view`).

The check: the transcript serialised as compact JSON (one orjson call, at C speed) starts
with the previous turn's serialisation less its closing bracket, followed by a comma or the
closing bracket (so the previous last message ended where it did: a number cannot have
grown), and, for the results, the pieces before the messages (tools, system) serialise the
same. The same JSON text is the same messages, so every result for them stands, and a check
they passed passes again (the checks judge each message on its own). Anything else (a
message edited, dropped or reordered, other tools or system, another dialect or check) takes
the full path, and that turn's transcript becomes the session's reference. The
serialisation is made once per turn (:class:`TranscriptText`) and compared with both
references. What a turn costs beyond its new messages: that serialisation and two
comparisons of bytes.

Memory: per session, the last checked transcript's serialisation, the last worked-out one's
(the same bytes when they are the same turn's) and the stripped copies of its messages that
had an envelope, counted as the serialisation once more. The least recently used sessions
are dropped beyond ``max_sessions`` sessions or ``max_bytes`` in all (defaults: 1,000 and
128 MiB); a dropped session's next turn takes the full path. Only sessions the client named
are kept (a generated id is new on every request).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from ..cost.baseline import PrefixPoint, PrefixPointsMemo
from ..cost.tokens import ListSize, request_tokens
from ..engine.stripper import TranscriptStripper

if TYPE_CHECKING:
    from ..dialects.base import Dialect

__all__ = ["MAX_BYTES", "MAX_SESSIONS", "SessionTranscripts", "TranscriptText", "TranscriptView"]

MAX_SESSIONS = 1_000
MAX_BYTES = 128 * 1024 * 1024
_BOUNDARY = (ord(","), ord("]"))  # what may follow a complete item in a JSON list

Check = Callable[..., None]  # a request check that judges each transcript item on its own


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


@dataclass(frozen=True, slots=True)
class TranscriptText:
    """One request's transcript as compact JSON, made once per turn: ``head`` the pieces
    before it (tools, system), ``blob`` its items. ``checked``: its leading items that
    passed ``check`` (and the nesting limit) on the session's previous request, byte for
    byte. ``body``, ``items``, ``tools``, ``system``: what it was made from (the turn's
    results reuse it while the body is still those objects)."""

    session: str
    check: Check
    body: dict[str, Any]
    items: list[Any]
    tools: Any
    system: Any
    head: bytes
    blob: bytes
    checked: int

    def made_from(self, body: dict[str, Any], items: list[Any]) -> bool:
        """Whether ``body`` is still the one this was made from."""
        return (
            body is self.body
            and items is self.items
            and body.get("tools") is self.tools
            and body.get("system") is self.system
        )


class _Reference:
    """A transcript as compact JSON, its item count, and what it was for."""

    __slots__ = ("blob", "count", "head", "owner")

    def __init__(self, owner: object = None) -> None:
        self.owner = owner  # the check it passed, or the dialect of its results
        self.head = b""  # tools and system, as compact JSON
        self.blob = b""  # the transcript, as compact JSON
        self.count = 0  # its items

    def kept(self, blob: bytes, head: bytes | None = None) -> int:
        """How many leading items of the transcript serialised as ``blob`` are this
        reference's (all of them, or 0); ``head``: also compare the pieces before them."""
        old = self.blob
        end = len(old) - 1  # where the closing bracket was
        if not self.count or len(blob) <= end or blob[end] not in _BOUNDARY:
            return 0
        if head is not None and head != self.head:
            return 0
        return self.count if blob.startswith(memoryview(old)[:end]) else 0

    def become(self, head: bytes, blob: bytes, count: int) -> None:
        self.head, self.blob, self.count = head, blob, count


class _Memo:
    """One session's references: the last checked transcript, and the last one whose
    results are kept (with the results)."""

    __slots__ = ("checked", "points", "results", "sizes", "strip")

    def __init__(self) -> None:
        self.checked = _Reference()
        self.results = _Reference()
        self.strip = TranscriptStripper("text")
        self.sizes = ListSize()
        self.points = PrefixPointsMemo()

    def results_for(self, dialect: Dialect) -> _Reference:
        """The results' reference, started over for another dialect."""
        if self.results.owner != dialect.name:
            self.results = _Reference(dialect.name)
            self.strip = TranscriptStripper(dialect.transcript[1])
            self.sizes = ListSize()
            self.points = PrefixPointsMemo()
        return self.results

    @property
    def nbytes(self) -> int:
        done, checked = self.results, self.checked
        total = 2 * len(done.blob) + len(done.head)  # + the stripped copies, at most as much
        if checked.blob is not done.blob:
            total += len(checked.blob)
        return total


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

    def text(
        self, session: str | None, dialect: Dialect, body: dict[str, Any], check: Check
    ) -> TranscriptText | None:
        """The request's transcript as compact JSON, and how many of its leading items
        passed ``check`` on the session's previous request. None for a session the client
        did not name, a transcript that is not a list, or one orjson cannot write (too
        deep: the full checks refuse it)."""
        items = body.get(dialect.transcript[0])
        if session is None or type(items) is not list:
            return None
        tools, system = body.get("tools"), body.get("system")
        try:
            head = orjson.dumps([tools, system])
            blob = orjson.dumps(items)
        except orjson.JSONEncodeError:
            return None
        memo = self._memos.get(session)
        ref = memo.checked if memo is not None else None
        checked = ref.kept(blob) if ref is not None and ref.owner == check else 0
        return TranscriptText(session, check, body, items, tools, system, head, blob, checked)

    def passed(self, text: TranscriptText | None) -> None:
        """``text``'s request passed its checks: its transcript is the reference the
        session's next request is compared with."""
        if text is None:
            return
        memo = self._take(text.session) or _Memo()
        memo.checked = _Reference(text.check)
        memo.checked.become(text.head, text.blob, len(text.items))
        self._put(text.session, memo)

    def view(
        self,
        session: str | None,
        dialect: Dialect,
        body: dict[str, Any],
        text: TranscriptText | None = None,
    ) -> TranscriptView:
        """This turn's transcript results; ``session`` None: nothing is kept. ``text``:
        the request's serialisation, if made (used while ``body`` is what it was made
        from)."""
        key = dialect.transcript[0]
        messages = body.get(key)
        items = messages if isinstance(messages, list) else []
        memo = self._take(session) if items is messages else None
        if memo is None:
            memo = _Memo()
        ref = memo.results_for(dialect)
        kept = 0
        if session is not None:
            kept = self._kept(ref, body, items, text if text and text.session == session else None)
        stripped = memo.strip.strip(items, kept)
        clean = body if stripped is None else {**body, key: stripped}
        transcript = items if stripped is None else stripped
        known = (transcript, memo.sizes.size(transcript, kept)) if items is messages else None
        est = request_tokens(clean, known)
        points = memo.points.points(clean, kept if key == "messages" else 0)
        if session is not None and items is messages and (ref.blob or memo.checked.blob):
            self._put(session, memo)
        return TranscriptView(clean, est, points, kept)

    @staticmethod
    def _kept(
        ref: _Reference, body: dict[str, Any], items: list[Any], text: TranscriptText | None
    ) -> int:
        """The items ``ref`` vouches for, and ``items`` made its reference."""
        if text is not None and text.made_from(body, items):
            head, blob = text.head, text.blob
        else:
            try:
                head = orjson.dumps([body.get("tools"), body.get("system")])
                blob = orjson.dumps(items)
            except orjson.JSONEncodeError:  # not from a JSON body: nothing to compare with
                ref.become(b"", b"", 0)
                return 0
        kept = ref.kept(blob, head)
        ref.become(head, blob, len(items))
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
