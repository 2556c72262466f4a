"""Exact, pure translation between Anthropic Messages and OpenAI chat completions.

Two directions, each with a request mapping, a full-response mapping and a stream translator:

* Anthropic client -> OpenAI-format upstream: :func:`anthropic_request_to_openai`,
  :func:`openai_response_to_anthropic`, :class:`OpenAIStreamToAnthropic`.
* OpenAI client -> Anthropic upstream: :func:`openai_request_to_anthropic`,
  :func:`anthropic_response_to_openai`, :class:`AnthropicStreamToOpenAI`.

Nothing here does I/O. Input dicts are never mutated. Requests come validated by their
dialect (``skillstate.dialects.openai`` / ``.anthropic``, ``Dialect.validate``), so the
request mappings check only what the other side cannot take.

Decisions worth knowing (each is also stated where it is implemented):

* Text joins. ``system`` text blocks are joined with a blank line into one OpenAI system
  string; an assistant message's text blocks are concatenated with no separator (Anthropic
  splits one continuous output into several text blocks, e.g. around citations); a
  ``tool_result``'s text blocks are joined with ``"\\n"``. A user message with several
  blocks becomes an OpenAI content-part array, so block boundaries survive.
* Tool-call arguments from an OpenAI upstream are turned into an Anthropic ``input`` object
  by :func:`parse_tool_arguments`, which the stream translator runs incrementally, so a
  streamed reply and the same reply unstreamed always give the same ``input``:
  a complete JSON object is taken exactly (raw control characters inside strings are
  tolerated and re-escaped); empty arguments give ``{}``; a JSON string holding a JSON
  object (double encoding) is decoded; anything else (truncated by ``max_tokens``, trailing
  junk, not an object, malformed) is *repaired*: the longest well-formed prefix is closed
  (an unfinished member's value becomes ``null``) and a ``"_raw"`` member carrying the
  upstream's complete argument text is added. So a repaired input is always recognisable
  by its ``"_raw"`` key (and tool-input validators that forbid unknown keys reject it).
* Usage. OpenAI ``prompt_tokens`` includes cached (and cache-write) tokens; Anthropic
  ``input_tokens`` excludes them: ``input_tokens = prompt_tokens - cached - cache_write``.
  A stream's ``message_start`` carries zero input tokens (unknown until the upstream's
  ``include_usage`` chunk); the real numbers arrive in ``message_delta.usage``, which the
  Anthropic SDKs copy over the ``message_start`` values.
* ``reasoning_content`` (OpenAI-compatible servers) and Anthropic ``thinking`` blocks are not
  carried across dialects: a thinking block needs a signature the other side cannot make.
* Stream translators expose ``.text``, ``.tool_calls`` (id, name, arguments JSON as sent to
  the client), ``.usage`` (the *upstream's* own usage object, in the upstream's dialect, or
  None) and ``.client_usage`` (the same, translated to the client's dialect).
* ``role: "system"`` entries in Anthropic ``messages`` (the anthropic SDK's
  ``SystemMessageParam``; text only) are accepted and become OpenAI system messages in place.
"""

from __future__ import annotations

import copy
import json
import math
import re
import time
import uuid
from typing import Any, TypeGuard

from skillstate.dialects import sse
from skillstate.dialects.capture import TextCapture
from skillstate.errors import ProxyError
from skillstate.ledger import MAX_TOKEN_COUNT

__all__ = [
    "AnthropicStreamToOpenAI",
    "OpenAIStreamToAnthropic",
    "ToolArgsStream",
    "anthropic_request_to_openai",
    "anthropic_response_to_openai",
    "anthropic_stop_reason",
    "anthropic_usage_to_openai",
    "openai_finish_reason",
    "openai_request_to_anthropic",
    "openai_response_to_anthropic",
    "openai_usage_to_anthropic",
    "parse_tool_arguments",
]

JSON = dict[str, Any]

TOOL_ERROR_PREFIX = "[tool error] "
SYSTEM_JOIN = "\n\n"
ASSISTANT_TEXT_JOIN = ""
TOOL_RESULT_TEXT_JOIN = "\n"

# --------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------


def _bad(message: str, param: str | None = None) -> ProxyError:
    return ProxyError("invalid_request", message, param=param)


def _dumps(value: Any) -> str:
    """Compact JSON text with non-ASCII kept, as tool arguments are written."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _clean(text: str) -> str:
    """Replace lone surrogates (unencodable in UTF-8 and rejected by JSON parsers) with U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
    return text


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _joined(parts: list[str]) -> str:
    """``"".join(parts)``, collapsing the list so repeated reads stay linear overall."""
    if len(parts) > 1:
        parts[:] = ["".join(parts)]
    return parts[0] if parts else ""


def _as_int(value: Any) -> int:
    """A token count for the other dialect: 0 for anything that is not a sane count (a
    1e300 from a broken server must not crash the JSON encoder)."""
    if _is_int(value) or (isinstance(value, float) and math.isfinite(value)):
        n = int(value)
        return n if 0 <= n <= MAX_TOKEN_COUNT else 0
    return 0


# --------------------------------------------------------------------------------------
# tool arguments: OpenAI JSON text -> Anthropic input object, incrementally
# --------------------------------------------------------------------------------------

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
        state = self._state
        if state == _STR:
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
        if state == _ESC:
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
        if state == _UHEX:
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
        if state in (_LOW1, _LOW2):
            if ch != ("\\" if state == _LOW1 else "u"):
                return False
            self._pending += ch
            self._hex = ""
            self._state = _LOW2 if state == _LOW1 else _UHEX
            return True
        if state == _NUM:
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
        if state == _LIT:
            if ch != self._lit[self._lit_pos]:
                return False
            self._pending += ch
            self._lit_pos += 1
            if self._lit_pos == len(self._lit):
                out.append(self._pending)
                self._pending = ""
                self._state = _AFTER
            return True
        if ch in _WS:
            return True
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
                    return dict(json.loads(done))
    except (ValueError, RecursionError):
        pass
    return {"_raw": _clean(raw)}


def parse_tool_arguments(arguments: Any) -> JSON:
    """The Anthropic ``input`` object for an OpenAI ``function.arguments`` value.

    Exactly the object a client accumulates from :class:`OpenAIStreamToAnthropic`'s stream
    of the same text, however it was split. See :class:`ToolArgsStream` and the module doc.
    """
    if isinstance(arguments, dict):
        return copy.deepcopy(arguments)
    if arguments is None:
        arguments = ""
    if not isinstance(arguments, str):
        arguments = _dumps(arguments)
    stream = ToolArgsStream()
    text = stream.push(arguments) + stream.finish()
    value = json.loads(text)
    return value if isinstance(value, dict) else {"_raw": _clean(arguments)}


