"""The turn routes (``/v1/chat/completions``, ``/v1/messages``, ``/v1/responses`` and
``/v1/responses/compact``) and ``count_tokens``: parse the request into a ``Turn``, hand it to
the pipeline, render what comes back. One handler serves every turn route; what a dialect's
route does around the turn is its ``TurnHooks`` (``PlainTurn`` here; the Responses chain and
stored responses: ``web.responses.ResponsesTurn``)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from ..auth.gate import principal_of
from ..auth.tenancy import store_session
from ..choices import Choice, Constrain
from ..config import Settings
from ..cost.budgets import BUDGET_HEADER
from ..dialects.anthropic import ANTHROPIC, validate_count_tokens_request
from ..dialects.base import Dialect as Wire
from ..dialects.registry import get_dialect
from ..errors import Dialect, ProxyError
from ..observability.telemetry import NO_TELEMETRY, TurnTelemetry
from ..sessions.ids import SESSION_HEADER, resolve_session_id
from ..sessions.transcripts import SessionTranscripts, TranscriptText
from ..turn.idempotency import IDEMPOTENCY_HEADER, idempotency_of
from ..turn.types import ClientBytes, Reply, StreamReply, Turn
from .compaction import AppliedEdits, Run, plan_messages
from .counting import count_tokens
from .runtime import Runtime, runtime
from .wire import (
    StreamingProxyResponse,
    check_nesting,
    error_response,
    read_json_body,
    unless_disconnected,
)

C = TypeVar("C", bound=Choice)
COUNT_TOKENS_ROUTE = "/v1/messages/count_tokens"  # the metrics' route label


class RequestHeaders:
    """A request's headers read once (a turn asks for half a dozen): ``values`` by
    lower-case name (a name sent more than once: its last value, as a dict of the pairs
    keeps it), and how often each name that came more than once came."""

    __slots__ = ("repeated", "values")

    def __init__(self, raw: Iterable[tuple[bytes, bytes]]) -> None:
        values: dict[str, str] = {}
        repeated: dict[str, int] = {}
        for k, v in raw:
            name = k.decode("latin-1").lower()
            if name in values:
                repeated[name] = repeated.get(name, 1) + 1
            values[name] = v.decode("latin-1")
        self.values = values
        self.repeated = repeated


_HEADERS_KEY = "skillstate.headers"  # the request's RequestHeaders, in its ASGI scope


def request_headers(request: Request) -> RequestHeaders:
    """The request's headers, read on the first call (kept in its scope)."""
    scope = request.scope
    found: RequestHeaders | None = scope.get(_HEADERS_KEY)
    if found is None:
        found = scope[_HEADERS_KEY] = RequestHeaders(scope["headers"])
    return found


def single_header(request: Request, name: str) -> str | None:
    """The one value of header ``name`` (None when absent). Sent twice it is a 400: which
    copy counts would depend on who reads it (the proxy, or something in front of it)."""
    headers = request_headers(request)
    if name in headers.repeated:
        times = headers.repeated[name]
        raise ProxyError("invalid_request", f"{name} was sent {times} times", param=name)
    return headers.values.get(name)


def _header_choice(request: Request, name: str, default: C) -> C:
    """The per-request override of a setting, one of its enum's values, else a 400; the
    setting itself when the header is absent or empty (every value is lower-case and
    unpadded: it is what the lookup would find)."""
    sent = single_header(request, name)
    if not sent:
        return default
    kind = type(default)
    # The member by its value, as kind(value) finds it, without the enum's call machinery.
    found: C | None = kind._value2member_map_.get(sent.strip().lower())  # type: ignore[assignment]
    if found is None:
        allowed = ", ".join(kind.values())
        raise ProxyError("invalid_request", f"{name} must be one of {allowed}", param=name)
    return found


async def parse_turn(
    request: Request,
    settings: Settings,
    dialect: Dialect,
    validate: Callable[..., None],
    session: str,
    telemetry: TurnTelemetry = NO_TELEMETRY,
    transcripts: SessionTranscripts | None = None,
    minted: bool = False,
) -> Turn:
    """The request as a ``Turn``: a validated body plus the per-request mode headers; the
    session in the caller's key's namespace. Its Idempotency-Key applies to the session the
    client named ("" when it named none: a retry gets the session the first try made).

    ``transcripts``: the checks (nesting, ``validate``) skip the leading transcript items
    that passed them on the named session's previous request (``validate`` takes their
    count, and judges each item on its own), and a body that extends that request's bytes
    is parsed from its new items only (``SessionTranscripts.parsed``). ``minted``:
    ``session`` is one the proxy made up, the request named none (``Turn.new_session``)."""
    caller = principal_of(request.scope)
    header = single_header(request, SESSION_HEADER)
    named = store_session(caller, header or "")
    memo = (transcripts, named) if transcripts is not None and header is not None else None
    known = functools.partial(memo[0].parsed, named) if memo is not None else None
    body, raw = await read_json_body(request, settings.max_body_bytes, known)
    wire = get_dialect(dialect)
    text = check_body(body, raw, wire, validate, memo)
    mode = _header_choice(request, "x-skillstate-mode", settings.mode)
    constrain = _header_choice(request, "x-skillstate-constrain", settings.constrain)
    key = single_header(request, IDEMPOTENCY_HEADER)
    idem = None if key is None else idempotency_of(key, named, dialect, body)
    stored = store_session(caller, session)
    return Turn(
        dialect=dialect,
        body=body,
        headers=dict(request_headers(request).values),
        session=stored,
        mode=mode,
        constrain=constrain != Constrain.OFF,
        telemetry=telemetry,
        client_session=session,
        idempotency=idem,
        transcript=text,
        minted_session=stored if minted else None,
        client_bytes=_own_bytes(body, raw, text),
        looked_up=wire,
    )


