"""Tool-call arguments: OpenAI JSON text -> an Anthropic ``input`` object, incrementally
(see the package doc for the repair rules)."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from ...jsondepth import MAX_JSON_DEPTH, JSONTooDeep, nesting_exceeds
from .common import (
    JSON,
    _clean,
    _dumps,
    _joined,
)

# parser states
_START, _OBJ_FIRST, _OBJ_KEY, _COLON, _VALUE, _ARR_FIRST, _AFTER = range(7)
_STR, _ESC, _UHEX, _LOW1, _LOW2, _NUM, _LIT, _DONE = range(7, 15)
# number sub-states
_N_MINUS, _N_ZERO, _N_INT, _N_DOT, _N_FRAC, _N_E, _N_ESIGN, _N_EXP = range(8)
_N_TERMINAL = frozenset({_N_ZERO, _N_INT, _N_FRAC, _N_EXP})
_WS = frozenset(" \t\n\r")
_DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = frozenset('"\\/bfnrt')
_LITERALS = {"t": "true", "f": "false", "n": "null"}
_CTRL_ESCAPES = {0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r"}
# A run of string content that can be copied as is: plain characters, complete simple and
# \u escapes, complete surrogate pairs. Anything else (an escape cut by a fragment boundary, a
# raw control character, a lone surrogate) goes through the character-by-character path.
_STR_RUN = re.compile(
    r'(?:[^"\\\x00-\x1f\ud800-\udfff]+|\\["\\/bfnrt]'
    r"|\\u(?![dD][89a-fA-F])[0-9a-fA-F]{4}"
    r"|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})+"
)


class ToolArgsStream:
    """Incrementally turns an OpenAI tool call's ``arguments`` text into the JSON text of an
    Anthropic ``input`` object.

    ``push(fragment)`` returns the text that may be sent now (as ``input_json_delta``);
    ``finish()`` returns the closing text. At every point the concatenation of what was
    returned is a prefix that a partial-JSON parser (the anthropic SDK uses jiter's partial
    mode) accepts, and after ``finish()`` it is one complete JSON object. The text returned
    depends only on the characters seen, never on how they were split into fragments.

    Whitespace outside strings is dropped; raw control characters inside strings are
    escaped; commas, unfinished numbers/literals/escapes and the final ``}`` are held back
    until they are known to be good, so a repair (see :func:`parse_tool_arguments`) never
    has to take anything back.
    """

    def __init__(self) -> None:
        self._raw: list[str] = []
        self._out: list[str] = []
        self._stack: list[str] = []  # closers of the open containers, outermost first
        self._state = _START
        self._pending = ""  # held back: an escape, or comma + unfinished number/literal
        self._comma = False  # a comma is held back
        self._is_key = False
        self._lit = ""
        self._lit_pos = 0
        self._num = _N_INT
        self._hex = ""
        self._high = False
        self._top_items = False
        self._broken = False
        self._finished = False

    @property
    def raw(self) -> str:
        """The upstream's argument text so far, exactly as received."""
        return _joined(self._raw)

    @property
    def emitted(self) -> str:
        """Everything returned by ``push``/``finish`` so far."""
        return _joined(self._out)

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def repaired(self) -> bool:
        """After ``finish()``: the upstream text was not taken as is."""
        return self._finished and (self._broken or self._state != _DONE)

    def push(self, fragment: str) -> str:
        if not fragment or self._finished:
            return ""
        self._raw.append(fragment)
        if self._broken:
            return ""
        out: list[str] = []
        i, n = 0, len(fragment)
        while i < n:
            if self._state == _STR:
                m = _STR_RUN.match(fragment, i)
                if m is not None:
                    out.append(m.group())
                    i = m.end()
                    continue
            if not self._step(fragment[i], out):
                self._broken = True
                break
            i += 1
        text = "".join(out)
        if text:
            self._out.append(text)
        return text

    def finish(self) -> str:
        if self._finished:
            return ""
        self._finished = True
        text = self._closing()
        if text:
            self._out.append(text)
        return text

    # -- internals -----------------------------------------------------------------

    def _closing(self) -> str:
        state = self._state
        if state == _START:
            return _dumps(_fallback_input(self.raw))
        if state == _DONE and not self._broken:
            return "}"
        parts: list[str] = []
        in_object = bool(self._stack) and self._stack[-1] == "}"
        if state in (_STR, _ESC, _UHEX, _LOW1, _LOW2):
            parts.append('"')  # a held-back partial escape is dropped
            if self._is_key:
                parts.append(":null")
        elif state == _COLON:
            parts.append(":null")
        elif state == _VALUE:
            if in_object:
                parts.append("null")
        elif state == _NUM and self._num in _N_TERMINAL:
            parts.append(self._pending)
        elif state in (_NUM, _LIT) and in_object:
            parts.append("null")
        if state != _DONE:
            parts.extend(reversed(self._stack[1:]))
        parts.append(("," if self._top_items else "") + '"_raw":' + _dumps(_clean(self.raw)) + "}")
        return "".join(parts)

    def _take_comma(self) -> str:
        if self._comma:
            self._comma = False
            return ","
        return ""

    def _close(self, out: list[str]) -> None:
        closer = self._stack.pop()
        if self._stack:
            out.append(closer)
            self._state = _AFTER
        else:
            self._state = _DONE  # the final "}" is held back until finish()

    def _start_value(self, ch: str, out: list[str]) -> bool:
        if ch == '"':
            out.append(self._take_comma() + '"')
            self._is_key = False
            self._state = _STR
        elif ch == "{":
            out.append(self._take_comma() + "{")
            self._stack.append("}")
            self._state = _OBJ_FIRST
        elif ch == "[":
            out.append(self._take_comma() + "[")
            self._stack.append("]")
            self._state = _ARR_FIRST
        elif ch == "-" or ch in _DIGITS:
            self._pending = self._take_comma() + ch
            self._num = _N_MINUS if ch == "-" else (_N_ZERO if ch == "0" else _N_INT)
            self._state = _NUM
        elif ch in _LITERALS:
            self._pending = self._take_comma() + ch
            self._lit = _LITERALS[ch]
            self._lit_pos = 1
            self._state = _LIT
        else:
            return False
        return True

    def _start_key(self, out: list[str]) -> None:
        out.append(self._take_comma() + '"')
        self._is_key = True
        self._state = _STR
        if len(self._stack) == 1:
            self._top_items = True

    def _step(self, ch: str, out: list[str]) -> bool:
        """Advance by one character; False once the text can no longer be a JSON object."""
        state = self._state
        if state == _STR:
            return self._in_string(ch, out)
        if state == _ESC:
            return self._in_escape(ch, out)
        if state == _UHEX:
            return self._in_unicode(ch, out)
        if state in (_LOW1, _LOW2):
            return self._in_low_surrogate(ch, out)
        if state == _NUM:
            return self._in_number(ch, out)
        if state == _LIT:
            return self._in_literal(ch, out)
        if ch in _WS:
            return True
        return self._structural(ch, out)

    def _in_string(self, ch: str, out: list[str]) -> bool:
        """Inside a string: copy, escaping raw control characters."""
        if ch == '"':
            out.append('"')
            self._state = _COLON if self._is_key else _AFTER
        elif ch == "\\":
            self._pending = "\\"
            self._state = _ESC
        else:
            code = ord(ch)
            if 0xD800 <= code <= 0xDFFF:
                return False
            out.append(_CTRL_ESCAPES.get(code, f"\\u{code:04x}") if code < 0x20 else ch)
        return True

    def _in_escape(self, ch: str, out: list[str]) -> bool:
        """After a backslash in a string."""
        if ch in _SIMPLE_ESCAPES:
            out.append(self._pending + ch)
            self._pending = ""
            self._state = _STR
        elif ch == "u":
            self._pending += ch
            self._hex = ""
            self._state = _UHEX
        else:
            return False
        return True

    def _in_unicode(self, ch: str, out: list[str]) -> bool:
        """The four hex digits of a \\u escape; surrogates must pair."""
        if ch not in _HEX:
            return False
        self._pending += ch
        self._hex += ch
        if len(self._hex) < 4:
            return True
        code = int(self._hex, 16)
        if self._high:
            if not 0xDC00 <= code <= 0xDFFF:
                return False
            self._high = False
        elif 0xD800 <= code <= 0xDBFF:
            self._high = True
            self._state = _LOW1
            return True
        elif 0xDC00 <= code <= 0xDFFF:
            return False
        out.append(self._pending)
        self._pending = ""
        self._state = _STR
        return True

    def _in_low_surrogate(self, ch: str, out: list[str]) -> bool:
        """After a high surrogate escape: the \\u of its low half."""
        state = self._state
        if ch != ("\\" if state == _LOW1 else "u"):
            return False
        self._pending += ch
        self._hex = ""
        self._state = _LOW2 if state == _LOW1 else _UHEX
        return True

    def _in_number(self, ch: str, out: list[str]) -> bool:
        """Inside a number, held back until it is known to be complete."""
        num = self._num
        nxt = -1
        if ch in _DIGITS:
            if num in (_N_MINUS, _N_INT):
                nxt = _N_ZERO if (num == _N_MINUS and ch == "0") else _N_INT
            elif num in (_N_DOT, _N_FRAC):
                nxt = _N_FRAC
            elif num in (_N_E, _N_ESIGN, _N_EXP):
                nxt = _N_EXP
        elif ch == "." and num in (_N_ZERO, _N_INT):
            nxt = _N_DOT
        elif ch in "eE" and num in (_N_ZERO, _N_INT, _N_FRAC):
            nxt = _N_E
        elif ch in "+-" and num == _N_E:
            nxt = _N_ESIGN
        if nxt >= 0:
            self._pending += ch
            self._num = nxt
            return True
        if num not in _N_TERMINAL:
            return False
        out.append(self._pending)
        self._pending = ""
        self._state = _AFTER
        return self._step(ch, out)

    def _in_literal(self, ch: str, out: list[str]) -> bool:
        """Inside true/false/null, held back until complete."""
        if ch != self._lit[self._lit_pos]:
            return False
        self._pending += ch
        self._lit_pos += 1
        if self._lit_pos == len(self._lit):
            out.append(self._pending)
            self._pending = ""
            self._state = _AFTER
        return True

    def _structural(self, ch: str, out: list[str]) -> bool:
        """Outside strings, numbers and literals: brackets, colons and commas."""
        state = self._state
        if state == _START:
            if ch != "{":
                return False
            out.append("{")
            self._stack.append("}")
            self._state = _OBJ_FIRST
            return True
        if state in (_OBJ_FIRST, _OBJ_KEY):
            if ch == '"':
                self._start_key(out)
            elif ch == "}" and state == _OBJ_FIRST:
                self._close(out)
            else:
                return False
            return True
        if state == _COLON:
            if ch != ":":
                return False
            out.append(":")
            self._state = _VALUE
            return True
        if state == _ARR_FIRST and ch == "]":
            self._close(out)
            return True
        if state in (_VALUE, _ARR_FIRST):
            return self._start_value(ch, out)
        if state == _AFTER:
            top = self._stack[-1]
            if ch == ",":
                self._comma = True
                self._state = _OBJ_KEY if top == "}" else _VALUE
            elif ch == top:
                self._close(out)
            else:
                return False
            return True
        return False  # _DONE: anything but whitespace after the object is junk