# --------------------------------------------------------------------------------------
# shared mappings
# --------------------------------------------------------------------------------------


def openai_usage_to_anthropic(usage: Any) -> JSON:
    """OpenAI ``usage`` -> Anthropic ``usage`` (input tokens exclude cache reads/writes)."""
    u = usage if isinstance(usage, dict) else {}
    details = u.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    prompt = _as_int(u.get("prompt_tokens"))
    cached = _as_int(details.get("cached_tokens")) or _as_int(u.get("prompt_cache_hit_tokens"))
    written = _as_int(details.get("cache_write_tokens"))
    return {
        "input_tokens": max(prompt - cached - written, 0),
        "output_tokens": _as_int(u.get("completion_tokens")),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": cached,
    }


def anthropic_usage_to_openai(usage: Any) -> JSON:
    """Anthropic ``usage`` -> OpenAI ``usage`` (prompt tokens include cache reads/writes)."""
    u = usage if isinstance(usage, dict) else {}
    read = _as_int(u.get("cache_read_input_tokens"))
    written = _as_int(u.get("cache_creation_input_tokens"))
    prompt = _as_int(u.get("input_tokens")) + read + written
    completion = _as_int(u.get("output_tokens"))
    details: JSON = {"cached_tokens": read}
    if written:
        details["cache_write_tokens"] = written
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": details,
    }


def anthropic_stop_reason(
    finish_reason: Any, *, has_tool_calls: bool, matched_stop: Any = None
) -> tuple[str, str | None]:
    """OpenAI ``finish_reason`` -> Anthropic ``(stop_reason, stop_sequence)``.

    ``matched_stop`` is vLLM's non-standard ``choice.stop_reason`` (the stop string that
    matched); OpenAI itself does not say which stop sequence fired. ``stop`` with tool calls
    present (some local servers do that) counts as ``tool_use``.
    """
    if finish_reason in ("tool_calls", "function_call"):
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason == "content_filter":
        return "refusal", None
    if finish_reason == "stop" and isinstance(matched_stop, str) and matched_stop:
        return "stop_sequence", matched_stop
    return ("tool_use" if has_tool_calls else "end_turn"), None


_FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


def openai_finish_reason(stop_reason: Any, *, has_tool_calls: bool = False) -> str:
    """Anthropic ``stop_reason`` -> OpenAI ``finish_reason``."""
    if isinstance(stop_reason, str) and stop_reason in _FINISH_REASONS:
        return _FINISH_REASONS[stop_reason]
    return "tool_calls" if has_tool_calls else "stop"


def _synth_tool_id(message_id: str, position: int) -> str:
    base = re.sub(r"[^A-Za-z0-9_-]", "_", message_id)
    return f"toolu_{base}_{position}"


# --------------------------------------------------------------------------------------
# Direction 1: Anthropic client -> OpenAI-format upstream
# --------------------------------------------------------------------------------------


def anthropic_request_to_openai(body: JSON, *, max_tokens_field: str = "max_tokens") -> JSON:
    """An Anthropic Messages request -> an OpenAI chat-completions request.

    ``body`` has passed ``validate_anthropic_request``. Structured outputs
    (``output_config.format``) become a ``json_schema`` ``response_format``. Dropped:
    ``metadata``, ``top_k``,
    ``thinking``, ``cache_control`` markers, ``thinking``/``redacted_thinking`` blocks and
    any other top-level field OpenAI has no equivalent for. Raises ProxyError 400 for
    content an OpenAI upstream cannot take (server tools, file/unknown image sources, ...).
    """
    messages: list[JSON] = []
    system = body.get("system")
    if system:
        text = system if isinstance(system, str) else SYSTEM_JOIN.join(b["text"] for b in system)
        if text:
            messages.append({"role": "system", "content": text})
    for i, msg in enumerate(body["messages"]):
        role, content, path = msg["role"], msg["content"], f"messages[{i}]"
        if role == "assistant":
            messages.append(_assistant_to_openai(content, path))
        elif role == "user":
            messages.extend(_user_to_openai(content, path))
        else:
            text = content if isinstance(content, str) else "".join(b["text"] for b in content)
            messages.append({"role": "system", "content": text})

    # max_tokens_field: OpenAI's reasoning models refuse "max_tokens"; servers such as Ollama
    # ignore "max_completion_tokens". The upstream's config picks (config.Upstream).
    out: JSON = {"model": body["model"], "messages": messages, max_tokens_field: body["max_tokens"]}
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("stop_sequences"):
        out["stop"] = list(body["stop_sequences"])
    if "stream" in body and body["stream"] is not None:
        out["stream"] = body["stream"]
        if body["stream"]:
            out["stream_options"] = {"include_usage": True}
    tools = body.get("tools")
    if tools:
        out["tools"] = [_tool_to_openai(t, f"tools[{i}]") for i, t in enumerate(tools)]
        tc = body.get("tool_choice")
        if tc:
            ttype = tc["type"]
            if ttype == "auto":
                out["tool_choice"] = "auto"
            elif ttype == "any":
                out["tool_choice"] = "required"
            elif ttype == "none":
                out["tool_choice"] = "none"
            else:
                out["tool_choice"] = {"type": "function", "function": {"name": tc["name"]}}
            if tc.get("disable_parallel_tool_use") and ttype != "none":
                out["parallel_tool_calls"] = False
    schema = _anthropic_output_schema(body)
    if schema is not None:
        # Anthropic guarantees the schema; OpenAI does only in strict mode, which refuses
        # schemas with optional or open-ended members. Strict whenever the schema allows it.
        spec: JSON = {"name": "output", "schema": schema}
        if _strict_compatible(schema):
            spec["strict"] = True
        out["response_format"] = {"type": "json_schema", "json_schema": spec}
    return out


