"""Streams to a Responses API client: the native relay (events untouched, the terminal one
held until the turn is committed), the chat-completions -> Responses event translator, a
chain of two relays (Anthropic -> chat -> Responses), and the envelope stripper of a
Responses event stream."""

from __future__ import annotations

from typing import Any

import orjson

from ... import jsontext
from ...cost.usage import Usage
from ...engine.stripper import EnvelopeStripper
from ...errors import ProxyError
from .. import sse
from ..base import JSON, Event, StreamRelay
from ..capture import RelayCapture
from ..openai import usage_from_openai
from .failure import failure_code
from .items import call_chars, is_client_call
from .translate import (
    choice_logprobs,
    custom_tool_call_item,
    function_call_item,
    incomplete_reason,
    is_custom_call,
    message_item,
    new_id,
    object_or_empty,
    refusal_part,
    response_object,
    usage_to_responses,
)

TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete"})


def error_event(message: str | ProxyError, sequence_number: int = 0) -> bytes:
    """An in-band stream error in the Responses API's shape (``type: error``; a ProxyError
    with its code)."""
    code = message.code if isinstance(message, ProxyError) else "stream_error"
    data = {
        "type": "error",
        "code": code,
        "message": str(message),
        "param": None,
        "sequence_number": sequence_number,
    }
    return sse.encode(data, event="error")


class ResponsesRelay(RelayCapture):
    """Responses upstream -> Responses client: each event's bytes untouched; the terminal
    event held back until the turn is committed. Keeps the final ``response`` object."""

    def __init__(self, *, request_model: str, capture_limit: int) -> None:
        super().__init__(capture_limit)
        self._held: list[bytes] = []
        self.response: JSON | None = None
        self._request_model = request_model
        self._seq = -1  # the sequence number of the last event relayed

    def feed(self, event: sse.SSEEvent) -> list[bytes]:
        try:
            data = jsontext.loads(event.data) if event.data else None
        except orjson.JSONDecodeError:
            return [event.raw]
        if not isinstance(data, dict):
            return [event.raw]
        etype = data.get("type") or event.event
        seq = data.get("sequence_number")
        if type(seq) is int:
            self._seq = seq
        if etype == "response.output_text.delta" and isinstance(data.get("delta"), str):
            self.add_text(data["delta"])
        elif etype == "response.output_item.added":
            if is_client_call(data.get("item")):
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
            self.usage = usage_from_openai(resp["usage"], resp.get("service_tier"))

    def finish(self) -> list[bytes]:
        return self._held

    def error(self, message: str | ProxyError) -> bytes:
        """The response the upstream began, ended as the API ends one that fails
        (``response.failed``, its error's code the one a client acts on). When none began
        (the stream failed before ``response.created``), one is begun here to be failed:
        Codex reads only ``response.failed``, and the openai SDK's ``responses.stream``
        refuses any first event but ``response.created`` (a lone ``error`` event is read
        by neither)."""
        if not isinstance(message, ProxyError):
            return error_event(message, self._seq + 1)
        out = []
        begun = self.response
        if begun is None:
            begun = response_object(
                model=self._request_model, output=[], usage=None, finish_reason=None,
                status="in_progress",
            )  # fmt: skip
            out.append(self._event("response.created", response=begun))
        error = {"code": failure_code(message), "message": message.message}
        # No output, as in ChatToResponsesRelay.error (its deltas went out already).
        failed = {**begun, "status": "failed", "output": [], "error": error}
        out.append(self._event("response.failed", response=failed))
        return b"".join(out)

    def _event(self, etype: str, **fields: Any) -> bytes:
        """An event of the proxy's own, numbered after the last one relayed."""
        self._seq += 1
        return sse.encode({"type": etype, **fields, "sequence_number": self._seq}, event=etype)