def _own_bytes(body: dict[str, Any], raw: bytes, text: TranscriptText | None) -> ClientBytes | None:
    """The client's bytes, to send as they are while the body is unchanged, when they were
    shown to hold no key twice (a repeated key reads otherwise in other parsers); None: the
    proxy sends its serialisation of what it read."""
    return ClientBytes(body, raw) if text is not None and text.vouches_for_raw else None


def check_body(
    body: dict[str, Any],
    raw: bytes,
    wire: Wire,
    validate: Callable[..., None],
    memo: tuple[SessionTranscripts, str] | None = None,
) -> TranscriptText | None:
    """The request checks: the nesting limit, then ``validate``. ``memo``: the session's
    transcripts (and the session), whose previous request's leading transcript items passed
    them already; the transcript's serialisation, made for that, is returned."""
    text = memo[0].text(memo[1], wire, body, validate, raw) if memo is not None else None
    if text is not None and text.checked:
        check_nesting(body, raw, (wire.transcript[0], text.checked))
        validate(body, text.checked)
    else:
        check_nesting(body, raw)
        validate(body)
    if memo is not None:
        memo[0].passed(text)
    return text


class TurnHooks(Protocol):
    """What one dialect's turn route does around the shared turn (one object per request)."""

    async def start(
        self, request: Request, rt: Runtime, tel: TurnTelemetry, shown: dict[str, str]
    ) -> tuple[Turn, Run]:
        """The request as a ``Turn``, and what runs it (the pipeline, or a compaction).
        ``shown`` gets the session header as soon as the session is known: an error reply
        carries it from then on."""
        ...

    async def finish(self, turn: Turn, result: Reply | StreamReply) -> Reply | StreamReply:
        """The reply as the client gets it."""
        ...


class PlainTurn:
    """The hooks of chat completions and Messages: the session is the header's (else a new
    one); a Messages request's ``context_management`` edits and compaction blocks are the
    proxy's to apply (``web.compaction.plan_messages``) and its reply reports the edits."""

    def __init__(self, dialect: Dialect, validate: Callable[..., None]) -> None:
        self.dialect = dialect
        self.validate = validate
        self.edits: AppliedEdits | None = None  # context_management the proxy applied

    async def start(
        self, request: Request, rt: Runtime, tel: TurnTelemetry, shown: dict[str, str]
    ) -> tuple[Turn, Run]:
        header = single_header(request, SESSION_HEADER)
        session = resolve_session_id(header)
        shown[SESSION_HEADER] = session
        turn = await parse_turn(
            request,
            rt.settings,
            self.dialect,
            self.validate,
            session,
            tel,
            rt.transcripts,
            minted=header is None,
        )
        if self.dialect != ANTHROPIC.name:
            return turn, lambda: rt.pipeline.run(turn)
        turn, self.edits, run = await plan_messages(
            rt, turn, principal_of(request.scope), adopt=header is None
        )
        shown[SESSION_HEADER] = turn.shown_session
        return turn, run

    async def finish(self, turn: Turn, result: Reply | StreamReply) -> Reply | StreamReply:
        if self.edits is None:
            return result
        if isinstance(result, Reply):
            return self.edits.reply(result)
        return dataclasses.replace(result, chunks=self.edits.stream(result.chunks))