def _strict_compatible(schema: Any) -> bool:
    """Whether OpenAI's strict mode accepts the schema: every object closed
    (``additionalProperties: false``) with all its properties required."""
    if not isinstance(schema, dict):
        return True
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    if schema.get("type") == "object" or props:
        if schema.get("additionalProperties") is not False:
            return False
        if set(schema.get("required") or ()) != set(props):
            return False
    children = list(props.values())
    for key in ("items", "anyOf", "oneOf", "allOf", "prefixItems"):
        sub = schema.get(key)
        children.extend(sub if isinstance(sub, list) else [] if sub is None else [sub])
    for key in ("$defs", "definitions"):
        defs = schema.get(key)
        children.extend(defs.values() if isinstance(defs, dict) else ())
    return all(_strict_compatible(c) for c in children)


def _anthropic_output_schema(body: JSON) -> JSON | None:
    """The JSON schema of Anthropic structured outputs (``output_config.format``, or the
    beta ``output_format``), if the request asks for one."""
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else body.get("output_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = fmt.get("schema")
        if isinstance(schema, dict):
            return schema
    return None


def _openai_output_format(response_format: Any) -> JSON | None:
    """OpenAI ``response_format`` -> Anthropic ``output_config.format``. Only a JSON schema
    has an equivalent; ``json_object`` (JSON mode) has none and is left to the prompt."""
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return None
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise _bad("response_format.json_schema.schema: must be an object", "response_format")
    return {"type": "json_schema", "schema": schema}


def _tool_to_openai(tool: JSON, path: str) -> JSON:
    ttype = tool.get("type")
    if ttype not in (None, "custom"):
        raise _bad(
            f"{path}: tool {tool['name']!r} has type {ttype!r}, an Anthropic built-in/server "
            "tool that an OpenAI-format upstream cannot run; define it as a custom tool "
            "with an input_schema",
            path,
        )
    fn: JSON = {"name": tool["name"]}
    if tool.get("description"):
        fn["description"] = tool["description"]
    fn["parameters"] = copy.deepcopy(tool["input_schema"])
    if isinstance(tool.get("strict"), bool):
        fn["strict"] = tool["strict"]
    return {"type": "function", "function": fn}


def _image_to_openai(block: JSON, path: str) -> JSON:
    source = block["source"]
    stype = source["type"]
    if stype == "base64":
        url = f"data:{source['media_type']};base64,{source['data']}"
    elif stype == "url":
        url = source["url"]
    else:
        raise _bad(
            f"{path}.source: image source type {stype!r} cannot be sent to an OpenAI-format "
            'upstream (use "base64" or "url")',
            f"{path}.source",
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _document_to_openai(block: JSON, path: str) -> JSON:
    source = block["source"]
    stype = source["type"]
    if stype == "text" and isinstance(source.get("data"), str):
        return {"type": "text", "text": source["data"]}
    if stype == "content":
        inner = source.get("content")
        if isinstance(inner, str):
            return {"type": "text", "text": inner}
        if isinstance(inner, list) and all(
            isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
            for b in inner
        ):
            return {"type": "text", "text": "".join(b["text"] for b in inner)}
    if stype == "base64" and source.get("media_type") == "application/pdf":
        name = block.get("title") if isinstance(block.get("title"), str) else "document.pdf"
        return {
            "type": "file",
            "file": {
                "filename": name,
                "file_data": f"data:application/pdf;base64,{source['data']}",
            },
        }
    raise _bad(
        f"{path}.source: document source type {stype!r} cannot be sent to an OpenAI-format "
        'upstream (use "text", "content" or a base64 PDF)',
        f"{path}.source",
    )


def _unsupported(btype: str, path: str) -> ProxyError:
    return _bad(
        f"{path}: {btype} blocks cannot be sent to an OpenAI-format upstream", f"{path}.type"
    )


def _tool_result_to_openai(block: JSON, path: str) -> tuple[str, list[JSON]]:
    """(tool message text, image parts that must travel in a following user message)."""
    content = block.get("content")
    images: list[JSON] = []
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        texts: list[str] = []
        for k, inner in enumerate(content):
            ipath = f"{path}.content[{k}]"
            itype = inner["type"]
            if itype == "text":
                texts.append(inner["text"])
            elif itype == "image":
                images.append(_image_to_openai(inner, ipath))
            elif itype == "document":
                part = _document_to_openai(inner, ipath)
                if part["type"] != "text":
                    raise _bad(f"{ipath}: only text documents can be sent in a tool result", ipath)
                texts.append(part["text"])
            else:
                raise _unsupported(itype, ipath)
        text = TOOL_RESULT_TEXT_JOIN.join(texts)
    if block.get("is_error"):
        text = TOOL_ERROR_PREFIX + text
    return text, images


def _user_to_openai(content: str | list[JSON], path: str) -> list[JSON]:
    """One Anthropic user message -> OpenAI messages: ``tool`` messages first (they must
    directly follow the assistant's tool_calls), then one user message with the remaining
    content in order. Images returned by tools cannot ride in an OpenAI ``tool`` message;
    they go, labelled, at the start of that user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tool_msgs: list[JSON] = []
    tool_images: list[JSON] = []
    parts: list[JSON] = []
    for j, block in enumerate(content):
        bpath = f"{path}.content[{j}]"
        btype = block["type"]
        if btype == "text":
            parts.append({"type": "text", "text": block["text"]})
        elif btype == "image":
            parts.append(_image_to_openai(block, bpath))
        elif btype == "document":
            parts.append(_document_to_openai(block, bpath))
        elif btype == "tool_result":
            text, images = _tool_result_to_openai(block, bpath)
            tool_msgs.append(
                {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}
            )
            if images:
                label = f"[image(s) returned by tool call {block['tool_use_id']}]"
                tool_images.append({"type": "text", "text": label})
                tool_images.extend(images)
        else:
            raise _unsupported(btype, bpath)
    out = tool_msgs
    user_parts = tool_images + parts
    if user_parts:
        if len(user_parts) == 1 and user_parts[0]["type"] == "text":
            out.append({"role": "user", "content": user_parts[0]["text"]})
        else:
            out.append({"role": "user", "content": user_parts})
    elif not tool_msgs:
        out.append({"role": "user", "content": ""})
    return out


def _assistant_to_openai(content: str | list[JSON], path: str) -> JSON:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    calls: list[JSON] = []
    for j, block in enumerate(content):
        btype = block["type"]
        if btype == "text":
            texts.append(block["text"])
        elif btype == "tool_use":
            calls.append(
                {
                    "id": block["id"],
                    "type": "function",
                    "function": {"name": block["name"], "arguments": _dumps(block["input"])},
                }
            )
        elif btype in ("thinking", "redacted_thinking"):
            continue  # not representable in OpenAI chat completions
        else:
            raise _unsupported(btype, f"{path}.content[{j}]")
    text = ASSISTANT_TEXT_JOIN.join(texts)
    msg: JSON = {"role": "assistant", "content": text if (text or not calls) else None}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _openai_message_text(message: JSON) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(
            p.get("text") or p.get("refusal") or ""
            for p in content
            if isinstance(p, dict) and p.get("type") in ("text", "refusal")
        )
    text = content if isinstance(content, str) else ""
    refusal = message.get("refusal")
    if isinstance(refusal, str):
        text += refusal
    return _clean(text)


def openai_response_to_anthropic(resp: JSON, *, request_model: str) -> JSON:
    """A non-streamed OpenAI chat completion -> an Anthropic ``message``.

    ``id`` is ``"msg_" + resp["id"]``; ``model`` is the client's ``request_model``. Only
    choice 0 is used. ``message.refusal`` text is treated as text. Tool-call arguments are
    parsed with :func:`parse_tool_arguments`; a call without an id gets a stable synthetic
    one derived from the message id and its position.
    """
    upstream_id = resp.get("id")
    message_id = f"msg_{upstream_id}" if isinstance(upstream_id, str) and upstream_id else None
    message_id = message_id or f"msg_{uuid.uuid4().hex}"
    choice = _first_choice(resp.get("choices"))
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    assert isinstance(message, dict)
    content: list[JSON] = []
    text = _openai_message_text(message)
    if text:
        content.append({"type": "text", "text": text})
    raw_calls = message.get("tool_calls")
    for pos, call in enumerate(raw_calls if isinstance(raw_calls, list) else []):
        if not isinstance(call, dict):
            continue
        fn = call.get("function") if isinstance(call.get("function"), dict) else {}
        assert isinstance(fn, dict)
        cid = call.get("id")
        name = fn.get("name")
        content.append(
            {
                "type": "tool_use",
                "id": cid if isinstance(cid, str) and cid else _synth_tool_id(message_id, pos),
                "name": name if isinstance(name, str) else "",
                "input": parse_tool_arguments(fn.get("arguments")),
            }
        )
    has_calls = any(b["type"] == "tool_use" for b in content)
    stop_reason, stop_sequence = anthropic_stop_reason(
        choice.get("finish_reason"),
        has_tool_calls=has_calls,
        matched_stop=choice.get("stop_reason"),
    )
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": request_model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": openai_usage_to_anthropic(resp.get("usage")),
    }


def _first_choice(choices: Any) -> JSON:
    if not isinstance(choices, list):
        return {}
    for choice in choices:
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            return choice
    return {}


class _Call:
    __slots__ = ("args", "block", "buffer", "closed", "id", "late", "name", "position")

    def __init__(self, position: int) -> None:
        self.position = position
        self.id: str | None = None
        self.name: str | None = None
        self.buffer: list[str] = []  # argument text that arrived before the block opened
        self.args = ToolArgsStream()
        self.block: int | None = None
        self.closed = False
        self.late = ""  # argument text that arrived after the block was closed


class OpenAIStreamToAnthropic:
    """Translates a streamed OpenAI chat completion (parsed chunks) into Anthropic SSE bytes.

    ``feed(chunk)`` returns the encoded events the chunk produces; ``finish()`` (call it when
    the upstream stream ends, e.g. on ``[DONE]``) closes the open block and emits
    ``message_delta`` (stop_reason and usage) and ``message_stop``; ``error(message)``
    returns an ``event: error`` and ends the stream. The first call emits ``message_start``
    (zero input tokens: the usage is only known from the upstream's final usage chunk) and a
    ``ping``. Text opens a text block; each tool call gets its own ``tool_use`` block, opened
    once its name is known (argument fragments that come earlier are buffered), with its
    arguments streamed as ``input_json_delta`` through :class:`ToolArgsStream`. A tool call
    whose name arrives only at the end is opened by ``finish()``.

    The message an Anthropic SDK accumulates from this stream equals
    :func:`openai_response_to_anthropic` of the same reply, as long as the upstream does not
    interleave text after tool calls (that opens a further text block) or send arguments for
    a call after a later call has begun (such late text is kept in ``late_arguments`` but
    can no longer be delivered).
    """

    def __init__(
        self,
        request_model: str,
        message_id: str | None = None,
        *,
        capture_limit: int | None = None,
    ) -> None:
        self.request_model = request_model
        self.message_id = message_id
        self._started = False
        self._done = False
        self._next_block = 0
        self._open_text: int | None = None  # index of the open text block
        self._open_call: _Call | None = None
        self._calls: dict[int, _Call] = {}
        self._order: list[_Call] = []  # calls in first-seen order
        self._text = TextCapture(capture_limit)
        self._finish_reason: str | None = None
        self._matched_stop: str | None = None
        self._raw_usage: JSON | None = None
        self._stop: tuple[str, str | None] | None = None
        self.upstream_model: str | None = None

    # -- public state ----------------------------------------------------------------

    @property
    def text(self) -> str:
        """The text delivered to the client so far (up to ``capture_limit`` characters)."""
        return self._text.text

    @property
    def text_truncated(self) -> bool:
        """More text was delivered than ``capture_limit`` let ``text`` keep."""
        return self._text.truncated

    @property
    def has_tool_calls(self) -> bool:
        """Whether the reply calls tools (O(1), unlike ``tool_calls``)."""
        return bool(self._order)

    @property
    def tool_calls(self) -> list[tuple[str, str, str]]:
        """(id, name, arguments JSON as delivered to the client so far) per call, in block
        order; complete JSON objects after ``finish()``."""
        calls = sorted(self._order, key=lambda c: (c.block is None, c.block or 0, c.position))
        return [(c.id or "", c.name or "", c.args.emitted) for c in calls]

    @property
    def late_arguments(self) -> dict[str, str]:
        return {c.id or "": c.late for c in self._order if c.late}

    @property
    def usage(self) -> JSON | None:
        """The upstream's own (OpenAI-shaped) usage object, once it reported one."""
        return self._raw_usage

    @property
    def client_usage(self) -> JSON | None:
        """The Anthropic usage sent (or to be sent) in ``message_delta``, once known."""
        return None if self._raw_usage is None else openai_usage_to_anthropic(self._raw_usage)

    @property
    def finish_reason(self) -> str | None:
        return self._finish_reason

    @property
    def stop_reason(self) -> str | None:
        if self._stop is not None:
            return self._stop[0]
        if self._finish_reason is None:
            return None
        return anthropic_stop_reason(
            self._finish_reason, has_tool_calls=bool(self._order), matched_stop=self._matched_stop
        )[0]

    @property
    def done(self) -> bool:
        return self._done

    # -- feeding -----------------------------------------------------------------------

    def feed(self, chunk: JSON) -> list[bytes]:
        if self._done or not isinstance(chunk, dict):
            return []
        out = self._start(chunk)
        err = chunk.get("error")
        if err is not None and not chunk.get("choices"):
            msg = err.get("message") if isinstance(err, dict) else err
            out.append(self.error(str(msg or "upstream error")))
            return out
        if isinstance(chunk.get("model"), str):
            self.upstream_model = chunk["model"]
        if isinstance(chunk.get("usage"), dict):
            self._raw_usage = chunk["usage"]
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                for key in ("content", "refusal"):
                    piece = delta.get(key)
                    if isinstance(piece, str) and piece:
                        out.extend(self._text_delta(_clean(piece)))
                tcs = delta.get("tool_calls")
                for tc in tcs if isinstance(tcs, list) else []:
                    if isinstance(tc, dict):
                        out.extend(self._tool_delta(tc))
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                self._finish_reason = reason
                stop = choice.get("stop_reason")
                self._matched_stop = stop if isinstance(stop, str) else None
        return out

    def finish(self) -> list[bytes]:
        if self._done:
            return []
        out = self._start({})
        for call in self._order:
            if call.block is None:
                out.extend(self._open_tool(call))
        out.extend(self._close_open())
        self._stop = anthropic_stop_reason(
            self._finish_reason, has_tool_calls=bool(self._order), matched_stop=self._matched_stop
        )
        usage: JSON = (
            openai_usage_to_anthropic(self._raw_usage)
            if self._raw_usage is not None
            else {"output_tokens": 0}
        )
        out.append(
            self._event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": self._stop[0], "stop_sequence": self._stop[1]},
                    "usage": usage,
                },
            )
        )
        out.append(self._event("message_stop", {"type": "message_stop"}))
        self._done = True
        return out

    def error(self, message: str | ProxyError, error_type: str = "api_error") -> bytes:
        """An Anthropic ``event: error``; the stream is over after it."""
        self._done = True
        if isinstance(message, ProxyError):
            return sse.encode(message.body("anthropic"), event="error")
        return sse.encode(
            {"type": "error", "error": {"type": error_type, "message": message}}, event="error"
        )

    # -- internals ---------------------------------------------------------------------

    @staticmethod
    def _event(name: str, data: JSON) -> bytes:
        return sse.encode(data, event=name)

    def _start(self, chunk: JSON) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        if self.message_id is None:
            cid = chunk.get("id")
            self.message_id = (
                f"msg_{cid}" if isinstance(cid, str) and cid else f"msg_{uuid.uuid4().hex}"
            )
        message: JSON = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.request_model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": 0,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        return [
            self._event("message_start", {"type": "message_start", "message": message}),
            self._event("ping", {"type": "ping"}),
        ]

    def _close_open(self) -> list[bytes]:
        out: list[bytes] = []
        if self._open_text is not None:
            out.append(self._stop_block(self._open_text))
            self._open_text = None
        call = self._open_call
        if call is not None and call.block is not None:
            tail = call.args.finish()
            if tail:
                out.append(self._json_delta(call.block, tail))
            out.append(self._stop_block(call.block))
            call.closed = True
            self._open_call = None
        return out

    def _stop_block(self, index: int) -> bytes:
        return self._event("content_block_stop", {"type": "content_block_stop", "index": index})

    def _json_delta(self, index: int, text: str) -> bytes:
        return self._event(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": text},
            },
        )

    def _text_delta(self, text: str) -> list[bytes]:
        out: list[bytes] = []
        if self._open_text is None:
            out.extend(self._close_open())
            self._open_text = self._next_block
            self._next_block += 1
            out.append(
                self._event(
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": self._open_text,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
            )
        self._text.add(text)
        out.append(
            self._event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": self._open_text,
                    "delta": {"type": "text_delta", "text": text},
                },
            )
        )
        return out

    def _call_for(self, tc: JSON) -> _Call:
        index = tc.get("index")
        cid = tc.get("id") if isinstance(tc.get("id"), str) and tc.get("id") else None
        if not _is_int(index):
            # Some servers omit the index: a new id means a new call, else the latest call.
            known = next((c for c in self._order if cid is not None and c.id == cid), None)
            if known is not None:
                return known
            if cid is None and self._order:
                return self._order[-1]
            index = max(self._calls, default=-1) + 1
        key = index if _is_int(index) else 0
        call = self._calls.get(key)
        if call is None:
            call = _Call(key)  # the upstream index names a synthesized id, as unstreamed
            self._calls[key] = call
            self._order.append(call)
        return call

    def _tool_delta(self, tc: JSON) -> list[bytes]:
        call = self._call_for(tc)
        cid = tc.get("id")
        if call.id is None and isinstance(cid, str) and cid:
            call.id = cid
        fn = tc.get("function") if isinstance(tc.get("function"), dict) else {}
        assert isinstance(fn, dict)
        name = fn.get("name")
        if call.name is None and isinstance(name, str) and name:
            call.name = name
        args = fn.get("arguments")
        fragment = args if isinstance(args, str) else ""
        if call.closed:
            call.late += fragment
            return []
        if call.block is None:
            if fragment:
                call.buffer.append(fragment)
            return self._open_tool(call) if call.name is not None else []
        if fragment and call is self._open_call:
            text = call.args.push(fragment)
            if text:
                return [self._json_delta(call.block, text)]
        elif fragment:
            call.buffer.append(fragment)  # unreachable: only the open call has a block
        return []

    def _open_tool(self, call: _Call) -> list[bytes]:
        out = self._close_open()
        assert self.message_id is not None
        if call.id is None:
            call.id = _synth_tool_id(self.message_id, call.position)
        call.block = self._next_block
        self._next_block += 1
        self._open_call = call
        out.append(
            self._event(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": call.block,
                    "content_block": {
                        "type": "tool_use",
                        "id": call.id,
                        "name": call.name or "",
                        "input": {},
                    },
                },
            )
        )
        if call.buffer:
            text = call.args.push("".join(call.buffer))
            call.buffer.clear()
            if text:
                out.append(self._json_delta(call.block, text))
        return out


