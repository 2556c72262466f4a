"""OpenAI chat completions as a dialect: request checks, transcript layout, replies, usage,
errors, the upstream endpoint and the native stream relay."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, NoReturn

import orjson

from .. import jsontext
from ..cost.usage import Usage, optional_token_count, service_tier, token_count
from ..engine.context import (
    DialectContext,
    Split,
    correction_text,
    observation,
    split_transcript,
    state_text,
)
from ..engine.stripper import (
    NOTHING,
    EnvelopeStripper,
    Known,
    Stripped,
    strip_content,
    strip_request_transcript,
)
from ..errors import ProxyError
from . import models, sse
from .base import (
    JSON,
    BadReply,
    Event,
    StreamRelay,
    TokenCount,
    content_chars,
    error_under_200,
    json_error_object,
    shape_of,
)
from .capture import RelayCapture
from .checks import bad_request as _bad
from .checks import check_bounds, is_one_of, json_type, validate_allowed_tools

NAME: Final = "openai"

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_TEXT_ROLES = _ROLES - {"tool"}  # the roles that need nothing beside their text
_TOOL_CHOICE_MODES = frozenset({"none", "auto", "required"})
_RESPONSE_FORMATS = frozenset({"text", "json_object", "json_schema"})
# The content-part types each role takes (the openai SDK's *MessageParam types, as the API
# enforces them): a part of another type is a 400 there, and here, before the upstream.
_PART_TYPES = {
    "user": ("text", "image_url", "input_audio", "file"),
    "assistant": ("text", "refusal"),
}
_TEXT_PARTS = ("text",)  # system, developer, tool (and the legacy function role)
# What each part type requires: its member named as the type, a string, or an object
# (with a string member inside it, when one is named).
_PART_NEEDS: dict[str, tuple[type, str | None]] = {
    "text": (str, None),
    "refusal": (str, None),
    "image_url": (dict, "url"),
    "input_audio": (dict, "data"),
    "file": (dict, None),
}
# The API reference's bounds on the numeric request fields (None: unbounded on that side).
_BOUNDS: tuple[tuple[str, float | None, float | None, bool], ...] = (
    ("max_tokens", 0, None, True),
    ("max_completion_tokens", 0, None, True),
    ("n", 1, 128, True),
    ("temperature", 0, 2, False),
    ("top_p", 0, 1, False),
    ("frequency_penalty", -2, 2, False),
    ("presence_penalty", -2, 2, False),
    ("top_logprobs", 0, 20, True),
    ("seed", None, None, True),
)
# ProxyError kind -> OpenAI error type
_ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    "conflict": "invalid_request_error",
    "request_too_large": "invalid_request_error",
    "rate_limit": "rate_limit_error",
    "api_error": "api_error",
    "upstream_unreachable": "api_error",
    "timeout": "timeout_error",
    "overloaded": "overloaded_error",
}


# -- request checks ----------------------------------------------------------------------


def validate_openai_request(body: JSON, checked: int = 0) -> None:
    """Raise ProxyError 400 naming the first structural problem of a chat-completions body.

    Structure only (types and required members), not values an upstream may refuse: after
    this, the transcript adapter and the bridges read the body without checking again.
    ``checked``: the leading messages that passed this check before (each message is judged
    on its own; ``skillstate.sessions.transcripts``)."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _bad("'model' is required and must be a non-empty string", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty array", "messages")
    for i, m in enumerate(messages[checked:] if checked else messages, checked):
        if type(m) is dict and m.get("tool_calls") is None and type(m.get("content")) is str:
            role = m.get("role")
            if type(role) is str and role in _TEXT_ROLES:
                continue  # the usual message, which _validate_message would pass as it is
        _validate_message(m, f"messages[{i}]")
    _check_tool_answers(messages, checked)
    if "stream" in body and not isinstance(body["stream"], bool):
        raise _bad("'stream' must be a boolean", "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("'stream_options' must be an object", "stream_options")
    if body.get("tools") is not None:
        _validate_tools(body["tools"])
    if body.get("tool_choice") is not None:
        _validate_tool_choice(body["tool_choice"])
    if body.get("response_format") is not None:
        _validate_response_format(body["response_format"])
    if body.get("parallel_tool_calls") is not None and not isinstance(
        body["parallel_tool_calls"], bool
    ):
        raise _bad("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    for key, low, high, integer in _BOUNDS:
        if body.get(key) is not None:  # most are absent: no call for them
            check_bounds(body, key, low, high, integer=integer)
    if body.get("logprobs") is not None and not isinstance(body["logprobs"], bool):
        raise _bad("'logprobs' must be a boolean", "logprobs")
    stop = body.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise _bad("'stop' must be a string or an array of strings", "stop")


def _validate_message(m: Any, path: str) -> None:
    if not isinstance(m, dict):
        raise _bad(f"{path} must be an object", path)
    role = m.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise _bad(
            f"{path}.role must be one of {', '.join(sorted(_ROLES))}; got {role!r}",
            f"{path}.role",
        )
    if role == "tool" and (not isinstance(m.get("tool_call_id"), str) or not m["tool_call_id"]):
        raise _bad(f"{path}: a tool message needs tool_call_id", f"{path}.tool_call_id")
    content = m.get("content")
    if role == "tool" and content is None:
        # Required by the API (a tool message is its call's output), and what a translation
        # to Messages or Responses sends as that output.
        raise _bad(
            f"Missing required parameter: '{path}.content'.",
            f"{path}.content",
            "missing_required_parameter",
        )
    if content is not None and not isinstance(content, (str, list)):
        raise _bad(f"{path}.content must be a string or an array of parts", f"{path}.content")
    allowed = _PART_TYPES.get(role, _TEXT_PARTS)
    for k, part in enumerate(content if isinstance(content, list) else ()):
        _validate_part(part, f"{path}.content[{k}]", allowed)
    calls = m.get("tool_calls")
    if calls is None:
        return
    if role != "assistant" or not isinstance(calls, list):
        raise _bad(f"{path}.tool_calls must be an array on an assistant message", path)
    for k, call in enumerate(calls):
        cpath = f"{path}.tool_calls[{k}]"
        if not isinstance(call, dict):
            raise _bad(f"{cpath} must be an object", cpath)
        if not isinstance(call.get("id"), str) or not call["id"]:
            raise _bad(f"{cpath}.id: required, a non-empty string", f"{cpath}.id")
        ctype = call.get("type", "function")
        if ctype not in ("function", "custom"):
            continue  # the upstream's to judge
        spec = call.get(ctype)
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
            raise _bad(f"{cpath}.{ctype}.name: required, a non-empty string", cpath)
        said = "arguments" if ctype == "function" else "input"
        value = spec.get(said)
        if (value is not None or ctype == "custom") and not isinstance(value, str):
            raise _bad(f"{cpath}.{ctype}.{said}: must be a string", cpath)


def call_chars(call: Any) -> int:
    """Characters a ``tool_calls`` entry (or a streamed piece of one) says: a function's name
    and arguments, a custom tool's name and input."""
    total = 0
    for kind, said in (("function", "arguments"), ("custom", "input")):
        spec = call.get(kind) if isinstance(call, dict) else None
        if isinstance(spec, dict):
            total += sum(len(spec[k]) for k in ("name", said) if isinstance(spec.get(k), str))
    return total


def _validate_part(part: Any, path: str, allowed: tuple[str, ...]) -> None:
    """A content part as the API takes it: an object whose string ``type`` the role allows,
    with the member that type requires (``text`` a string, ``image_url.url`` a string...)."""
    if not isinstance(part, dict):
        raise _bad(
            f"Invalid type for '{path}': expected an object, but got {json_type(part)} instead",
            path,
            "invalid_type",
        )
    ptype = part.get("type")
    if not isinstance(ptype, str):
        missing = "type" not in part
        raise _bad(
            f"Missing required parameter: '{path}.type'"
            if missing
            else f"Invalid type for '{path}.type': expected a string, but got {json_type(ptype)}",
            f"{path}.type",
            "missing_required_parameter" if missing else "invalid_type",
        )
    if ptype not in allowed:
        raise _bad(
            f"Invalid value: {ptype!r} for '{path}.type'. Supported values are: "
            + ", ".join(repr(t) for t in allowed),
            f"{path}.type",
            "invalid_value",
        )
    kind, inner = _PART_NEEDS[ptype]
    value = part.get(ptype)
    if not isinstance(value, kind):
        _missing_or_wrong(value, f"{path}.{ptype}", "a string" if kind is str else "an object")
    if inner is not None and isinstance(value, dict) and not isinstance(value.get(inner), str):
        _missing_or_wrong(value.get(inner), f"{path}.{ptype}.{inner}", "a string")


def _missing_or_wrong(value: Any, param: str, expected: str) -> NoReturn:
    if value is None:
        raise _bad(f"Missing required parameter: '{param}'", param, "missing_required_parameter")
    raise _bad(
        f"Invalid type for '{param}': expected {expected}, but got {json_type(value)} instead",
        param,
        "invalid_type",
    )


def _check_tool_answers(messages: list[Any], checked: int) -> None:
    """Tool messages answer the tool calls of the assistant message just before them (only
    tool messages between), and every call is answered before the next other message: the
    API refuses anything else (a 400 naming the message). Messages before ``checked`` passed
    before; the walk starts at the assistant message whose calls they may still answer."""
    start = checked
    while start > 0 and messages[start - 1].get("role") == "tool":
        start -= 1
    if start > 0:
        start -= 1  # the message the leading tool messages answer (or none)
    calls: dict[str, bool] | None = None  # the open calls' ids -> answered
    owner = 0
    for i in range(start, len(messages)):
        m = messages[i]
        if m.get("role") == "tool":
            if calls is None or m["tool_call_id"] not in calls:
                if i < checked:
                    continue
                raise _bad(
                    f"messages[{i}]: a message with role 'tool' must answer a tool call of the "
                    f"assistant message before it; none has id {m['tool_call_id']!r}",
                    f"messages[{i}].tool_call_id",
                )
            calls[m["tool_call_id"]] = True
            continue
        if i >= checked:
            _all_answered(calls, owner)
        tool_calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        calls = {c["id"]: False for c in tool_calls} if tool_calls else None
        owner = i
    _all_answered(calls, owner)


def _all_answered(calls: dict[str, bool] | None, owner: int) -> None:
    if calls is not None and not all(calls.values()):
        missing = ", ".join(k for k, done in calls.items() if not done)
        raise _bad(
            f"messages[{owner}]: an assistant message with 'tool_calls' must be followed by "
            f"tool messages answering each 'tool_call_id'; no answer for: {missing}",
            f"messages[{owner}].tool_calls",
        )


def _validate_tools(tools: Any) -> None:
    if not isinstance(tools, list):
        raise _bad("'tools' must be an array of tool objects", "tools")
    for i, tool in enumerate(tools):
        path = f"tools[{i}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise _bad(f"{path} must be an object with a string 'type'", path)
        ttype = tool["type"]
        if ttype not in ("function", "custom"):
            continue  # other kinds are for the upstream to accept or refuse
        spec = tool.get(ttype)
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
            raise _bad(f"{path}.{ttype}.name: required, a non-empty string", f"{path}.{ttype}")
        if ttype == "function":
            params = spec.get("parameters")
            if params is not None and not isinstance(params, dict):
                raise _bad(f"{path}.function.parameters must be an object", path)
            desc = spec.get("description")
            if desc is not None and not isinstance(desc, str):
                raise _bad(f"{path}.function.description must be a string", path)


def _validate_tool_choice(choice: Any) -> None:
    if isinstance(choice, str) and choice in _TOOL_CHOICE_MODES:
        return
    if isinstance(choice, dict) and isinstance(choice.get("type"), str):
        ctype = choice["type"]
        if ctype == "allowed_tools":
            nested = choice.get("allowed_tools")
            nested = nested if isinstance(nested, dict) else {}
            path = "tool_choice.allowed_tools"
            validate_allowed_tools(nested.get("mode"), nested.get("tools"), path)
            return
        if ctype not in ("function", "custom"):
            return  # other kinds: the upstream's to judge
        spec = choice.get(ctype)
        if isinstance(spec, dict) and isinstance(spec.get("name"), str) and spec["name"]:
            return
    raise _bad(
        'tool_choice: must be "none", "auto", "required" or '
        '{"type": "function", "function": {"name": ...}}',
        "tool_choice",
    )


def _validate_response_format(fmt: Any) -> None:
    if not isinstance(fmt, dict) or not is_one_of(fmt.get("type"), _RESPONSE_FORMATS):
        raise _bad(
            'response_format: must be an object with type "text", "json_object" or "json_schema"',
            "response_format",
        )
    if fmt["type"] == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise _bad("response_format.json_schema: must be an object", "response_format")
        if spec.get("schema") is not None and not isinstance(spec["schema"], dict):
            raise _bad("response_format.json_schema.schema: must be an object", "response_format")


# -- transcript layout ---------------------------------------------------------------------


class OpenAIContext:
    """System text is in leading system/developer messages; tool results are tool messages."""

    transcript_key = "messages"

    def is_system(self, msg: dict[str, Any]) -> bool:
        return msg.get("role") in ("system", "developer")

    def is_user_turn(self, msg: dict[str, Any]) -> bool:
        return msg.get("role") in ("user", "tool", "function")

    def is_tool_result(self, msg: dict[str, Any]) -> bool:
        return msg.get("role") in ("tool", "function")

    def has_tool_calls(self, msg: dict[str, Any]) -> bool:
        return msg.get("role") == "assistant" and bool(
            msg.get("tool_calls") or msg.get("function_call")
        )

    def compact(
        self, body: dict[str, Any], split: Split, contract: str, state: dict[str, Any]
    ) -> dict[str, Any]:
        msgs = body["messages"]
        out = list(msgs[: split.system_end])
        if split.task is not None:
            out.extend(msgs[split.task : split.task_end])  # in the stable prefix from turn 1 on
        out.append({"role": "user", "content": contract + "\n\n" + state_text(state)})
        out.extend(observation(msgs, split))
        return {**body, "messages": out}

    def full(self, body: dict[str, Any], contract: str) -> dict[str, Any]:
        msgs = body["messages"]
        end = split_transcript(msgs, self).system_end
        out = [*msgs[:end], {"role": "system", "content": contract}, *msgs[end:]]
        return {**body, "messages": out}

    def correction(
        self, body: dict[str, Any], reply_text: str, errors: Sequence[str]
    ) -> dict[str, Any]:
        extra = [
            {"role": "assistant", "content": reply_text},
            {"role": "user", "content": correction_text(errors)},
        ]
        return {**body, "messages": [*body["messages"], *extra]}

    def instruct(self, body: dict[str, Any], text: str) -> dict[str, Any]:
        return {**body, "messages": [*body["messages"], {"role": "user", "content": text}]}


# -- usage ------------------------------------------------------------------------------------


def usage_from_openai(u: Mapping[str, Any] | None, tier: Any = None) -> Usage | None:
    """OpenAI-style usage -> ``Usage``; None when missing or malformed. ``tier``: the
    reply's ``service_tier`` (beside its usage, in the reply or the stream's chunk).

    Chat completions: ``prompt_tokens`` already INCLUDES ``prompt_tokens_details.cached_tokens``
    so input = prompt_tokens, cache_read = cached_tokens. Also accepted: the Responses API
    (``input_tokens``/``output_tokens``/``input_tokens_details.cached_tokens``, same inclusive
    semantics) and DeepSeek's ``prompt_cache_hit_tokens``. OpenAI reports no cache writes (0).
    """
    if not isinstance(u, Mapping):
        return None
    if "prompt_tokens" in u or "completion_tokens" in u:
        inp, out = token_count(u.get("prompt_tokens")), token_count(u.get("completion_tokens"))
        details = u.get("prompt_tokens_details")
    else:
        inp, out = token_count(u.get("input_tokens")), token_count(u.get("output_tokens"))
        details = u.get("input_tokens_details")
    if inp is None or out is None:
        return None
    cached: int | None = 0
    if isinstance(details, Mapping) and details.get("cached_tokens") is not None:
        cached = optional_token_count(details, "cached_tokens")
    elif u.get("prompt_cache_hit_tokens") is not None:
        cached = optional_token_count(u, "prompt_cache_hit_tokens")
    if cached is None or cached > inp:
        return None
    return Usage(inp, out, cached, 0, service_tier=service_tier(tier))


# -- the native stream relay ------------------------------------------------------------------


def openai_error_event(message: str | ProxyError) -> bytes:
    """An in-band stream error in OpenAI's shape: a ProxyError as its error object (an
    error an upstream reported with its own code), else an ``api_error``."""
    if isinstance(message, ProxyError):
        return sse.encode(OPENAI.error_body(message))
    return sse.encode({"error": {"message": message, "type": "api_error", "code": "stream_error"}})


class OpenAIRelay(RelayCapture):
    """OpenAI upstream -> OpenAI client: each event's bytes untouched; ``[DONE]`` held back
    until the turn is committed."""

    def __init__(self, *, client_wants_usage: bool, capture_limit: int) -> None:
        super().__init__(capture_limit)
        self._wants_usage = client_wants_usage
        self._held: list[bytes] = []

    def feed(self, event: sse.SSEEvent) -> list[bytes]:
        if event.data == "[DONE]":
            self.complete = True
            self._held.append(event.raw)
            return []
        if not event.data:
            return [event.raw]
        try:
            chunk = jsontext.loads(event.data)
        except orjson.JSONDecodeError:
            return [event.raw]
        if not isinstance(chunk, dict):
            return [event.raw]
        if "error" in chunk:
            err = chunk["error"]
            self.upstream_error = str(err.get("message") if isinstance(err, dict) else err)
            self.error_forwarded = True
            return [event.raw]
        self.note_model(chunk.get("model"))
        usage = chunk.get("usage")
        if usage:
            self.usage = usage_from_openai(usage, chunk.get("service_tier"))
        choices = chunk.get("choices") or []
        for choice in choices:
            if choice.get("index", 0) != 0:
                continue  # with n > 1 the state follows choice 0, as for a JSON reply
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if isinstance(content, str):
                self.add_text(content)
            if delta.get("tool_calls") or delta.get("function_call"):
                self.has_tool_calls = True
        if usage and not choices and not self._wants_usage:
            return []  # the usage-only chunk we asked for on the client's behalf
        return [event.raw]

    def finish(self) -> list[bytes]:
        return self._held or [b"data: [DONE]\n\n"]

    def error(self, message: str | ProxyError) -> bytes:
        return openai_error_event(message)


# -- the reply envelope in a stream -----------------------------------------------------------

_CHOICE_KEYS_THAT_SPEAK = ("logprobs",)
_DELTA_KEYS_THAT_SPEAK = ("role", "tool_calls", "function_call", "refusal")


class OpenAIChunkStripper:
    """Strips the envelope from a chat-completions stream, chunk by chunk: each choice's
    ``delta.content`` is stripped; a chunk left with nothing to say is dropped; the
    held-back rest goes out in the chunk that carries the choice's ``finish_reason`` (or
    from :meth:`finish`, for a stream that ended without one). The action fallback (a reply
    that was only the envelope shows its action) applies per choice, to a choice that calls
    no tool (its tool calls come after its text, before its ``finish_reason``)."""

    def __init__(self) -> None:
        self._strippers: dict[int, EnvelopeStripper] = {}
        self._calling: set[int] = set()  # choices that call tools: no action fallback
        self._last: dict[str, Any] | None = None  # a chunk to model finish() chunks on

    @property
    def removed_chars(self) -> int:
        return sum(s.removed_chars for s in self._strippers.values())

    def _stripper(self, index: int) -> EnvelopeStripper:
        if index not in self._strippers:
            self._strippers[index] = EnvelopeStripper()
        return self._strippers[index]

    def tool_chars(self, name: str | None, data: JSON) -> int:
        total = 0
        for choice in data.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            calls = delta.get("tool_calls") if isinstance(delta, dict) else None
            total += sum(call_chars(call) for call in (calls if isinstance(calls, list) else ()))
        return total

    def chunk(self, data: dict[str, Any]) -> dict[str, Any] | None:
        """The chunk to send instead of ``data`` (None: send nothing)."""
        out = self.event(None, data)
        return out[0][1] if out else None

    def event(self, name: str | None, data: JSON) -> list[Event]:
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            return [(name, data)]  # e.g. the usage chunk
        self._last = data
        out: list[Any] = []
        speaks = data.get("usage") is not None
        for choice in choices:
            if not isinstance(choice, dict):
                out.append(choice)
                speaks = True
                continue
            index = choice.get("index", 0)
            index = index if isinstance(index, int) else 0
            delta = choice.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            content = delta.get("content")
            finished = choice.get("finish_reason") is not None
            if delta.get("tool_calls") or delta.get("function_call"):
                self._calling.add(index)
            if not isinstance(content, str) and not finished:
                out.append(choice)
                speaks = True
                continue
            stripper = self._stripper(index)
            text = stripper.feed(content) if isinstance(content, str) else ""
            if finished:
                text += stripper.flush(fallback=index not in self._calling)
            new_delta = {k: v for k, v in delta.items() if k != "content"}
            if text:
                new_delta["content"] = text
            elif "content" in delta and content is None:
                new_delta["content"] = None
            if (
                text
                or finished
                or any(k in new_delta for k in _DELTA_KEYS_THAT_SPEAK)
                or any(choice.get(k) is not None for k in _CHOICE_KEYS_THAT_SPEAK)
            ):
                out.append({**choice, "delta": new_delta})
                speaks = True
        if not speaks:
            return []
        return [(name, {**data, "choices": out})]

    def finish(self) -> list[dict[str, Any]]:
        """Chunks with the held-back rest of choices whose stream ended without a
        ``finish_reason`` (call before the terminal ``[DONE]``)."""
        return [chunk for _, chunk in self.end("[DONE]")]

    def end(self, data: str) -> list[Event]:
        if data != "[DONE]":
            return []
        chunks: list[Event] = []
        for index, stripper in self._strippers.items():
            rest = stripper.flush(fallback=index not in self._calling)
            if rest:
                base = self._last or {"object": "chat.completion.chunk"}
                choice = {"index": index, "delta": {"content": rest}, "finish_reason": None}
                chunks.append((None, {**base, "choices": [choice]}))
        self._strippers.clear()
        return chunks


# -- the dialect ------------------------------------------------------------------------------


class OpenAIDialect:
    """OpenAI chat completions (``POST /v1/chat/completions``)."""

    name = NAME
    client_path = "/chat/completions"
    upstream_path = "/chat/completions"
    token_count: TokenCount | None = None
    marker_header: str | None = None  # the default on shared routes
    transcript = ("messages", "text")
    context: DialectContext = OpenAIContext()

    def validate(self, body: JSON, checked: int = 0) -> None:
        validate_openai_request(body, checked)

    def stream_usage_requested(self, body: JSON) -> bool:
        options = body.get("stream_options")
        return isinstance(options, dict) and bool(options.get("include_usage"))

    def reply_text(self, resp: JSON) -> tuple[str, bool]:
        msg = _first_message(resp)
        content = msg.get("content")
        if isinstance(content, list):
            # An upstream's reply is hostile: a "text" that is not a string counts as none.
            content = "".join(
                p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
        text = content if isinstance(content, str) else ""
        return text, bool(msg.get("tool_calls") or msg.get("function_call"))

    def reply_cut_off(self, resp: JSON) -> bool:
        return _first_choice(resp).get("finish_reason") == "length"

    def reply_problem(self, resp: JSON) -> BadReply | None:
        return chat_reply_problem(resp)

    def usage(self, raw: Any, tier: Any = None) -> Usage | None:
        return usage_from_openai(raw, tier)

    def error_body(self, err: ProxyError) -> JSON:
        return {
            "error": {
                "message": err.message,
                "type": _ERROR_TYPES[err.kind],
                "param": err.param,
                "code": err.code,
            }
        }

    def error_status(self, err: ProxyError) -> int:
        # 529 is Anthropic's "overloaded"; OpenAI clients know 503.
        return 503 if err.kind == "overloaded" else err.status

    def relayed_error(self, raw: bytes, status: int) -> tuple[int, bytes] | None:
        if json_error_object(raw) is None:
            return None
        # 529 is Anthropic's "overloaded", also behind OpenAI-format gateways; OpenAI clients
        # know 503.
        return (503 if status == 529 else status), raw

    def upstream_headers(self, key: str | None, version: str) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"} if key else {}

    def forwards_header(self, name: str) -> bool:
        return not name.startswith("anthropic-")

    def upstream_body(self, body: JSON, *, stream: bool, grammar: JSON | None) -> JSON:
        extra: JSON = {}
        if grammar is not None:
            extra["response_format"] = grammar
        if stream:
            # Usage in the stream's last chunk, for the ledger (dropped again for a client
            # that did not ask for it: OpenAIRelay).
            options = body.get("stream_options")
            extra["stream_options"] = {
                **(options if isinstance(options, dict) else {}),
                "include_usage": True,
            }
        return {**body, **extra} if extra else body

    def relay(
        self, *, request_model: str, client_wants_usage: bool, capture_limit: int
    ) -> StreamRelay:
        return OpenAIRelay(client_wants_usage=client_wants_usage, capture_limit=capture_limit)

    def model_list(self, body: JSON, *, single: bool) -> JSON:
        return models.model_to_openai(body) if single else models.models_to_openai(body)

    def strip_reply(self, resp: JSON, known: Known = None) -> tuple[JSON, Stripped]:
        # Every choice's message.content; the state engine reads the first.
        choices = resp.get("choices")
        if not isinstance(choices, list):
            return resp, NOTHING
        first = NOTHING
        out: list[Any] | None = None  # the choices, copied once one changes
        for k, choice in enumerate(choices):
            message = choice.get("message") if isinstance(choice, dict) else None
            if not isinstance(message, dict):
                continue
            calls = bool(message.get("tool_calls") or message.get("function_call"))
            said = message.get("content")
            content, summary = strip_content(said, known=known, fallback=not calls)
            if k == 0:
                first = summary
            if content is not said:
                if calls and not content:  # the text was only the envelope: nothing was said
                    content = None
                if out is None:
                    out = list(choices)
                out[k] = {**choice, "message": {**message, "content": content}}
        return ({**resp, "choices": out} if out is not None else resp), first

    def strip_request(self, body: JSON) -> JSON:
        return strip_request_transcript(body, *self.transcript)

    def stream_stripper(self) -> OpenAIChunkStripper:
        return OpenAIChunkStripper()

    def tool_call_chars(self, resp: JSON) -> int:
        choices = resp.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        message = first.get("message") if isinstance(first, dict) else None
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        return sum(call_chars(call) for call in (calls if isinstance(calls, list) else ()))

    def mask_observation(self, msg: JSON, min_chars: int, stand_in: Callable[[Any], str]) -> JSON:
        role = msg.get("role")
        content = msg.get("content")
        if role in ("tool", "function", "user") and content_chars(content) >= min_chars:
            return {**msg, "content": stand_in(content)}
        return msg


def chat_reply_problem(resp: JSON) -> BadReply | None:
    """What makes a chat completion no reply (``Dialect.reply_problem``): choices that are
    not a non-empty list of objects each with a ``message`` object, whose ``content`` is a
    string, null or a list of parts and whose ``tool_calls`` (when given) a list of objects.
    An error object under status 200 is named as such."""
    choices = resp.get("choices")
    if not isinstance(choices, list) or not choices:
        what = "with no choices" if choices == [] else f"whose choices is {shape_of(choices)}"
        return error_under_200(resp) or BadReply(f"a chat completion {what}")
    for i, choice in enumerate(choices):
        at = f"choices[{i}]"
        if not isinstance(choice, dict):
            return BadReply(f"a chat completion whose {at} is {shape_of(choice)}, not an object")
        msg = choice.get("message")
        if not isinstance(msg, dict):
            return BadReply(
                f"a chat completion whose {at}.message is {shape_of(msg)}, not a message"
            )
        content = msg.get("content")
        if content is not None and not isinstance(content, (str, list)):
            return BadReply(
                f"a chat completion whose {at}.message.content is {shape_of(content)},"
                " not a string, null or a list of parts"
            )
        calls = msg.get("tool_calls")
        if calls is not None and not (
            isinstance(calls, list) and all(isinstance(c, dict) for c in calls)
        ):
            return BadReply(
                f"a chat completion whose {at}.message.tool_calls is {shape_of(calls)},"
                " not a list of tool calls"
            )
    return None


def _first_choice(resp: JSON) -> Mapping[str, Any]:
    choices = resp.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    return first if isinstance(first, dict) else {}


def _first_message(resp: JSON) -> Mapping[str, Any]:
    msg = _first_choice(resp).get("message")
    return msg if isinstance(msg, dict) else {}


OPENAI = OpenAIDialect()
