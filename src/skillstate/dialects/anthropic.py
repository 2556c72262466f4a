"""Anthropic Messages as a dialect: request checks, transcript layout, replies, usage, errors,
the upstream endpoint and the native stream relay."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import orjson

from .. import jsontext
from ..cost.usage import Usage, optional_token_count, speed, token_count
from ..engine.context import DialectContext, Split, correction_text, observation, state_text
from ..engine.stripper import (
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
    json_error_object,
    typed_items_problem,
)
from .capture import RelayCapture
from .checks import bad_request as _bad
from .checks import check_bounds, is_one_of
from .checks import is_int as _is_int

NAME: Final = "anthropic"
# ProxyError kind -> Anthropic error type
_ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    # Anthropic has no conflict type; 409 with invalid_request_error is what its API sends.
    "conflict": "invalid_request_error",
    "request_too_large": "request_too_large",
    "rate_limit": "rate_limit_error",
    "api_error": "api_error",
    "upstream_unreachable": "api_error",
    "timeout": "timeout_error",
    "overloaded": "overloaded_error",
}


# -- request checks ----------------------------------------------------------------------


# Every content-block type the Anthropic Messages API (including its beta surface, per the
# anthropic SDK's *BlockParam types) accepts in a request. Anything else is "unknown".
ANTHROPIC_BLOCK_TYPES = frozenset(
    {
        "text",
        "image",
        "document",
        "search_result",
        "thinking",
        "redacted_thinking",
        "tool_use",
        "tool_result",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "container_upload",
        "mcp_tool_use",
        "mcp_tool_result",
        "compaction",
        "advisor_tool_result",
        "tool_reference",
        "browser_state",
        "tool_addition",
        "tool_removal",
        "fallback",
    }
)
_TOOL_RESULT_CONTENT_TYPES = frozenset(
    {"text", "image", "document", "search_result", "tool_reference", "browser_state"}
)
_ASSISTANT_ONLY = frozenset({"tool_use", "thinking", "redacted_thinking"})
# A role:"system" message inside ``messages`` (mid-conversation system messages: no beta
# header, Claude Code sends one) takes text, and the beta's tool changes (the anthropic SDK's
# BetaSystemMessageParam); its content may be left out when it carries an output_config.
_SYSTEM_MESSAGE_BLOCKS = frozenset({"text", "tool_addition", "tool_removal"})
# thinking {"type": "enabled"}: budget_tokens "must be >= 1024" (the SDK's
# ThinkingConfigEnabledParam). Not checked against max_tokens: with interleaved thinking
# (a beta header, which Claude Code sends) the budget may exceed it.
_MIN_THINKING_BUDGET = 1024
_TOOL_CHOICE_TYPES = frozenset({"auto", "any", "tool", "none"})


def validate_count_tokens_request(body: Any, checked: int = 0) -> None:
    """As :func:`validate_anthropic_request` for ``/v1/messages/count_tokens`` (no
    ``max_tokens``)."""
    validate_anthropic_request(body, checked, count_tokens=True)


def validate_anthropic_request(body: Any, checked: int = 0, *, count_tokens: bool = False) -> None:
    """Raise ``ProxyError("invalid_request", ...)`` naming the first problem in an Anthropic
    Messages request body. Only structure is checked, not values an upstream may refuse.
    ``checked``: the leading messages that passed this check before (each message is judged
    on its own; ``skillstate.sessions.transcripts``)."""
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model: required, a non-empty string", "model")
    if "max_tokens" not in body and not count_tokens:
        raise _bad("max_tokens: required", "max_tokens")
    max_tokens = body.get("max_tokens", 0)
    if not _is_int(max_tokens) or max_tokens < 0:
        raise _bad("max_tokens: must be a non-negative integer", "max_tokens")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages: required, a non-empty array", "messages")
    _validate_system(body.get("system"))
    for i, msg in enumerate(messages[checked:] if checked else messages, checked):
        _validate_message(msg, f"messages[{i}]")
    _check_tool_results(messages, checked)
    if "tools" in body and body["tools"] is not None:
        _validate_tools(body["tools"])
    _validate_output_config(body)
    if "tool_choice" in body and body["tool_choice"] is not None:
        tc = body["tool_choice"]
        if not isinstance(tc, dict) or not is_one_of(tc.get("type"), _TOOL_CHOICE_TYPES):
            raise _bad(
                'tool_choice: must be an object with type "auto", "any", "tool" or "none"',
                "tool_choice",
            )
        if tc["type"] == "tool" and (not isinstance(tc.get("name"), str) or not tc["name"]):
            raise _bad('tool_choice: type "tool" requires a string name', "tool_choice.name")
        dptu = tc.get("disable_parallel_tool_use")
        if dptu is not None and not isinstance(dptu, bool):
            raise _bad(
                "tool_choice.disable_parallel_tool_use: must be a boolean",
                "tool_choice.disable_parallel_tool_use",
            )
    stops = body.get("stop_sequences")
    if stops is not None and (
        not isinstance(stops, list) or not all(isinstance(s, str) for s in stops)
    ):
        raise _bad("stop_sequences: must be an array of strings", "stop_sequences")
    _validate_sampling(body)
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise _bad("stream: must be a boolean", "stream")
    if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
        raise _bad("metadata: must be an object", "metadata")


def _validate_sampling(body: JSON) -> None:
    """temperature and top_p within 0..1 (the API reference's ranges), top_k an integer (the
    legacy default -1 meant "off", so no bound), thinking as the API takes it."""
    check_bounds(body, "temperature", 0, 1)
    check_bounds(body, "top_p", 0, 1)
    check_bounds(body, "top_k", None, None, integer=True)
    thinking = body.get("thinking")
    if thinking is None:
        return
    if not isinstance(thinking, dict) or not isinstance(thinking.get("type"), str):
        raise _bad("thinking: must be an object with a string type", "thinking")
    if thinking["type"] == "enabled":
        budget = thinking.get("budget_tokens")
        if not _is_int(budget) or budget < _MIN_THINKING_BUDGET:
            raise _bad(
                f"thinking.budget_tokens: must be an integer >= {_MIN_THINKING_BUDGET}"
                f" when thinking is enabled; got {budget!r}",
                "thinking.budget_tokens",
            )


def _validate_system(system: Any) -> None:
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list):
        raise _bad("system: must be a string or an array of text blocks", "system")
    for j, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise _bad(f"system[{j}]: must be a text block", f"system[{j}]")
        if not isinstance(block.get("text"), str):
            raise _bad(f"system[{j}].text: must be a string", f"system[{j}].text")


def _validate_message(msg: Any, path: str) -> None:
    if not isinstance(msg, dict):
        raise _bad(f"{path}: must be an object", path)
    role = msg.get("role")
    if role not in ("user", "assistant", "system"):
        raise _bad(f'{path}.role: must be "user" or "assistant", got {role!r}', f"{path}.role")
    if "content" not in msg:
        if role == "system" and isinstance(msg.get("output_config"), dict):
            return  # a per-turn output_config alone
        raise _bad(f"{path}.content: required", f"{path}.content")
    content = msg["content"]
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _bad(
            f"{path}.content: must be a string or an array of content blocks, "
            f"got {type(content).__name__}",
            f"{path}.content",
        )
    for j, block in enumerate(content):
        bpath = f"{path}.content[{j}]"
        btype = _validate_block(block, bpath)
        if role == "system" and btype not in _SYSTEM_MESSAGE_BLOCKS:
            raise _bad(
                f"{bpath}: a system message may only contain text, tool_addition and "
                f"tool_removal blocks, not {btype}",
                f"{bpath}.type",
            )
        if role == "user" and btype in _ASSISTANT_ONLY:
            raise _bad(f"{bpath}: {btype} blocks are only allowed in assistant messages", bpath)
        if role == "assistant" and btype == "tool_result":
            raise _bad(f"{bpath}: tool_result blocks are only allowed in user messages", bpath)


def _validate_block(block: Any, path: str, allowed: frozenset[str] = ANTHROPIC_BLOCK_TYPES) -> str:
    if not isinstance(block, dict):
        raise _bad(f"{path}: a content block must be an object", path)
    btype = block.get("type")
    if not isinstance(btype, str):
        raise _bad(f"{path}.type: required", f"{path}.type")
    if btype not in allowed:
        raise _bad(f"{path}: unknown content block type {btype!r}", f"{path}.type")
    if btype == "text":
        if not isinstance(block.get("text"), str):
            raise _bad(f"{path}.text: must be a string", f"{path}.text")
    elif btype in ("image", "document"):
        source = block.get("source")
        if not isinstance(source, dict) or not isinstance(source.get("type"), str):
            raise _bad(f"{path}.source: must be an object with a type", f"{path}.source")
        stype = source["type"]
        if stype == "base64" and not (
            isinstance(source.get("data"), str) and isinstance(source.get("media_type"), str)
        ):
            raise _bad(
                f"{path}.source: base64 sources need string media_type and data", f"{path}.source"
            )
        if stype == "url" and not isinstance(source.get("url"), str):
            raise _bad(f"{path}.source.url: must be a string", f"{path}.source.url")
    elif btype == "tool_use":
        for key in ("id", "name"):
            if not isinstance(block.get(key), str) or not block[key]:
                raise _bad(f"{path}.{key}: tool_use requires a non-empty string", f"{path}.{key}")
        if not isinstance(block.get("input"), dict):
            raise _bad(f"{path}.input: tool_use input must be an object", f"{path}.input")
    elif btype == "tool_result":
        tid = block.get("tool_use_id")
        if not isinstance(tid, str) or not tid:
            raise _bad(
                f"{path}.tool_use_id: tool_result requires a non-empty string tool_use_id",
                f"{path}.tool_use_id",
            )
        content = block.get("content")
        if isinstance(content, list):
            for k, inner in enumerate(content):
                _validate_block(inner, f"{path}.content[{k}]", _TOOL_RESULT_CONTENT_TYPES)
        elif content is not None and not isinstance(content, str):
            raise _bad(f"{path}.content: must be a string or an array of blocks", f"{path}.content")
        if block.get("is_error") is not None and not isinstance(block["is_error"], bool):
            raise _bad(f"{path}.is_error: must be a boolean", f"{path}.is_error")
    elif btype == "thinking" and not isinstance(block.get("thinking"), str):
        raise _bad(f"{path}.thinking: must be a string", f"{path}.thinking")
    return btype


def _block_ids(msg: Any, btype: str, key: str) -> list[tuple[int, str]]:
    """(position, id) of ``msg``'s content blocks of type ``btype`` (their ``key``)."""
    content = msg.get("content")
    if not isinstance(content, list):
        return []
    return [(j, b[key]) for j, b in enumerate(content) if b.get("type") == btype]


