"""Streams to a Responses API client: the native relay (events untouched, the terminal one
held until the turn is committed), the chat-completions -> Responses event translator, and a
chain of two relays (Anthropic -> chat -> Responses)."""

from __future__ import annotations

from typing import Any

import orjson

from ...usage import Usage
from .. import sse
from ..base import JSON, StreamRelay
from ..capture import RelayCapture
from ..openai import usage_from_openai
from .translate import (
    function_call_item,
    message_item,
    new_id,
    response_object,
    usage_to_responses,
)

TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete"})


def error_event(message: str, sequence_number: int = 0) -> bytes:
    """An in-band stream error in the Responses API's shape (``type: error``)."""
    data = {
        "type": "error",
        "code": "stream_error",
        "message": message,
        "param": None,
        "sequence_number": sequence_number,
    }
    return sse.encode(data, event="error")


class ResponsesRelay(RelayCapture):
    """Responses upstream -> Responses client: each event's bytes untouched; the terminal
    event held back until the turn is committed. Keeps the final ``response`` object."""

    def __init__(self, *, capture_limit: int) -> None:
        super().__init__(capture_limit)
        self._held: list[bytes] = []
        self.response: JSON | None = None

    def feed(self, event: sse.SSEEvent) -> list[bytes]:
        try:
            data = orjson.loads(event.data) if event.data else None
        except orjson.JSONDecodeError:
            return [event.raw]
        if not isinstance(data, dict):
            return [event.raw]
        etype = data.get("type") or event.event
        if etype == "response.output_text.delta" and isinstance(data.get("delta"), str):
            self.add_text(data["delta"])
        elif etype == "response.output_item.added":
            item = data.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call":
                self.has_tool_calls = True
        elif etype in ("response.created", "response.in_progress"):
            self._take_response(data)
        elif etype in TERMINAL_EVENTS:
            self._take_response(data)
            self.complete = True
            self._held.append(event.raw)
            return []
        elif etype in ("response.failed", "error"):
            err = (
                data.get("error") if etype == "error" else (data.get("response") or {}).get("error")
            )
            message = err.get("message") if isinstance(err, dict) else data.get("message")
            self.upstream_error = str(message or etype)
            self.error_forwarded = True
        return [event.raw]

    def _take_response(self, data: JSON) -> None:
        resp = data.get("response")
        if not isinstance(resp, dict):
            return
        self.response = resp
        if isinstance(resp.get("model"), str):
            self.model = resp["model"]
        if resp.get("usage"):
            self.usage = usage_from_openai(resp["usage"])

    def finish(self) -> list[bytes]:
        return self._held

    def error(self, message: str) -> bytes:
        return error_event(message)


