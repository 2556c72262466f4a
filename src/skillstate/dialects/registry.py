"""Every dialect and every bridge the proxy knows, by name; and the three operations that pick
between "same format" and "bridge" (request, reply, stream), so callers never branch on a
dialect's name. A new wire format adds its module's objects here and nothing elsewhere."""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from .. import jsontext
from ..errors import ProxyError, kind_for_status
from ..jsondepth import MAX_JSON_DEPTH, JSONTooDeep, nesting_exceeds
from .anthropic import ANTHROPIC
from .base import JSON, BadReply, Bridge, Dialect, StreamRelay, error_message
from .openai import OPENAI
from .relay import AnthropicToOpenAIRelay, OpenAIToAnthropicRelay
from .responses import RESPONSES
from .responses.from_chat import (
    anthropic_request_to_responses,
    chat_request_to_responses,
    responses_response_to_chat,
)
from .responses.stream import ChainedRelay, ChatToResponsesRelay
from .responses.to_chat import ResponsesToChatRelay
from .responses.translate import (
    chat_response_to_responses,
    keeps_custom,
    responses_request_to_chat,
)
from .translate import (
    anthropic_request_to_openai,
    anthropic_response_to_openai,
    openai_request_to_anthropic,
    openai_response_to_anthropic,
)

DIALECTS: dict[str, Dialect] = {d.name: d for d in (OPENAI, ANTHROPIC, RESPONSES)}
DEFAULT_DIALECT = OPENAI.name  # on shared routes, for a client that names no format

_BRIDGES = (
    Bridge(
        client="anthropic",
        upstream="openai",
        request=lambda body, max_tokens_field: anthropic_request_to_openai(
            body, max_tokens_field=max_tokens_field
        ),
        response=lambda resp, model: openai_response_to_anthropic(resp, request_model=model),
        relay=lambda model, wants_usage, limit: OpenAIToAnthropicRelay(
            request_model=model, capture_limit=limit
        ),
    ),
    Bridge(
        client="openai",
        upstream="anthropic",
        request=lambda body, max_tokens_field: openai_request_to_anthropic(body),
        response=lambda resp, model: anthropic_response_to_openai(resp),
        relay=lambda model, wants_usage, limit: AnthropicToOpenAIRelay(
            model=model, include_usage=wants_usage, capture_limit=limit
        ),
    ),
    Bridge(
        client="openai-responses",
        upstream="openai",
        request=lambda body, max_tokens_field: responses_request_to_chat(
            body, max_tokens_field=max_tokens_field, custom=keeps_custom("openai")
        ),
        response=chat_response_to_responses,
        relay=lambda model, wants_usage, limit: ChatToResponsesRelay(
            request_model=model, capture_limit=limit
        ),
    ),
    # Responses <-> Anthropic goes through chat completions: both halves exist already.
    # Custom tools stay out (Messages has no free-text tool), as other tools without a form.
    Bridge(
        client="openai-responses",
        upstream="anthropic",
        request=lambda body, max_tokens_field: openai_request_to_anthropic(
            responses_request_to_chat(body, custom=keeps_custom("anthropic"), logprobs=False)
        ),
        response=lambda resp, model: chat_response_to_responses(
            anthropic_response_to_openai(resp), model
        ),
        relay=lambda model, wants_usage, limit: ChainedRelay(
            AnthropicToOpenAIRelay(model=model, include_usage=True, capture_limit=limit),
            ChatToResponsesRelay(request_model=model, capture_limit=limit),
        ),
    ),
    # A chat client in front of a Responses-only model (gpt-5-codex, o3-pro).
    Bridge(
        client="openai",
        upstream="openai-responses",
        request=lambda body, max_tokens_field: chat_request_to_responses(body),
        response=responses_response_to_chat,
        relay=lambda model, wants_usage, limit: ResponsesToChatRelay(
            request_model=model, include_usage=wants_usage, capture_limit=limit
        ),
    ),
    # Messages -> Responses goes through chat completions, as Responses -> Messages does.
    Bridge(
        client="anthropic",
        upstream="openai-responses",
        request=lambda body, max_tokens_field: anthropic_request_to_responses(body),
        response=lambda resp, model: openai_response_to_anthropic(
            responses_response_to_chat(resp, model), request_model=model
        ),
        relay=lambda model, wants_usage, limit: ChainedRelay(
            ResponsesToChatRelay(request_model=model, include_usage=True, capture_limit=limit),
            OpenAIToAnthropicRelay(request_model=model, capture_limit=limit),
        ),
    ),
)
BRIDGES: dict[tuple[str, str], Bridge] = {(b.client, b.upstream): b for b in _BRIDGES}


def get_dialect(name: str) -> Dialect:
    """The dialect called ``name`` (a client route's format or an upstream's ``kind``)."""
    return DIALECTS[name]