def _check_tool_results(messages: list[Any], checked: int) -> None:
    """As the API: a turn's tool_use blocks are answered, each, by tool_result blocks in the
    user turn right after it, and a tool_result answers a tool_use of the assistant turn
    just before; tool_use ids are unique. Consecutive messages of a role are taken as one
    turn and system messages as standing between turns (the API is no more lenient).
    Messages before ``checked`` passed before: the walk starts at the assistant turn the
    first new message may answer, and judges what the new messages change (a new tool_use
    id is compared with that turn's and the new messages')."""
    start = checked
    while start > 0 and messages[start - 1].get("role") != "assistant":
        start -= 1
    while start > 0 and messages[start - 1].get("role") in ("assistant", "system"):
        start -= 1
    calls: dict[str, int] = {}  # the last assistant turn's tool_use ids -> their message
    answered: set[str] = set()  # those the user turn after it answered
    seen: set[str] = set()
    turn: str | None = None
    last_user = -1
    for i in range(start, len(messages)):
        role = messages[i].get("role")
        if role == "assistant":
            if turn == "user":
                _all_answered(calls, answered, last_user >= checked)
                calls = {}
            for j, tid in _block_ids(messages[i], "tool_use", "id"):
                if tid in seen and i >= checked:
                    raise _bad(
                        f"messages[{i}].content[{j}]: tool_use ids must be unique; "
                        f"{tid!r} is used twice",
                        f"messages[{i}].content[{j}].id",
                    )
                seen.add(tid)
                calls[tid] = i
        elif role == "user":
            if turn != "user":
                answered = set()
            last_user = i
            for j, tid in _block_ids(messages[i], "tool_result", "tool_use_id"):
                if tid not in calls and i >= checked:
                    raise _bad(
                        f"messages[{i}].content[{j}]: unexpected tool_use_id {tid!r} found in "
                        "tool_result blocks: each tool_result block must have a corresponding "
                        "tool_use block in the previous message",
                        f"messages[{i}].content[{j}].tool_use_id",
                    )
                answered.add(tid)
        else:
            continue  # a system message stands between turns
        turn = role
    if turn == "user":
        _all_answered(calls, answered, last_user >= checked)


