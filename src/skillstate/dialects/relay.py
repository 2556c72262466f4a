"""Stream relays between two dialects: an upstream stream through the stream translator,
captured for the state engine on the way. (A dialect's native relay lives with it.)

The terminal event is held back: the pipeline commits the turn first and then calls
`finish()`.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from .. import jsontext
from ..errors import ProxyError, reported_error
from . import sse
from .anthropic import usage_from_anthropic
from .capture import RelayCapture
from .openai import usage_from_openai
from .translate import AnthropicStreamToOpenAI, OpenAIStreamToAnthropic

_Translator = TypeVar("_Translator", OpenAIStreamToAnthropic, AnthropicStreamToOpenAI)


class _TranslatingRelay(RelayCapture, Generic[_Translator]):
    """A relay whose client bytes come from a stream translator (``_t``): the translator
    captures the text it delivers, and ends or errors the client's stream."""

    _t: _Translator

    @property
    def text(self) -> str:
        return self._t.text

    @property
    def truncated(self) -> bool:
        return self._t.text_truncated

    def finish(self) -> list[bytes]:
        return self._t.finish()

    def error(self, message: str | ProxyError) -> bytes:
        return self._t.error(message)


class OpenAIToAnthropicRelay(_TranslatingRelay[OpenAIStreamToAnthropic]):
    """OpenAI upstream -> Anthropic client, through the stream translator."""

    def __init__(self, *, request_model: str, capture_limit: int) -> None:
        super().__init__(capture_limit)
        # The translator captures the text it delivers; the relay reads that capture.
        self._t = OpenAIStreamToAnthropic(request_model, capture_limit=capture_limit)

    def feed(self, event: sse.SSEEvent) -> list[bytes]:
        chunk = self.openai_chunk(event)
        if chunk is None:
            return []
        self.note_model(chunk.get("model"))
        if chunk.get("usage"):
            self.usage = usage_from_openai(chunk["usage"], chunk.get("service_tier"))
        out = self._t.feed(chunk)
        self.has_tool_calls = self._t.has_tool_calls
        return out


class AnthropicToOpenAIRelay(_TranslatingRelay[AnthropicStreamToOpenAI]):
    """Anthropic upstream -> OpenAI client, through the stream translator."""

    def __init__(self, *, model: str, include_usage: bool, capture_limit: int) -> None:
        super().__init__(capture_limit)
        # The translator captures the text it delivers; the relay reads that capture.
        self._t = AnthropicStreamToOpenAI(model, include_usage, capture_limit=capture_limit)

    def feed(self, event: sse.SSEEvent) -> list[bytes]:
        name = event.event
        if name is None or not event.data:
            return []
        data = jsontext.loads(event.data)  # not JSON: the stream is unreadable (streaming._feed)
        if name == "message_stop":
            self.complete = True
        if name == "error":
            err = (data.get("error") or {}) if isinstance(data, dict) else {}
            if not isinstance(err, dict):  # a shape no provider sends: unreadable
                raise TypeError("an error event whose error is not an object")
            self.upstream_error = reported_error(err)
            return []
        out = self._t.feed(name, data)
        self.has_tool_calls = self._t.has_tool_calls
        if self._t.usage is not None:
            self.usage = usage_from_anthropic(self._t.usage)
        if isinstance(data, dict) and name == "message_start":
            message = data.get("message")
            self.note_model(message.get("model") if isinstance(message, dict) else None)
        return out