def dialect_for_path(path: str) -> str | None:
    """The dialect whose client routes serve ``path``: its turn path, its token-counting path,
    or a path under its turn path (``/v1/responses/compact``, ``/v1/responses/{id}``)."""
    path = path.rstrip("/")
    path = path[3:] if path.startswith("/v1/") else path
    for d in DIALECTS.values():
        if d.token_count is not None and path == d.token_count.path:
            return d.name
    for d in DIALECTS.values():
        if path == d.client_path or path.startswith(d.client_path + "/"):
            return d.name
    return None


def dialect_for_headers(headers: Mapping[str, str]) -> str:
    """The client's dialect on a route the formats share, by the header its SDK sends."""
    for d in DIALECTS.values():
        if d.marker_header is not None and d.marker_header in headers:
            return d.name
    return DEFAULT_DIALECT


def bridge(client: str, upstream: str) -> Bridge:
    """The translation from a client's format to an upstream kind's (two different names)."""
    try:
        return BRIDGES[(client, upstream)]
    except KeyError:
        raise ProxyError(
            "invalid_request",
            f"a {client} request cannot be sent to a {upstream} upstream",
            code="unsupported_upstream",
        ) from None


def request_for(
    client: str,
    upstream: str,
    body: JSON,
    *,
    max_tokens_field: str = "max_tokens",
    stream: bool = False,
    grammar: JSON | None = None,
) -> JSON:
    """A validated client request as an upstream of kind ``upstream`` takes it.
    ``max_tokens_field``: the name that upstream reads the token limit under."""
    if client != upstream:
        body = bridge(client, upstream).request(body, max_tokens_field)
    return DIALECTS[upstream].upstream_body(body, stream=stream, grammar=grammar)


def reply_for(client: str, upstream: str, resp: JSON, request_model: str) -> JSON:
    """An upstream's non-streamed reply in the client's format."""
    if client == upstream:
        return resp
    return bridge(client, upstream).response(resp, request_model)


def read_reply(
    raw: bytes, upstream_kind: str, client: str, request_model: str, *, reads: bool = False
) -> tuple[JSON, JSON, bytes] | BadReply:
    """An upstream's non-streamed 2xx body: (the reply, the reply in the client's dialect and
    its bytes), or what is wrong with it. Upstream bytes are hostile: JSON nested past
    ``MAX_JSON_DEPTH`` (in the body, or in tool-call arguments a translation parses) would
    not serialise for the client, so it is refused like a body that is no reply. A reply the
    proxy reads (translated to another format, or ``reads``: judged and committed) must have
    its format's shape (``Dialect.reply_problem``); one relayed as it came to a client of
    the same format (passthrough) goes byte for byte, as the provider wrote it."""
    try:
        resp = jsontext.loads(raw)
    except orjson.JSONDecodeError:
        resp = None
    if not isinstance(resp, dict):
        return BadReply("a body that is not a JSON object")
    if nesting_exceeds(resp, MAX_JSON_DEPTH, raw):
        return BadReply(f"a reply nesting JSON more than {MAX_JSON_DEPTH} levels deep")
    if upstream_kind == client and not reads:
        return resp, resp, raw
    problem = DIALECTS[upstream_kind].reply_problem(resp)
    if problem is not None:
        return problem
    if upstream_kind == client:
        return resp, resp, raw
    try:
        translated = reply_for(client, upstream_kind, resp, request_model)
    except JSONTooDeep as e:
        return BadReply(f"a reply whose {e}")
    return resp, translated, orjson.dumps(translated)


def make_relay(
    client: str,
    upstream: str,
    *,
    request_model: str,
    client_wants_usage: bool,
    capture_limit: int,
) -> StreamRelay:
    """The relay for an upstream stream of kind ``upstream`` to a ``client`` client."""
    if client == upstream:
        return DIALECTS[client].relay(
            request_model=request_model,
            client_wants_usage=client_wants_usage,
            capture_limit=capture_limit,
        )
    return bridge(client, upstream).relay(request_model, client_wants_usage, capture_limit)


def error_reply(raw: bytes, status: int, upstream_kind: str, client: str) -> tuple[int, bytes]:
    """An upstream's error answer as the client sees it: untouched when it already is an error
    object of the client's dialect; otherwise (the other dialect, an HTML page from a load
    balancer, plain text, another server's JSON) rewritten into one, keeping its message."""
    d = DIALECTS[client]
    if upstream_kind == client:
        relayed = d.relayed_error(raw, status)
        if relayed is not None:
            return relayed
    err = ProxyError(kind_for_status(status), error_message(raw), status=status)
    return d.error_status(err), orjson.dumps(d.error_body(err))