def _all_answered(calls: dict[str, int], answered: set[str], judged: bool) -> None:
    missing = [tid for tid in calls if tid not in answered]
    if missing and judged:
        i = calls[missing[0]]
        raise _bad(
            f"messages[{i}]: tool_use ids were found without tool_result blocks immediately "
            f"after: {', '.join(missing)}. Each tool_use block must have a corresponding "
            "tool_result block in the next message",
            f"messages[{i}].content",
        )


def _validate_tools(tools: Any) -> None:
    if not isinstance(tools, list):
        raise _bad("tools: must be an array", "tools")
    for i, tool in enumerate(tools):
        path = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _bad(f"{path}: must be an object", path)
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise _bad(f"{path}.name: required, a non-empty string", f"{path}.name")
        if tool.get("type") in (None, "custom"):
            schema = tool.get("input_schema")
            if not isinstance(schema, dict) or schema.get("type") != "object":
                raise _bad(
                    f'{path}.input_schema: must be a JSON Schema object with "type": "object"',
                    f"{path}.input_schema",
                )
            if tool.get("description") is not None and not isinstance(tool["description"], str):
                raise _bad(f"{path}.description: must be a string", f"{path}.description")


def _validate_output_config(body: JSON) -> None:
    """Structured outputs: ``output_config`` (and the beta ``output_format``) shapes."""
    config = body.get("output_config")
    if config is None:
        fmt = body.get("output_format")
        param = "output_format"
    elif not isinstance(config, dict):
        raise _bad("output_config: must be an object", "output_config")
    else:
        fmt = config.get("format")
        param = "output_config.format"
    if fmt is None:
        return
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise _bad(f'{param}: must be an object with type "json_schema"', param)
    if not isinstance(fmt.get("schema"), dict):
        raise _bad(f"{param}.schema: must be a JSON Schema object", f"{param}.schema")


