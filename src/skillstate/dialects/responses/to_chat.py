"""A Responses API event stream -> chat-completions chunks (a chat client in front of an
upstream of kind ``openai-responses``; a Messages client reads them through one more relay,
``ChainedRelay``). Event shapes: the openai SDK's ResponseStreamEvent types."""

from __future__ import annotations

import time
from typing import Any

from ... import jsontext
from ...errors import ProxyError
from .. import sse
from ..capture import RelayCapture
from ..openai import openai_error_event, usage_from_openai
from .failure import failed_response_error
from .from_chat import (
    chat_completion_id,
    chat_finish_reason,
    chat_logprobs,
    chat_tool_call,
)
from .from_chat import responses_usage_to_chat as _usage_to_chat
from .translate import object_or_empty, token_logprobs

# The events that stream a call's arguments (or input): chat's name for the call's kind,
# and whether the event carries the whole (its done event) or a piece.
_CALL_EVENTS = {
    "response.function_call_arguments.delta": ("function", False),
    "response.function_call_arguments.done": ("function", True),
    "response.custom_tool_call_input.delta": ("custom", False),
    "response.custom_tool_call_input.done": ("custom", True),
}
_MEMBER = {"function": "arguments", "custom": "input"}  # the member each kind streams
# The events that stream a message part: chat's member for it, the event's member that
# carries it, and whether that is the whole (the part's done event) or a piece.
_PART_EVENTS = {
    "response.output_text.delta": ("content", "delta", False),
    "response.output_text.done": ("content", "text", True),
    "response.refusal.delta": ("refusal", "delta", False),
    "response.refusal.done": ("refusal", "refusal", True),
}
# A message part's type -> chat's member for it, and the part's member that holds it.
_PART_MEMBERS = {"output_text": ("content", "text"), "refusal": ("refusal", "refusal")}


class _Call:
    """A tool call being streamed: its index among the reply's calls, chat's name for its
    kind, and what of its arguments (or input) the client was sent."""

    __slots__ = ("index", "kind", "sent")

    def __init__(self, index: int, kind: str) -> None:
        self.index, self.kind, self.sent = index, kind, ""


