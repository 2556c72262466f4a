"""A whole reply, as the SSE stream its upstream kind sends for it.

Some upstreams (or gateways in front of them) take ``stream: true`` and answer with the
whole reply as JSON (``application/json``), as they would without the field. The proxy reads
that reply as what it is and turns it into the events the same upstream would have streamed
(``as_stream``), so the turn goes through the one streamed path (relay, translation,
envelope stripping, metering, commit) and the client gets a stream in its own dialect.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson

from .. import jsontext
from . import sse
from .base import BadReply, error_message

JSON = dict[str, Any]
Events = Iterator[bytes]


def is_json_reply(content_type: str | None, first: bytes) -> bool:
    """Whether a 2xx answer to a streamed request is a whole JSON reply, not an SSE
    stream: its content type says JSON and its body opens an object."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    json_type = kind == "application/json" or kind.endswith("+json")
    return json_type and first.lstrip()[:1] == b"{"


def as_stream(kind: str, raw: bytes, problem: Callable[[JSON], BadReply | None]) -> bytes | str:
    """The SSE bytes of the reply ``raw`` (JSON, in upstream kind ``kind``'s format), or
    what makes it no reply of that kind: not JSON, an error object (its message), a reply
    of a shape no provider sends (``problem``: the kind's ``Dialect.reply_problem``)."""
    try:
        resp = jsontext.loads(raw)
    except orjson.JSONDecodeError:
        resp = None
    build = _BUILDERS.get(kind)
    if build is None or not isinstance(resp, dict):
        return error_message(raw)
    if resp.get("error") and not isinstance(resp.get("output"), list):
        return error_message(raw)
    bad = problem(resp)
    if bad is not None:
        return bad.what
    return b"".join(build(resp))


def _openai(resp: JSON) -> Events:
    """A chat completion as its chunks: each choice's message as one delta, then its
    finish reason, then the usage (``choices: []``), then ``[DONE]``."""
    head = {
        "id": resp.get("id") or "chatcmpl-proxy",
        "object": "chat.completion.chunk",
        "created": resp.get("created") or int(time.time()),
        "model": resp.get("model") or "",
    }
    if resp.get("system_fingerprint") is not None:
        head["system_fingerprint"] = resp["system_fingerprint"]
    choices = [c for c in resp.get("choices") or () if isinstance(c, dict)]
    for choice in choices:
        index = choice.get("index", 0)
        message = choice.get("message")
        delta = _chat_delta(message if isinstance(message, dict) else {})
        yield sse.encode({**head, "choices": [{"index": index, "delta": delta}]})
    for choice in choices:
        end = {"index": choice.get("index", 0), "delta": {}, "finish_reason": None}
        end["finish_reason"] = choice.get("finish_reason") or "stop"
        yield sse.encode({**head, "choices": [end]})
    if isinstance(resp.get("usage"), dict):
        yield sse.encode({**head, "choices": [], "usage": resp["usage"]})
    yield sse.encode(b"[DONE]")


def _chat_delta(message: Mapping[str, Any]) -> JSON:
    """A chat message as one streamed delta (tool calls numbered, as deltas carry them)."""
    delta: JSON = {k: v for k, v in message.items() if k not in ("tool_calls", "annotations")}
    delta.setdefault("role", "assistant")
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        delta["tool_calls"] = [
            {"index": i, **c} for i, c in enumerate(calls) if isinstance(c, dict)
        ]
    return delta


def _anthropic(resp: JSON) -> Events:
    """A Messages reply as its events: ``message_start`` (no content), each content block
    as start, delta(s) and stop, then ``message_delta`` (stop reason, usage) and
    ``message_stop``."""
    given = resp.get("usage")
    usage: JSON = given if isinstance(given, dict) else {}
    start = {k: v for k, v in resp.items() if k not in ("content", "stop_reason", "stop_sequence")}
    start.update(content=[], stop_reason=None, stop_sequence=None)
    start["usage"] = {**usage, "output_tokens": 0}
    yield _event("message_start", {"type": "message_start", "message": start})
    for index, block in enumerate(resp.get("content") or ()):
        if isinstance(block, dict):
            yield from _anthropic_block(index, block)
    delta = {"stop_reason": resp.get("stop_reason"), "stop_sequence": resp.get("stop_sequence")}
    yield _event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
    yield _event("message_stop", {"type": "message_stop"})