# -- transcript layout ---------------------------------------------------------------------


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content) if isinstance(content, list) else []


class AnthropicContext:
    """System text is the top-level ``system`` field; tool results are blocks in user turns."""

    transcript_key = "messages"

    # Anthropic keeps system text in a top-level field, so no message is a system message.
    def is_system(self, msg: dict[str, Any]) -> bool:
        return False

    def is_user_turn(self, msg: dict[str, Any]) -> bool:
        return msg.get("role") == "user"

    def is_tool_result(self, msg: dict[str, Any]) -> bool:
        content = msg.get("content")
        return isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content
        )

    def has_tool_calls(self, msg: dict[str, Any]) -> bool:
        content = msg.get("content")
        return (
            msg.get("role") == "assistant"
            and isinstance(content, list)
            and any(isinstance(b, dict) and b.get("type") == "tool_use" for b in content)
        )

    def compact(
        self, body: dict[str, Any], split: Split, contract: str, state: dict[str, Any]
    ) -> dict[str, Any]:
        msgs = body["messages"]
        head: list[Any] = []
        if split.task is not None:  # in the stable prefix from the first turn on
            for task in msgs[split.task : split.task_end]:
                head.extend(_blocks(task.get("content")))
        head.append({"type": "text", "text": contract})
        head.append({"type": "text", "text": state_text(state)})
        obs = observation(msgs, split)
        # System messages inside `messages` (Claude Code's environment text) are instructions,
        # not history: each is kept, as sent, in its place before or after the task.
        before = [m for m in msgs[: split.task or 0] if m.get("role") == "system"]
        after = [
            m for m in msgs[(split.task or 0) : split.observation] if m.get("role") == "system"
        ]
        # Keep user/assistant alternation: the observation's leading user turn joins the
        # prefix turn instead of following it as a second user message.
        if obs and obs[0].get("role") == "user" and not after:
            first = obs.pop(0)
            head.extend(_blocks(first.get("content")))
        prefix = [*before, {"role": "user", "content": head}, *after]
        return {**body, "messages": [*prefix, *obs]}

    def full(self, body: dict[str, Any], contract: str) -> dict[str, Any]:
        system = body.get("system")
        if system is None or system == "":
            new_system: Any = contract
        elif isinstance(system, str):
            new_system = system + "\n\n" + contract
        else:
            new_system = [*system, {"type": "text", "text": contract}]
        return {**body, "system": new_system}

    def correction(
        self, body: dict[str, Any], reply_text: str, errors: Sequence[str]
    ) -> dict[str, Any]:
        extra = [
            {"role": "assistant", "content": reply_text or "(no text)"},
            {"role": "user", "content": correction_text(errors)},
        ]
        return {**body, "messages": [*body["messages"], *extra]}

    def instruct(self, body: dict[str, Any], text: str) -> dict[str, Any]:
        # Joined to a trailing user turn (after its tool results), so roles keep alternating.
        msgs = body["messages"]
        note = {"type": "text", "text": text}
        last = msgs[-1] if msgs else None
        if isinstance(last, dict) and last.get("role") == "user":
            joined = {**last, "content": [*_blocks(last.get("content")), note]}
            return {**body, "messages": [*msgs[:-1], joined]}
        return {**body, "messages": [*msgs, {"role": "user", "content": [note]}]}


