"""The envelope stripper: a text without the proxy's protocol. Pure, no I/O, no dialect.

The machine every dialect's reply, stream and transcript stripping is built on (each
dialect module says where its format keeps text: ``Dialect.strip_reply``,
``stream_stripper``, ``strip_request``).

With ``reply_envelope: strip`` the client sees the reply minus every envelope the
extractor (:mod:`skillstate.engine.patch`) would accept: fenced ```json / untagged ``` blocks whose
content is an envelope object, and unfenced envelope objects (the bare object under
constrained decoding, or a ``{`` at the start of a line). The fence and JSON rules are
patch.py's own (the same fence-run, info-tag and envelope-shape definitions), applied line
by line so that a stream can be stripped as it arrives.

* :class:`EnvelopeStripper` is incremental: :meth:`~EnvelopeStripper.feed` a text delta,
  get back the text that is safe to show; :meth:`~EnvelopeStripper.flush` at the end. It
  holds back only what might still turn out to be an envelope: a line that might open a
  fence (until the block is decided), a ``{`` that might start an envelope object (until
  the object ends or cannot be JSON), and trailing whitespace (which goes with an
  envelope that follows it). The output does not depend on how the reply was chunked.
* :func:`strip_envelope` is the same machine fed the whole text at once.

Whitespace right before a removed envelope goes with it, and so does whitespace at the
start of the output after a removed envelope. A reply that is nothing but envelopes
becomes the last envelope's ``action`` as its text (documented behaviour: under
constrained decoding, or when a model answers with the bare object), so the client never
gets an empty message where the model said something; if that envelope has no action, the
reply is left as it was. A reply that also calls tools gets no fallback: the model never
said its action to the user, so the text is left empty (each dialect then drops it: ``null``
content in chat completions, no text block in Messages, no message item in Responses).

Cost: every character is looked at a bounded number of times (an unfenced ``{`` that turns
out not to be JSON is re-read once); per-feed work is O(delta) except for the one-off
parse of a candidate when it is decided.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from .patch import (
    _BLANK,
    _FENCE_RUN,
    _INFO_TAG,
    _JSON_TAGS,
    Envelope,
    _envelope_problem,
    _loads_prefix,
)

__all__ = [
    "NOTHING",
    "EnvelopeStripper",
    "Known",
    "Stripped",
    "TranscriptStripper",
    "strip_content",
    "strip_envelope",
    "strip_request_transcript",
    "strip_texts",
    "strip_transcript",
]

_FENCE_CHARS = "`~"
_LINE_BLANKS = frozenset(" \t\r\f\v")  # patch._BLANK: what may precede a fence on its line
_JSON_WS = frozenset(" \t\r\n")
# A fence opener glued to the end of a prose line ("Done. ```json"): not a fence to
# markdown or to patch.py, but when an envelope object follows on the next line it is the
# fence the model meant, and it goes with the envelope, as its closing line does. Read
# backwards from the line's end, each part (blanks, tag, blanks, run) at most _GLUED_MAX
# characters: the check is O(1) however long the line, and a stream is held back only
# while its line ends in what may still become one. (A line that starts with a fence run
# opens a block: it never reaches _prose.)
_GLUED_MAX = 16
_TAG_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.+#-")
_TAB_BLANKS = frozenset(" \t")
# Characters that may appear outside strings in a JSON object.
_JSON_BARE = frozenset("{}[],:0123456789-+.eEtrufalsn \t\r\n")

# Machine states.
_LINE_START = 0  # outside blocks, at a line start (leading whitespace in _ws)
_PROSE = 1  # outside blocks, in a line known not to open anything
_OBJECT = 2  # in an unfenced "{" that may be an envelope
_OPENER = 3  # on a fence line that opens a block, waiting for the line's end
_BLOCK = 4  # inside a fenced block


@dataclass(frozen=True)
class Stripped:
    """Result of :func:`strip_envelope`.

    ``text``: the reply without envelopes (or the action, see the module docstring).
    ``envelope``: the last envelope removed (None if none was). ``removed_chars``: the
    characters of the removed envelope spans (fences included, surrounding whitespace not),
    for estimating the envelope's share of the output. ``sole``: the envelope was the
    reply's only candidate (one ```json block, no other block or line-start ``{`` that
    might be one), so it is the one :func:`~skillstate.engine.patch.extract_envelope` finds
    (reasoning aside): the verdict then need not read the reply again.
    """

    text: str
    envelope: Envelope | None
    removed_chars: int
    sole: bool = False


def _as_envelope(value: Any, source: str) -> Envelope | None:
    """The envelope in a parsed JSON value, by patch.py's rule, or None. ``source``: the
    text ``value`` was parsed from (``Envelope.source``)."""
    if _envelope_problem(value, "") is not None:
        return None
    return Envelope(value["state_patch"], value.get("action"), None, source)


def _back_over(text: str, end: int, chars: frozenset[str] | str) -> int | None:
    """Where the run of ``chars`` that ends at ``end`` starts; None past _GLUED_MAX."""
    start = end
    while start > 0 and text[start - 1] in chars:
        start -= 1
        if end - start > _GLUED_MAX:
            return None
    return start


def _fence_tail(text: str) -> tuple[int, int, str] | None:
    """(its start, its fence run's length, its tag) when ``text`` ends with a fence run of
    one character, blanks, an info tag and blanks (each part short); else None."""
    tag_end = _back_over(text, len(text), _TAB_BLANKS)
    tag_start = None if tag_end is None else _back_over(text, tag_end, _TAG_CHARS)
    run_end = None if tag_start is None else _back_over(text, tag_start, _TAB_BLANKS)
    if run_end is None or tag_end is None or tag_start is None or run_end == 0:
        return None
    char = text[run_end - 1]
    start = _back_over(text, run_end, char) if char in _FENCE_CHARS else None
    if start is None:
        return None
    return start, run_end - start, text[tag_start:tag_end]


def _fence_close(
    line: str, char: str, length: int, start: int, line_start: bool
) -> tuple[bool, int] | None:
    """Whether a complete line (no newline) closes an open block, as patch._scan_fences
    decides it: (at_end, run start) of the closing run, or None.

    A run of the block's fence character, at least as long as the opener and not before
    ``start``, closes it when it ends the line (at_end) or starts it (then the line opens a
    new block). ``line_start`` False: the line's first run is not at a line start (the
    opener's own line)."""
    first = True
    for m in _FENCE_RUN.finditer(line):
        s, e = m.span()
        at_start = first and line_start and _BLANK.match(line, 0, s).end() == s  # type: ignore[union-attr]
        first = False
        at_end = _BLANK.match(line, e).end() == len(line)  # type: ignore[union-attr]
        if not (at_start or at_end):
            continue
        if line[s] != char or e - s < length or s < start:
            continue
        return at_end, s
    return None


class EnvelopeStripper:
    """Incremental envelope stripper; see the module docstring.

    ``feed(delta)`` returns the text that can go to the client now; ``flush()`` returns the
    rest, once, at the end. ``envelope`` / ``removed_chars`` describe what was removed.
    """

    def __init__(self) -> None:
        self.envelope: Envelope | None = None
        self.removed_chars = 0
        # Candidates read (blocks decided, line-start "{" scanned), and whether the only one
        # so far is a ```json block that held an envelope (see Stripped.sole).
        self.candidates = 0
        self.sole_json_envelope = False
        self._todo = ""  # received, not yet read by the machine
        self._state = _LINE_START
        self._ws = ""  # whitespace not yet shown (it goes with an envelope that follows)
        self._line_blanks = ""  # at _LINE_START: the whitespace since the line's start
        self._fresh = True  # nothing but whitespace so far: a "{" is the bare object
        self._cand = ""  # held candidate text (an object, or a block span so far)
        self._out: list[str] = []
        self._started = False  # some non-whitespace text went out
        self._raw: list[str] | None = []  # the whole reply, kept until something went out
        # _OBJECT: the scanner's state.
        self._depth = 0
        self._in_str = self._esc = self._need_key = False
        # _BLOCK: the open block.
        self._fence_char = ""
        self._fence_len = 0
        self._tag = ""
        self._content_at = 0  # where the content starts in _cand
        self._held = True  # holding a possible envelope (else passing a decided block through)
        self._line = ""  # passing: the part of the current line already shown
        # An envelope removed with the line break before it, after text went out: what
        # follows it on its line must not join the shown text's last line.
        self._break = False
        self._glued = ""  # a glued opener held (with the blanks before it), see _GLUED_OPENER
        self._glued_fence = ("", 0)
        self._closer: tuple[str, int] | None = None  # the glued block's closing line, to drop

    # -- public ------------------------------------------------------------------------------

    def feed(self, delta: str) -> str:
        """Read a text delta; return what is safe to show now (may be "")."""
        if self._raw is not None:
            self._raw.append(delta)
        self._todo += delta
        self._run(final=False)
        return self._take()

    def flush(self, fallback: bool = True) -> str:
        """The held-back rest, at the end of the reply. ``fallback``: a reply that was only
        envelopes becomes the last one's action (see the module docstring)."""
        self._run(final=True)
        self._show_glued()
        self._emit(self._ws)
        self._ws = ""
        shown = self.fallback_text() if fallback else ""
        if shown:
            self._out = [shown]
            self._started = True
        return self._take()

    def fallback_text(self) -> str:
        """What a reply that was only envelopes shows (the last one's action, else the reply
        as it was); "" when some text went out or there was no envelope. Read it after
        ``flush(fallback=False)`` to decide later (a stream that has yet to say whether a
        tool call follows)."""
        if self._started or self.envelope is None:
            return ""
        return self.envelope.action or "".join(self._raw or ())

    # -- output ------------------------------------------------------------------------------

    def _take(self) -> str:
        out = "".join(self._out)
        self._out.clear()
        return out

    def _emit(self, text: str) -> None:
        if not text:
            return
        if not self._started:
            if self.envelope is not None:
                text = text.lstrip()
                if not text:
                    return
            elif text.isspace():
                self._out.append(text)  # whitespace only: not yet "started"
                return
            self._started = True
            self._raw = None
        self._out.append(text)

    def _show_glued(self) -> None:
        """A held glued opener is prose after all (no envelope follows it)."""
        if self._glued:
            self._emit(self._glued)
            self._glued = ""

    def _decided(self, span: str, envelope: Envelope | None) -> None:
        """A candidate is decided: drop it with the whitespace before it, or show both."""
        if envelope is not None and self._glued:
            # The fence glued before it goes with it, and so will its closing line.
            self.removed_chars += len(self._glued.strip())
            self._glued, self._closer = "", self._glued_fence
        self._show_glued()
        if envelope is not None:
            self.envelope = envelope
            self.removed_chars += len(span)
            # Nothing shown yet: what follows starts the output, where a "{" is a bare object.
            self._fresh = not self._started
            self._break = self._break or (self._started and "\n" in self._ws)
        else:
            self._emit(self._ws + span)
        self._ws = ""
        self._cand = ""

    # -- the machine -------------------------------------------------------------------------

    def _run(self, final: bool) -> None:
        i = 0
        steps = (self._line_start, self._prose, self._object, self._opener, self._block)
        while True:
            if i >= len(self._todo) and not (final and self._state in (_OBJECT, _OPENER, _BLOCK)):
                break
            j = steps[self._state](i, final)
            if j < 0:  # needs more input
                break
            i = j
        self._todo = self._todo[i:]

    def _line_start(self, i: int, final: bool) -> int:
        todo = self._todo
        n = len(todo)
        j = i
        while j < n and todo[j].isspace():
            j += 1
        if j > i:
            ws = todo[i:j]
            self._ws += ws
            nl = ws.rfind("\n")
            self._line_blanks = ws[nl + 1 :] if nl >= 0 else self._line_blanks + ws
            return j  # read on from the first non-whitespace character
        if self._break:
            self._break = False
            if "\n" not in self._ws:
                # "``\n{env}``{env}" without this became "````{env}": the two lines joined
                # into a fenced envelope the client would see.
                self._ws = "\n" + self._ws
        c = todo[j]
        if self._closer is not None:
            end = self._closing_line(j, final)
            if end < 0:
                return -1
            if end > j:
                return end
        if c == "{" and (self._fresh or not self._line_blanks):
            self.candidates += 1
            self._fresh = False
            self._state = _OBJECT
            self._cand = "{"
            self._depth, self._in_str, self._esc, self._need_key = 1, False, False, True
            return j + 1
        self._show_glued()
        if c in _FENCE_CHARS and all(b in _LINE_BLANKS for b in self._line_blanks):
            k = j
            while k < n and todo[k] == c:
                k += 1
            if k - j >= 3:
                self._fresh = False
                self._state = _OPENER
                return j
            if k == n and not final:
                return -1  # "``" so far: may still become a fence
        self._fresh = False
        self._state = _PROSE
        return j

    def _closing_line(self, j: int, final: bool) -> int:
        """At a line's first non-blank character after an envelope a glued opener went
        with: the end of that line when it is the block's closing fence (dropped, with the
        whitespace since the envelope), ``j`` when it is not, -1 until the line is whole."""
        todo = self._todo
        nl = todo.find("\n", j)
        if nl < 0 and not final:
            return -1
        end = len(todo) if nl < 0 else nl
        char, length = self._closer or ("", 0)
        self._closer = None
        line = todo[j:end].rstrip(" \t\r\f\v")
        if len(line) >= length and line == char * len(line):
            self.removed_chars += len(line)
            self._ws = ""
            return end
        return j

    def _prose(self, i: int, final: bool) -> int:
        todo = self._todo
        nl = todo.find("\n", i)
        end = len(todo) if nl < 0 else nl
        segment = todo[i:end]
        if nl < 0 and not final:
            tail = _fence_tail(segment)
            if tail is not None and any(t.startswith(tail[2].lower()) for t in _JSON_TAGS):
                # It may end as a glued opener: held until the line's end.
                if tail[0] == 0:
                    return -1
                end, segment = i + tail[0], segment[: tail[0]]
        elif nl >= 0 and self._glued_at_end(segment):
            self._line_blanks = ""
            self._state = _LINE_START
            return nl + 1
        body = segment.rstrip()
        if body:
            self._emit(self._ws + body)
            self._ws = segment[len(body) :]
        else:
            self._ws += segment
        if nl < 0 or end < nl:
            return end
        self._ws += "\n"
        self._line_blanks = ""
        self._state = _LINE_START
        return nl + 1

    def _glued_at_end(self, segment: str) -> bool:
        """Whether the rest of a prose line ends with a glued JSON or untagged opener:
        then the text before it is shown and the opener held, until the next line says
        whether an envelope follows."""
        tail = _fence_tail(segment)
        if tail is None or tail[1] < 3 or tail[2].lower() not in (*_JSON_TAGS, ""):
            return False
        start, run, _ = tail
        head = segment[:start]
        body = head.rstrip()
        if body:
            self._emit(self._ws + body)
            self._ws = ""
        self._glued = self._ws + head[len(body) :] + segment[start:]
        self._glued_fence = (segment[start], run)
        self._ws = "\n"
        return True

    def _object(self, i: int, final: bool) -> int:
        """Scan an unfenced "{" until its object ends, or it cannot be JSON."""
        todo = self._todo
        depth, in_str, esc, need_key = self._depth, self._in_str, self._esc, self._need_key
        k = i
        n = len(todo)
        ok = True
        while k < n:
            ch = todo[k]
            if in_str:
                if esc:
                    esc = False
                elif ch == "\\":
                    esc = True
                elif ch == '"':
                    in_str = False
                elif ch < " ":
                    ok = False
                    break
            elif need_key and ch in _JSON_WS:
                pass
            elif need_key and ch not in '"}':
                ok = False
                break
            else:
                need_key = False
                if ch == '"':
                    in_str = True
                elif ch in "{[":
                    depth += 1
                elif ch in "}]":
                    depth -= 1
                    if depth == 0:
                        k += 1
                        break
                elif ch not in _JSON_BARE:
                    ok = False
                    break
            k += 1
        self._cand += todo[i:k]
        if ok and depth > 0 and not final:
            self._depth, self._in_str, self._esc, self._need_key = depth, in_str, esc, need_key
            return k
        if ok and depth == 0:
            try:
                value: Any = orjson.loads(self._cand)
            except orjson.JSONDecodeError:
                pass
            else:
                envelope = _as_envelope(value, self._cand)
                self._decided(self._cand, envelope)
                # A removed envelope leaves nothing before what follows it on its line, so
                # that text is read as a line start: a fence or "{" there is judged where
                # the client will see it (read as prose, "``\n{env}```{env}" became
                # "`````{env}", an envelope again).
                self._state = _LINE_START if self._fresh or envelope is not None else _PROSE
                self._line_blanks = ""
                return k
        # Not JSON after all: the "{" is prose, and what followed it is read again.
        rest = self._cand[1:]
        self._cand = ""
        self._show_glued()
        self._emit(self._ws + "{")
        self._ws = ""
        self._state = _PROSE
        self._todo = rest + todo[k:]
        return 0

    def _opener(self, i: int, final: bool) -> int:
        """A line opening a fenced block (from its fence run; blanks before it are in _ws)."""
        todo = self._todo
        nl = todo.find("\n", i)
        if nl < 0 and not final:
            return -1
        end = len(todo) if nl < 0 else nl
        line = todo[i:end]
        run = _FENCE_RUN.match(line)
        assert run is not None  # _line_start saw three fence characters
        info = _INFO_TAG.match(line, run.end())
        assert info is not None  # the pattern matches the empty string
        self._fence_char, self._fence_len = line[0], run.end()
        self._tag = info.group(1).lower()
        after = info.end()
        self._cand = line
        self._line = ""
        if after < len(line) and line[after] == "{":
            self._content_at = after  # ```json {"state_patch": ...}
            closed = _fence_close(line, self._fence_char, self._fence_len, after, False)
            if closed is not None:  # ... ``` on the same line
                self._held = True
                self._state = _PROSE
                self._decide_block(line[after : closed[1]])
                return end
        else:
            self._content_at = len(line) + 1
        self._held = self._tag in _JSON_TAGS or self._tag == ""
        if not self._held:
            self._emit(self._ws + line)
            self._ws = ""
            self._cand = ""
        self._state = _BLOCK
        if nl < 0:  # the reply ends on the opening line: an unterminated block
            if self._held:
                self._decide_block(line[after:] if self._content_at == after else "")
            self._state = _PROSE
            return end
        if self._held:
            self._cand += "\n"
        else:
            self._emit("\n")
        return nl + 1

    def _block(self, i: int, final: bool) -> int:
        todo = self._todo
        nl = todo.find("\n", i)
        if nl < 0 and not final:
            if not self._held:  # show a content line early unless it may be a fence line
                partial = todo[i:]
                head = (self._line + partial).lstrip(" \t\r\f\v")
                if head and head[0] not in _FENCE_CHARS:
                    self._emit(partial)
                    self._line += partial
                    return len(todo)
            return -1
        end = len(todo) if nl < 0 else nl
        part = todo[i:end]
        line = self._line + part
        self._line = ""
        closed = _fence_close(line, self._fence_char, self._fence_len, 0, True)
        if closed is None:
            if self._held:
                self._cand += part if nl < 0 else part + "\n"
                if self._tag == "" and not self._plain_may_be_envelope():
                    self._held = False
                    self._emit(self._ws + self._cand)
                    self._ws = ""
                    self._cand = ""
            else:
                self._emit(part if nl < 0 else part + "\n")
            if nl < 0:  # the reply ends inside the block: it runs to the end
                if self._held:
                    self._decide_block(self._cand[self._content_at :])
                self._state = _PROSE
                return end
            return nl + 1
        at_end, s = closed
        if at_end:
            if self._held:
                content = (self._cand + line[:s])[self._content_at :]
                self._cand += line
                self._decide_block(content)
            else:
                self._emit(part)
            self._state = _PROSE  # the newline (if any) is read next, outside the block
            return end
        # The line closes the block and opens a new one (its blanks go with the new one).
        if self._held:
            self._decide_block(self._cand[self._content_at :] + line[:s])
        self._ws = line[:s]
        self._state = _OPENER
        return i + s

    def _plain_may_be_envelope(self) -> bool:
        """An untagged block is a candidate only if its content starts with "{"."""
        content = self._cand[self._content_at :].lstrip()
        return not content or content[0] == "{"

    def _decide_block(self, content: str) -> None:
        envelope = None
        stripped = content.lstrip()
        json_tag = self._tag in _JSON_TAGS
        if stripped and (json_tag or (self._tag == "" and stripped[0] == "{")):
            value, _, error = _loads_prefix(content)
            if error is None:
                envelope = _as_envelope(value, content)
        self.candidates += 1
        self.sole_json_envelope = self.candidates == 1 and json_tag and envelope is not None
        self._decided(self._cand, envelope)


def strip_envelope(text: str, fallback: bool = True) -> Stripped:
    """``text`` without its envelopes (the whole text through :class:`EnvelopeStripper`)."""
    whole = _one_json_block(text, fallback)
    return whole if whole is not None else _strip_by_machine(text, fallback)


_BLOCK_OPENER, _BLOCK_CLOSER = "```json\n", "\n```"


def _one_json_block(text: str, fallback: bool) -> Stripped | None:
    """``_strip_by_machine(text, fallback)`` for the usual reply, one ```json block holding
    an envelope and nothing else (what the contract asks for), read without the machine
    (a few µs instead of ~20-40 a turn); None for any other text. With no backtick inside
    the block, no line of it closes the block (a ``~`` run cannot close a backtick fence),
    so the machine reads its content, with the line break before the closing fence, as
    this JSON; ``tests/turn/test_hotpath_equivalence.py`` checks the two agree."""
    if not text.startswith(_BLOCK_OPENER) or not text.endswith(_BLOCK_CLOSER):
        return None
    content = text[8:-3]
    if "`" in content:
        return None
    try:
        envelope = _as_envelope(orjson.loads(content), content)
    except orjson.JSONDecodeError:
        return None
    if envelope is None:
        return None
    # The reply is all envelope: its action shows, else the reply as it was (the fallback).
    shown = (envelope.action or text) if fallback else ""
    return Stripped(shown, envelope, len(text), True)


def _strip_by_machine(text: str, fallback: bool = True) -> Stripped:
    """``strip_envelope`` by its definition: the whole text through the machine."""
    stripper = EnvelopeStripper()
    out = stripper.feed(text) + stripper.flush(fallback)
    sole = stripper.sole_json_envelope and stripper.candidates == 1
    return Stripped(out, stripper.envelope, stripper.removed_chars, sole)


def strip_texts(texts: Sequence[str], fallback: bool = True) -> tuple[list[str], Stripped]:
    """Strip the text parts of one message (e.g. an Anthropic reply's text blocks) each on
    its own; the action fallback applies to the message as a whole: when every part is
    blank afterwards, the part that held the last envelope becomes its action. Without
    ``fallback`` (a reply that also calls tools: the action was never said to the user) the
    parts stay blank.

    Returns the new parts and a summary (joined text, last envelope, removed characters).
    """
    results = [strip_envelope(t, fallback=False) for t in texts]
    parts = [r.text for r in results]
    last = next((k for k in range(len(results) - 1, -1, -1) if results[k].envelope), None)
    if fallback and last is not None and all(not p.strip() for p in parts):
        action = results[last].envelope.action  # type: ignore[union-attr]
        parts = list(texts) if not action else [*parts[:last], action, *parts[last + 1 :]]
    envelope = results[last].envelope if last is not None else None
    return parts, Stripped("".join(parts), envelope, sum(r.removed_chars for r in results))


NOTHING = Stripped("", None, 0)  # what stripping a text without envelopes removed


# A text and its ``strip_envelope(text)``: the pipeline strips a reply's text for the
# ledger first, and the same string again in the client's copy is not stripped twice
# (matched by identity: strings are immutable and the result depends on the text alone).
Known = tuple[str, Stripped] | None


def strip_content(
    content: Any, text_type: str = "text", known: Known = None, fallback: bool = True
) -> tuple[Any, Stripped]:
    """A message's content without envelopes: a string, or a list of parts / blocks whose
    parts of type ``text_type`` are stripped (others untouched; a part left empty is
    dropped, as Anthropic refuses empty text blocks). The same object if nothing changed.
    ``known``: a text already through ``strip_envelope`` and its result (used if it is
    this very string). ``fallback``: see :func:`strip_texts` (False for a message that
    also calls tools)."""
    if isinstance(content, str):
        if "{" not in content:  # every envelope is a JSON object: nothing to strip (fast path)
            return content, NOTHING
        if known is not None and known[0] is content and fallback:
            result = known[1]  # ``known`` was stripped with the fallback
        else:
            result = strip_envelope(content, fallback)
        return (content if result.envelope is None else result.text), result
    if not isinstance(content, list):
        return content, NOTHING
    at = [
        k
        for k, part in enumerate(content)
        if isinstance(part, dict)
        and part.get("type") == text_type
        and isinstance(part.get("text"), str)
    ]
    parts, summary = strip_texts([content[k]["text"] for k in at], fallback)
    if summary.envelope is None:
        return content, summary
    out = list(content)
    emptied = set()
    for k, text in zip(at, parts, strict=True):
        if text:
            out[k] = {**content[k], "text": text}
        elif content[k]["text"]:
            emptied.add(k)
    return [part for k, part in enumerate(out) if k not in emptied], summary


def _clean_message(msg: Any, text_type: str) -> Any:
    """One transcript message without envelopes: ``msg`` itself unless it is an assistant
    message whose content had one."""
    if isinstance(msg, dict) and msg.get("role") == "assistant":
        content = msg.get("content")
        new, _ = strip_content(content, text_type)
        if new is not content:
            return {**msg, "content": new}
    return msg


def _clean_assistants(messages: Sequence[Any], text_type: str) -> list[Any] | None:
    """``messages`` with envelopes stripped from its assistant messages, or None when none
    had one (no copy made)."""
    out = None
    for k, msg in enumerate(messages):
        new = _clean_message(msg, text_type)
        if new is not msg:
            if out is None:
                out = list(messages)
            out[k] = new
    return out


class TranscriptStripper:
    """:func:`strip_transcript` of one session's transcript, turn after turn, stripping
    only the messages that are new since the last call.

    A message's result depends on that message alone, so when the caller vouches that the
    first ``kept`` messages are the ones the last call ended with (the same JSON: see
    :mod:`skillstate.sessions.transcripts`), their results are reused. Kept between calls:
    the stripped copies of the messages that had an envelope, by index.
    """

    __slots__ = ("_count", "_stripped", "_text_type")

    def __init__(self, text_type: str = "text") -> None:
        self._text_type = text_type
        self._count = 0  # messages in the last call's transcript
        self._stripped: dict[int, Any] = {}  # index -> the message without its envelopes

    def strip(self, messages: Sequence[Any], kept: int) -> list[Any] | None:
        """``messages`` without envelopes, as ``strip_transcript`` gives them, or None when
        no message had one. ``kept``: 0, or the number of messages of the last call, all of
        them equal to the first ones of ``messages``."""
        if kept not in (0, self._count):
            raise ValueError(f"kept must be 0 or {self._count}, not {kept}")
        stripped = self._stripped if kept else {}
        for k in range(kept, len(messages)):
            msg = messages[k]
            new = _clean_message(msg, self._text_type)
            if new is not msg:
                stripped[k] = new
        self._stripped, self._count = stripped, len(messages)
        if not stripped:
            return None
        out = list(messages)
        for k, new in stripped.items():
            out[k] = new
        return out


def strip_transcript(messages: Sequence[Any], text_type: str = "text") -> list[Any]:
    """A client transcript without the envelopes the proxy made the model write.

    Only assistant messages (``role: assistant``) change, their content as
    :func:`strip_content` strips it: the shape of OpenAI chat completions and Anthropic
    Messages (``text_type`` ``"text"``) and of a Responses API ``input`` list's message items
    (``"output_text"``); tool calls and other items are untouched. Messages without an
    envelope are the same objects; nothing is mutated. For the honest baseline: what the
    client's transcript would hold without the proxy.
    """
    out = _clean_assistants(messages, text_type)
    return list(messages) if out is None else out


def strip_request_transcript(
    body: dict[str, Any], key: str, text_type: str = "text"
) -> dict[str, Any]:
    """A request ``body`` whose transcript (the list under ``key``) is without envelopes, as
    :func:`strip_transcript` strips it; ``body`` itself when it had none (or no list)."""
    messages = body.get(key)
    if not isinstance(messages, list):
        return body
    out = _clean_assistants(messages, text_type)
    return body if out is None else {**body, key: out}