# --------------------------------------------------------------------------------------
# Direction 2: OpenAI client -> Anthropic upstream
# --------------------------------------------------------------------------------------


_DATA_URL = re.compile(r"^data:(?P<mt>[^;,]+)(?:;[^,]*)?;base64,(?P<data>.*)$", re.DOTALL)


def _openai_text_of(content: Any, path: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in ("text", "refusal"):
                raise _bad(f"{path}[{k}]: only text parts are allowed here", f"{path}[{k}]")
            value = part.get("text") if part["type"] == "text" else part.get("refusal")
            if not isinstance(value, str):
                raise _bad(f"{path}[{k}]: text must be a string", f"{path}[{k}]")
            texts.append(value)
        return "".join(texts)
    raise _bad(f"{path}: must be a string or an array of content parts", path)


def _openai_part_to_block(part: Any, path: str) -> JSON:
    if not isinstance(part, dict):
        raise _bad(f"{path}: a content part must be an object", path)
    ptype = part.get("type")
    if ptype == "text":
        if not isinstance(part.get("text"), str):
            raise _bad(f"{path}.text: must be a string", f"{path}.text")
        return {"type": "text", "text": part["text"]}
    if ptype == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str) or not url:
            raise _bad(f"{path}.image_url.url: must be a string", f"{path}.image_url.url")
        m = _DATA_URL.match(url)
        if m:
            source: JSON = {"type": "base64", "media_type": m["mt"], "data": m["data"]}
        elif url.startswith(("http://", "https://")):
            source = {"type": "url", "url": url}
        else:
            raise _bad(
                f"{path}.image_url.url: must be an http(s) URL or a base64 data URL",
                f"{path}.image_url.url",
            )
        return {"type": "image", "source": source}
    if ptype == "file":
        file = part.get("file") if isinstance(part.get("file"), dict) else {}
        assert isinstance(file, dict)
        data = file.get("file_data")
        m = _DATA_URL.match(data) if isinstance(data, str) else None
        if m and m["mt"] == "application/pdf":
            block: JSON = {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": m["data"]},
            }
            if isinstance(file.get("filename"), str):
                block["title"] = file["filename"]
            return block
        raise _bad(
            f"{path}: only inline PDF files (file_data as a base64 data URL) can be sent to "
            "an Anthropic upstream",
            path,
        )
    raise _bad(f"{path}: content part type {ptype!r} cannot be sent to an Anthropic upstream", path)