# -- usage ------------------------------------------------------------------------------------


def usage_from_anthropic(u: Mapping[str, Any] | None) -> Usage | None:
    """Anthropic usage -> ``Usage``; None when missing or malformed.

    Anthropic's ``input_tokens`` EXCLUDES ``cache_read_input_tokens`` and
    ``cache_creation_input_tokens``, so total input = the sum of the three. ``speed: "fast"``
    (fast mode) is billed at its own rates. The writes' split
    by TTL, ``cache_creation: {"ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens"}``
    (in a stream: on ``message_start`` only; ``message_delta`` repeats the sum without it),
    gives ``cache_write_1h_tokens``, which are billed at twice the input price. A missing or
    malformed split counts every write as a five-minute one, as before the split existed,
    rather than losing the call's usage.
    """
    if not isinstance(u, Mapping):
        return None
    inp, out = token_count(u.get("input_tokens")), token_count(u.get("output_tokens"))
    read = optional_token_count(u, "cache_read_input_tokens")
    write = optional_token_count(u, "cache_creation_input_tokens")
    if inp is None or out is None or read is None or write is None:
        return None
    split = u.get("cache_creation")
    hour = 0
    if isinstance(split, Mapping):
        hour = optional_token_count(split, "ephemeral_1h_input_tokens") or 0
    fast = speed(u.get("speed"))
    return Usage(inp + read + write, out, read, write, min(hour, write), speed=fast)


def _message_problem(resp: JSON) -> BadReply | None:
    """What makes a Messages reply no reply (``Dialect.reply_problem``): ``content`` that is
    not a list of blocks, each an object with a ``type``. An empty list is a reply (the API
    sends one at ``max_tokens``, or when the model had nothing to add). An error object
    under status 200 is named as such."""
    return typed_items_problem(resp, "content", "a message whose", "blocks", "a block")


# -- the native stream relay ------------------------------------------------------------------