class ChatToResponsesRelay(RelayCapture):
    """Chat-completions upstream stream -> Responses API events, in the order the API sends
    them: created, in_progress, per output item added / deltas / done, then completed."""

    def __init__(self, *, request_model: str, capture_limit: int) -> None:
        super().__init__(capture_limit)
        self._seq = 0
        self._id = new_id("resp_")
        self.model = request_model
        self._output: list[JSON] = []
        self._open: int | None = None  # output index of the item still receiving deltas
        self._calls: dict[int, int] = {}  # chat tool_call index -> output index
        self._finish_reason: str | None = None
        self._chat_usage: JSON | None = None
        self._started = False
        self.response: JSON | None = None

    def _event(self, etype: str, **fields: Any) -> bytes:
        data = {"type": etype, **fields, "sequence_number": self._seq}
        self._seq += 1
        return sse.encode(data, event=etype)

    def _snapshot(self, status: str) -> JSON:
        return response_object(
            model=self.model or "",
            output=self._output if status != "in_progress" else [],
            usage=usage_to_responses(self._chat_usage) if status != "in_progress" else None,
            finish_reason=self._finish_reason,
            response_id=self._id,
            status=None if status == "done" else status,
        )

    def _start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        snap = self._snapshot("in_progress")
        return [
            self._event("response.created", response=snap),
            self._event("response.in_progress", response=snap),
        ]

    def feed(self, event: sse.SSEEvent) -> list[bytes]:
        chunk = self.openai_chunk(event)
        if chunk is None:
            return []
        out = self._start()
        if isinstance(chunk.get("model"), str):
            self.model = chunk["model"]
        if chunk.get("usage"):
            self._chat_usage = chunk["usage"]
            self.usage = usage_from_openai(chunk["usage"])
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str) and delta["content"]:
                out += self._text_delta(delta["content"])
            for call in delta.get("tool_calls") or ():
                out += self._tool_call(call)
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
        return out

    def _text_delta(self, piece: str) -> list[bytes]:
        self.add_text(piece)
        out: list[bytes] = []
        if self._open is None or self._output[self._open]["type"] != "message":
            out += self._close()
            item = message_item("", status="in_progress")
            item["content"] = []
            self._open = len(self._output)
            self._output.append(item)
            out.append(
                self._event(
                    "response.output_item.added",
                    output_index=self._open,
                    item={**item, "content": []},
                )
            )
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            item["content"].append(part)
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=self._open,
                    content_index=0,
                    part=dict(part),
                )
            )
        item = self._output[self._open]
        item["content"][0]["text"] += piece
        out.append(
            self._event(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=self._open,
                content_index=0,
                delta=piece,
                logprobs=[],
            )
        )
        return out

    def _tool_call(self, call: JSON) -> list[bytes]:
        self.has_tool_calls = True
        index = call.get("index", 0)
        fn = call.get("function") or {}
        out: list[bytes] = []
        if index not in self._calls:
            out += self._close()
            item = function_call_item(
                call.get("id") or new_id("call_"), fn.get("name") or "", "", status="in_progress"
            )
            self._open = self._calls[index] = len(self._output)
            self._output.append(item)
            out.append(
                self._event("response.output_item.added", output_index=self._open, item=dict(item))
            )
        pos = self._calls[index]
        item = self._output[pos]
        if fn.get("name") and not item["name"]:
            item["name"] = fn["name"]
        piece = fn.get("arguments")
        if isinstance(piece, str) and piece:
            item["arguments"] += piece
            out.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=pos,
                    delta=piece,
                )
            )
        return out

    def _close(self) -> list[bytes]:
        """The done events of the item still open."""
        if self._open is None:
            return []
        pos, self._open = self._open, None
        item = self._output[pos]
        item["status"] = "completed"
        out: list[bytes] = []
        if item["type"] == "message":
            part = item["content"][0]
            out.append(
                self._event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=pos,
                    content_index=0,
                    text=part["text"],
                    logprobs=[],
                )
            )
            out.append(
                self._event(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=pos,
                    content_index=0,
                    part=part,
                )
            )
        else:
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=pos,
                    arguments=item["arguments"],
                )
            )
        out.append(self._event("response.output_item.done", output_index=pos, item=item))
        return out

    def finish(self) -> list[bytes]:
        out = self._start() + self._close()
        self.response = snap = self._snapshot("done")
        kind = "response.incomplete" if snap["status"] == "incomplete" else "response.completed"
        out.append(self._event(kind, response=snap))
        return out

    def error(self, message: str) -> bytes:
        return error_event(message, self._seq)


class ChainedRelay:
    """Two relays in a row (upstream -> middle format -> client): the first one's output is
    parsed again as the second one's input. Usage, model and completeness are the first's
    (it reads the upstream); the captured text and tool calls the second's."""

    def __init__(self, first: StreamRelay, second: StreamRelay) -> None:
        self._first = first
        self._second = second
        self._parser = sse.SSEParser()
        self.has_tool_calls = False
        self.usage: Usage | None = None
        self.model: str | None = None
        self.complete = False
        self.upstream_error: str | None = None
        self.error_forwarded = False  # the second relay writes the client's error event

    def _through(self, chunks: list[bytes]) -> list[bytes]:
        events = self._parser.feed(b"".join(chunks)) if chunks else []
        out = [b for e in events for b in self._second.feed(e)]
        first, second = self._first, self._second
        self.has_tool_calls = second.has_tool_calls
        self.usage, self.model, self.complete = first.usage, first.model, first.complete
        self.upstream_error = first.upstream_error or second.upstream_error
        return out

    def feed(self, event: sse.SSEEvent) -> list[bytes]:
        return self._through(self._first.feed(event))

    def finish(self) -> list[bytes]:
        out = self._through(self._first.finish())
        return out + self._second.finish()

    def error(self, message: str) -> bytes:
        return self._second.error(message)

    @property
    def text(self) -> str:
        return self._second.text

    @property
    def response(self) -> JSON | None:
        """The client's final ``response`` object, once the stream is finished."""
        return getattr(self._second, "response", None)