def openai_request_to_anthropic(body: JSON, *, default_max_tokens: int = 4096) -> JSON:
    """An OpenAI chat-completions request -> an Anthropic Messages request.

    ``system``/``developer`` messages (wherever they are) are joined into ``system``;
    ``tool`` messages become ``tool_result`` blocks in a user message; consecutive messages
    of the same resulting role are merged. ``temperature`` is clamped to Anthropic's [0, 1].
    A ``json_schema`` ``response_format`` becomes ``output_config.format`` (structured
    outputs). Dropped: ``stream_options`` (see :class:`AnthropicStreamToOpenAI`), a
    ``json_object`` ``response_format`` (no equivalent), ``seed``, penalties, ``logit_bias``,
    ``logprobs``, ``reasoning_effort`` and the like.
    ``body`` has passed ``validate_openai_request``; raises ProxyError 400 for what Anthropic
    cannot take (``n`` > 1, legacy ``functions``, audio, non-function tools).
    """
    model = body["model"]
    messages = body["messages"]
    if body.get("functions") or body.get("function_call"):
        raise _bad("functions/function_call are deprecated and not supported; use tools")
    n = body.get("n")
    if n is not None and n != 1:
        raise _bad("n: only 1 choice is supported with an Anthropic upstream", "n")

    system_parts: list[str] = []
    out_msgs: list[JSON] = []

    def add(role: str, blocks: list[JSON]) -> None:
        if not blocks:
            return
        if out_msgs and out_msgs[-1]["role"] == role:
            out_msgs[-1]["content"].extend(blocks)
        else:
            out_msgs.append({"role": role, "content": blocks})

    for i, msg in enumerate(messages):
        path = f"messages[{i}]"
        role = msg.get("role")
        content = msg.get("content")
        if role in ("system", "developer"):
            text = _openai_text_of(content, f"{path}.content")
            if text:
                system_parts.append(text)
        elif role == "user":
            if isinstance(content, str):
                blocks = [{"type": "text", "text": content}] if content else []
            elif isinstance(content, list):
                blocks = [
                    _openai_part_to_block(p, f"{path}.content[{k}]") for k, p in enumerate(content)
                ]
                blocks = [b for b in blocks if not (b["type"] == "text" and not b["text"])]
            else:
                raise _bad(f"{path}.content: must be a string or an array", f"{path}.content")
            add("user", blocks)
        elif role == "assistant":
            text = _openai_text_of(content, f"{path}.content")
            refusal = msg.get("refusal")
            if isinstance(refusal, str) and refusal and not text:
                text = refusal
            blocks = [{"type": "text", "text": text}] if text else []
            calls = msg.get("tool_calls")
            for k, call in enumerate(calls or []):
                blocks.append(_tool_call_to_block(call, f"{path}.tool_calls[{k}]"))
            add("assistant", blocks)
        elif role == "tool":
            result: JSON = {"type": "tool_result", "tool_use_id": msg["tool_call_id"]}
            if isinstance(content, list):
                _openai_text_of(content, f"{path}.content")  # validates: text parts only
                result["content"] = [
                    {"type": "text", "text": p.get("text") or p.get("refusal") or ""}
                    for p in content
                ]
                result["content"] = [b for b in result["content"] if b["text"]] or ""
            else:
                result["content"] = _openai_text_of(content, f"{path}.content")
            add("user", [result])
        else:  # "function", the one role left after validation
            raise _bad(f"{path}: legacy function messages are not supported; use tools", path)

    if not out_msgs:
        raise _bad("messages: at least one non-system message is required", "messages")
    for msg in out_msgs:
        blocks = msg["content"]
        if len(blocks) == 1 and blocks[0]["type"] == "text":
            msg["content"] = blocks[0]["text"]

    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = default_max_tokens

    out: JSON = {"model": model, "messages": out_msgs, "max_tokens": max_tokens}
    if system_parts:
        out["system"] = SYSTEM_JOIN.join(system_parts)
    temperature = body.get("temperature")
    if temperature is not None:
        out["temperature"] = min(max(float(temperature), 0.0), 1.0)
    if body.get("top_p") is not None:
        out["top_p"] = body["top_p"]
    if _is_int(body.get("top_k")):
        out["top_k"] = body["top_k"]
    stop = body.get("stop")
    if isinstance(stop, str):
        out["stop_sequences"] = [stop]
    elif stop:
        out["stop_sequences"] = list(stop)
    if body.get("stream") is not None:
        out["stream"] = bool(body["stream"])
    if isinstance(body.get("user"), str) and body["user"]:
        out["metadata"] = {"user_id": body["user"]}

    tools = body.get("tools")
    if tools:
        out["tools"] = [_openai_tool_to_anthropic(t, f"tools[{i}]") for i, t in enumerate(tools)]
        choice = _openai_tool_choice(body.get("tool_choice"))
        if body.get("parallel_tool_calls") is False:
            choice = choice or {"type": "auto"}
            if choice["type"] != "none":
                choice["disable_parallel_tool_use"] = True
        if choice is not None:
            out["tool_choice"] = choice
    output_format = _openai_output_format(body.get("response_format"))
    if output_format is not None:
        out["output_config"] = {"format": output_format}
    return out


