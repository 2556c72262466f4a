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
comparisons of bytes. A client writing compact JSON usually sends its previous request's bytes
around the previous serialisation followed by the new items' (:meth:`_Reference.spliced`):
the serialisation is then cut from those bytes, and the bytes, their lead and tail shown once
per anchor to hold no key twice, may go upstream as they are
(:attr:`TranscriptText.vouches_for_raw`). Such a request is not even parsed whole: the
session keeps what its last checked request parsed to, and a body that is those bytes
followed by new items is those objects plus the new items, parsed alone
(:meth:`SessionTranscripts.parsed`, before anything else reads the body).

Memory: per session, the last checked transcript's serialisation and the bytes of its
request around it (and, once its place in them is known, what that request parsed to,
counted as three times those bytes), the last worked-out one's (the same bytes when they are
the same turn's) and the stripped copies of its messages that had an envelope, counted as
the serialisation once more. The least recently used sessions
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
from ..jsonkeys import keys_once

if TYPE_CHECKING:
    from ..dialects.base import Dialect

__all__ = ["MAX_BYTES", "MAX_SESSIONS", "SessionTranscripts", "TranscriptText", "TranscriptView"]

MAX_SESSIONS = 1_000
MAX_BYTES = 128 * 1024 * 1024
_BOUNDARY = (ord(","), ord("]"))  # what may follow a complete item in a JSON list
_COMMA, _CLOSE = _BOUNDARY
_PROBE = 64  # bytes of a transcript's serialisation looked for in its request's body
_PROBES = 4  # places tried

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
class _Anchor:
    """Where a transcript's serialisation sat in its request's bytes: ``lead`` the bytes
    before it, ``tail`` those after it, ``key`` the member it was. ``verified``: the bytes
    between ``lead`` and ``tail`` were shown to be the member's value, and ``lead`` and
    ``tail`` to hold no key twice (see the module docstring and :func:`_holds_value`)."""

    lead: bytes
    tail: bytes
    key: str
    verified: bool


def _anchor(raw: bytes, key: str, blob: bytes) -> _Anchor | None:
    """``blob``'s place in ``raw``, unverified; None when it is not there (a client that
    writes other JSON) or not among the first places its start is."""
    probe = blob[:_PROBE]
    at = raw.find(probe)
    for _ in range(_PROBES):
        if at < 0:
            return None
        if raw.startswith(blob, at):
            return _Anchor(raw[:at], raw[at + len(blob) :], key, False)
        at = raw.find(probe, at + 1)
    return None


