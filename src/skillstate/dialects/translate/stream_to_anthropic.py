"""A streamed OpenAI chat completion -> Anthropic Messages stream events."""

from __future__ import annotations

import uuid

from ...errors import ProxyError
from .. import sse
from ..anthropic import ANTHROPIC
from ..capture import TextCapture
from ..checks import is_int as _is_int
from .common import (
    JSON,
    _clean,
    _synth_tool_id,
    anthropic_stop_reason,
    openai_usage_to_anthropic,
)
from .toolargs import ToolArgsStream


class _Call:
    __slots__ = ("args", "block", "buffer", "closed", "id", "late", "name", "position")

    def __init__(self, position: int) -> None:
        self.position = position
        self.id: str | None = None
        self.name: str | None = None
        self.buffer: list[str] = []  # argument text that arrived before the block opened
        self.args = ToolArgsStream()
        self.block: int | None = None
        self.closed = False
        self.late = ""  # argument text that arrived after the block was closed


class OpenAIStreamToAnthropic:
    """Translates a streamed OpenAI chat completion (parsed chunks) into Anthropic SSE bytes.

    ``feed(chunk)`` returns the encoded events the chunk produces; ``finish()`` (call it when
    the upstream stream ends, e.g. on ``[DONE]``) closes the open block and emits
    ``message_delta`` (stop_reason and usage) and ``message_stop``; ``error(message)``
    returns an ``event: error`` and ends the stream. The first call emits ``message_start``
    (zero input tokens: the usage is only known from the upstream's final usage chunk) and a
    ``ping``. Text opens a text block; each tool call gets its own ``tool_use`` block, opened
    once its name is known (argument fragments that come earlier are buffered), with its
    arguments streamed as ``input_json_delta`` through :class:`ToolArgsStream`. A tool call
    whose name arrives only at the end is opened by ``finish()``.

    Parallel calls: while one call's block is open, a later call is not opened but kept,
    with its arguments, and sent whole by ``finish()``; so the open call gets every argument
    the upstream sends for it, however the calls' pieces are interleaved (some servers name
    every call first, then send their arguments).

    The message an Anthropic SDK accumulates from this stream equals
    :func:`openai_response_to_anthropic` of the same reply, as long as the upstream does not
    interleave text after tool calls (that opens a further text block, and closes the open
    call: its arguments sent after that are kept in ``late_arguments`` but can no longer be
    delivered).
    """

    def __init__(
        self,
        request_model: str,
        message_id: str | None = None,
        *,
        capture_limit: int | None = None,
    ) -> None:
        self.request_model = request_model
        self.message_id = message_id
        self._started = False
        self._done = False
        self._next_block = 0
        self._open_text: int | None = None  # index of the open text block
        self._open_call: _Call | None = None
        self._calls: dict[int, _Call] = {}
        self._order: list[_Call] = []  # calls in first-seen order
        self._text = TextCapture(capture_limit)
        self._finish_reason: str | None = None
        self._refused = False  # a refusal delta came (the stop reason is then refusal)
        self._matched_stop: str | None = None
        self._raw_usage: JSON | None = None
        self._stop: tuple[str, str | None] | None = None

    # -- public state ----------------------------------------------------------------

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
        return bool(self._order)

    @property
    def tool_calls(self) -> list[tuple[str, str, str]]:
        """(id, name, arguments JSON as delivered to the client so far) per call, in block
        order; complete JSON objects after ``finish()``."""
        calls = sorted(self._order, key=lambda c: (c.block is None, c.block or 0, c.position))
        return [(c.id or "", c.name or "", c.args.emitted) for c in calls]

    @property
    def late_arguments(self) -> dict[str, str]:
        return {c.id or "": c.late for c in self._order if c.late}

    @property
    def usage(self) -> JSON | None:
        """The upstream's own (OpenAI-shaped) usage object, once it reported one."""
        return self._raw_usage

    @property
    def client_usage(self) -> JSON | None:
        """The Anthropic usage sent (or to be sent) in ``message_delta``, once known."""
        return None if self._raw_usage is None else openai_usage_to_anthropic(self._raw_usage)

    @property
    def finish_reason(self) -> str | None:
        return self._finish_reason

    @property
    def stop_reason(self) -> str | None:
        if self._stop is not None:
            return self._stop[0]
        if self._finish_reason is None:
            return None
        return self._stop_reason()[0]

    def _stop_reason(self) -> tuple[str, str | None]:
        return anthropic_stop_reason(
            self._finish_reason,
            has_tool_calls=bool(self._order),
            matched_stop=self._matched_stop,
            refused=self._refused,
        )

    @property
    def done(self) -> bool:
        return self._done

    # -- feeding -----------------------------------------------------------------------

    def feed(self, chunk: JSON) -> list[bytes]:
        if self._done or not isinstance(chunk, dict):
            return []
        out = self._start(chunk)
        err = chunk.get("error")
        if err is not None and not chunk.get("choices"):
            msg = err.get("message") if isinstance(err, dict) else err
            out.append(self.error(str(msg or "upstream error")))
            return out
        if isinstance(chunk.get("usage"), dict):
            self._raw_usage = chunk["usage"]
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                for key in ("content", "refusal"):
                    piece = delta.get(key)
                    if isinstance(piece, str) and piece:
                        self._refused = self._refused or key == "refusal"
                        out.extend(self._text_delta(_clean(piece)))
                tcs = delta.get("tool_calls")
                for tc in tcs if isinstance(tcs, list) else []:
                    if isinstance(tc, dict):
                        out.extend(self._tool_delta(tc))
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                self._finish_reason = reason
                stop = choice.get("stop_reason")
                self._matched_stop = stop if isinstance(stop, str) else None
        return out

    def finish(self) -> list[bytes]:
        if self._done:
            return []
        out = self._start({})
        for call in self._order:
            if call.block is None:
                out.extend(self._open_tool(call))
        out.extend(self._close_open())
        self._stop = self._stop_reason()
        usage: JSON = (
            openai_usage_to_anthropic(self._raw_usage)
            if self._raw_usage is not None
            else {"output_tokens": 0}
        )
        out.append(
            self._event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": self._stop[0], "stop_sequence": self._stop[1]},
                    "usage": usage,
                },
            )
        )
        out.append(self._event("message_stop", {"type": "message_stop"}))
        self._done = True
        return out

    def error(self, message: str | ProxyError, error_type: str = "api_error") -> bytes:
        """An Anthropic ``event: error``; the stream is over after it."""
        self._done = True
        if isinstance(message, ProxyError):
            return sse.encode(ANTHROPIC.error_body(message), event="error")
        return sse.encode(
            {"type": "error", "error": {"type": error_type, "message": message}}, event="error"
        )

    # -- internals ---------------------------------------------------------------------

    @staticmethod
    def _event(name: str, data: JSON) -> bytes:
        return sse.encode(data, event=name)

    def _start(self, chunk: JSON) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        if self.message_id is None:
            cid = chunk.get("id")
            self.message_id = (
                f"msg_{cid}" if isinstance(cid, str) and cid else f"msg_{uuid.uuid4().hex}"
            )
        message: JSON = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.request_model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": 0,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        return [
            self._event("message_start", {"type": "message_start", "message": message}),
            self._event("ping", {"type": "ping"}),
        ]

    def _close_open(self) -> list[bytes]:
        out: list[bytes] = []
        if self._open_text is not None:
            out.append(self._stop_block(self._open_text))
            self._open_text = None
        call = self._open_call
        if call is not None and call.block is not None:
            tail = call.args.finish()
            if tail:
                out.append(self._json_delta(call.block, tail))
            out.append(self._stop_block(call.block))
            call.closed = True
            self._open_call = None
        return out

    def _stop_block(self, index: int) -> bytes:
        return self._event("content_block_stop", {"type": "content_block_stop", "index": index})

    def _json_delta(self, index: int, text: str) -> bytes:
        return self._event(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": text},
            },
        )

    def _text_delta(self, text: str) -> list[bytes]:
        out: list[bytes] = []
        if self._open_text is None:
            out.extend(self._close_open())
            self._open_text = self._next_block
            self._next_block += 1
            out.append(
                self._event(
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": self._open_text,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
            )
        self._text.add(text)
        out.append(
            self._event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": self._open_text,
                    "delta": {"type": "text_delta", "text": text},
                },
            )
        )
        return out

    def _call_for(self, tc: JSON) -> _Call:
        index = tc.get("index")
        cid = tc.get("id") if isinstance(tc.get("id"), str) and tc.get("id") else None
        if not _is_int(index):
            # Some servers omit the index: a new id means a new call, else the latest call.
            known = next((c for c in self._order if cid is not None and c.id == cid), None)
            if known is not None:
                return known
            if cid is None and self._order:
                return self._order[-1]
            index = max(self._calls, default=-1) + 1
        key = index if _is_int(index) else 0
        call = self._calls.get(key)
        if call is None:
            call = _Call(key)  # the upstream index names a synthesized id, as unstreamed
            self._calls[key] = call
            self._order.append(call)
        return call

    def _tool_delta(self, tc: JSON) -> list[bytes]:
        call = self._call_for(tc)
        cid = tc.get("id")
        if call.id is None and isinstance(cid, str) and cid:
            call.id = cid
        fn = tc.get("function") if isinstance(tc.get("function"), dict) else {}
        assert isinstance(fn, dict)
        name = fn.get("name")
        if call.name is None and isinstance(name, str) and name:
            call.name = name
        args = fn.get("arguments")
        fragment = args if isinstance(args, str) else ""
        if call.closed:
            call.late += fragment
            return []
        if call.block is None:
            if fragment:
                call.buffer.append(fragment)
            if self._open_call is not None and self._open_call is not call:
                # Another call is open: it stays open, since its arguments may still come
                # (a server that names every call before their arguments, or interleaves
                # them); this one opens at the end, with all of its own (``finish``).
                return []
            return self._open_tool(call) if call.name is not None else []
        if fragment and call is self._open_call:
            text = call.args.push(fragment)
            if text:
                return [self._json_delta(call.block, text)]
        elif fragment:
            call.buffer.append(fragment)  # unreachable: only the open call has a block
        return []

    def _open_tool(self, call: _Call) -> list[bytes]:
        out = self._close_open()
        assert self.message_id is not None
        if call.id is None:
            call.id = _synth_tool_id(self.message_id, call.position)
        call.block = self._next_block
        self._next_block += 1
        self._open_call = call
        out.append(
            self._event(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": call.block,
                    "content_block": {
                        "type": "tool_use",
                        "id": call.id,
                        "name": call.name or "",
                        "input": {},
                    },
                },
            )
        )
        if call.buffer:
            text = call.args.push("".join(call.buffer))
            call.buffer.clear()
            if text:
                out.append(self._json_delta(call.block, text))
        return out