def _tool_call_to_block(call: JSON, path: str) -> JSON:
    if call.get("type", "function") != "function":
        raise _bad(f"{path}.type: only function tool calls are supported", f"{path}.type")
    fn = call["function"]
    args = fn.get("arguments")
    return {
        "type": "tool_use",
        "id": call["id"],
        "name": fn["name"],
        "input": parse_tool_arguments(args),
    }


def _openai_tool_to_anthropic(tool: JSON, path: str) -> JSON:
    if tool["type"] != "function":
        raise _bad(f'{path}: only {{"type": "function"}} tools are supported', path)
    fn = tool["function"]
    params = fn.get("parameters")
    if params is None:
        schema: JSON = {"type": "object", "properties": {}}
    else:
        schema = copy.deepcopy(params)
        if "type" not in schema:
            schema = {"type": "object", **schema}
            schema.setdefault("properties", {})
        elif schema["type"] != "object":
            raise _bad(
                f'{path}.function.parameters: must be a JSON Schema with "type": "object"',
                f"{path}.function.parameters",
            )
    out: JSON = {"name": fn["name"]}
    if isinstance(fn.get("description"), str) and fn["description"]:
        out["description"] = fn["description"]
    out["input_schema"] = schema
    if isinstance(fn.get("strict"), bool):
        out["strict"] = fn["strict"]
    return out