def _holds_value(anchor: _Anchor, body: dict[str, Any]) -> bool:
    """Whether the bytes between ``anchor``'s lead and tail are the value of ``body``'s
    member ``anchor.key`` (``body`` parsed from lead + those bytes + tail, a non-empty
    list there): with ``[]`` in their place the bytes must parse to the body with that
    member ``[]``. Were they anything else (a member a later duplicate key overrides, a
    part of a string or of another value), the body would differ elsewhere, or keep its
    non-empty member.

    Lead and tail must also hold no key twice (``jsonkeys``): the bytes between are orjson's
    own serialisation, so a request spliced on a verified anchor holds every key once and
    means to any parser what it means to the proxy (``TranscriptText.vouches_for_raw``)."""
    rest_text = b"".join((anchor.lead, b"[]", anchor.tail))
    try:
        rest = orjson.loads(rest_text)
    except orjson.JSONDecodeError:
        return False
    return type(rest) is dict and rest == {**body, anchor.key: []} and keys_once(rest_text)


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
    anchor: _Anchor | None = None
    base: bytes | None = None  # the reference serialisation ``blob`` continues, if spliced

    @property
    def vouches_for_raw(self) -> bool:
        """Whether its request's bytes mean exactly its body to any JSON parser, so they may
        go upstream as they are: spliced on a verified anchor, they are lead and tail
        holding no key twice around orjson's own serialisation of the transcript (the
        session's previous one and the new items'). Anything else may repeat a key, which
        parsers read differently (``jsonkeys``)."""
        return self.base is not None

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

    __slots__ = ("anchor", "blob", "body", "count", "head", "owner")

    def __init__(self, owner: object = None) -> None:
        self.owner = owner  # the check it passed, or the dialect of its results
        self.head = b""  # tools and system, as compact JSON
        self.blob = b""  # the transcript, as compact JSON
        self.count = 0  # its items
        self.anchor: _Anchor | None = None  # where blob was in its request's bytes
        # what its request's bytes parsed to (kept with an anchor: ``reparsed``)
        self.body: dict[str, Any] | None = None

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

    def spliced(
        self, raw: bytes, body: dict[str, Any], key: str, items: list[Any]
    ) -> tuple[bytes, _Anchor] | None:
        """The serialisation of ``items`` (``body[key]``, ``body`` parsed from ``raw``) when
        ``raw`` is this reference's request's bytes around its transcript's serialisation
        followed by the new items' (see the module docstring), and the anchor it has."""
        anchor, old, count = self.anchor, self.blob, self.count
        if anchor is None or anchor.key != key or len(items) < count or not count:
            return None
        lead, tail = anchor.lead, anchor.tail
        start, stop = len(lead), len(raw) - len(tail)  # where the transcript is, if there
        end = start + len(old) - 1  # where old's closing bracket is, if there
        if stop <= end or not (raw.startswith(lead) and raw.endswith(tail)):
            return None
        if not raw.startswith(memoryview(old)[:-1], start):
            return None
        if len(items) == count:
            blob = old if stop == end + 1 and raw[end] == _CLOSE else None
        else:
            try:
                new = orjson.dumps(items[count:])
            except orjson.JSONEncodeError:
                return None
            fits = stop - end == len(new) and raw[end] == _COMMA
            blob = raw[start:stop] if fits and raw.startswith(new[1:], end + 1) else None
        if blob is None:
            return None
        if not anchor.verified:
            if not _holds_value(anchor, body):
                self.anchor = self.body = None  # the next requests take the full path
                return None
            anchor = _Anchor(lead, tail, key, True)
        return blob, anchor

    def reparsed(self, raw: bytes) -> dict[str, Any] | None:
        """What ``raw`` parses to, when it is this reference's request's bytes around its
        transcript's serialisation, on a verified anchor, followed by the new items' (what
        :meth:`spliced` takes): only the new items are parsed; the earlier items and the
        other members are the objects this reference's request parsed to (its lead and tail
        are the same bytes, holding no key twice, around the same value). Shared, not
        copied: nothing in a turn changes the body it parsed (every change is a copy)."""
        anchor, old, body = self.anchor, self.blob, self.body
        if anchor is None or not anchor.verified or body is None:
            return None
        lead, tail = anchor.lead, anchor.tail
        start, stop = len(lead), len(raw) - len(tail)
        end = start + len(old) - 1  # where old's closing bracket is, if there
        if stop <= end or not (raw.startswith(lead) and raw.endswith(tail)):
            return None
        if not raw.startswith(memoryview(old)[:-1], start):
            return None
        items = body[anchor.key]
        if stop == end + 1 and raw[end] == _CLOSE:
            return {**body, anchor.key: list(items)}
        if raw[end] != _COMMA:
            return None
        try:
            new = orjson.loads(b"[" + raw[end + 1 : stop])
        except orjson.JSONDecodeError:
            return None
        try:
            written = orjson.dumps(new)  # the new items must be orjson's bytes, as in spliced
        except orjson.JSONEncodeError:  # nested past orjson's limit: the full path refuses it
            return None
        if len(written) != stop - end or not raw.startswith(memoryview(written)[1:], end + 1):
            return None
        return {**body, anchor.key: [*items, *new]}


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
        anchor = checked.anchor
        if anchor is not None:
            around = len(anchor.lead) + len(anchor.tail)
            total += around
            if checked.body is not None:  # parsed objects: about three times their JSON
                total += 3 * (len(checked.blob) + around)
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
        self,
        session: str | None,
        dialect: Dialect,
        body: dict[str, Any],
        check: Check,
        raw: bytes | None = None,
    ) -> TranscriptText | None:
        """The request's transcript as compact JSON, and how many of its leading items
        passed ``check`` on the session's previous request. None for a session the client
        did not name, a transcript that is not a list, or one orjson cannot write (too
        deep: the full checks refuse it). ``raw``: the bytes ``body`` was parsed from (the
        serialisation is then taken from them when they hold it, see the module
        docstring)."""
        key = dialect.transcript[0]
        items = body.get(key)
        if session is None or type(items) is not list:
            return None
        tools, system = body.get("tools"), body.get("system")
        memo = self._memos.get(session)
        ref = memo.checked if memo is not None else None
        spliced = None
        if memo is not None and ref is not None and raw:
            held = memo.nbytes
            spliced = ref.spliced(raw, body, key, items)
            self._bytes += memo.nbytes - held  # an anchor refused on its check is dropped
        if ref is not None and spliced is not None:
            # the same members around the transcript: the same tools and system
            blob, anchor = spliced
            checked = ref.count if ref.owner == check else 0
            return TranscriptText(
                session,
                check,
                body,
                items,
                tools,
                system,
                ref.head,
                blob,
                checked,
                anchor,
                ref.blob,
            )
        try:
            head = orjson.dumps([tools, system])
            blob = orjson.dumps(items)
        except orjson.JSONEncodeError:
            return None
        checked = ref.kept(blob) if ref is not None and ref.owner == check else 0
        found = _anchor(raw, key, blob) if raw and items else None
        return TranscriptText(
            session, check, body, items, tools, system, head, blob, checked, found
        )

    def passed(self, text: TranscriptText | None) -> None:
        """``text``'s request passed its checks: its transcript is the reference the
        session's next request is compared with."""
        if text is None:
            return
        memo = self._take(text.session) or _Memo()
        memo.checked = _Reference(text.check)
        memo.checked.become(text.head, text.blob, len(text.items))
        memo.checked.anchor = text.anchor
        if text.anchor is not None:  # the next request may extend these bytes
            memo.checked.body = text.body
        self._put(text.session, memo)

    def parsed(self, session: str, raw: bytes) -> dict[str, Any] | None:
        """``orjson.loads(raw)``, parsed from its new items only when ``raw`` extends the
        bytes of the session's last request that passed its checks (``_Reference.reparsed``);
        None when it does not (the caller parses it)."""
        memo = self._memos.get(session)
        return memo.checked.reparsed(raw) if memo is not None else None

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
            if text.base is not None and text.base is ref.blob and head == ref.head:
                # spliced onto this very reference: it vouches for its items (no comparison)
                kept = ref.count
                ref.become(head, blob, len(items))
                return kept
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