class ResponsesToChatRelay(RelayCapture):
    """Responses upstream -> chat client. ``response.created`` opens the reply (the role
    chunk), text, refusal and tool-call deltas become content, refusal and ``tool_calls``
    deltas (a call's first chunk carries its id, type and name, as OpenAI streams them);
    ``response.completed`` / ``response.incomplete`` is held until the turn is committed,
    then ``finish()`` sends the finish_reason chunk, the usage chunk (``choices: []``, when
    the client asked for it with ``stream_options.include_usage``) and ``[DONE]``.
    ``response.failed`` and ``error`` events end the stream with the upstream's message
    (the pipeline writes it as chat's error chunk, ``error()``). A done event (a part's, a
    call's arguments', an item's) whose text or arguments run past the deltas sent sends
    the rest: a server may stream none, or send an item only when it is done."""

    def __init__(self, *, request_model: str, include_usage: bool, capture_limit: int) -> None:
        super().__init__(capture_limit)
        self.model = request_model
        self._include_usage = include_usage
        self._id = chat_completion_id(None)
        self._created = int(time.time())
        self._started = False
        self._calls: dict[Any, _Call] = {}  # by the call item's id and its output_index
        self._call_count = 0
        # What was sent of each message part: by output index, content index and member.
        self._parts: dict[tuple[Any, Any, str], str] = {}
        self._said = False  # some text, refusal or call went out
        self._response: dict[str, Any] = {}  # the terminal event's response object

    def _chunk(
        self, delta: dict[str, Any], finish_reason: str | None = None, logprobs: Any = None
    ) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        data: dict[str, Any] = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self.model,
            "choices": [choice],
        }
        if self._include_usage:
            data["usage"] = None  # as OpenAI sends every chunk before the usage chunk
        return sse.encode(data)

    def _start(self, response: Any = None) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        resp = object_or_empty(response)
        self._id = chat_completion_id(resp.get("id"))
        if isinstance(resp.get("created_at"), int):
            self._created = resp["created_at"]
        self.note_model(resp.get("model"))
        # No "content" yet: a reply of tool calls only accumulates to content null, as the
        # unstreamed completion has it (finish() sends "" for a reply that said nothing).
        return [self._chunk({"role": "assistant"})]

    def feed(self, event: sse.SSEEvent) -> list[bytes]:
        # Data that is not JSON raises: the stream is unreadable (streaming._feed).
        data = jsontext.loads(event.data) if event.data else None
        if not isinstance(data, dict):
            return []
        etype = data.get("type") or event.event
        # The error the upstream reports, its code kept: an error event carries its code
        # and message itself, a failed response in its ``error``.
        if etype == "error":
            self.upstream_error = failed_response_error({"error": data})
            return []
        if etype == "response.failed":
            self.upstream_error = failed_response_error(data.get("response"))
            return []
        out = self._start(data.get("response"))
        if etype in ("response.completed", "response.incomplete"):
            self._response = object_or_empty(data.get("response"))
            self.note_model(self._response.get("model"))
            resp = self._response
            self.usage = usage_from_openai(resp.get("usage"), resp.get("service_tier"))
            self.complete = True
        elif etype == "response.output_item.added":
            out += self._call_opened(data)
        elif etype in _PART_EVENTS:
            member, said, done = _PART_EVENTS[etype]
            at = (data.get("output_index"), data.get("content_index"))
            logprobs = None if done else chat_logprobs(token_logprobs(data.get("logprobs")))
            out += self._part_piece(at, member, data.get(said), done, logprobs)
        elif etype in _CALL_EVENTS:
            kind, done = _CALL_EVENTS[etype]
            piece = data.get(_MEMBER[kind] if done else "delta")
            out += self._call_piece(data, piece, kind, done)
        elif etype == "response.output_item.done":
            out += self._item_done(data)
        return out

    def _item_done(self, data: dict[str, Any]) -> list[bytes]:
        """An item's whole: what its deltas did not send (all of it from a server that
        sends items only when they are done, as Codex's tests do)."""
        item = object_or_empty(data.get("item"))
        index = data.get("output_index")
        if item.get("type") == "message":
            out: list[bytes] = []
            for k, part in enumerate(item.get("content") or ()):
                ptype = object_or_empty(part).get("type")
                said = _PART_MEMBERS.get(ptype) if isinstance(ptype, str) else None
                if said is not None:
                    out += self._part_piece((index, k), said[0], part.get(said[1]), True)
            return out
        call = chat_tool_call(item)
        if call is None:
            return []
        out = [] if self._call_of(data) is not None else self._call_opened(data)
        kind = call["type"]
        return out + self._call_piece(data, call[kind][_MEMBER[kind]], kind, True)

    def _call_opened(self, data: dict[str, Any]) -> list[bytes]:
        """A function_call or custom_tool_call item opened: its first chunk."""
        item = object_or_empty(data.get("item"))
        head = chat_tool_call({**item, "arguments": "", "input": ""})
        if head is None:
            return []  # a message, reasoning, a hosted call: nothing to say yet
        call = _Call(self._call_count, head["type"])
        self._call_count += 1
        self._calls[("at", data.get("output_index"))] = call
        if isinstance(item.get("id"), str):
            self._calls[item["id"]] = call
        self.has_tool_calls = self._said = True
        return [self._chunk({"tool_calls": [{"index": call.index, **head}]})]

    def _call_of(self, data: dict[str, Any]) -> _Call | None:
        """The call an event is about: by its item's id, else by its output index."""
        item_id = data.get("item_id") or object_or_empty(data.get("item")).get("id")
        found = self._calls.get(item_id) if isinstance(item_id, str) else None
        return found or self._calls.get(("at", data.get("output_index")))

    def _call_piece(self, data: dict[str, Any], piece: Any, kind: str, done: bool) -> list[bytes]:
        """A delta of a call's arguments (or input); on a done event, what the deltas did
        not send of the whole (all of it when none came)."""
        call = self._call_of(data)
        if call is None or call.kind != kind or not isinstance(piece, str):
            return []
        if done:
            if not piece.startswith(call.sent):
                return []  # deltas that disagree with the whole: the client has the deltas
            piece = piece[len(call.sent) :]
        if not piece:
            return []
        call.sent += piece
        delta = {"index": call.index, kind: {_MEMBER[kind]: piece}}
        return [self._chunk({"tool_calls": [delta]})]

    def _part_piece(
        self, at: tuple[Any, Any], member: str, piece: Any, done: bool, logprobs: Any = None
    ) -> list[bytes]:
        """A delta of a message part's text (chat's ``content``) or refusal (``refusal``);
        on a done event, what the deltas did not send of the whole."""
        if not isinstance(piece, str):
            return []
        key = (*at, member)
        sent = self._parts.get(key, "")
        if done:
            if not piece.startswith(sent):
                return []  # deltas that disagree with the whole: the client has the deltas
            piece = piece[len(sent) :]
        if not piece:
            return []
        self._parts[key] = sent + piece
        if member == "content":
            self.add_text(piece)
        self._said = True
        return [self._chunk({member: piece}, logprobs=logprobs)]

    def finish(self) -> list[bytes]:
        out = self._start()
        resp = self._response
        reason = chat_finish_reason(
            resp.get("status"), resp.get("incomplete_details"), self.has_tool_calls
        )
        out.append(self._chunk({} if self._said else {"content": ""}, reason))
        if self._include_usage:
            usage = _usage_to_chat(resp.get("usage"))
            out.append(
                sse.encode(
                    {
                        "id": self._id,
                        "object": "chat.completion.chunk",
                        "created": self._created,
                        "model": self.model,
                        "choices": [],
                        "usage": usage,
                    }
                )
            )
        out.append(sse.encode("[DONE]"))
        return out

    def error(self, message: str | ProxyError) -> bytes:
        return openai_error_event(message)
