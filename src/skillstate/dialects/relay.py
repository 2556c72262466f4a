"""Stream relays: read an upstream SSE stream, hand the client its own dialect's bytes, and
capture what the state engine needs (text, tool calls, usage) on the way.

A same-dialect relay forwards each event's raw bytes untouched. The terminal event
(`data: [DONE]` / `message_stop`) is held back: the pipeline commits the turn first and
then calls `finish()`.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from ..ledger import Usage, usage_from_anthropic, usage_from_openai
from . import sse
from .capture import TextCapture
from .translate import AnthropicStreamToOpenAI, OpenAIStreamToAnthropic


class StreamRelay(Protocol):
    @property
    def text(self) -> str: ...

    has_tool_calls: bool
    usage: Usage | None
    model: str | None
    complete: bool  # the upstream sent its terminal event
    upstream_error: str | None  # the upstream sent an error event
    error_forwarded: bool  # ... and it was passed to the client as is

    def feed(self, event: sse.SSEEvent) -> list[bytes]: ...
    def finish(self) -> list[bytes]: ...
    def error(self, message: str) -> bytes: ...


class _Capture:
    """Bounded text capture shared by all relays."""

    def __init__(self, limit: int) -> None:
        self._text = TextCapture(limit)
        self.has_tool_calls = False
        self.usage: Usage | None = None
        self.model: str | None = None
        self.complete = False
        self.upstream_error: str | None = None
        self.error_forwarded = False  # the upstream's own error event reached the client

    def add_text(self, s: str) -> None:
        self._text.add(s)

    @property
    def text(self) -> str:
        return self._text.text

    @property
    def truncated(self) -> bool:
        return self._text.truncated


def openai_error_event(message: str) -> bytes:
    return sse.encode({"error": {"message": message, "type": "api_error", "code": "stream_error"}})


def anthropic_error_event(message: str) -> bytes:
    return sse.encode(
        {"type": "error", "error": {"type": "api_error", "message": message}}, event="error"
    )


class OpenAIRelay(_Capture):
    """OpenAI upstream -> OpenAI client."""

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
            chunk = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            return [event.raw]
        if not isinstance(chunk, dict):
            return [event.raw]
        if "error" in chunk:
            err = chunk["error"]
            self.upstream_error = str(err.get("message") if isinstance(err, dict) else err)
            self.error_forwarded = True
            return [event.raw]
        self.model = chunk.get("model") or self.model
        usage = chunk.get("usage")
        if usage:
            self.usage = usage_from_openai(usage)
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

    def error(self, message: str) -> bytes:
        return openai_error_event(message)


class AnthropicRelay(_Capture):
    """Anthropic upstream -> Anthropic client."""

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
            data = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            return [event.raw]
        if not isinstance(data, dict):
            return [event.raw]
        if name == "message_start":
            msg = data.get("message") or {}
            self.model = msg.get("model") or self.model
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

    def error(self, message: str) -> bytes:
        return anthropic_error_event(message)


class OpenAIToAnthropicRelay(_Capture):
    """OpenAI upstream -> Anthropic client, through the stream translator."""

    def __init__(self, *, request_model: str, capture_limit: int) -> None:
        super().__init__(capture_limit)
        # The translator captures the text it delivers; the relay reads that capture.
        self._t = OpenAIStreamToAnthropic(request_model, capture_limit=capture_limit)

    def feed(self, event: sse.SSEEvent) -> list[bytes]:
        if event.data == "[DONE]":
            self.complete = True
            return []
        if not event.data:
            return []
        try:
            chunk = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            return []
        if not isinstance(chunk, dict):
            return []
        if "error" in chunk:
            err = chunk["error"]
            self.upstream_error = str(err.get("message") if isinstance(err, dict) else err)
            return []
        self.model = chunk.get("model") or self.model
        if chunk.get("usage"):
            self.usage = usage_from_openai(chunk["usage"])
        out = self._t.feed(chunk)
        self.has_tool_calls = self._t.has_tool_calls
        return out

    @property
    def text(self) -> str:
        return self._t.text

    @property
    def truncated(self) -> bool:
        return self._t.text_truncated

    def finish(self) -> list[bytes]:
        return self._t.finish()

    def error(self, message: str) -> bytes:
        return self._t.error(message)


class AnthropicToOpenAIRelay(_Capture):
    """Anthropic upstream -> OpenAI client, through the stream translator."""

    def __init__(self, *, model: str, include_usage: bool, capture_limit: int) -> None:
        super().__init__(capture_limit)
        # The translator captures the text it delivers; the relay reads that capture.
        self._t = AnthropicStreamToOpenAI(model, include_usage, capture_limit=capture_limit)

    def feed(self, event: sse.SSEEvent) -> list[bytes]:
        name = event.event
        if name is None or not event.data:
            return []
        try:
            data = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            return []
        if name == "message_stop":
            self.complete = True
        if name == "error":
            err = (data.get("error") or {}) if isinstance(data, dict) else {}
            self.upstream_error = str(err.get("message") or "upstream error")
            return []
        out = self._t.feed(name, data)
        self.has_tool_calls = self._t.has_tool_calls
        if self._t.usage is not None:
            self.usage = usage_from_anthropic(self._t.usage)
        if isinstance(data, dict) and name == "message_start":
            self.model = (data.get("message") or {}).get("model") or self.model
        return out

    @property
    def text(self) -> str:
        return self._t.text

    @property
    def truncated(self) -> bool:
        return self._t.text_truncated

    def finish(self) -> list[bytes]:
        return self._t.finish()

    def error(self, message: str) -> bytes:
        return self._t.error(message)


def make_relay(
    client: str,
    upstream: str,
    *,
    request_model: str,
    client_wants_usage: bool,
    capture_limit: int,
) -> StreamRelay:
    if client == upstream == "openai":
        return OpenAIRelay(client_wants_usage=client_wants_usage, capture_limit=capture_limit)
    if client == upstream == "anthropic":
        return AnthropicRelay(capture_limit=capture_limit)
    if client == "anthropic":
        return OpenAIToAnthropicRelay(request_model=request_model, capture_limit=capture_limit)
    return AnthropicToOpenAIRelay(
        model=request_model, include_usage=client_wants_usage, capture_limit=capture_limit
    )