def anthropic_error_event(message: str | ProxyError) -> bytes:
    """An in-band stream error in Anthropic's shape (a ProxyError: with its error type)."""
    if isinstance(message, ProxyError):
        return sse.encode(ANTHROPIC.error_body(message), event="error")
    return sse.encode(
        {"type": "error", "error": {"type": "api_error", "message": message}}, event="error"
    )


class AnthropicRelay(RelayCapture):
    """Anthropic upstream -> Anthropic client: each event's bytes untouched; ``message_stop``
    held back until the turn is committed."""

    def __init__(self, *, capture_limit: int) -> None:
        super().__init__(capture_limit)
        self._held: list[bytes] = []
        self._usage_raw: dict[str, Any] = {}

    def feed(self, event: sse.SSEEvent) -> list[bytes]:
        name = event.event
        if name == "message_stop":
            self.complete = True
            self._held.append(event.raw)
            return []
        if name in (None, "ping") or not event.data:
            return [event.raw]
        try:
            data = jsontext.loads(event.data)
        except orjson.JSONDecodeError:
            return [event.raw]
        if not isinstance(data, dict):
            return [event.raw]
        if name == "message_start":
            msg = data.get("message") or {}
            self.note_model(msg.get("model"))
            self._merge_usage(msg.get("usage"))
        elif name == "content_block_start":
            if (data.get("content_block") or {}).get("type") in ("tool_use", "server_tool_use"):
                self.has_tool_calls = True
        elif name == "content_block_delta":
            delta = data.get("delta") or {}
            if delta.get("type") == "text_delta":
                self.add_text(delta.get("text") or "")
        elif name == "message_delta":
            self._merge_usage(data.get("usage"))
        elif name == "error":
            err = data.get("error") or {}
            self.upstream_error = str(err.get("message") or "upstream error")
            self.error_forwarded = True
        return [event.raw]

    def _merge_usage(self, u: Any) -> None:
        if isinstance(u, dict):
            self._usage_raw.update({k: v for k, v in u.items() if v is not None})
            self.usage = usage_from_anthropic(self._usage_raw)

    def finish(self) -> list[bytes]:
        return self._held or [sse.encode({"type": "message_stop"}, event="message_stop")]

    def error(self, message: str | ProxyError) -> bytes:
        return anthropic_error_event(message)


# -- the reply envelope in a stream -----------------------------------------------------------


_TOOL_USE_BLOCKS = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})