def _fallback_input(raw: str) -> JSON:
    """The input for argument text that does not start with ``{``."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
        if isinstance(value, str):
            inner = json.loads(value)
            if isinstance(inner, dict):
                text = ToolArgsStream()
                done = text.push(value) + text.finish()
                if not text.repaired:
                    return dict(_loads(done))
    except JSONTooDeep:
        raise
    except (ValueError, RecursionError):
        pass
    return {"_raw": _clean(raw)}


# Digits (a sign included) beyond which an integer cannot fit in 64 bits: 2**64 has 20.
_INT64_DIGITS = 20


def _int_or_float(digits: str) -> int | float:
    """An integer as orjson reads one: beyond 64 bits it becomes a float (orjson cannot
    write such an int back, so the translated reply would not serialise), past the float
    range an infinity, written as null. A long one is never given to ``int``: Python refuses
    to convert more than 4,300 digits (ValueError), and an int past the float range cannot
    become a float (OverflowError); ``float`` reads any number of digits."""
    if len(digits) > _INT64_DIGITS:
        return float(digits)
    value = int(digits)
    return value if -(2**63) <= value < 2**64 else float(value)


def _loads(text: str) -> Any:
    """``text`` parsed (JSON the upstream wrote), refused with ``JSONTooDeep`` when it nests
    deeper than ``MAX_JSON_DEPTH``: the client's reply could not be serialised."""
    try:
        value = json.loads(text, parse_int=_int_or_float)
    except RecursionError:
        value = None
        too_deep = True
    else:
        too_deep = nesting_exceeds(value, MAX_JSON_DEPTH, text)
    if too_deep:
        raise JSONTooDeep(f"tool-call arguments nest JSON more than {MAX_JSON_DEPTH} levels deep")
    return value


def parse_tool_arguments(arguments: Any) -> JSON:
    """The Anthropic ``input`` object for an OpenAI ``function.arguments`` value.

    Exactly the object a client accumulates from :class:`OpenAIStreamToAnthropic`'s stream
    of the same text, however it was split. See :class:`ToolArgsStream` and the module doc.
    """
    if isinstance(arguments, dict):
        if nesting_exceeds(arguments, MAX_JSON_DEPTH):
            raise JSONTooDeep(
                f"tool-call arguments nest JSON more than {MAX_JSON_DEPTH} levels deep"
            )
        return copy.deepcopy(arguments)
    if arguments is None:
        arguments = ""
    if not isinstance(arguments, str):
        arguments = _dumps(arguments)
    stream = ToolArgsStream()
    text = stream.push(arguments) + stream.finish()
    value = _loads(text)
    return value if isinstance(value, dict) else {"_raw": _clean(arguments)}