async def _turn(request: Request, dialect: Dialect, route: str, hooks: TurnHooks) -> Response:
    rt = runtime(request)
    tel = rt.telemetry.turn(route, dialect, key_name(request))
    session_hdr: dict[str, str] = {}
    try:
        turn, run = await hooks.start(request, rt, tel, session_hdr)
        tel.begin(turn)
        await admit(request, rt, turn)
        # A disconnect cancels the turn. Decided: the turn is committed iff the proxy had the
        # model's whole answer before that (the commit then finishes: Committer.commit_transition);
        # earlier, the upstream call is cancelled and nothing is committed. See README.
        with tel.active():  # the turn's task starts under the turn's span
            result = await unless_disconnected(request, run())
    except ProxyError as e:
        response = error_response(e, dialect, session_hdr)
        tel.finished(response.status_code)
        return response
    if result is None:
        tel.finished(499)
        return Response(status_code=499)  # the client is gone; nobody reads this
    result = await hooks.finish(turn, result)
    headers = with_budgets(turn, result)
    if isinstance(result, Reply):
        tel.finished(result.status)
        return Response(result.body, status_code=result.status, headers=headers)
    return StreamingProxyResponse(result.chunks, headers, streaming(tel, result.abort))


async def admit(request: Request, rt: Runtime, turn: Turn) -> None:
    """The caller's key's rate limits (before the upstreams'), and the turn's budgets: its
    key's and its session's (``x-skillstate-budget-usd`` sets the session's), held per
    upstream call by the pipeline."""
    caller = principal_of(request.scope)
    if caller is not None:
        await rt.quotas.admit(caller, turn.body)
    asked = single_header(request, BUDGET_HEADER)
    key, record = (caller.name, caller.record) if caller is not None else (None, None)
    turn.budgets = await rt.budgets.for_turn(
        key,
        record,
        turn.session,
        asked,
        stored=not turn.new_session,
        mode=str(turn.recorded_mode),
        stream=turn.stream,
    )


def with_budgets(turn: Turn, result: Reply | StreamReply) -> dict[str, str]:
    """The reply's headers with what the turn's budgets have spent and have left (a stream:
    spent before it; its own cost is in its closing comment)."""
    if turn.budgets is None or not turn.budgets.budgets:
        return result.headers  # under no budget: nothing to add (no copy of the headers)
    cost = 0.0
    if isinstance(result, Reply):  # what the ledger charges the turn, measured or estimated
        for name in ("x-skillstate-cost-usd", "x-skillstate-estimated-cost-usd"):
            cost += float(result.headers.get(name) or 0)
    return {**result.headers, **turn.budgets.headers(cost)}


def key_name(request: Request) -> str | None:
    """The name of the client key this request was made with (None with auth off)."""
    caller = principal_of(request.scope)
    return caller.name if caller is not None else None


def streaming(
    tel: TurnTelemetry, abort: Callable[[], Awaitable[None]]
) -> Callable[[], Awaitable[None]]:
    """A stream is starting: its first byte is noted now, and the returned ``on_close`` (the
    stream's ``abort``, which the response calls once when it is over) counts the request."""
    tel.first_byte()

    async def done() -> None:
        try:
            await abort()
        finally:
            tel.finished(200)

    return done


def turn_endpoint(
    dialect: Dialect, hooks: Callable[[], TurnHooks] | None = None, path: str | None = None
) -> Callable[[Request], Awaitable[Response]]:
    """The handler of one dialect's turn route (``path``, by default
    ``Dialect.client_path``); ``hooks`` makes each request's hooks (by default the
    dialect's ``PlainTurn``)."""
    d = get_dialect(dialect)
    route = "/v1" + (path or d.client_path)  # the metrics' route label

    def hooks_of() -> TurnHooks:
        return PlainTurn(dialect, d.validate) if hooks is None else hooks()

    async def handle(request: Request) -> Response:
        return await _turn(request, dialect, route, hooks_of())

    name = (path or d.client_path).strip("/").replace("/", "_")
    handle.__name__ = handle.__qualname__ = f"{dialect}_turn" if path is None else name
    return handle


async def messages_count_tokens(request: Request) -> Response:
    """Anthropic's count_tokens, for the body this turn would send upstream."""
    rt = runtime(request)
    tel = rt.telemetry.turn(COUNT_TOKENS_ROUTE, "anthropic")
    session_hdr: dict[str, str] = {}
    try:
        session = resolve_session_id(single_header(request, SESSION_HEADER))
        session_hdr = {SESSION_HEADER: session}
        turn = await parse_turn(
            request, rt.settings, "anthropic", validate_count_tokens_request, session
        )
        # What would go upstream: compaction blocks restored, the proxy's edits applied.
        adopt = request.headers.get(SESSION_HEADER) is None
        asked = turn.body
        turn, _, _ = await plan_messages(rt, turn, principal_of(request.scope), adopt=adopt)
        # The request before its context management (in the session it resolved to).
        original = None
        if asked.get("context_management") is not None:
            original = dataclasses.replace(turn, body=asked)
        tel.begin(turn)
        result = await count_tokens(rt.pipeline.planner, rt.sessions, rt.pool, turn, original)
    except ProxyError as e:
        response = error_response(e, "anthropic", session_hdr)
        tel.finished(response.status_code)
        return response
    tel.finished(result.status)
    return Response(result.body, status_code=result.status, headers=result.headers)