def _calls_a_tool(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") in _TOOL_USE_BLOCKS


class AnthropicEventStripper:
    """Strips the envelope from a Messages stream, event by event. Each ``text`` block's
    ``text_delta`` is stripped and the rest flushed before its ``content_block_stop``. A
    text block's ``content_block_start`` is held until the block has text: a block left
    empty is not sent at all (the API refuses empty text blocks when the client sends the
    message back), and the blocks after it are renumbered. The action fallback (a reply
    that was only the envelope shows its action) applies when nothing was shown before in
    the same message and no tool_use block follows: such a block is held until the next
    event says which."""

    def __init__(self) -> None:
        self._stripper: EnvelopeStripper | None = None  # of the open text block
        self._held_start: dict[str, Any] | None = None  # its content_block_start, not yet sent
        # A closed envelope-only block whose action shows unless a tool_use block follows:
        # (its content_block_start, the action, its content_block_stop).
        self._pending: tuple[dict[str, Any], str, dict[str, Any]] | None = None
        self._dropped = 0  # empty text blocks not sent: later indexes move down
        self._shown = False  # some text of this message went out
        self.removed_chars = 0

    def end(self, data: str) -> list[Event]:
        return []  # a Messages stream has no end sentinel: message_stop closes it

    def tool_chars(self, name: str | None, data: JSON) -> int:
        if not name:
            name = str(data.get("type") or "")
        if name == "content_block_start":
            block = data.get("content_block")
            if isinstance(block, dict) and block.get("type") == "tool_use":
                return len(str(block.get("name") or ""))
        elif name == "content_block_delta":
            delta = data.get("delta")
            if isinstance(delta, dict) and delta.get("type") == "input_json_delta":
                return len(str(delta.get("partial_json") or ""))
        return 0

    def _renumber(self, data: dict[str, Any]) -> dict[str, Any]:
        index = data.get("index")
        if self._dropped and isinstance(index, int):
            return {**data, "index": index - self._dropped}
        return data

    def event(self, name: str | None, data: dict[str, Any]) -> list[Event]:
        """The events to send instead of (``name``, ``data``)."""
        if not name:  # an event without its ``event:`` line: named by its type
            name = str(data.get("type") or "")
        if self._pending is not None:
            return [*self._settle_pending(name, data), *self.event(name, data)]
        if name == "message_start":
            self._shown = False
        block = data.get("content_block")
        if (
            name == "content_block_start"
            and isinstance(block, dict)
            and block.get("type") == "text"
        ):
            self._stripper = EnvelopeStripper()
            initial = block.get("text")
            self._held_start = {**data, "content_block": {**block, "text": ""}}
            if isinstance(initial, str) and initial:
                return self._text(self._stripper.feed(initial), data)
            return []
        if self._stripper is None:
            return [(name, self._renumber(data))]
        delta = data.get("delta")
        if (
            name == "content_block_delta"
            and isinstance(delta, dict)
            and delta.get("type") == "text_delta"
        ):
            text = delta.get("text")
            return self._text(self._stripper.feed(text if isinstance(text, str) else ""), data)
        if name == "content_block_stop":
            stripper, self._stripper = self._stripper, None
            out = self._text(stripper.flush(fallback=False), data)
            self.removed_chars += stripper.removed_chars
            if self._held_start is None:
                return [*out, (name, self._renumber(data))]
            action = "" if self._shown else stripper.fallback_text()
            if action:  # shown unless a tool_use block follows (decided at the next event)
                self._pending = (self._held_start, action, data)
            else:  # nothing was said: the block is not sent
                self._dropped += 1
            self._held_start = None
            return out
        return [(name, self._renumber(data))]

    def _settle_pending(self, name: str, data: dict[str, Any]) -> list[Event]:
        """The held envelope-only block, before (``name``, ``data``): dropped when a tool
        call follows (the model never said its action to the user), else shown as it."""
        assert self._pending is not None
        start, action, stop = self._pending
        self._pending = None
        block = data.get("content_block")
        if name == "content_block_start" and _calls_a_tool(block):
            self._dropped += 1
            return []
        self._held_start = start
        return [*self._text(action, stop), ("content_block_stop", self._renumber(stop))]

    def _text(self, text: str, like: dict[str, Any]) -> list[Event]:
        """A text_delta event for ``text`` (after the held block start, if any)."""
        if not text:
            return []
        out: list[Event] = []
        if self._held_start is not None:
            out.append(("content_block_start", self._renumber(self._held_start)))
            self._held_start = None
        index = like.get("index", 0)
        delta = {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "text_delta", "text": text},
        }
        out.append(("content_block_delta", self._renumber(delta)))
        self._shown = True
        return out


# -- the dialect ------------------------------------------------------------------------------

# The fields Anthropic's count_tokens accepts; it rejects others (max_tokens, stream, ...).
# context_management (beta): the count is after its edits, and the answer reports the count
# before them (``context_management.original_input_tokens``).
COUNT_TOKENS_FIELDS = frozenset(
    {
        "model", "messages", "system", "tools", "tool_choice", "thinking", "mcp_servers",
        "context_management",
    }
)  # fmt: skip


