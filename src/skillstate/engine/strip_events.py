"""Envelope stripping for streamed replies, at the level of the client's stream events.

:class:`StrippingRelay` wraps a relay and runs each client event it produces through the
client dialect's event stripper (``Dialect.stream_stripper``: chat-completion chunks,
Messages events, Responses API events), which returns the events to send instead, with
every text delta run through an :class:`~skillstate.engine.stripper.EnvelopeStripper`. The
per-format strippers live with their dialects; the two older ones are named here too.
"""

from __future__ import annotations

from typing import Any

from .. import jsontext
from ..cost.usage import Usage
from ..dialects.anthropic import AnthropicEventStripper
from ..dialects.base import StreamRelay
from ..dialects.openai import OpenAIChunkStripper
from ..dialects.registry import get_dialect
from ..dialects.sse import SSEEvent, SSEParser, encode
from ..errors import ProxyError

__all__ = ["AnthropicEventStripper", "OpenAIChunkStripper", "StrippingRelay"]


class StrippingRelay:
    """A stream relay whose client bytes go through the envelope stripper.

    Wraps any relay (same-dialect or translating): its client-dialect events are parsed
    again, run through the client dialect's event stripper and re-encoded
    (``rewrite=True``), or passed on byte for byte (``rewrite=False``: the ``keep``
    setting). Either way it counts the characters of the reply's tool calls (name plus
    arguments, in the client's events), for the envelope's share of the output. The
    captured ``text`` is the inner relay's: the unstripped reply, which the judge reads.
    """

    def __init__(self, inner: StreamRelay, client_dialect: str, *, rewrite: bool) -> None:
        self._inner = inner
        self._rewrite = rewrite
        self._parser = SSEParser()
        self._events = get_dialect(client_dialect).stream_stripper()
        self.tool_chars = 0

    # -- what the pipeline reads, from the inner relay -----------------------------------
    @property
    def text(self) -> str:
        return str(self._inner.text)

    @property
    def has_tool_calls(self) -> bool:
        return bool(self._inner.has_tool_calls)

    @property
    def usage(self) -> Usage | None:
        return self._inner.usage

    @property
    def model(self) -> str | None:
        return self._inner.model

    @property
    def complete(self) -> bool:
        return bool(self._inner.complete)

    @property
    def upstream_error(self) -> str | ProxyError | None:
        return self._inner.upstream_error

    @property
    def error_forwarded(self) -> bool:
        return bool(self._inner.error_forwarded)

    @property
    def removed_chars(self) -> int:
        return self._events.removed_chars

    def error(self, message: str | ProxyError) -> bytes:
        raw = self._inner.error(message)
        if not self._rewrite:
            return raw
        # Through the stripper too: a numbered stream's error event continues its numbering.
        return b"".join(b for e in SSEParser().feed(raw) for b in self._event(e))

    # -- the client's bytes ----------------------------------------------------------------
    def feed(self, event: SSEEvent) -> list[bytes]:
        return self._through(self._inner.feed(event))

    def finish(self) -> list[bytes]:
        return self._through(self._inner.finish())

    def _through(self, ready: list[bytes]) -> list[bytes]:
        if not ready:
            return ready
        out: list[bytes] = []
        for event in self._parser.feed(b"".join(ready)):
            out.extend(self._event(event))
        return out if self._rewrite else ready

    def _event(self, event: SSEEvent) -> list[bytes]:
        data: Any = None
        if event.data and event.data != "[DONE]":
            # Data that is not JSON (the client's SDK could not read it either) raises: the
            # stream is unreadable and its turn not committed (streaming._feed).
            data = jsontext.loads(event.data)
        if not isinstance(data, dict):
            if not self._rewrite:
                return [event.raw]
            return [*(encode(d, event=n) for n, d in self._events.end(event.data)), event.raw]
        name = event.event
        self.tool_chars += self._events.tool_chars(name, data)
        if not self._rewrite:
            return []
        out = self._events.event(name, data)
        if not out:
            return []
        if out[1:]:  # a held-back rest or block start with it
            return [encode(d, event=n) for n, d in out]
        name, data = out[0]  # the usual case: one event in, one out
        return [encode(data, event=name)]
