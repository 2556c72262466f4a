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

from .strip import EnvelopeStripper

__all__ = ["AnthropicEventStripper", "OpenAIChunkStripper"]

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
