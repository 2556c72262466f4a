"""Envelope stripping for streamed replies, at the level of the client's stream events.

Pure adapters between a relay and the client: they take the parsed JSON payload of each
client-dialect event and return the events to send instead, with every text delta run
through an :class:`~skillstate.strip.EnvelopeStripper` (one per choice / text block).

* :class:`OpenAIChunkStripper`: chat-completion chunks. Each choice's ``delta.content`` is
  stripped; a chunk left with nothing to say is dropped; the held-back rest goes out in
  the chunk that carries the choice's ``finish_reason`` (or from :meth:`finish`, for a
  stream that ended without one).
* :class:`AnthropicEventStripper`: Messages stream events. Each ``text`` block's
  ``text_delta`` is stripped and the rest flushed before its ``content_block_stop``. A text
  block's ``content_block_start`` is held until the block has text: a block left empty is
  not sent at all (the API refuses empty text blocks when the client sends the message
  back), and the blocks after it are renumbered.

The action fallback (a reply that was only the envelope shows its action) applies when
nothing was shown before in the same message.
"""

from __future__ import annotations

from typing import Any

import orjson

from .dialects.base import StreamRelay
from .dialects.sse import SSEEvent, SSEParser, encode
from .ledger import Usage
from .strip import EnvelopeStripper

__all__ = ["AnthropicEventStripper", "OpenAIChunkStripper", "StrippingRelay"]

_CHOICE_KEYS_THAT_SPEAK = ("logprobs",)
_DELTA_KEYS_THAT_SPEAK = ("role", "tool_calls", "function_call", "refusal")


class OpenAIChunkStripper:
    """Strips the envelope from an OpenAI chat-completions stream, chunk by chunk."""

    def __init__(self) -> None:
        self._strippers: dict[int, EnvelopeStripper] = {}
        self._last: dict[str, Any] | None = None  # a chunk to model finish() chunks on

    @property
    def removed_chars(self) -> int:
        return sum(s.removed_chars for s in self._strippers.values())

    def _stripper(self, index: int) -> EnvelopeStripper:
        if index not in self._strippers:
            self._strippers[index] = EnvelopeStripper()
        return self._strippers[index]

    def chunk(self, data: dict[str, Any]) -> dict[str, Any] | None:
        """The chunk to send instead of ``data`` (None: send nothing)."""
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            return data  # e.g. the usage chunk
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
            if not isinstance(content, str) and not finished:
                out.append(choice)
                speaks = True
                continue
            stripper = self._stripper(index)
            text = stripper.feed(content) if isinstance(content, str) else ""
            if finished:
                text += stripper.flush(fallback=True)
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
            return None
        return {**data, "choices": out}

    def finish(self) -> list[dict[str, Any]]:
        """Chunks with the held-back rest of choices whose stream ended without a
        ``finish_reason`` (call before the terminal ``[DONE]``)."""
        chunks = []
        for index, stripper in self._strippers.items():
            rest = stripper.flush(fallback=True)
            if rest:
                base = self._last or {"object": "chat.completion.chunk"}
                choice = {"index": index, "delta": {"content": rest}, "finish_reason": None}
                chunks.append({**base, "choices": [choice]})
        self._strippers.clear()
        return chunks


class AnthropicEventStripper:
    """Strips the envelope from an Anthropic Messages stream, event by event."""

    def __init__(self) -> None:
        self._stripper: EnvelopeStripper | None = None  # of the open text block
        self._held_start: dict[str, Any] | None = None  # its content_block_start, not yet sent
        self._dropped = 0  # empty text blocks not sent: later indexes move down
        self._shown = False  # some text of this message went out
        self.removed_chars = 0

    def _renumber(self, data: dict[str, Any]) -> dict[str, Any]:
        index = data.get("index")
        if self._dropped and isinstance(index, int):
            return {**data, "index": index - self._dropped}
        return data

    def event(self, name: str, data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """The events to send instead of (``name``, ``data``)."""
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
            rest = self._stripper.flush(fallback=not self._shown)
            self.removed_chars += self._stripper.removed_chars
            self._stripper = None
            out = self._text(rest, data)
            if self._held_start is not None:  # nothing was said: the block is not sent
                self._held_start = None
                self._dropped += 1
                return out
            return [*out, (name, self._renumber(data))]
        return [(name, self._renumber(data))]

    def _text(self, text: str, like: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """A text_delta event for ``text`` (after the held block start, if any)."""
        if not text:
            return []
        out: list[tuple[str, dict[str, Any]]] = []
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


class StrippingRelay:
    """A stream relay whose client bytes go through the envelope stripper.

    Wraps any relay (same-dialect or translating): its client-dialect events are parsed
    again, run through :class:`OpenAIChunkStripper` / :class:`AnthropicEventStripper` and
    re-encoded (``rewrite=True``), or passed on byte for byte (``rewrite=False``: the
    ``keep`` setting). Either way it counts the characters of the reply's tool calls (name
    plus arguments, in the client's events), for the envelope's share of the output. The
    captured ``text`` is the inner relay's: the unstripped reply, which the judge reads.
    """

    def __init__(self, inner: StreamRelay, client_dialect: str, *, rewrite: bool) -> None:
        self._inner = inner
        self._anthropic = client_dialect == "anthropic"
        self._rewrite = rewrite
        self._parser = SSEParser()
        self._openai = OpenAIChunkStripper()
        self._events = AnthropicEventStripper()
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
    def upstream_error(self) -> str | None:
        return self._inner.upstream_error

    @property
    def error_forwarded(self) -> bool:
        return bool(self._inner.error_forwarded)

    @property
    def removed_chars(self) -> int:
        return self._events.removed_chars if self._anthropic else self._openai.removed_chars

    def error(self, message: str) -> bytes:
        return self._inner.error(message)

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
            try:
                data = orjson.loads(event.data)
            except orjson.JSONDecodeError:
                data = None
        if not isinstance(data, dict):
            if event.data == "[DONE]" and not self._anthropic and self._rewrite:
                return [*(encode(c) for c in self._openai.finish()), event.raw]
            return [event.raw]
        if self._anthropic:
            self._count_anthropic(event.event, data)
            if not self._rewrite:
                return []
            name = event.event or str(data.get("type") or "")
            return [encode(d, event=n) for n, d in self._events.event(name, data)]
        self._count_openai(data)
        if not self._rewrite:
            return []
        chunk = self._openai.chunk(data)
        return [] if chunk is None else [encode(chunk)]

    def _count_openai(self, data: dict[str, Any]) -> None:
        for choice in data.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            calls = delta.get("tool_calls") if isinstance(delta, dict) else None
            for call in calls if isinstance(calls, list) else ():
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    for key in ("name", "arguments"):
                        if isinstance(function.get(key), str):
                            self.tool_chars += len(function[key])

    def _count_anthropic(self, name: str | None, data: dict[str, Any]) -> None:
        if name == "content_block_start":
            block = data.get("content_block")
            if isinstance(block, dict) and block.get("type") == "tool_use":
                self.tool_chars += len(str(block.get("name") or ""))
        elif name == "content_block_delta":
            delta = data.get("delta")
            if isinstance(delta, dict) and delta.get("type") == "input_json_delta":
                self.tool_chars += len(str(delta.get("partial_json") or ""))