class AnthropicDialect:
    """Anthropic Messages (``POST /v1/messages``)."""

    name = NAME
    client_path = "/messages"
    upstream_path = "/messages"
    token_count: TokenCount | None = TokenCount("/messages/count_tokens", COUNT_TOKENS_FIELDS)
    marker_header: str | None = "anthropic-version"  # the Anthropic SDK always sends it
    transcript = ("messages", "text")
    context: DialectContext = AnthropicContext()

    def validate(self, body: JSON, checked: int = 0) -> None:
        validate_anthropic_request(body, checked)

    def stream_usage_requested(self, body: JSON) -> bool:
        return True  # Anthropic streams always carry usage

    def reply_text(self, resp: JSON) -> tuple[str, bool]:
        content = resp.get("content")
        blocks = content if isinstance(content, list) else []
        # An upstream's reply is hostile: a "text" that is not a string counts as none.
        text = "".join(
            b["text"]
            for b in blocks
            if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        )
        tools = any(isinstance(b, dict) and b.get("type") == "tool_use" for b in blocks)
        return text, tools

    def reply_cut_off(self, resp: JSON) -> bool:
        return resp.get("stop_reason") == "max_tokens"

    def reply_problem(self, resp: JSON) -> BadReply | None:
        return _message_problem(resp)

    def usage(self, raw: Any, tier: Any = None) -> Usage | None:
        return usage_from_anthropic(raw)  # its tiers are in its usage (not priced apart)

    def error_body(self, err: ProxyError) -> JSON:
        return {"type": "error", "error": {"type": _ERROR_TYPES[err.kind], "message": err.message}}

    def error_status(self, err: ProxyError) -> int:
        return err.status

    def relayed_error(self, raw: bytes, status: int) -> tuple[int, bytes] | None:
        body = json_error_object(raw)
        return (status, raw) if body is not None and body.get("type") == "error" else None

    def upstream_headers(self, key: str | None, version: str) -> dict[str, str]:
        out = {"anthropic-version": version}
        if key:
            out["x-api-key"] = key
        return out

    def forwards_header(self, name: str) -> bool:
        return True

    def upstream_body(self, body: JSON, *, stream: bool, grammar: JSON | None) -> JSON:
        return body  # usage is always streamed; the envelope grammar is OpenAI-format only

    def relay(
        self, *, request_model: str, client_wants_usage: bool, capture_limit: int
    ) -> StreamRelay:
        return AnthropicRelay(capture_limit=capture_limit)

    def model_list(self, body: JSON, *, single: bool) -> JSON:
        return models.model_to_anthropic(body) if single else models.models_to_anthropic(body)

    def strip_reply(self, resp: JSON, known: Known = None) -> tuple[JSON, Stripped]:
        # The text blocks of content (a block left empty is dropped; tool_use untouched). A
        # reply that calls a tool gets no action fallback: its envelope-only text block goes.
        content = resp.get("content")
        calls = isinstance(content, list) and any(_calls_a_tool(b) for b in content)
        content, summary = strip_content(content, fallback=not calls)
        return (resp if content is resp.get("content") else {**resp, "content": content}), summary

    def strip_request(self, body: JSON) -> JSON:
        return strip_request_transcript(body, *self.transcript)

    def stream_stripper(self) -> AnthropicEventStripper:
        return AnthropicEventStripper()

    def tool_call_chars(self, resp: JSON) -> int:
        total = 0  # the input counted as compact JSON
        for block in resp.get("content") or ():
            if isinstance(block, dict) and block.get("type") == "tool_use":
                arguments = orjson.dumps(block.get("input"), default=str).decode()
                total += len(str(block.get("name") or "")) + len(arguments)
        return total

    def mask_observation(self, msg: JSON, min_chars: int, stand_in: Callable[[Any], str]) -> JSON:
        content = msg.get("content")
        if isinstance(content, str):
            return {**msg, "content": stand_in(content)} if len(content) >= min_chars else msg
        if not isinstance(content, list):
            return msg
        blocks: list[Any] = []
        changed = False
        for block in content:
            new = block
            if isinstance(block, dict):
                kind = block.get("type")
                if kind == "tool_result" and content_chars(block.get("content", "")) >= min_chars:
                    new = {**block, "content": stand_in(block.get("content", ""))}
                elif kind == "text" and len(block.get("text") or "") >= min_chars:
                    new = {**block, "text": stand_in(block.get("text"))}
                elif kind in ("image", "document") and content_chars([block]) >= min_chars:
                    new = {"type": "text", "text": stand_in(block)}
                    if "cache_control" in block:
                        new["cache_control"] = block["cache_control"]
            changed = changed or new is not block
            blocks.append(new)
        return {**msg, "content": blocks} if changed else msg


ANTHROPIC = AnthropicDialect()
