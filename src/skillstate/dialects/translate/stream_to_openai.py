"""A streamed Anthropic message -> OpenAI ``chat.completion.chunk`` events."""

from __future__ import annotations

import time
import uuid
from typing import Any

from ...errors import ProxyError
from .. import sse
from ..capture import TextCapture
from ..checks import is_int as _is_int
from ..openai import OPENAI
from .common import (
    JSON,
    _dumps,
    _joined,
    anthropic_usage_to_openai,
    openai_finish_reason,
)


class AnthropicStreamToOpenAI:
    """Translates a streamed Anthropic message (event name + parsed data) into OpenAI
    ``chat.completion.chunk`` SSE bytes.

    ``feed(event, data)`` returns encoded chunks: a first ``{"role": "assistant"}`` delta at
    ``message_start``, ``content`` deltas for text, and tool calls
    in OpenAI form (a first delta with index, id, type, function name and ``arguments: ""``,
    then argument fragments; a tool call whose input streamed no text gets ``"{}"``).
    ``finish()`` emits the ``finish_reason`` chunk, the usage chunk (``choices: []``, only when
    ``include_usage``) and ``data: [DONE]``. With ``include_usage`` every other chunk carries
    ``"usage": null``, as OpenAI does. ``error(message)`` returns ``data: {"error": {...}}``
    and ends the stream; an upstream ``error`` event is translated the same way.
    """

    def __init__(
        self,
        model: str,
        include_usage: bool,
        *,
        completion_id: str | None = None,
        created: int | None = None,
        capture_limit: int | None = None,
    ) -> None:
        self.model = model
        self.include_usage = include_usage
        self.completion_id = completion_id
        self.created = int(time.time()) if created is None else created
        self._started = False
        self._done = False
        self._text = TextCapture(capture_limit)
        self._sent_text = False
        self._tools: dict[int, list[Any]] = {}  # block index -> [tool index, id, name, args, start]
        self._tool_order: list[list[Any]] = []
        self._usage: JSON = {}
        self._saw_usage = False
        self._stop_reason: str | None = None

    @property
    def text(self) -> str:
        """The text delivered to the client so far (up to ``capture_limit`` characters)."""
        return self._text.text

    @property
    def text_truncated(self) -> bool:
        """More text was delivered than ``capture_limit`` let ``text`` keep."""
        return self._text.truncated

    @property
    def has_tool_calls(self) -> bool:
        """Whether the reply calls tools (O(1), unlike ``tool_calls``)."""
        return bool(self._tool_order)

    @property
    def tool_calls(self) -> list[tuple[str, str, str]]:
        """(id, name, arguments JSON as sent to the client so far) per call, in order."""
        return [(t[1], t[2], _joined(t[3])) for t in self._tool_order]

    @property
    def usage(self) -> JSON | None:
        """The upstream's own (Anthropic-shaped) usage: ``message_start`` values updated by
        ``message_delta``'s cumulative ones, once any arrived."""
        return dict(self._usage) if self._saw_usage else None

    @property
    def client_usage(self) -> JSON | None:
        """The OpenAI usage sent (or to be sent) in the final usage chunk, once known."""
        return anthropic_usage_to_openai(self._usage) if self._saw_usage else None

    @property
    def stop_reason(self) -> str | None:
        """The upstream's Anthropic stop_reason."""
        return self._stop_reason

    @property
    def finish_reason(self) -> str | None:
        if self._stop_reason is None and not self._done:
            return None
        return openai_finish_reason(self._stop_reason, has_tool_calls=bool(self._tool_order))

    @property
    def done(self) -> bool:
        return self._done

    def _chunk(self, delta: JSON, finish_reason: str | None = None) -> bytes:
        data: JSON = {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        if self.include_usage:
            data["usage"] = None
        return sse.encode(data)

    def _start(self, message: Any = None) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        if self.completion_id is None:
            mid = message.get("id") if isinstance(message, dict) else None
            self.completion_id = (
                f"chatcmpl-{mid}"
                if isinstance(mid, str) and mid
                else f"chatcmpl-{uuid.uuid4().hex}"
            )
        # No "content" key yet: a reply that turns out to be tool calls only must accumulate
        # to content null, as the unstreamed completion has (see finish() for empty replies).
        return [self._chunk({"role": "assistant"})]

    def _take_usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        for key in (
            "input_tokens",
            "output_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
        ):
            if _is_int(usage.get(key)):
                self._usage[key] = usage[key]
                self._saw_usage = True
        # The writes' TTL split (message_start only) is for the ledger's price of the 1h
        # writes; the client's usage is built from the sums alone.
        if isinstance(usage.get("cache_creation"), dict):
            self._usage["cache_creation"] = usage["cache_creation"]

    def feed(self, event: str | None, data: JSON) -> list[bytes]:
        if self._done or not isinstance(data, dict):
            return []
        etype = event or data.get("type")
        if etype == "error":
            err = data.get("error")
            msg = err.get("message") if isinstance(err, dict) else err
            etype_ = err.get("type") if isinstance(err, dict) else None
            return [
                *self._start(),
                self.error(str(msg or "upstream error"), str(etype_ or "api_error")),
            ]
        if etype == "message_start":
            message = data.get("message")
            out = self._start(message)
            if isinstance(message, dict):
                self._take_usage(message.get("usage"))
            return out
        out = self._start()
        if etype == "content_block_start":
            out.extend(self._on_block_start(data))
        elif etype == "content_block_delta":
            out.extend(self._on_block_delta(data))
        elif etype == "content_block_stop":
            out.extend(self._on_block_stop(data))
        elif etype == "message_delta":
            self._on_message_delta(data)
        return out

    def _on_block_start(self, data: JSON) -> list[bytes]:
        block = data.get("content_block")
        index = data.get("index")
        if not isinstance(block, dict) or not _is_int(index):
            return []
        if block.get("type") == "text":
            text = block.get("text")
            if isinstance(text, str) and text:
                return [self._text_chunk(text)]
        elif block.get("type") == "tool_use":
            start = block.get("input")
            tool = [len(self._tool_order), str(block.get("id") or ""), str(block.get("name") or "")]
            tool += [[], start if isinstance(start, dict) else {}]
            self._tools[index] = tool
            self._tool_order.append(tool)
            return [
                self._chunk(
                    {
                        "tool_calls": [
                            {
                                "index": tool[0],
                                "id": tool[1],
                                "type": "function",
                                "function": {"name": tool[2], "arguments": ""},
                            }
                        ]
                    }
                )
            ]
        return []

    def _text_chunk(self, text: str) -> bytes:
        self._text.add(text)
        self._sent_text = True
        return self._chunk({"content": text})

    def _args_chunk(self, tool: list[Any], text: str) -> bytes:
        tool[3].append(text)
        return self._chunk({"tool_calls": [{"index": tool[0], "function": {"arguments": text}}]})

    def _on_block_delta(self, data: JSON) -> list[bytes]:
        delta = data.get("delta")
        if not isinstance(delta, dict):
            return []
        if delta.get("type") == "text_delta":
            text = delta.get("text")
            if isinstance(text, str) and text:
                return [self._text_chunk(text)]
        elif delta.get("type") == "input_json_delta":
            index = data.get("index")
            tool = self._tools.get(index) if _is_int(index) else None
            partial = delta.get("partial_json")
            if tool is not None and isinstance(partial, str) and partial:
                return [self._args_chunk(tool, partial)]
        return []

    def _on_block_stop(self, data: JSON) -> list[bytes]:
        index = data.get("index")
        tool = self._tools.pop(index, None) if _is_int(index) else None
        if tool is not None and not tool[3]:
            return [self._args_chunk(tool, _dumps(tool[4]))]
        return []

    def _on_message_delta(self, data: JSON) -> None:
        delta = data.get("delta")
        if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
            self._stop_reason = delta["stop_reason"]
        self._take_usage(data.get("usage"))

    def finish(self) -> list[bytes]:
        if self._done:
            return []
        out = self._start()
        for index in list(self._tools):
            out.extend(self._on_block_stop({"index": index}))
        self._done = True
        reason = openai_finish_reason(self._stop_reason, has_tool_calls=bool(self._tool_order))
        empty = not self._sent_text and not self._tool_order
        out.append(self._chunk({"content": ""} if empty else {}, reason))
        if self.include_usage:
            out.append(
                sse.encode(
                    {
                        "id": self.completion_id,
                        "object": "chat.completion.chunk",
                        "created": self.created,
                        "model": self.model,
                        "choices": [],
                        "usage": anthropic_usage_to_openai(self._usage),
                    }
                )
            )
        out.append(sse.encode("[DONE]"))
        return out

    def error(self, message: str | ProxyError, error_type: str = "api_error") -> bytes:
        """``data: {"error": {...}}`` in OpenAI's error shape; the stream is over after it."""
        self._done = True
        if isinstance(message, ProxyError):
            return sse.encode(OPENAI.error_body(message))
        return sse.encode(
            {"error": {"message": message, "type": error_type, "param": None, "code": None}}
        )
