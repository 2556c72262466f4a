"""The Responses API routes: ``POST /v1/responses`` (a turn, with ``previous_response_id``
chains and ``store`` kept by the proxy, for every upstream kind),
``POST /v1/responses/input_tokens`` (what that turn would send, counted) and
``GET``/``DELETE /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items`` and
``POST /v1/responses/{id}/cancel``.

A Responses turn runs through the shared turn handler (``web.turns``) with ``ResponsesTurn``
as its hooks. The chain is rebuilt there, before the turn: the stored response's input and
output items come first, then the request's own input, and ``previous_response_id`` is not
sent upstream (an upstream without server-side state, such as llama.cpp, gets the whole
chain). In state mode that chain is the session's transcript, which the compact context then
shortens."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..auth.gate import Principal, principal_of
from ..auth.tenancy import split_session, store_session
from ..choices import Mode
from ..compaction import items as ci
from ..dialects import sse
from ..dialects.replystream import responses_events
from ..dialects.responses import RESPONSES, input_items
from ..dialects.responses.stream import TERMINAL_EVENTS
from ..dialects.responses.translate import (
    keeps_custom,
    reject_unsupported_tools,
    require_call_ids,
    split_tools,
    untranslated_items,
)
from ..dialects.responses.validate import validate_input_tokens_request
from ..errors import ProxyError
from ..headertext import HEADER_TEXT_MAX_CHARS, header_safe
from ..numbertext import whole_number
from ..observability.telemetry import TurnTelemetry
from ..sessions.ids import SESSION_HEADER, resolve_session_id
from ..store import Store, StoredResponse, StoreError
from ..turn.render import REPLAYED_HEADER
from ..turn.stored import StoredLink, response_of
from ..turn.types import Reply, StreamReply, Turn
from ..upstream.client import UpstreamPool, UpstreamRuntime
from .compaction import Run, plan, restore
from .counting import count_tokens
from .paging import parse_limit
from .runtime import Runtime, runtime
from .turns import parse_turn, single_header
from .wire import error_response

# GET /responses/{id}/input_items pages as the API does: 20 items, at most 100.
INPUT_ITEMS_PAGE = 20
INPUT_ITEMS_MOST = 100

DIALECT = RESPONSES.name
JSON = dict[str, Any]
INPUT_TOKENS_ROUTE = "/v1/responses/input_tokens"  # the metrics' route label


MAX_CHAIN = 10_000  # responses followed back from a previous_response_id


async def _chain(store: Store, response_id: str, links: int = MAX_CHAIN) -> list[StoredResponse]:
    try:
        return await store.response_chain(response_id, links)
    except StoreError as e:
        raise e.for_client("could not read the response") from e


def _history(chain: list[StoredResponse]) -> list[Any]:
    """Every link's input items and output items, oldest first; not a compaction trigger,
    an instruction to the request it ended (the answer's compaction item stands for it)."""
    return [
        item
        for link in chain
        for item in (*link.input, *(link.response.get("output") or ()))
        if ci.kind(item) != ci.TRIGGER
    ]


async def _with_chain(
    store: Store, turn: Turn, session_header: str | None, caller: Principal | None
) -> Turn:
    """The turn with its chain rebuilt from ``previous_response_id``, its input as a list
    and its session: the header's, else the previous response's, else a new one (in the
    caller's key's namespace: another key's response id is not found)."""
    body = turn.body
    items = input_items(body.get("input"))
    session = resolve_session_id(session_header) if session_header is not None else None
    session = None if session is None else store_session(caller, session)
    prev_id = body.get("previous_response_id")
    if prev_id is not None:
        chain = await _chain(store, prev_id)
        if not chain or not _owned(chain[-1], caller):
            raise ProxyError(
                "invalid_request",
                f"Previous response with id '{prev_id}' not found.",
                param="previous_response_id",
                code="previous_response_not_found",
                status=404,
            )
        items = [*_history(chain), *items]
        session = session or chain[-1].session
        body = {k: v for k, v in body.items() if k != "previous_response_id"}
    if prev_id is not None or (turn.mode != Mode.PASSTHROUGH and isinstance(body["input"], str)):
        body = {**body, "input": items}  # the state context works on a list of items
    minted = None if session else store_session(caller, resolve_session_id(None))
    session = session or minted
    assert session is not None
    shown = split_session(session)[1] if caller is not None else session
    return dataclasses.replace(
        turn, body=body, session=session, client_session=shown, minted_session=minted
    )


def _owned(found: StoredResponse, caller: Principal | None) -> bool:
    """Whether the caller may chain on a stored response (``previous_response_id``): its
    key's own (anyone's, auth off). Not one made before the first key, even for an admin:
    a keyed client's turns are its own namespace's (``skillstate.auth.tenancy``)."""
    return caller is None or split_session(found.session)[0] == caller.name


def _reachable(found: StoredResponse, caller: Principal | None) -> bool:
    """Whether the caller may read or delete a stored response: its own, or for an admin
    also one made before the first key (no key: as ``?key=(none)`` on ``/state``)."""
    unkeyed = caller is not None and caller.admin and split_session(found.session)[0] is None
    return unkeyed or _owned(found, caller)


class ResponsesTurn:
    """The Responses route's hooks around the shared turn (``web.turns``): the chain rebuilt
    from ``previous_response_id`` before it (and compaction items restored, or the request
    served as a compaction: ``skillstate.web.compaction``), the response stored after it.
    ``endpoint``: ``POST /v1/responses/compact``, which stores nothing."""

    def __init__(self, endpoint: bool = False) -> None:
        self.endpoint = endpoint
        self.link: StoredLink | None = None
        self.tools: Any = None  # the request's tools, and its own input items: what an
        self.own_items: list[Any] = []  # upstream of another kind is not sent is named
        self.pool: UpstreamPool | None = None
        self.store: Store | None = None

    async def start(
        self, request: Request, rt: Runtime, tel: TurnTelemetry, shown: dict[str, str]
    ) -> tuple[Turn, Run]:
        header = request.headers.get(SESSION_HEADER)
        if header is not None:
            resolve_session_id(header)  # a malformed header is a 400 before the body is read
        turn = await parse_turn(
            request,
            rt.settings,
            DIALECT,
            RESPONSES.validate,
            session="",
            telemetry=tel,
            transcripts=rt.transcripts,
        )
        turn, background = (turn, False) if self.endpoint else _in_foreground(turn)
        prev_id = turn.body.get("previous_response_id")
        own_items = input_items(turn.body.get("input"))
        self.tools, self.own_items = turn.body.get("tools"), own_items
        _reject_unsupported(rt, turn)
        caller = principal_of(request.scope)
        turn = await _with_chain(rt.store, turn, header, caller)
        shown[SESSION_HEADER] = turn.shown_session  # on a bad compaction item's 400 too
        turn = await restore(rt, turn, caller, adopt=header is None and prev_id is None)
        shown[SESSION_HEADER] = turn.shown_session  # (the item's session, adopted)
        _reject_conversation(turn)
        if not self.endpoint and turn.body.get("store") is not False:
            self.link = StoredLink(turn.session, prev_id, own_items, background=background)
            # The turn stores it with its commit; a compaction's parts do not (the reply is
            # made after them: ``finish`` stores it).
            turn = dataclasses.replace(turn, stored=self.link)
        turn, run = plan(rt, turn, caller, endpoint=self.endpoint)
        self.store = rt.store
        self.pool = rt.pool
        return turn, run

    async def finish(self, turn: Turn, result: Reply | StreamReply) -> Reply | StreamReply:
        if self.pool is not None:
            kind = _answering_kind(self.pool.candidates(turn.model or None), result.headers)
            if kind != DIALECT:
                custom = keeps_custom(kind)
                _, tools = split_tools(self.tools, custom=custom)
                _say_dropped(result.headers, "tools", tools)
                # Item types are the API's (validated): every one of them fits in the header.
                items = untranslated_items(self.own_items, custom=custom)
                _say_dropped(result.headers, "items", items, 1024)
        link, store = self.link, self.store
        if link is None or link.done or store is None:
            return result  # nothing to store, or stored with the turn's commit
        replayed = REPLAYED_HEADER in result.headers  # kept under its Idempotency-Key: as it was
        if isinstance(result, StreamReply):
            if replayed or turn.stored is not None:
                return result  # a stream that ended without a response: nothing to store
            return dataclasses.replace(result, chunks=_keep_stream(store, link, result.chunks))
        if 200 <= result.status < 300:
            body, response = link.reply(result.body)
            if response is not None and not replayed and turn.stored is None:
                with contextlib.suppress(StoreError):
                    await store.put_response(response)
            return dataclasses.replace(result, body=body)
        return result


async def responses_input_tokens(request: Request) -> Response:
    """``POST /v1/responses/input_tokens``: the tokens this request would send upstream as
    a turn (``web.counting``), its chain rebuilt from ``previous_response_id`` and its
    compaction items restored as the turn route does; checked as a turn is. Nothing is
    committed, stored, metered or rate-limited."""
    rt = runtime(request)
    tel = rt.telemetry.turn(INPUT_TOKENS_ROUTE, DIALECT)
    shown: dict[str, str] = {}
    try:
        header = single_header(request, SESSION_HEADER)
        if header is not None:
            shown[SESSION_HEADER] = resolve_session_id(header)
        turn = await parse_turn(
            request, rt.settings, DIALECT, validate_input_tokens_request, session=""
        )
        _reject_unsupported(rt, turn)
        caller = principal_of(request.scope)
        adopt = header is None and turn.body.get("previous_response_id") is None
        turn = await _with_chain(rt.store, turn, header, caller)
        turn = await restore(rt, turn, caller, adopt=adopt)
        shown[SESSION_HEADER] = turn.shown_session
        tel.begin(turn)
        result = await count_tokens(rt.pipeline.planner, rt.sessions, rt.pool, turn)
    except ProxyError as e:
        response = error_response(e, DIALECT, shown)
        tel.finished(response.status_code)
        return response
    tel.finished(result.status)
    return Response(result.body, status_code=result.status, headers=result.headers)


def compact_hooks() -> ResponsesTurn:
    """The hooks of ``POST /v1/responses/compact``: the request's transcript compacted into
    the session's state, answered with its user messages and one ``compaction`` item."""
    return ResponsesTurn(endpoint=True)


def _in_foreground(turn: Turn) -> tuple[Turn, bool]:
    """The turn without ``background`` and ``background_options``, and whether it asked for
    a background run. The proxy serves a turn while its client waits: it reads the reply to
    commit the session's state, and stores the response it answers. So a background request
    runs in the foreground, upstream too (an upstream asked for one would answer ``queued``,
    with no output to commit, and the stored response would stay queued); the client gets
    the finished response, with ``background: true``, which ends any polling loop at once.
    A discounted completion window (``2h``, ``8h``) is refused: in the foreground it would
    be billed in full, which is not what the client asked for."""
    body = turn.body
    if "background" not in body and "background_options" not in body:
        return turn, False
    options = body.get("background_options")
    window = options.get("completion_window") if isinstance(options, dict) else None
    if window is not None and window != "soonest":
        raise ProxyError(
            "invalid_request",
            f"background_options.completion_window {str(window)[:20]!r}: the proxy runs a"
            " background request while its client waits, so it cannot wait for a discounted"
            " window; use 'soonest' (or none), or send the request to the API directly",
            param="background_options.completion_window",
        )
    body = {k: v for k, v in body.items() if k not in ("background", "background_options")}
    return dataclasses.replace(turn, body=body), turn.body.get("background") is True


def _reject_unsupported(rt: Runtime, turn: Turn) -> None:
    """What an upstream of another kind that may serve the turn cannot take: a function call
    output without ``call_id`` (a 400 naming the client's item), and under
    ``unsupported_tools: reject`` a tool it lacks (hosted tools; custom tools on Anthropic)."""
    kinds = sorted({up.kind for up in rt.pool.candidates(turn.model or None)} - {DIALECT})
    if kinds:
        require_call_ids(turn.body)
    if rt.settings.unsupported_tools != "reject":
        return
    for kind in kinds:
        reject_unsupported_tools(turn.body, custom=keeps_custom(kind))


# The modes that send the proxy's own context every turn in place of the transcript.
_OWN_CONTEXT_MODES = frozenset({Mode.STATE, Mode.WINDOW, Mode.AUTO})


def _reject_conversation(turn: Turn) -> None:
    """A ``conversation`` in a mode that sends its own context: the API would put the
    conversation's items (the earlier turns' contexts) before it, and add this turn's to
    them, so the model would read every earlier state and the session would cost more each
    turn. A 400 naming it; the transcript and ``previous_response_id`` work in every mode."""
    if turn.body.get("conversation") is not None and turn.mode in _OWN_CONTEXT_MODES:
        raise ProxyError(
            "invalid_request",
            f"conversation: in {turn.mode} mode the proxy sends its own context every turn,"
            " and the conversation's items would go before it; send the transcript or"
            " previous_response_id, or use passthrough",
            param="conversation",
        )


def _answering_kind(candidates: list[UpstreamRuntime], headers: dict[str, str]) -> str:
    """The kind of the upstream that answered (``x-skillstate-upstream``)."""
    name = headers.get("x-skillstate-upstream")
    return next((up.kind for up in candidates if up.name == name), DIALECT)


def _say_dropped(
    headers: dict[str, str], what: str, dropped: list[str], limit: int = HEADER_TEXT_MAX_CHARS
) -> None:
    """Name the tools (or input item types) the answering upstream never saw (it was not of
    the Responses kind): ``x-skillstate-dropped-tools`` / ``x-skillstate-dropped-items``."""
    if dropped:
        headers[f"x-skillstate-dropped-{what}"] = header_safe(",".join(dropped), limit)


async def _keep_stream(
    store: Store, link: StoredLink, chunks: AsyncIterator[bytes]
) -> AsyncIterator[bytes]:
    """A compaction's stream as it is, with its final response stored before the terminal
    event goes out (a client that chains right after the stream finds it)."""
    parser = sse.SSEParser()
    async for chunk in chunks:
        for event in parser.feed(chunk):
            if event.event in TERMINAL_EVENTS and event.data:
                resp = response_of(event.data)
                record = None if resp is None else link.record(resp)
                if record is not None:
                    with contextlib.suppress(StoreError):
                        await store.put_response(record)
        yield chunk


async def _stored(request: Request, links: int = 1) -> list[StoredResponse]:
    """The response named in the path, after up to ``links - 1`` it chains on (oldest
    first, the response itself last); a 404 when it is unknown or another key's."""
    rid = request.path_params["response_id"]
    chain = await _chain(runtime(request).store, rid, links)
    if not chain or not _reachable(chain[-1], principal_of(request.scope)):
        raise ProxyError("not_found", f"No response found with id '{rid}'.", param="response_id")
    return chain


async def response_item(request: Request) -> Response:
    """``GET`` (the stored response object; with ``stream=true``, a background response's
    events after ``starting_after``) and ``DELETE`` ``/v1/responses/{id}``."""
    try:
        streamed = request.method == "GET" and _stream_query(request)
        found = (await _stored(request))[-1]
        if request.method == "DELETE":
            await runtime(request).store.delete_response(found.id)
            return JSONResponse({"id": found.id, "object": "response", "deleted": True})
        if streamed:
            return _streamed_again(found.response, _starting_after(request))
    except ProxyError as e:
        return error_response(e, DIALECT)
    except StoreError as e:
        return error_response(e.for_client("could not delete the response"), DIALECT)
    return JSONResponse(found.response)


async def response_cancel(request: Request) -> Response:
    """``POST /v1/responses/{id}/cancel``. A background response is finished by the time
    its id is known (the proxy runs it in the foreground: ``_in_foreground``), so this
    answers it unchanged, as the API answers a finished background response; any other
    response cannot be cancelled (a 400, as the API answers)."""
    try:
        found = (await _stored(request))[-1]
        if found.response.get("background") is not True:
            raise ProxyError(
                "invalid_request",
                "only a response created with background: true can be cancelled",
                param="response_id",
            )
    except ProxyError as e:
        return error_response(e, DIALECT)
    return JSONResponse(found.response)


def _stream_query(request: Request) -> bool:
    """``GET /v1/responses/{id}``'s ``stream``: ``true`` or ``false`` (the SDKs' words)."""
    value = request.query_params.get("stream", "false")
    if value not in ("true", "false"):
        raise ProxyError("invalid_request", "stream must be 'true' or 'false'", param="stream")
    return value == "true"


def _starting_after(request: Request) -> int:
    """``starting_after``: the sequence number of the last event the client has (-1: none)."""
    value = request.query_params.get("starting_after")
    if value is None:
        return -1
    number = whole_number(value)
    if number is None:
        raise ProxyError(
            "invalid_request",
            "starting_after must be a whole number (an event's sequence_number)",
            param="starting_after",
        )
    return number


def _streamed_again(response: dict[str, Any], after: int) -> Response:
    """A stored background response as the events of its stream (``responses_events``: the
    stream a finished response makes), those after ``after``. The API streams only a
    background response again; it keeps its events, and the proxy keeps the response."""
    if response.get("background") is not True:
        raise ProxyError(
            "invalid_request",
            "only a response created with background: true can be streamed again;"
            " GET it without stream=true",
            param="stream",
        )
    return Response(b"".join(responses_events(response, after)), media_type="text/event-stream")


async def response_input_items(request: Request) -> Response:
    """``GET /v1/responses/{id}/input_items``: the items the response was generated from,
    in the API's list shape and pages: ``order`` (``desc``, newest first, by default, or
    ``asc``), ``limit`` (1 to 100, 20 by default) items ``after`` the item of that id."""
    try:
        order, limit, after = _input_items_query(request)
        chain = await _stored(request, MAX_CHAIN)
        found = chain[-1]
        items = [
            {"id": item.get("id") or f"item_{found.id}_{i}", **_listed(item)}
            for i, item in enumerate([*_history(chain[:-1]), *found.input])
            if isinstance(item, dict)
        ]
        if order == "desc":
            items.reverse()
        start = _after(items, after)
    except ProxyError as e:
        return error_response(e, DIALECT)
    page = items[start : start + limit]
    return JSONResponse(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": start + limit < len(items),
        }
    )