def _openai_tool_choice(choice: Any) -> JSON | None:
    if choice is None:
        return None
    if choice == "auto":
        return {"type": "auto"}
    if choice == "none":
        return {"type": "none"}
    if choice == "required":
        return {"type": "any"}
    if choice.get("type") == "function":
        return {"type": "tool", "name": choice["function"]["name"]}
    raise _bad(
        f"tool_choice: type {choice.get('type')!r} cannot be sent to an Anthropic upstream",
        "tool_choice",
    )


def anthropic_response_to_openai(
    resp: JSON, *, model: str | None = None, created: int | None = None
) -> JSON:
    """A non-streamed Anthropic message -> an OpenAI ``chat.completion``.

    ``id`` is ``"chatcmpl-" + resp["id"]``; ``model`` defaults to the upstream's. Text
    blocks are concatenated; ``thinking`` and server-tool blocks are not carried over.
    ``created`` defaults to now (the one impure input; pass it for reproducible output).
    """
    text_parts: list[str] = []
    calls: list[JSON] = []
    content = resp.get("content")
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            text_parts.append(block["text"])
        elif block.get("type") == "tool_use":
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {
                        "name": block.get("name"),
                        "arguments": _dumps(block.get("input") or {}),
                    },
                }
            )
    text = ASSISTANT_TEXT_JOIN.join(text_parts)
    message: JSON = {
        "role": "assistant",
        "content": text if (text or not calls) else None,
        "refusal": None,
    }
    if calls:
        message["tool_calls"] = calls
    rid = resp.get("id")
    return {
        "id": f"chatcmpl-{rid}" if isinstance(rid, str) and rid else f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model or resp.get("model") or "",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": openai_finish_reason(
                    resp.get("stop_reason"), has_tool_calls=bool(calls)
                ),
            }
        ],
        "usage": anthropic_usage_to_openai(resp.get("usage")),
    }


