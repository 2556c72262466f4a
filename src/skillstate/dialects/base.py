"""The wire-format protocol: one object per dialect, and the bridges between two of them.

Everything the proxy does differently for OpenAI chat completions, Anthropic Messages and
the Responses API is asked of a :class:`Dialect` object (its request checks, where it keeps
system text and tool results, how its replies carry text, tool calls and usage, where the
reply envelope is stripped from its replies, streams and transcripts, how an observation is
masked, its error bodies, its upstream path and auth header, its stream relay), and
everything that converts between two of them is a :class:`Bridge`. The objects live in one
module per wire format and are listed in :mod:`skillstate.dialects.registry`, so a further
wire format is one module plus a registry line; nothing else branches on a dialect's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from .. import jsontext
from ..cost.usage import Usage
from ..engine.stripper import Known, Stripped
from ..errors import ProxyError
from . import sse
from .checks import json_type

if TYPE_CHECKING:
    from ..engine.context import DialectContext

JSON = dict[str, Any]


class StreamRelay(Protocol):
    """Reads an upstream stream's events, hands the client its own dialect's bytes and
    captures what the state engine needs (text, tool calls, usage) on the way."""

    @property
    def text(self) -> str: ...
    @property
    def has_tool_calls(self) -> bool: ...
    @property
    def usage(self) -> Usage | None: ...
    @property
    def model(self) -> str | None: ...
    @property
    def complete(self) -> bool:
        """The upstream sent its terminal event."""
        ...

    @property
    def upstream_error(self) -> str | ProxyError | None:
        """The upstream sent an error event: its message, or the error it reports with its
        own code (a Responses stream's ``response.failed``)."""
        ...

    @property
    def error_forwarded(self) -> bool:
        """... and it was passed to the client as is."""
        ...

    def feed(self, event: sse.SSEEvent) -> list[bytes]: ...
    def finish(self) -> list[bytes]: ...
    def error(self, message: str | ProxyError) -> bytes: ...


Event = tuple[str | None, JSON]  # an SSE event's name (None: unnamed) and its JSON payload


class EventStripper(Protocol):
    """Removes the reply envelope from one client stream, event by event (a dialect's
    :meth:`Dialect.stream_stripper`; ``skillstate.engine.strip_events.StrippingRelay`` drives it).
    The events it returns are the client's: their text deltas concatenate to the text
    their closing events carry."""

    @property
    def removed_chars(self) -> int:
        """Characters of the envelopes removed so far."""
        ...

    def event(self, name: str | None, data: JSON) -> list[Event]:
        """The events to send instead of this one (none, it, or it with others)."""
        ...

    def end(self, data: str) -> list[Event]:
        """The events to send before a non-JSON event (``data``: its payload, e.g. chat's
        ``[DONE]``): the held-back text of a stream that ends without its closing events."""
        ...

    def tool_chars(self, name: str | None, data: JSON) -> int:
        """Characters of tool calls (names and arguments) this event adds to the reply."""
        ...


class Dialect(Protocol):
    """One wire format, both as what a client speaks and as an upstream's ``kind``."""

    name: str  # the registry key, the config's upstream ``kind`` and the stored label
    client_path: str  # where clients POST a turn (served with and without ``/v1``)
    upstream_path: str  # where a turn is POSTed, under the upstream's base URL
    token_count: TokenCount | None  # the format's token-counting endpoint, if it has one
    # A request header only this format's SDKs send, which tells its clients apart on the
    # routes the formats share (GET /v1/models); None for the default format.
    marker_header: str | None
    # Where a request keeps its transcript: the body's list, and the type of the text parts
    # of its assistant messages (what ``strip_request`` strips).
    transcript: tuple[str, str]
    context: DialectContext  # where a transcript keeps system text and tool results

    def validate(self, body: JSON, checked: int = 0) -> None:
        """Raise ProxyError 400 naming the first structural problem of a client request.
        Runs once per request; every later stage (context, bridges) trusts its result.
        ``checked``: the leading transcript items that passed this check before, byte for
        byte (``skillstate.sessions.transcripts``): each item is judged on its own, so they
        are not walked again."""
        ...

    def stream_usage_requested(self, body: JSON) -> bool:
        """Whether a streaming client asked to be sent usage."""
        ...

    def reply_text(self, resp: JSON) -> tuple[str, bool]:
        """(all text content, whether the reply calls tools) of a non-streamed reply."""
        ...

    def reply_cut_off(self, resp: JSON) -> bool:
        """Whether a non-streamed reply stopped at its token limit."""
        ...

    def reply_problem(self, resp: JSON) -> BadReply | None:
        """What makes a 2xx JSON object from an upstream of this kind no reply the proxy can
        read, translate or commit (a shape no provider sends, or a failure the reply itself
        reports), or None. Only what the proxy reads is checked: what a provider does send
        (chat's ``content: null`` beside tool calls, Messages' empty ``content`` at
        ``max_tokens``) passes."""
        ...

    def usage(self, raw: Any, tier: Any = None) -> Usage | None:
        """A reply's usage object normalised (None when missing or malformed); ``tier``: the
        reply's ``service_tier`` beside it, where the kind puts it there."""
        ...

    def error_body(self, err: ProxyError) -> JSON:
        """``err`` as this format's error object."""
        ...

    def error_status(self, err: ProxyError) -> int:
        """The HTTP status a client of this format expects for ``err``."""
        ...

    def relayed_error(self, raw: bytes, status: int) -> tuple[int, bytes] | None:
        """An upstream of this kind answered a client of this kind with an error: the
        (status, body) to relay as is, or None when the body is not this format's error
        object and must be rewritten."""
        ...

    def upstream_headers(self, key: str | None, version: str) -> dict[str, str]:
        """The auth (and protocol version) headers an upstream of this kind needs."""
        ...

    def forwards_header(self, name: str) -> bool:
        """Whether a client header (lower-case name) may travel to an upstream of this kind."""
        ...

    def upstream_body(self, body: JSON, *, stream: bool, grammar: JSON | None) -> JSON:
        """The last touches a request in this format gets before it goes to an upstream of
        this kind: usage in streams, and ``grammar`` (the envelope's JSON schema) as
        constrained decoding where the format has it."""
        ...

    def relay(
        self, *, request_model: str, client_wants_usage: bool, capture_limit: int
    ) -> StreamRelay:
        """The relay for an upstream stream of this kind to a client of this kind."""
        ...

    def model_list(self, body: JSON, *, single: bool) -> JSON:
        """Another format's model list (or, with ``single``, model object) in this format."""
        ...

    # -- the reply envelope: kept from the client (``reply_envelope: strip``) --------------

    def strip_reply(self, resp: JSON, known: Known = None) -> tuple[JSON, Stripped]:
        """A non-streamed reply without envelopes (``resp`` itself when it had none; never
        mutated), and what was removed from the text the state engine reads. ``known``:
        that text (:meth:`reply_text`) already stripped, and its result."""
        ...

    def strip_request(self, body: JSON) -> JSON:
        """A client request without the envelopes in its earlier assistant turns (the
        baseline's transcript; ``body`` itself when it had none; never mutated)."""
        ...

    def stream_stripper(self) -> EventStripper:
        """A new envelope stripper for one stream of this format's client events."""
        ...

    def tool_call_chars(self, resp: JSON) -> int:
        """Characters of the tool calls in a non-streamed reply (each name plus its
        arguments), for the envelope's share of the output."""
        ...

    # -- mask mode -----------------------------------------------------------------------------

    def mask_observation(self, msg: JSON, min_chars: int, stand_in: Callable[[Any], str]) -> JSON:
        """One user-side transcript message (``context.is_user_turn``) with its tool results
        and user content of at least ``min_chars`` characters each replaced by ``stand_in``
        of the original; ids and roles kept. ``msg`` itself when nothing is masked."""
        ...


@dataclass(frozen=True, slots=True)
class BadReply:
    """Why an upstream's 2xx body is no reply the client can be given: ``what`` it was (the
    client reads "upstream NAME returned <what>", a 502), or, with ``reported``, the error
    the reply itself reports (a Responses reply whose status is ``failed``): the client gets
    it as the upstream's error, its message and code kept, with the status they mean."""

    what: str
    reported: ProxyError | None = None

    @property
    def status(self) -> int:
        return 502 if self.reported is None else self.reported.status

    def error(self, upstream: str) -> ProxyError:
        """The client's error: a reply that is no reply is a 502 with ``x-should-retry:
        false`` (the SDKs would send the call twice more, each billed again, for a reply
        the upstream gave and would likely give again); a reported error keeps the SDKs'
        own rule (a 429 or 500 is worth retrying)."""
        if self.reported is not None:
            return self.reported
        return ProxyError(
            "upstream_unreachable", f"upstream {upstream} returned {self.what}", should_retry=False
        )


def shape_of(value: Any) -> str:
    """What a JSON value is, for a message naming what was wrong with a reply: as the
    request checks name it (``checks.json_type``), a list as a reply's fields call it."""
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    return json_type(value)


def typed_items_problem(resp: JSON, key: str, whose: str, items: str, item: str) -> BadReply | None:
    """What makes ``resp[key]`` no list of ``items``, each an object with a ``type`` (a
    Messages reply's content blocks, a Responses reply's output items): ``whose`` names the
    reply ("a message whose"), ``item`` one of them ("a block"). Where it is no list, an
    error object under status 200 is named as such."""
    value = resp.get(key)
    if not isinstance(value, list):
        return error_under_200(resp) or BadReply(
            f"{whose} {key} is {shape_of(value)}, not a list of {items}"
        )
    for i, entry in enumerate(value):
        if not isinstance(entry, dict):
            return BadReply(f"{whose} {key}[{i}] is {shape_of(entry)}, not {item}")
        if not isinstance(entry.get("type"), str):
            return BadReply(f"{whose} {key}[{i}] has no type")
    return None


def error_under_200(resp: JSON) -> BadReply | None:
    """A body that is an error object (a gateway's, or a provider's, under status 200): the
    problem, naming its message; None for any other body."""
    err = resp.get("error")
    if isinstance(err, dict):
        message = err.get("message")
    elif isinstance(err, str):
        message = err
    else:
        return None
    return BadReply(f"an error under status 200 ({_clip(str(message or 'no message'))})")


@dataclass(frozen=True, slots=True)
class TokenCount:
    """A format's token-counting endpoint (``/messages/count_tokens``,
    ``/responses/input_tokens``): served to its clients under that path (with and without
    ``/v1``), and called at an upstream of its kind."""

    path: str  # under the upstream's base URL; the client route too
    fields: frozenset[str]  # the request members it takes (the API refuses others)
    reply_object: str | None = None  # its answer's ``object`` member, when it has one

    def answer(self, input_tokens: int) -> JSON:
        """The endpoint's answer for a count of ``input_tokens``."""
        if self.reply_object is None:
            return {"input_tokens": input_tokens}
        return {"object": self.reply_object, "input_tokens": input_tokens}


@dataclass(frozen=True, slots=True)
class Bridge:
    """Translation between a client's format and an upstream's of another kind."""

    client: str
    upstream: str
    # (client request, upstream's max_tokens field) -> upstream request
    request: Callable[[JSON, str], JSON]
    # (upstream reply, the client's requested model) -> client reply
    response: Callable[[JSON, str], JSON]
    # (request_model, client_wants_usage, capture_limit) -> relay of upstream to client bytes
    relay: Callable[[str, bool, int], StreamRelay]


def content_chars(content: Any) -> int:
    """The size of a message's content: a string's length, or the text of its ``text``
    parts plus the other parts as compact JSON (what an observation mask saves)."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(
            len(part.get("text") or "")
            if part.get("type") == "text"
            else len(orjson.dumps(part, default=str))
            for part in content
            if isinstance(part, dict)
        )
    return 0


def json_error_object(raw: bytes) -> JSON | None:
    """The body when it is a JSON object with an ``error`` object in it, else None."""
    try:
        body = jsontext.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return None
    return body


# A rewritten error keeps at most this much of the upstream's message: enough for any real
# explanation, while an upstream (or a load balancer) answering megabytes is not echoed whole.
MAX_ERROR_MESSAGE_CHARS = 2000


def error_message(raw: bytes) -> str:
    """The human message inside an upstream error body of any dialect (or the raw text),
    cut to ``MAX_ERROR_MESSAGE_CHARS``."""
    return _clip(_message_in(raw))


def _clip(message: str) -> str:
    if len(message) <= MAX_ERROR_MESSAGE_CHARS:
        return message
    cut = len(message) - MAX_ERROR_MESSAGE_CHARS
    return f"{message[:MAX_ERROR_MESSAGE_CHARS]}… ({cut} more characters cut by the proxy)"


def _message_in(raw: bytes) -> str:
    try:
        body = jsontext.loads(raw)
    except orjson.JSONDecodeError:
        return raw[: 4 * MAX_ERROR_MESSAGE_CHARS].decode("utf-8", errors="replace")[:500] or (
            "upstream error"
        )
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if body.get("message"):
            return str(body["message"])
    return raw[: 4 * MAX_ERROR_MESSAGE_CHARS].decode("utf-8", errors="replace")[:500]