def _anthropic_block(index: int, block: JSON) -> Events:
    kind = block.get("type")
    deltas: list[JSON] = []
    if kind == "text":
        first = {**block, "text": ""}
        deltas.append({"type": "text_delta", "text": block.get("text") or ""})
    elif kind in ("tool_use", "server_tool_use", "mcp_tool_use"):
        first = {**block, "input": {}}
        partial = orjson.dumps(block.get("input") or {}).decode()
        deltas.append({"type": "input_json_delta", "partial_json": partial})
    elif kind == "thinking":
        first = {**block, "thinking": "", "signature": ""}
        deltas.append({"type": "thinking_delta", "thinking": block.get("thinking") or ""})
        if block.get("signature"):
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
    else:  # redacted thinking, tool results, anything else: whole in its start
        first = block
    yield _event(
        "content_block_start",
        {"type": "content_block_start", "index": index, "content_block": first},
    )
    for delta in deltas:
        yield _event(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        )
    yield _event("content_block_stop", {"type": "content_block_stop", "index": index})


def responses_events(resp: JSON, after: int = -1) -> Events:
    """A Responses reply as its events: created, each output item (added, its text or
    arguments as one delta and done, done), then the terminal event its status names
    (``response.completed``, ``.incomplete`` or ``.failed``) with the reply. ``after``: only
    the events whose ``sequence_number`` is greater (``GET /v1/responses/{id}``'s
    ``starting_after``)."""
    seq = _Sequence(after)
    pending = {**resp, "status": "in_progress", "output": [], "usage": None}
    yield seq.event("response.created", {"response": pending})
    yield seq.event("response.in_progress", {"response": pending})
    for index, item in enumerate(resp.get("output") or ()):
        if isinstance(item, dict):
            yield from _responses_item(seq, index, item)
    status = resp.get("status")
    terminal = f"response.{status}" if status in ("incomplete", "failed") else "response.completed"
    yield seq.event(terminal, {"response": resp})


def _responses_item(seq: _Sequence, index: int, item: JSON) -> Events:
    at: JSON = {"output_index": index}
    item_id = item.get("id")
    kind = item.get("type")
    if kind == "message":
        yield seq.event("response.output_item.added", {**at, "item": {**item, "content": []}})
        at["item_id"] = item_id
        for part_index, part in enumerate(item.get("content") or ()):
            if isinstance(part, dict):
                yield from _responses_part(seq, {**at, "content_index": part_index}, part)
    elif kind == "function_call":
        yield seq.event("response.output_item.added", {**at, "item": {**item, "arguments": ""}})
        args = item.get("arguments") or ""
        at["item_id"] = item_id
        yield seq.event("response.function_call_arguments.delta", {**at, "delta": args})
        yield seq.event("response.function_call_arguments.done", {**at, "arguments": args})
    else:
        yield seq.event("response.output_item.added", {**at, "item": item})
    yield seq.event("response.output_item.done", {"output_index": index, "item": item})


def _responses_part(seq: _Sequence, at: JSON, part: JSON) -> Events:
    empty = {**part, "text": ""} if part.get("type") == "output_text" else part
    yield seq.event("response.content_part.added", {**at, "part": empty})
    if part.get("type") == "output_text":
        text = part.get("text") or ""
        yield seq.event("response.output_text.delta", {**at, "delta": text, "logprobs": []})
        yield seq.event("response.output_text.done", {**at, "text": text, "logprobs": []})
    yield seq.event("response.content_part.done", {**at, "part": part})


class _Sequence:
    """A Responses stream's events, each with its ``sequence_number``."""

    def __init__(self, after: int = -1) -> None:
        self.n = 0
        self.after = after  # the events up to this sequence number are left out (b"")

    def event(self, name: str, data: JSON) -> bytes:
        n = self.n
        self.n += 1
        if n <= self.after:
            return b""
        return _event(name, {"type": name, "sequence_number": n, **data})


def _event(name: str, data: JSON) -> bytes:
    return sse.encode(data, event=name)


_BUILDERS: dict[str, Callable[[JSON], Events]] = {
    "openai": _openai,
    "anthropic": _anthropic,
    "openai-responses": responses_events,
}