class AnthropicStreamToOpenAI:
    """Translates a streamed Anthropic message (event name + parsed data) into OpenAI
    ``chat.completion.chunk`` SSE bytes.

    ``feed(event, data)`` returns encoded chunks: a first ``{"role": "assistant"}`` delta at
    ``message_start``, ``content`` deltas for text, and tool calls
    in OpenAI form (a first delta with index, id, type, function name and ``arguments: ""``,
    then argument fragments; a tool call whose input streamed no text gets ``"{}"``).
    ``finish()`` emits the ``finish_reason`` chunk, the usage chunk (``choices: []``, only when
    ``include_usage``) and ``data: [DONE]``. With ``include_usage`` every other chunk carries
    ``"usage": null``, as OpenAI does. ``error(message)`` returns ``data: {"error": {...}}``
    and ends the stream; an upstream ``error`` event is translated the same way.
    """

    def __init__(
        self,
        model: str,
        include_usage: bool,
        *,
        completion_id: str | None = None,
        created: int | None = None,
        capture_limit: int | None = None,
    ) -> None:
        self.model = model
        self.include_usage = include_usage
        self.completion_id = completion_id
        self.created = int(time.time()) if created is None else created
        self._started = False
        self._done = False
        self._text = TextCapture(capture_limit)
        self._sent_text = False
        self._tools: dict[int, list[Any]] = {}  # block index -> [tool index, id, name, args, start]
        self._tool_order: list[list[Any]] = []
        self._usage: JSON = {}
        self._saw_usage = False
        self._stop_reason: str | None = None
        self._stop_sequence: str | None = None

    @property
    def text(self) -> str:
        """The text delivered to the client so far (up to ``capture_limit`` characters)."""
        return self._text.text

    @property
    def text_truncated(self) -> bool:
        """More text was delivered than ``capture_limit`` let ``text`` keep."""
        return self._text.truncated

    @property
    def has_tool_calls(self) -> bool:
        """Whether the reply calls tools (O(1), unlike ``tool_calls``)."""
        return bool(self._tool_order)

    @property
    def tool_calls(self) -> list[tuple[str, str, str]]:
        """(id, name, arguments JSON as sent to the client so far) per call, in order."""
        return [(t[1], t[2], _joined(t[3])) for t in self._tool_order]

    @property
    def usage(self) -> JSON | None:
        """The upstream's own (Anthropic-shaped) usage: ``message_start`` values updated by
        ``message_delta``'s cumulative ones, once any arrived."""
        return dict(self._usage) if self._saw_usage else None

    @property
    def client_usage(self) -> JSON | None:
        """The OpenAI usage sent (or to be sent) in the final usage chunk, once known."""
        return anthropic_usage_to_openai(self._usage) if self._saw_usage else None

    @property
    def stop_reason(self) -> str | None:
        """The upstream's Anthropic stop_reason."""
        return self._stop_reason

    @property
    def finish_reason(self) -> str | None:
        if self._stop_reason is None and not self._done:
            return None
        return openai_finish_reason(self._stop_reason, has_tool_calls=bool(self._tool_order))

    @property
    def done(self) -> bool:
        return self._done

    def _chunk(self, delta: JSON, finish_reason: str | None = None) -> bytes:
        data: JSON = {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        if self.include_usage:
            data["usage"] = None
        return sse.encode(data)

    def _start(self, message: Any = None) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        if self.completion_id is None:
            mid = message.get("id") if isinstance(message, dict) else None
            self.completion_id = (
                f"chatcmpl-{mid}"
                if isinstance(mid, str) and mid
                else f"chatcmpl-{uuid.uuid4().hex}"
            )
        # No "content" key yet: a reply that turns out to be tool calls only must accumulate
        # to content null, as the unstreamed completion has (see finish() for empty replies).
        return [self._chunk({"role": "assistant"})]

    def _take_usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        for key in (
            "input_tokens",
            "output_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
        ):
            if _is_int(usage.get(key)):
                self._usage[key] = usage[key]
                self._saw_usage = True

    def feed(self, event: str | None, data: JSON) -> list[bytes]:
        if self._done or not isinstance(data, dict):
            return []
        etype = event or data.get("type")
        if etype == "error":
            err = data.get("error")
            msg = err.get("message") if isinstance(err, dict) else err
            etype_ = err.get("type") if isinstance(err, dict) else None
            return [
                *self._start(),
                self.error(str(msg or "upstream error"), str(etype_ or "api_error")),
            ]
        if etype == "message_start":
            message = data.get("message")
            out = self._start(message)
            if isinstance(message, dict):
                self._take_usage(message.get("usage"))
            return out
        out = self._start()
        if etype == "content_block_start":
            out.extend(self._on_block_start(data))
        elif etype == "content_block_delta":
            out.extend(self._on_block_delta(data))
        elif etype == "content_block_stop":
            out.extend(self._on_block_stop(data))
        elif etype == "message_delta":
            self._on_message_delta(data)
        return out

    def _on_block_start(self, data: JSON) -> list[bytes]:
        block = data.get("content_block")
        index = data.get("index")
        if not isinstance(block, dict) or not _is_int(index):
            return []
        if block.get("type") == "text":
            text = block.get("text")
            if isinstance(text, str) and text:
                return [self._text_chunk(text)]
        elif block.get("type") == "tool_use":
            start = block.get("input")
            tool = [len(self._tool_order), str(block.get("id") or ""), str(block.get("name") or "")]
            tool += [[], start if isinstance(start, dict) else {}]
            self._tools[index] = tool
            self._tool_order.append(tool)
            return [
                self._chunk(
                    {
                        "tool_calls": [
                            {
                                "index": tool[0],
                                "id": tool[1],
                                "type": "function",
                                "function": {"name": tool[2], "arguments": ""},
                            }
                        ]
                    }
                )
            ]
        return []

    def _text_chunk(self, text: str) -> bytes:
        self._text.add(text)
        self._sent_text = True
        return self._chunk({"content": text})

    def _args_chunk(self, tool: list[Any], text: str) -> bytes:
        tool[3].append(text)
        return self._chunk({"tool_calls": [{"index": tool[0], "function": {"arguments": text}}]})

    def _on_block_delta(self, data: JSON) -> list[bytes]:
        delta = data.get("delta")
        if not isinstance(delta, dict):
            return []
        if delta.get("type") == "text_delta":
            text = delta.get("text")
            if isinstance(text, str) and text:
                return [self._text_chunk(text)]
        elif delta.get("type") == "input_json_delta":
            index = data.get("index")
            tool = self._tools.get(index) if _is_int(index) else None
            partial = delta.get("partial_json")
            if tool is not None and isinstance(partial, str) and partial:
                return [self._args_chunk(tool, partial)]
        return []

    def _on_block_stop(self, data: JSON) -> list[bytes]:
        index = data.get("index")
        tool = self._tools.pop(index, None) if _is_int(index) else None
        if tool is not None and not tool[3]:
            return [self._args_chunk(tool, _dumps(tool[4]))]
        return []

    def _on_message_delta(self, data: JSON) -> None:
        delta = data.get("delta")
        if isinstance(delta, dict):
            if isinstance(delta.get("stop_reason"), str):
                self._stop_reason = delta["stop_reason"]
            if isinstance(delta.get("stop_sequence"), str):
                self._stop_sequence = delta["stop_sequence"]
        self._take_usage(data.get("usage"))

    def finish(self) -> list[bytes]:
        if self._done:
            return []
        out = self._start()
        for index in list(self._tools):
            out.extend(self._on_block_stop({"index": index}))
        self._done = True
        reason = openai_finish_reason(self._stop_reason, has_tool_calls=bool(self._tool_order))
        empty = not self._sent_text and not self._tool_order
        out.append(self._chunk({"content": ""} if empty else {}, reason))
        if self.include_usage:
            out.append(
                sse.encode(
                    {
                        "id": self.completion_id,
                        "object": "chat.completion.chunk",
                        "created": self.created,
                        "model": self.model,
                        "choices": [],
                        "usage": anthropic_usage_to_openai(self._usage),
                    }
                )
            )
        out.append(sse.encode("[DONE]"))
        return out

    def error(self, message: str | ProxyError, error_type: str = "api_error") -> bytes:
        """``data: {"error": {...}}`` in OpenAI's error shape; the stream is over after it."""
        self._done = True
        if isinstance(message, ProxyError):
            return sse.encode(message.body("openai"))
        return sse.encode(
            {"error": {"message": message, "type": error_type, "param": None, "code": None}}
        )
