"""The bounded text capture of a streamed reply: what the state engine reads once the stream
ends. Appends cost O(piece); the text is joined when it is read, so a stream builds it once
and holds at most ``limit`` characters however long the reply runs."""

from __future__ import annotations

from typing import Any

from .. import jsontext
from ..cost.usage import Usage
from ..errors import ProxyError, reported_error
from . import sse


class TextCapture:
    """Text pieces up to ``limit`` characters (None: no limit); later pieces are dropped and
    ``truncated`` says so."""

    __slots__ = ("_limit", "_parts", "_size", "truncated")

    def __init__(self, limit: int | None = None) -> None:
        self._parts: list[str] = []
        self._size = 0
        self._limit = limit
        self.truncated = False

    def add(self, piece: str) -> None:
        if not piece:
            return
        if self.truncated:
            return  # the capture is a prefix of the reply, never one with holes
        if self._limit is not None and self._size + len(piece) > self._limit:
            self.truncated = True
            return
        self._parts.append(piece)
        self._size += len(piece)

    def __bool__(self) -> bool:
        return self._size > 0

    @property
    def text(self) -> str:
        # Collapsed on read, so reading again without appending does not join again.
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""


class RelayCapture:
    """What every stream relay records for the state engine and the ledger."""

    def __init__(self, limit: int) -> None:
        self._text = TextCapture(limit)
        self.has_tool_calls = False
        self.usage: Usage | None = None
        self.model: str | None = None
        self.complete = False
        self.upstream_error: str | ProxyError | None = None
        self.error_forwarded = False  # the upstream's own error event reached the client

    def add_text(self, s: object) -> None:
        """Reply text as the upstream sent it: anything but a string (a hostile or broken
        upstream's) is no text."""
        if isinstance(s, str):
            self._text.add(s)

    def openai_chunk(self, event: sse.SSEEvent) -> dict[str, Any] | None:
        """The chunk object of an OpenAI chat-completions stream event, for a relay that
        translates it; None when there is nothing to translate: ``[DONE]`` (which marks the
        stream complete), an empty or non-object event, or an error event (the error it
        reports, its kind and code kept, recorded as ``upstream_error``). Data that is not
        JSON raises (orjson's JSONDecodeError): the stream is unreadable
        (``streaming._feed``)."""
        if event.data == "[DONE]":
            self.complete = True
            return None
        if not event.data:
            return None
        chunk = jsontext.loads(event.data)
        if not isinstance(chunk, dict):
            return None
        if "error" in chunk:
            self.upstream_error = reported_error(chunk["error"])
            return None
        return chunk

    def note_model(self, model: object) -> None:
        """The model an event names, when it names one (a string; anything else is ignored:
        the ledger and the price lookup read it)."""
        if isinstance(model, str) and model:
            self.model = model

    @property
    def text(self) -> str:
        return self._text.text

    @property
    def truncated(self) -> bool:
        return self._text.truncated