def _listed(item: dict[str, Any]) -> dict[str, Any]:
    """An input item as the API lists it: a message in the easy form (its ``content`` a
    string) as a message item of content parts, the SDKs' ``ResponseInputMessageItem`` (an
    assistant's: ``ResponseOutputMessage``)."""
    content = item.get("content")
    if "role" not in item or not isinstance(content, str):
        return item
    if item["role"] == "assistant":
        part: dict[str, Any] = {"type": "output_text", "text": content, "annotations": []}
    else:
        part = {"type": "input_text", "text": content}
    return {**item, "type": "message", "content": [part]}


def _input_items_query(request: Request) -> tuple[str, int, str | None]:
    """``order``, ``limit`` and ``after`` of an input items listing; a 400 naming the one
    that is not what the API takes."""
    q = request.query_params
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ProxyError("invalid_request", "order must be 'asc' or 'desc'", param="order")
    return order, parse_limit(q.get("limit"), INPUT_ITEMS_PAGE, INPUT_ITEMS_MOST), q.get("after")


def _after(items: list[dict[str, Any]], after: str | None) -> int:
    """Where the page after the item ``after`` starts (0 without one); a 400 when no item
    of the listing has that id."""
    if after is None:
        return 0
    for i, item in enumerate(items):
        if item["id"] == after:
            return i + 1
    raise ProxyError("invalid_request", f"no input item {after[:80]!r} in this list", param="after")