class ChatToResponsesRelay(RelayCapture):
    """Chat-completions upstream stream -> Responses API events, in the order the API sends
    them: created, in_progress, per output item added / deltas / done, then completed (or
    incomplete). The reply's ``content`` and ``refusal`` deltas are the message item's
    ``output_text`` and ``refusal`` parts; a reply cut off (``finish_reason`` ``length`` or
    ``content_filter``) leaves its last item ``incomplete``, with the response, as
    :func:`~.translate.chat_response_to_responses` does."""

    def __init__(self, *, request_model: str, capture_limit: int) -> None:
        super().__init__(capture_limit)
        self._seq = 0
        self._id = new_id("resp_")
        self.model = request_model
        self._output: list[JSON] = []
        self._open: int | None = None  # output index of the item still receiving deltas
        self._calls: dict[int, int] = {}  # chat tool_call index -> output index
        # Calls begun while another call's item is open: it stays open (its arguments may
        # still come), these are sent whole when it closes (``_tool_call``).
        self._deferred: list[int] = []
        self._finish_reason: str | None = None
        self._cut: int | None = None  # output index of the item the reply was cut in
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
            self.usage = usage_from_openai(chunk["usage"], chunk.get("service_tier"))
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str) and delta["content"]:
                out += self._part_delta("output_text", delta["content"], choice_logprobs(choice))
            if isinstance(delta.get("refusal"), str) and delta["refusal"]:
                out += self._part_delta("refusal", delta["refusal"], [])
            for call in delta.get("tool_calls") or ():
                out += self._tool_call(call)
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
        return out

    def _part_delta(self, ptype: str, piece: str, logprobs: list[JSON]) -> list[bytes]:
        """A piece of the reply's text (``output_text``, with its tokens' log probabilities
        when asked for) or refusal (``refusal``): the first piece opens a message item, each
        kind's first its part of that item."""
        if ptype == "output_text":
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
        item = self._output[self._open]
        ids = {"item_id": item["id"], "output_index": self._open}
        k = next((k for k, p in enumerate(item["content"]) if p["type"] == ptype), None)
        if k is None:
            k = len(item["content"])
            item["content"].append(
                {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                if ptype == "output_text"
                else refusal_part("")
            )
            out.append(
                self._event(
                    "response.content_part.added",
                    **ids,
                    content_index=k,
                    part=dict(item["content"][k]),
                )
            )
        part = item["content"][k]
        member, family = _PARTS[ptype]
        part[member] += piece
        fields: JSON = {"delta": piece}
        if ptype == "output_text":
            part["logprobs"] += logprobs
            fields["logprobs"] = logprobs
        out.append(self._event(f"response.{family}.delta", **ids, content_index=k, **fields))
        return out

    def _tool_call(self, call: JSON) -> list[bytes]:
        """A streamed piece of a chat tool call: its first piece (by ``index``) opens a
        function_call or custom_tool_call item, the pieces' arguments or input are its
        deltas. A call begun while another call's item is open waits, gathering its pieces,
        and is sent whole when that item closes: some servers name every call before their
        arguments, or interleave them, and an item's done event must carry all of its
        arguments (Codex runs a call from it)."""
        self.has_tool_calls = True
        index = call.get("index", 0)
        out: list[bytes] = []
        if index not in self._calls:
            custom = is_custom_call(call)
            name = object_or_empty(call.get("custom" if custom else "function")).get("name") or ""
            call_id = call.get("id") or new_id("call_")
            item = (
                custom_tool_call_item(call_id, name, "", status="in_progress")
                if custom
                else function_call_item(call_id, name, "", status="in_progress")
            )
            self._calls[index] = len(self._output)
            self._output.append(item)
            if self._open is not None and self._output[self._open]["type"] != "message":
                self._deferred.append(self._calls[index])
            else:
                out += self._close()
                self._open = self._calls[index]
                out.append(
                    self._event(
                        "response.output_item.added", output_index=self._open, item=dict(item)
                    )
                )
        pos = self._calls[index]
        item = self._output[pos]
        kind_key = "custom" if item["type"] == "custom_tool_call" else "function"
        spec = object_or_empty(call.get(kind_key))
        if spec.get("name") and not item["name"]:
            item["name"] = spec["name"]
        member, kind = _STREAMED[item["type"]]
        piece = spec.get(member)
        if isinstance(piece, str) and piece:
            item[member] += piece
            if pos == self._open:
                out.append(
                    self._event(
                        f"response.{kind}.delta", item_id=item["id"], output_index=pos, delta=piece
                    )
                )
        return out

    def _close(self) -> list[bytes]:
        """The done events of the item still open, then the calls that waited for it, each
        whole (added, its arguments in one delta, done)."""
        out = self._done(self._open) if self._open is not None else []
        self._open = None
        deferred, self._deferred = self._deferred, []
        for pos in deferred:
            item = self._output[pos]
            member, kind = _STREAMED[item["type"]]
            added = {**item, member: ""}
            out.append(self._event("response.output_item.added", output_index=pos, item=added))
            if item[member]:
                out.append(
                    self._event(
                        f"response.{kind}.delta",
                        item_id=item["id"],
                        output_index=pos,
                        delta=item[member],
                    )
                )
            out += self._done(pos)
        return out

    def _done(self, pos: int) -> list[bytes]:
        """The done events of the item at ``pos`` (``incomplete`` when the reply was cut
        off in it)."""
        item = self._output[pos]
        item["status"] = "incomplete" if pos == self._cut else "completed"
        out: list[bytes] = []
        if item["type"] == "message":
            ids = {"item_id": item["id"], "output_index": pos}
            for k, part in enumerate(item["content"]):
                member, family = _PARTS[part["type"]]
                fields = {member: part[member]}
                if part["type"] == "output_text":
                    fields["logprobs"] = part["logprobs"]
                done = f"response.{family}.done"
                out.append(self._event(done, **ids, content_index=k, **fields))
                out.append(
                    self._event("response.content_part.done", **ids, content_index=k, part=part)
                )
        else:
            member, kind = _STREAMED[item["type"]]
            fields = {member: item[member]}
            out.append(
                self._event(f"response.{kind}.done", item_id=item["id"], output_index=pos, **fields)
            )
        out.append(self._event("response.output_item.done", output_index=pos, item=item))
        return out

    def finish(self) -> list[bytes]:
        if self._output and incomplete_reason(self._finish_reason) is not None:
            self._cut = len(self._output) - 1  # the item being written when it was cut
        out = self._start() + self._close()
        self.response = snap = self._snapshot("done")
        kind = "response.incomplete" if snap["status"] == "incomplete" else "response.completed"
        out.append(self._event(kind, response=snap))
        return out

    def error(self, message: str | ProxyError) -> bytes:
        """An error (the upstream's, or the proxy's own: a cut, an unreadable event) ends
        the response as the API ends one that fails: ``response.failed``, its ``error`` the
        code a Responses client acts on (``failure_code``: Codex reads only this event)."""
        if not isinstance(message, ProxyError):
            return error_event(message, self._seq)
        out = self._start()
        # No output, as the API fails a response: its deltas are all the client gets of
        # it (an output here would bypass the envelope stripper, which reads only the
        # deltas and the items' done events).
        snap = {**self._snapshot("failed"), "output": []}
        snap["error"] = {"code": failure_code(message), "message": message.message}
        out.append(self._event("response.failed", response=snap))
        return b"".join(out)


# A message part's type -> the member holding its text and the event family of its deltas
# and done event.
_PARTS = {"output_text": ("text", "output_text"), "refusal": ("refusal", "refusal")}
# A call item's streamed member and the event family its deltas and done event belong to.
_STREAMED = {
    "function_call": ("arguments", "function_call_arguments"),
    "custom_tool_call": ("input", "custom_tool_call_input"),
}


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
        self.upstream_error: str | ProxyError | None = None
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

    def error(self, message: str | ProxyError) -> bytes:
        return self._second.error(message)

    @property
    def text(self) -> str:
        return self._second.text

    @property
    def response(self) -> JSON | None:
        """The client's final ``response`` object, once the stream is finished."""
        return getattr(self._second, "response", None)


_TextPart = tuple[Any, Any]  # (output_index, content_index) of an output_text part


class ResponsesEventStripper:
    """Strips the envelope from a Responses API event stream, event by event.

    Each output_text part (by output index and content index) has its own
    :class:`~skillstate.engine.stripper.EnvelopeStripper`: its ``response.output_text.delta`` events
    carry the stripped text (a delta left empty is not sent), and the held-back rest goes
    out as one more delta right before the part's ``response.output_text.done``. That event,
    ``response.content_part.done``, ``response.output_item.done`` and the terminal
    ``response.completed`` / ``response.incomplete`` carry the part's stripped text, so the
    deltas add up to what the closing events say. Reasoning items, tool calls and every
    other event pass unchanged; ``sequence_number`` is renumbered to stay consecutive. The
    action fallback (a reply that was only the envelope shows its action) applies when no
    text of the response was shown before and no tool call follows. So a message item is
    held, from its ``response.output_item.added`` on, until it shows text; one that ends
    having shown none waits for the next event: a tool-call item drops it (the model never
    said its action to the user; later ``output_index`` values move down), anything else
    releases it with the action. A tool call is one the client runs (``items``); a hosted
    call (a web search the API ran) is part of the model's own final turn.
    """

    def __init__(self) -> None:
        self._strippers: dict[_TextPart, EnvelopeStripper] = {}
        self._shown: dict[_TextPart, list[str]] = {}  # the text each part showed so far
        self._final: dict[_TextPart, str] = {}  # a finished part's stripped text
        self._said = False  # some text of this response went out
        self._seq: int | None = None  # the next sequence_number
        self.removed_chars = 0
        # The message item held while it has shown nothing: its output index, its events as
        # received, a stripper per text part to learn whether it would show text, and
        # whether it ended (then the next event decides).
        self._held: tuple[Any, list[Event], dict[Any, EnvelopeStripper]] | None = None
        self._held_done = False
        self._dropped: list[int] = []  # output indexes of the message items dropped

    def end(self, data: str) -> list[Event]:
        return []  # a Responses stream has no end sentinel: its terminal event closes it

    def tool_chars(self, name: str | None, data: JSON) -> int:
        """What a client call said, counted once, from its whole item when it is done."""
        etype = data.get("type") or name
        if etype == "response.output_item.done":
            return call_chars(data.get("item"))
        return 0

    def event(self, name: str | None, data: JSON) -> list[Event]:
        out = self._hold_or_strip(name, data)
        # Numbered on from the stream's first event, past the events dropped or added.
        seq = self._seq
        for k, (n, d) in enumerate(out):
            index = d.get("output_index")
            moved = sum(1 for i in self._dropped if i < index) if isinstance(index, int) else 0
            if moved and isinstance(index, int):
                d = {**d, "output_index": index - moved}
                out[k] = (n, d)
            number = d.get("sequence_number")
            if isinstance(number, int):
                if seq is None:
                    seq = number
                if number != seq:
                    out[k] = (n, {**d, "sequence_number": seq})
                seq += 1
        self._seq = seq
        return out

    def _hold_or_strip(self, name: str | None, data: JSON) -> list[Event]:
        etype = data.get("type") or name
        if self._held is not None:
            index, events, probes = self._held
            if self._held_done:  # the held item ended: this event decides
                self._held = None
                enveloped = any(p.envelope is not None for p in probes.values())
                if (
                    enveloped
                    and etype == "response.output_item.added"
                    and is_client_call(data.get("item"))
                ):
                    self._dropped.append(index)
                    self.removed_chars += sum(p.removed_chars for p in probes.values())
                    return self._strip(name, data)
                return [*self._release(events), *self._hold_or_strip(name, data)]
            if data.get("output_index") == index and etype not in TERMINAL_EVENTS:
                events.append((name, data))
                self._held_done = etype == "response.output_item.done"
                if self._probe_shows(probes, etype, data):
                    self._held = None
                    return self._release(events)
                return []
            self._held = None  # another item or the end: what was held goes out first
            return [*self._release(events), *self._hold_or_strip(name, data)]
        item = data.get("item")
        if (
            etype == "response.output_item.added"
            and not self._said
            and isinstance(item, dict)
            and item.get("type") == "message"
        ):
            self._held, self._held_done = (data.get("output_index"), [(name, data)], {}), False
            return []
        return self._strip(name, data)

    @staticmethod
    def _probe_shows(probes: dict[Any, EnvelopeStripper], etype: Any, data: JSON) -> bool:
        """Whether a held item's text event shows text once stripped (fed to a probe)."""
        key = data.get("content_index")
        if etype == "response.output_text.delta":
            piece = data.get("delta")
            probe = probes.setdefault(key, EnvelopeStripper())
            return bool(probe.feed(piece if isinstance(piece, str) else ""))
        if etype == "response.output_text.done":
            found = probes.pop(key, None)
            if found is None:  # a part without deltas: its whole text is here
                text = data.get("text")
                probe = EnvelopeStripper()
                shown = probe.feed(text if isinstance(text, str) else "")
            else:
                probe, shown = found, ""
            probes[(key, "done")] = probe
            return bool(shown + probe.flush(fallback=False))
        return False

    def _release(self, events: list[Event]) -> list[Event]:
        return [out for name, data in events for out in self._strip(name, data)]

    def _strip(self, name: str | None, data: JSON) -> list[Event]:
        etype = data.get("type") or name
        if etype == "response.output_text.delta":
            out = self._delta(name, data)
        elif etype == "response.output_text.done":
            out = self._text_done(name, data)
        elif etype == "response.content_part.done":
            part = data.get("part")
            key = (data.get("output_index"), data.get("content_index"))
            if isinstance(part, dict) and part.get("type") == "output_text" and key in self._final:
                data = {**data, "part": {**part, "text": self._final[key]}}
            out = [(name, data)]
        elif etype == "response.output_item.done":
            item = data.get("item")
            if isinstance(item, dict):
                data = {**data, "item": self._item(data.get("output_index"), item)}
            out = [(name, data)]
        elif etype in TERMINAL_EVENTS and isinstance(data.get("response"), dict):
            out = [(name, {**data, "response": self._response(data["response"])})]
        else:
            if etype == "response.created":
                self._said = False
            out = [(name, data)]
        return out

    def _delta(self, name: str | None, data: JSON) -> list[Event]:
        key = (data.get("output_index"), data.get("content_index"))
        piece = data.get("delta")
        stripper = self._strippers.get(key)
        if stripper is None:
            stripper = self._strippers[key] = EnvelopeStripper()
            self._shown[key] = []
        text = stripper.feed(piece if isinstance(piece, str) else "")
        if not text:
            return []
        self._shown[key].append(text)
        self._said = True
        if text == piece:
            return [(name, data)]
        return [(name, {**data, "delta": text, **({"logprobs": []} if "logprobs" in data else {})})]

    def _text_done(self, name: str | None, data: JSON) -> list[Event]:
        key = (data.get("output_index"), data.get("content_index"))
        stripper = self._strippers.pop(key, None)
        shown = self._shown.pop(key, [])
        if stripper is None:  # a part without deltas: its whole text is here
            stripper = EnvelopeStripper()
            text = data.get("text")
            shown.append(stripper.feed(text if isinstance(text, str) else ""))
        rest = stripper.flush(fallback=not self._said)
        self.removed_chars += stripper.removed_chars
        out: list[Event] = []
        if rest:
            delta: JSON = {
                "type": "response.output_text.delta",
                "item_id": data.get("item_id"),
                "output_index": data.get("output_index"),
                "content_index": data.get("content_index"),
                "delta": rest,
                "logprobs": [],
            }
            if "sequence_number" in data:  # renumbered in event(), before the done event
                delta["sequence_number"] = data["sequence_number"]
            out.append(("response.output_text.delta" if name else None, delta))
            shown.append(rest)
        final = self._final[key] = "".join(shown)
        self._said = self._said or bool(final)
        if final != data.get("text"):
            data = {**data, "text": final, **({"logprobs": []} if "logprobs" in data else {})}
        out.append((name, data))
        return out

    def _item(self, index: Any, item: JSON) -> JSON:
        """An output item with its output_text parts' stripped text."""
        content = item.get("content")
        if item.get("type") != "message" or not isinstance(content, list):
            return item
        parts = list(content)
        for k, part in enumerate(content):
            key = (index, k)
            if isinstance(part, dict) and part.get("type") == "output_text" and key in self._final:
                parts[k] = {**part, "text": self._final[key]}
        return {**item, "content": parts}

    def _response(self, resp: JSON) -> JSON:
        output = resp.get("output")
        if not isinstance(output, list) or not (self._final or self._dropped):
            return resp
        items = [
            self._item(i, it) if isinstance(it, dict) else it
            for i, it in enumerate(output)
            if i not in self._dropped
        ]
        return {**resp, "output": items}
