"""One client turn through the stages:

session -> limits -> context -> upstream -> extract -> validate/merge -> store -> ledger

Handlers in `app` parse and render; everything between lives here. The state logic itself
(context, patch) is pure; this module only sequences it with I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
import orjson

from ..cancelsafe import shielded, uncancellable
from ..choices import CacheBreakpoints, ContextShape, Mode, ReplyEnvelope
from ..config import Settings
from ..cost.auto import AutoEstimate, AutoPlanner, TurnSizes
from ..cost.baseline import SessionPrefixCaches, envelope_output_share
from ..cost.cachehints import CacheHints, count_breakpoints, prompt_cache_key
from ..cost.meter import BaselineSource, MeterContext, TurnMeter
from ..cost.pricing import PriceBook
from ..cost.tokens import estimate_tokens, request_tokens
from ..cost.usage import Usage
from ..dialects import sse
from ..dialects.base import StreamRelay
from ..dialects.registry import error_reply, get_dialect, make_relay, reply_for
from ..engine import constrain, context
from ..engine.context import EnvelopeForm
from ..engine.mask import mask_transcript
from ..engine.strip_events import StrippingRelay
from ..engine.stripper import Stripped, strip_envelope
from ..engine.verdict import Outcome, Verdicts
from ..errors import ProxyError
from ..headertext import header_safe
from ..jsondepth import MAX_JSON_DEPTH, JSONTooDeep, nesting_exceeds
from ..observability.telemetry import NO_TELEMETRY, TurnTelemetry
from ..sessions.ids import SESSION_HEADER
from ..sessions.locks import Hold, SessionLocks, TurnLocks
from ..sessions.transcripts import SessionTranscripts, TranscriptView
from ..store import SessionRecord, StepConflict, Store, StoreError, TransitionRecord
from ..store.records import LedgerRow
from ..upstream.client import Exchange, Outbound, UpstreamPool

if TYPE_CHECKING:
    from ..cost.budgets import TurnBudgets

log = logging.getLogger("skillstate")
T = TypeVar("T")

CONSTRAINED_ACTION_MAX_LENGTH = 32  # chars of "action" allowed by the constrained envelope
CUT_OFF_ECHO_CHARS = 200  # of a reply cut off at max_tokens, echoed in the re-ask


@dataclass
class Turn:
    """A parsed client request."""

    dialect: str  # "openai" | "anthropic"
    body: dict[str, Any]
    headers: Mapping[str, str]  # lower-case names
    session: str  # the store's id (namespaced by the caller's key: skillstate.auth.tenancy)
    mode: Mode
    constrain: bool = False
    telemetry: TurnTelemetry = (
        NO_TELEMETRY  # /metrics and traces (skillstate.observability.telemetry)
    )
    client_session: str | None = None  # the id the client sent, when it differs from session
    budgets: TurnBudgets | None = None  # the key's and the session's (cost/budgets.py)
    # A context form fixed by the caller instead of the mode's: a compaction's checkpoint
    # sends the whole transcript with the contract (skillstate.compaction).
    shape: ContextShape | None = None

    @property
    def shown_session(self) -> str:
        """The session id the client knows (what the session header answers)."""
        return self.client_session or self.session

    @property
    def stream(self) -> bool:
        """Whether the client asked for a streamed (SSE) reply."""
        return bool(self.body.get("stream"))

    @property
    def model(self) -> str:
        """The model the client asked for ("" when the body names none)."""
        m = self.body.get("model")
        return m if isinstance(m, str) else ""

    @property
    def keeps_state(self) -> bool:
        """Whether this turn's mode keeps the session's state (and so holds its lock)."""
        return self.mode in (Mode.STATE, Mode.AUTO)

    @cached_property
    def envelope_form(self) -> EnvelopeForm:
        """How the reply carries the envelope (see skillstate.engine.context.EnvelopeForm)."""
        return "none" if constrain.has_own_format(self.body) else "block"


@dataclass
class Reply:
    """A complete reply for the client: status, body in its dialect, and headers."""

    status: int
    body: bytes
    headers: dict[str, str]


@dataclass
class StreamReply:
    """A streamed reply: headers now, body chunks as the upstream sends them (the turn is
    judged and committed before the last chunk)."""

    headers: dict[str, str]
    chunks: AsyncIterator[bytes]
    # Idempotent: drops the upstream and releases the session. The response calls it when
    # it is done, so nothing leaks even if `chunks` was never started (early disconnect).
    abort: Callable[[], Awaitable[None]]


def with_envelope(shape: ContextShape) -> bool:
    """Whether a turn sent in this shape asks the model for the state envelope (and so is
    judged and committed)."""
    return shape in (ContextShape.COMPACT, ContextShape.FULL)


def strips(turn: Turn) -> bool:
    """Whether the client's copy of this turn's reply is stripped of envelopes: never when
    the request brought its own output format (``format-noop``: the reply must parse as the
    client's format, and the model was not asked for an envelope)."""
    return turn.envelope_form != "none"


def _cache_hints(turn: Turn, body: dict[str, Any], schema: list[str]) -> CacheHints:
    """The turn's hints for the provider's prompt cache (``skillstate.cost.cachehints``).

    The cache key: only for a session the client named (a generated id is new on every
    request, and would scatter its calls over caches). The breakpoint: at the contract's
    text block of a compact context in the Anthropic format (the contract ends the stable
    prefix: system, tools, task, contract); its tokens are estimated from those parts."""
    key = prompt_cache_key(turn.session) if SESSION_HEADER in turn.headers else None
    messages = body.get("messages")
    first = messages[0] if isinstance(messages, list) and messages else None
    content = first.get("content") if isinstance(first, dict) else None
    if not isinstance(content, list):
        return CacheHints(key)
    contract = context.contract_text(schema, turn.envelope_form)
    at = next(
        (
            k
            for k, b in enumerate(content)
            if isinstance(b, dict) and b.get("type") == "text" and b.get("text") == contract
        ),
        None,
    )
    if at is None:
        return CacheHints(key)
    prefix = [body.get("tools"), body.get("system"), content[: at + 1]]
    return CacheHints(key, contract, estimate_tokens(prefix))


_est = request_tokens  # tokens of what an upstream would read of a body


class Pipeline:
    """One client turn through the stages, and the operator's changes to a session.

    It decides (context shape, re-ask, commit); the stages it calls do the work: context
    building, the upstream pool, patch validation, the store, and a ``TurnMeter`` per turn
    that counts every upstream attempt. Turns of one session run one at a time (``locks``:
    ``SessionLocks`` in one process, Redis leases across replicas); turns of different
    sessions run concurrently.
    """

    def __init__(
        self,
        settings: Settings,
        store: Store,
        pool: UpstreamPool,
        prices: PriceBook,
        locks: TurnLocks | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.pool = pool
        self.prices = prices
        self.verdicts = Verdicts(settings)
        self.locks: TurnLocks = locks if locks is not None else SessionLocks()
        self._background: set[asyncio.Task[Any]] = set()
        # What each session's baseline request (no proxy) would have in the prompt cache.
        self.baseline_caches = SessionPrefixCaches(max(settings.max_sessions, 1_000))
        self.auto = AutoPlanner(max(settings.max_sessions, 1_000))
        # Each session's last transcript and the results on it, for the next turn's.
        self.transcripts = SessionTranscripts()

    # -- policy and context ----------------------------------------------------------------

    # -- the operator's changes ---------------------------------------------------------------

    @property
    def active_sessions(self) -> int:
        """Sessions with a turn running or waiting (for /health)."""
        return len(self.locks)

    async def operator_patch(
        self, session: str, patch: dict[str, Any], by: str | None = None
    ) -> OperatorChange:
        """Apply an operator's patch (``PATCH /state``) as one more transition of the
        session: validated like a model's patch, committed like a turn, under its lock.
        ``by`` (the operator's key name) is recorded as the action ``operator:<by>``."""
        async with self.locks.hold(session) as hold:
            record = await self._load(session, hold)
            if record is None:
                raise ProxyError("not_found", f"unknown session {session}")
            tr = self.verdicts.check_patch(record.state, patch, record.schema)
            if not tr.ok or tr.new_state is None:
                raise ProxyError("invalid_request", "; ".join(tr.errors) or "invalid patch")
            transition = TransitionRecord(
                record.step + 1,
                "operator",
                tr.applied_patch,
                "operator" if by is None else f"operator:{by}",
                tr.warnings,
                time.time(),
            )
            step = await self.commit_transition(
                session, record.step, tr.new_state, record.schema, transition, hold=hold
            )
        return OperatorChange(step, tr.new_state, tr.warnings)

    async def purge_expired(self, older_than: float) -> int:
        """Delete the sessions not updated since ``older_than`` (the TTL purge), except those
        with a turn running or waiting: that turn's commit makes them fresh again. New turns
        wait for the purge (one store transaction). While Redis is unreachable under
        ``coordination_down: refuse`` the purge cannot pause the other replicas: it is
        skipped (0), and the next one runs as usual."""
        try:
            async with self.locks.pause_new() as busy:
                return await self.store.purge_sessions(older_than, keep=busy)
        except ProxyError as e:
            if e.code != "coordination_unavailable":
                raise
            log.warning("session purge skipped (Redis is unreachable); tried again next interval")
            return 0

    async def delete_session(self, session: str) -> bool:
        """Forget a session (``DELETE /state``), after any turn of it in flight. False when
        there was no such session."""
        async with self.locks.hold(session) as hold:
            deleted = await self.store.delete(session)
            hold.committed(0)
            return deleted

    async def load_current(self, session: str) -> SessionRecord | None:
        """The session as last committed, read without holding it (``GET /state``): from
        the store's cache only while that is current (another replica may have committed)."""
        record = await self.store.load(session)
        if record is not None and not await self.locks.current(record):
            record = await self.store.load(session, fresh=True)
        return record

    async def _load(self, session: str, hold: Hold) -> SessionRecord | None:
        """The session as last committed, for the holder of its lock: read again from the
        database when the store's copy is behind another replica's commit. A store that
        cannot answer (a PostgreSQL store down) is the client's 503 before anything is sent."""
        try:
            record = await self.store.load(session)
            if record is not None and not hold.current(record):
                record = await self.store.load(session, fresh=True)
        except StoreError as e:
            raise e.for_client("could not load the session; the turn was not sent") from e
        return record

    def _outbound(
        self,
        turn: Turn,
        body: dict[str, Any],
        schema: list[str],
        state: dict[str, Any],
        *,
        bounded: bool = False,
    ) -> Outbound:
        grammar: dict[str, Any] | None = None
        if turn.constrain and constrain.should_constrain(body):
            # No "reasoning" field and a short action: under a grammar, small models (the reason
            # to constrain) run a free-text field to its maxLength, and the envelope then gets
            # cut off at max_tokens. Measured with SmolLM2-135M: docs/benchmarks.md.
            # A re-ask is bounded: its grammar is finite, so the model cannot run away again
            # by adding keys to an open map.
            schema_doc = constrain.envelope_schema(
                schema,
                self.settings.initial_state,
                self.settings.state_schema,
                CONSTRAINED_ACTION_MAX_LENGTH,
                reasoning="off",
                state=state,
                bounded=bounded,
            )
            # strict=False: OpenAI rejects strict schemas with optional keys; llama.cpp ignores it.
            grammar = constrain.response_format_for(schema_doc, strict=False)
        return Outbound(
            client_dialect=turn.dialect,
            body=body,
            stream=turn.stream,
            est_tokens=_est(body),
            client_headers=turn.headers,
            grammar=grammar,
            cache_hints=_cache_hints(turn, body, schema),
        )

    def build_context(
        self,
        turn: Turn,
        state: dict[str, Any],
        schema: list[str],
        chosen: ContextShape | None = None,
    ) -> tuple[dict[str, Any], ContextShape]:
        """The body to send upstream for this turn, and which shape it is. ``chosen``: the
        shape ``auto`` chose (passthrough when it chose none)."""
        if turn.mode == Mode.AUTO or turn.shape is not None:
            return self._auto_context(turn, state, schema, turn.shape or chosen)
        if turn.mode == Mode.PASSTHROUGH:
            return turn.body, ContextShape.PASSTHROUGH
        if turn.mode == Mode.MASK:
            masked = mask_transcript(turn.dialect, turn.body, self.settings.mask_keep)
            return masked, ContextShape.MASK
        form = turn.envelope_form
        adapter = get_dialect(turn.dialect).context
        return context.build_compact(adapter, turn.body, schema, state, form), ContextShape.COMPACT

    def _auto_context(
        self,
        turn: Turn,
        state: dict[str, Any],
        schema: list[str],
        form: ContextShape | None,
    ) -> tuple[dict[str, Any], ContextShape]:
        adapter = get_dialect(turn.dialect).context
        if form == ContextShape.FULL:
            body = context.build_full(adapter, turn.body, schema, turn.envelope_form)
            return body, ContextShape.FULL
        if form == ContextShape.COMPACT:
            compact = context.build_compact(adapter, turn.body, schema, state, turn.envelope_form)
            return compact, ContextShape.COMPACT
        return turn.body, ContextShape.PASSTHROUGH

    def _auto_decision(
        self, turn: Turn, state: dict[str, Any], schema: list[str], est_client: int, has_state: bool
    ) -> AutoEstimate | None:
        """``auto``'s choice for this turn (``skillstate.cost.auto``), from the sizes of its
        candidates and the first upstream that serves the model (its cache regime and
        rates). None outside auto mode or when no upstream serves the model."""
        if turn.mode != Mode.AUTO:
            return None
        candidates = self.pool.candidates(turn.model or None)
        if not candidates:
            return None
        cfg = candidates[0].cfg
        adapter = get_dialect(turn.dialect).context
        compact = context.build_compact(adapter, turn.body, schema, state, turn.envelope_form)
        anthropic_client = turn.dialect == "anthropic"
        sizes = TurnSizes(
            transcript=est_client,
            compact=_est(compact),
            state=estimate_tokens(context.state_text(state)),
            contract=estimate_tokens(context.contract_text(schema, turn.envelope_form)),
            client_breakpoints=anthropic_client and count_breakpoints(turn.body) > 0,
            proxy_breakpoint=anthropic_client and cfg.cache_breakpoints == CacheBreakpoints.AUTO,
        )
        rates = self.prices.rates(
            model=turn.model or None, upstream=cfg.name, provider_hint=cfg.url
        )
        regime = cfg.cache_regime(turn.model or None)
        return self.auto.decide(
            turn.session, sizes, has_state=has_state, regime=regime, prices=rates
        )

    async def preview(self, turn: Turn) -> dict[str, Any]:
        """The body this turn would send upstream now (in the client's dialect): nothing is
        sent or committed and no lock is taken (e.g. for ``/v1/messages/count_tokens``)."""
        if not turn.keeps_state:
            return self.build_context(turn, self.settings.initial_state, [])[0]
        if turn.mode == Mode.AUTO:
            return turn.body  # auto decides a turn's form only when it runs
        try:
            record = await self.load_current(turn.session)
        except StoreError as e:
            raise e.for_client("could not load the session") from e
        state = record.state if record else self.settings.initial_state
        schema = record.schema if record else self.settings.allowed_keys
        return self.build_context(turn, state, schema)[0]

    # -- the turn ----------------------------------------------------------------------------

    async def run(self, turn: Turn) -> Reply | StreamReply:
        """Run one client turn: hold the session, build the context, call upstream, judge
        and commit. Every upstream attempt is metered, whichever way the turn ends."""
        stack = AsyncExitStack()
        handed_over = False
        meter: TurnMeter | None = None
        try:
            if turn.keeps_state:
                hold = await stack.enter_async_context(self.locks.hold(turn.session))
                with turn.telemetry.span("load state"):
                    record = await self._load(turn.session, hold)
                if record is None:
                    self._ensure_room()
                await self._ensure_writable()
            else:
                hold, record = None, None
            state = record.state if record else self.settings.initial_state
            step = record.step if record else 0
            schema = record.schema if record else self.settings.allowed_keys
            client = self._client_transcript(turn)
            est_client = client.est_tokens if client is not None else 0
            decision = self._auto_decision(turn, state, schema, est_client, record is not None)
            form = decision.form if decision is not None else None
            sent, shape = self.build_context(turn, state, schema, form)
            turn.telemetry.context(shape)
            ctx = self._meter_context(turn, sent, shape, client)
            meter = TurnMeter(self.prices, ctx)
            meta = _TurnMeta(
                turn, state, step, schema, record is None, shape, meter, decision, hold
            )
            out = self._outbound(turn, sent, schema, state)
            if not turn.stream:
                return await self._complete(out, meta)
            ex = await self._dispatch(out, meta)
            meter.failed_attempts(ex.failed_attempts)
            if not ex.ok:
                return await self._relay_error(ex, meta)
            handed_over = True

            async def abort() -> None:
                ex.close()
                if not meta.streamed:  # the stream never started: its close did not run
                    await self._close_ledger(turn, meter)
                await stack.aclose()

            chunks = self._stream(ex, out, meta, stack)
            return StreamReply(self._base_headers(meta, ex), chunks, abort)
        finally:
            if not handed_over:
                if meter is not None:
                    turn.telemetry.metered(meter.rows)
                    await self._close_ledger(turn, meter)
                await stack.aclose()

    def _client_transcript(self, turn: Turn) -> TranscriptView | None:
        """The client's request without the envelopes the proxy caused (the baseline's
        transcript), its estimated tokens and prefix hashes; None in passthrough. Worked
        out on the messages new since the session's last turn (a session the client named)."""
        if turn.mode == Mode.PASSTHROUGH:
            return None
        named = turn.session if SESSION_HEADER in turn.headers else None
        return self.transcripts.view(named, get_dialect(turn.dialect), turn.body)

    def _meter_context(
        self,
        turn: Turn,
        sent: dict[str, Any],
        shape: ContextShape,
        client: TranscriptView | None,
    ) -> MeterContext:
        """What the turn's ledger rows share. Outside passthrough mode, the baseline is the
        client's transcript without the envelopes the proxy caused, its prompt cache
        modelled per session (``skillstate.cost.baseline``)."""
        if client is None:
            return MeterContext(turn.session, str(turn.mode), turn.model or None, None, shape)
        source = BaselineSource(
            self.baseline_caches.get(turn.session),
            client.points,
            untouched=client.clean is turn.body and sent is turn.body,
            now=time.monotonic(),
        )
        return MeterContext(
            turn.session, str(turn.mode), turn.model or None, client.est_tokens, shape, source
        )

    async def _dispatch(self, out: Outbound, meta: _TurnMeta) -> Exchange:
        """Send upstream (the pool retries and fails over); failed attempts are metered.
        The call's worst case is held against the turn's budgets first (or it is refused)."""
        turn = meta.turn
        if turn.budgets is not None:
            upstreams = [(u.name, u.cfg.url) for u in self.pool.candidates(turn.model or None)]
            await turn.budgets.reserve(turn.model, out.est_tokens, out.body, upstreams)
        try:
            return await self.pool.dispatch(out)
        except ProxyError as e:
            meta.meter.failed_attempts(e.attempts)
            raise

    async def _complete(self, out: Outbound, meta: _TurnMeta) -> Reply:
        """A non-streamed turn: call, judge, re-ask while the answer is invalid (up to
        ``max_retries``), then commit the last answer and reply with it."""
        turn = meta.turn
        retries = 0
        # The last model answer: a re-ask that fails upstream still answers the client with
        # it (an invalid turn) instead of an error.
        previous: _Answer | None = None
        while True:
            answer = await self._attempt(out, meta, reasking=previous is not None)
            if isinstance(answer, Reply):
                return answer  # an upstream error, relayed
            if answer is None:  # the re-ask failed: the previous answer stands
                meta.meter.restore()
                break
            if not with_envelope(meta.shape):
                return self._reply(answer, meta, None, None, retries)
            text, tools = get_dialect(turn.dialect).reply_text(answer.resp)
            answer.outcome = self.verdicts.judge(
                text, tools, meta.state, meta.schema, turn.envelope_form
            )
            previous = answer
            if answer.outcome.status != "invalid" or retries >= self.settings.max_retries:
                break
            # The discarded answer becomes a rollback-retry row (zero baseline): the attempt
            # whose answer reaches the client is the turn's one "generation" row.
            meta.meter.discard_last()
            retries += 1
            out = self._reask(out, meta, answer, text)
        assert previous is not None and previous.outcome is not None
        step = await self._commit(meta, previous.outcome)
        return self._reply(previous, meta, previous.outcome, step, retries)

    async def _attempt(
        self, out: Outbound, meta: _TurnMeta, *, reasking: bool
    ) -> _Answer | Reply | None:
        """One upstream call, metered. A first call that fails gives the error reply (or
        raises ProxyError); a re-ask that fails gives None, so the turn keeps its answer."""
        meter = meta.meter
        try:
            ex = await self._dispatch(out, meta)
        except ProxyError:
            if not reasking:
                raise
            return None
        meter.failed_attempts(ex.failed_attempts)
        try:
            raw = await ex.read()
        except BaseException:
            ex.close()  # cancelled or failed mid-body: the upstream sees it go away
            raise
        ex.release()
        if not ex.ok:
            if not reasking:
                return await self._relay_error(ex, meta, raw)
            meter.failed(ex.upstream.name, ex.status)
            return None
        read = _read_reply(raw, ex.upstream.kind, meta.turn)
        if isinstance(read, str):
            # The upstream answered (and may bill the call) with something that is no reply
            # the client can be given.
            meter.failed(ex.upstream.name, 502, "transport-retry" if reasking else "generation")
            if reasking:
                return None
            raise ProxyError("upstream_unreachable", f"upstream {ex.upstream.name} returned {read}")
        resp, client_resp, raw = read
        usage = ex.upstream.dialect.usage(resp.get("usage"))
        await self._reconcile(ex, usage)
        model = resp.get("model") if isinstance(resp.get("model"), str) else None
        share = Fraction(0)
        stripped: tuple[str, Stripped] | None = None
        if with_envelope(meta.shape):
            wire = get_dialect(meta.turn.dialect)
            text, _ = wire.reply_text(client_resp)
            tools = wire.tool_call_chars(client_resp)
            stripped = (text, strip_envelope(text))  # kept: the client's copy strips it too
            share = envelope_output_share(text, stripped[1].removed_chars, tools)
            self._envelope_seen(meta, usage, share)
        meter.answered(
            upstream=ex.upstream.name,
            provider_hint=ex.upstream.cfg.url,
            usage=usage,
            status=ex.status,
            model=model,
            est_sent=out.est_tokens,
            regime=ex.upstream.cfg.cache_regime(model or meta.turn.model),
            envelope_share=share,
        )
        return _Answer(ex, raw, client_resp, stripped=stripped)

    def _reask(self, out: Outbound, meta: _TurnMeta, answer: _Answer, text: str) -> Outbound:
        """The request again, with the invalid answer and what was wrong with it."""
        turn = meta.turn
        assert answer.outcome is not None
        errors = answer.outcome.errors
        if get_dialect(turn.dialect).reply_cut_off(answer.resp):
            # Echoing a reply that ran to max_tokens costs those tokens again on the re-ask
            # and shows the model its own loop; its opening is enough to say what went wrong.
            text = text[:CUT_OFF_ECHO_CHARS] + " …"
            errors = [*errors, "the reply was cut off at max_tokens: patch only what changed"]
        asked = context.add_correction(get_dialect(turn.dialect).context, out.body, text, errors)
        return self._outbound(turn, asked, meta.schema, meta.state, bounded=True)

    def _envelope_seen(self, meta: _TurnMeta, usage: Usage | None, share: Fraction) -> None:
        """What an envelope cost in output tokens, for ``auto``'s estimates."""
        if meta.turn.mode == Mode.AUTO and usage is not None:
            self.auto.envelope_cost(meta.turn.session, float(usage.output_tokens * share))

    async def _reconcile(self, ex: Exchange, usage: Usage | None) -> None:
        """Correct the upstream's token-per-minute window with the real usage."""
        if ex.ticket is not None and usage is not None:
            await ex.upstream.limits.settle(ex.ticket, usage.input_tokens + usage.output_tokens)

    async def _stream(
        self, ex: Exchange, out: Outbound, meta: _TurnMeta, stack: AsyncExitStack
    ) -> AsyncIterator[bytes]:
        """Relay a 2xx stream in the client's dialect, then judge and commit before the
        terminal event. Metered whichever way it ends (a cut is a 499 row)."""
        turn = meta.turn
        meter = meta.meter
        meta.streamed = True
        relay: StreamRelay = make_relay(
            turn.dialect,
            ex.upstream.kind,
            request_model=turn.model,
            client_wants_usage=get_dialect(turn.dialect).stream_usage_requested(turn.body),
            capture_limit=self.settings.capture_limit_bytes,
        )
        envelope = with_envelope(meta.shape)
        stripping: StrippingRelay | None = None
        if envelope:
            rewrite = self.settings.reply_envelope == ReplyEnvelope.STRIP and strips(turn)
            relay = stripping = StrippingRelay(relay, turn.dialect, rewrite=rewrite)
        clean = False

        def answered(status: int) -> None:
            share = Fraction(0)
            if stripping is not None:
                text = relay.text
                removed = strip_envelope(text).removed_chars
                share = envelope_output_share(text, removed, stripping.tool_chars)
                self._envelope_seen(meta, relay.usage, share)
            meter.answered(
                upstream=ex.upstream.name,
                provider_hint=ex.upstream.cfg.url,
                usage=relay.usage,
                status=status,
                model=relay.model,
                est_sent=out.est_tokens,
                kind="stream",
                regime=ex.upstream.cfg.cache_regime(relay.model or turn.model),
                envelope_share=share,
            )

        try:
            problem = None
            async with contextlib.aclosing(_relay_events(ex, relay)) as events:
                async for ready in events:
                    if isinstance(ready, bytes):
                        yield ready
                    else:
                        problem = ready.problem
            await self._reconcile(ex, relay.usage)
            answered(ex.status if problem is None else 502)
            if problem is not None:
                if not relay.error_forwarded:
                    yield relay.error(problem)
                return
            tail = relay.finish()
            if envelope:
                note = await self._commit_stream(meta, relay)
                if isinstance(note, bytes):
                    yield note  # the error event: the reply is out but not committed
                    clean = True
                    return
                tail.insert(0, note.comment)
            await self._close_ledger(turn, meter)  # before the last bytes go out
            yield b"".join(tail)
            clean = True
        finally:
            if clean:
                ex.release()
            else:
                ex.close()  # the upstream sees the request cancelled
                if not meter.answered_yet:
                    answered(499)
            turn.telemetry.metered(meter.rows)
            await self._close_ledger(turn, meter)
            await shielded(stack.aclose())

    async def _commit_stream(self, meta: _TurnMeta, relay: StreamRelay) -> _StreamNote | bytes:
        """Judge and commit a finished stream. Returns the SSE comment carrying the verdict
        and cost (headers are long gone), or the error event when that failed."""
        turn = meta.turn
        try:
            outcome = self.verdicts.judge(
                relay.text, relay.has_tool_calls, meta.state, meta.schema, turn.envelope_form
            )
            # Commit before the terminal event: a client that reads /state right after the
            # stream ends sees the new state.
            step = await self._commit(meta, outcome)
        except Exception as e:
            # Say so in-band, as an upstream error would be, rather than by cutting the
            # connection.
            if not isinstance(e, ProxyError):
                log.exception("turn %s: judging or committing a stream", turn.session)
            internal = f"internal proxy error ({type(e).__name__})"
            return relay.error(str(e) if isinstance(e, ProxyError) else internal)
        costs = meta.meter.headers().items()
        extra = "".join(f" {k.removeprefix('x-skillstate-')}={v}" for k, v in costs)
        note = f"skillstate transition={outcome.status} step={step}{extra}"
        return _StreamNote(sse.comment(note))

    # -- commit, ledger and replies -----------------------------------------------------------

    async def _ensure_writable(self) -> None:
        """A store known unable to write refuses the turn before it is sent (and billed):
        its commit would fail."""
        try:
            await self.store.ensure_writable(self.settings.health_timeout)
        except StoreError as e:
            raise e.for_client("the store cannot write; the turn was not sent") from e

    def _ensure_room(self) -> None:
        """A new session beyond ``max_sessions`` is refused before it spends tokens."""
        try:
            self.store.ensure_room_for_session()
        except StoreError as e:
            raise e.for_client("cannot start a new session") from e

    async def _commit(self, meta: _TurnMeta, outcome: Outcome) -> int:
        """Commit the judged turn with its ledger rows (see ``commit_transition``)."""
        new_state = outcome.state
        if new_state is None and meta.is_new:
            new_state = meta.state  # create the session with its initial state
        transition = TransitionRecord(
            step=meta.step + 1,
            status=outcome.status,
            patch=outcome.patch,
            action=outcome.action,
            errors=outcome.errors,
            ts=time.time(),
            context=str(meta.shape),
            estimate=meta.decision.as_dict() if meta.decision is not None else None,
        )
        rows = meta.meter.unwritten()
        tel = meta.turn.telemetry
        with tel.span("commit state"):
            step = await self.commit_transition(
                meta.turn.session, meta.step, new_state, meta.schema, transition, rows, meta.hold
            )
        tel.transition(outcome.status, outcome.patch, outcome.action)
        meta.meter.mark_written()
        if meta.turn.mode == Mode.AUTO:
            self.auto.committed(meta.turn.session, meta.shape, outcome.status)
        return step

    async def commit_transition(
        self,
        session: str,
        expected_step: int,
        state: dict[str, Any] | None,
        schema: list[str],
        transition: TransitionRecord,
        rows: list[LedgerRow] | None = None,
        hold: Hold | None = None,
    ) -> int:
        """Commit one transition of a session whose lock (``hold``) the caller holds.

        The store's commit and its cache update are one unit that cancellation cannot split:
        a client that goes away while it runs does not release the session (the caller's
        lock stays held until it is done), so the next turn never sees the cache behind the
        database. Once started, the commit finishes; the cancellation is re-raised after.
        A step conflict (another writer of the same database) is a 409, never a 500; so is
        a lock lost meanwhile (a Redis lease not renewed in time), found out before the
        commit. Either way the turn's ledger rows stay unwritten here, and the caller's
        meter writes them: the upstream call was made and billed.
        """
        if hold is not None:
            hold.check()
        work = asyncio.ensure_future(
            self.store.commit(
                session,
                expected_step=expected_step,
                state=state,
                schema=schema,
                transition=transition,
                now=transition.ts,
                ledger=rows,
            )
        )
        try:
            return await uncancellable(work)
        except StepConflict as e:
            raise ProxyError("conflict", f"the turn was not committed: {e}; retry it") from e
        except StoreError as e:
            raise e.for_client("could not commit the turn") from e
        finally:
            if hold is not None:  # also when cancelled after the commit finished
                ok = work.done() and not work.cancelled() and work.exception() is None
                if ok:
                    hold.committed(work.result())
                else:
                    hold.unsure()

    async def _close_ledger(self, turn: Turn, meter: TurnMeter) -> None:
        """Write whatever the commit did not take (failures, passthrough, errors): off the
        critical path, not cancelled with the turn (no task when the commit took every row:
        the usual state-mode turn). A turn holding budget reservations writes them before
        its reply goes out and then ends its holds: the next call reads the real cost."""
        if turn.budgets is not None and turn.budgets.holding:
            await shielded(_written_then_released(meter.flush(self.store), turn.budgets))
        elif meter.unwritten():
            self._spawn(meter.flush(self.store))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def settle(self) -> None:
        """Wait for the ledger writes already started off the critical path.

        `/cost` settles first, so a client that asks for its cost right after a reply sees
        that reply; shutdown settles before the store closes, so no row is dropped.
        """
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    def _base_headers(self, meta: _TurnMeta, ex: Exchange | None) -> dict[str, str]:
        h = {SESSION_HEADER: meta.turn.shown_session, "x-skillstate-mode": str(meta.turn.mode)}
        if meta.shape != ContextShape.PASSTHROUGH or meta.turn.mode == Mode.AUTO:
            h["x-skillstate-context"] = str(meta.shape)
        if meta.decision is not None:
            figures = meta.decision.as_dict()
            h["x-skillstate-auto"] = "; ".join(f"{k}={v}" for k, v in figures.items())
        if ex is not None:
            h.update(ex.relay_headers())
        return h

    def _reply(
        self,
        answer: _Answer,
        meta: _TurnMeta,
        outcome: Outcome | None,
        step: int | None,
        retries: int,
    ) -> Reply:
        """The client's reply: the answer's body, with the turn's verdict and cost headers."""
        h = self._base_headers(meta, answer.ex)
        h["content-type"] = "application/json"
        h["x-skillstate-retries"] = str(retries)
        if outcome is not None and step is not None:
            h["x-skillstate-step"] = str(step)
            h["x-skillstate-transition"] = outcome.status
            if outcome.errors:
                h["x-skillstate-validation"] = header_safe("; ".join(outcome.errors), 500)
            if outcome.action:
                h["x-skillstate-action"] = header_safe(outcome.action)
        h.update(meta.meter.headers())
        raw = answer.raw
        if (
            outcome is not None
            and self.settings.reply_envelope == ReplyEnvelope.STRIP
            and strips(meta.turn)
        ):
            # The verdict above was made on the unstripped text; the client gets the reply
            # without the protocol (an envelope-only reply becomes its action).
            stripped, _ = get_dialect(meta.turn.dialect).strip_reply(answer.resp, answer.stripped)
            if stripped is not answer.resp:
                raw = orjson.dumps(stripped)
        return Reply(answer.ex.status, raw, h)

    async def _relay_error(self, ex: Exchange, meta: _TurnMeta, raw: bytes | None = None) -> Reply:
        """An upstream error answer, relayed with its status in the client's dialect."""
        if raw is None:
            raw = await ex.read()
        ex.release()
        meta.meter.failed(ex.upstream.name, ex.status, "generation")
        status, raw = error_reply(raw, ex.status, ex.upstream.kind, meta.turn.dialect)
        h = self._base_headers(meta, ex)
        h["content-type"] = "application/json"
        return Reply(status, raw, h)


async def _written_then_released(flush: Awaitable[None], budgets: TurnBudgets | None) -> None:
    """The ledger rows written, then the budget holds they replace released."""
    try:
        await flush
    finally:
        if budgets is not None:
            await budgets.release()


@dataclass(frozen=True)
class OperatorChange:
    """The result of an operator's patch: the new step and state, and what was dropped."""

    step: int
    state: dict[str, Any]
    warnings: list[str]


@dataclass
class _TurnMeta:
    """What the stages of one turn share: the request, the session as loaded, the context
    shape sent and the turn's meter."""

    turn: Turn
    state: dict[str, Any]
    step: int
    schema: list[str]
    is_new: bool
    shape: ContextShape
    meter: TurnMeter
    decision: AutoEstimate | None = None  # auto's choice and its estimates
    hold: Hold | None = None  # the session's lock, in the modes that keep state
    streamed: bool = False  # the stream's relay started (it closes the ledger itself)


@dataclass
class _Answer:
    """One upstream answer (already in the client's dialect) and, once judged, its verdict."""

    ex: Exchange
    raw: bytes
    resp: dict[str, Any]
    outcome: Outcome | None = None
    stripped: tuple[str, Stripped] | None = None  # its text and strip_envelope(text)


@dataclass
class _StreamNote:
    comment: bytes


@dataclass
class _StreamProblem:
    problem: str


async def _relay_events(
    ex: Exchange, relay: StreamRelay
) -> AsyncGenerator[bytes | _StreamProblem, None]:
    """The upstream stream through the relay: client bytes, one write per upstream read,
    then a ``_StreamProblem`` if the stream did not finish properly."""
    parser = sse.SSEParser()
    try:
        chunk = ex.first_chunk
        content = ex.response.content
        while chunk:
            ready = [b for event in parser.feed(chunk) for b in _feed(relay, event, ex)]
            if ready:
                yield b"".join(ready)
            if parser.pending > sse.MAX_EVENT_BYTES:
                raise _Unreadable(f"an SSE event over {sse.MAX_EVENT_BYTES} bytes")
            chunk = await content.readany()
        ready = [b for event in parser.flush() for b in _feed(relay, event, ex)]
        if ready:
            yield b"".join(ready)
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        problem = "upstream timed out" if isinstance(e, asyncio.TimeoutError) else (
            f"upstream connection failed mid-stream ({type(e).__name__})"
        )  # fmt: skip
        yield _StreamProblem(problem)
        return
    except _Unreadable as e:
        yield _StreamProblem(f"upstream {ex.upstream.name} sent {e}")
        return
    problem_ = relay.upstream_error or (
        None if relay.complete else "upstream closed the stream before it finished"
    )
    if problem_ is not None:
        yield _StreamProblem(problem_)


class _Unreadable(Exception):
    """An upstream's stream event the proxy cannot read (what it was, in the message)."""


def _feed(relay: StreamRelay, event: sse.SSEEvent, ex: Exchange) -> list[bytes]:
    """``relay.feed(event)``, for an event from a hostile upstream: one the relay cannot
    read (a shape no provider sends, JSON too deep to write back) ends the stream with an
    error event in the client's dialect instead of cutting the connection, which clients
    retry (billed again)."""
    try:
        return relay.feed(event)
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, RecursionError) as e:
        log.warning(
            "upstream %s: a stream event the relay cannot read (%s: %s)",
            ex.upstream.name, type(e).__name__, str(e)[:200],
        )  # fmt: skip
        raise _Unreadable(f"a stream event the proxy cannot read ({type(e).__name__})") from None


def _read_reply(
    raw: bytes, upstream_kind: str, turn: Turn
) -> tuple[dict[str, Any], dict[str, Any], bytes] | str:
    """An upstream's non-streamed 2xx body: (the reply, the reply in the client's dialect and
    its bytes), or what is wrong with it. Upstream bytes are hostile: JSON nested past
    ``MAX_JSON_DEPTH`` (in the body, or in tool-call arguments a translation parses) would
    not serialise for the client, so it is refused like a body that is no reply."""
    try:
        resp = orjson.loads(raw)
    except orjson.JSONDecodeError:
        resp = None
    if not isinstance(resp, dict):
        return "a body that is not a JSON object"
    if nesting_exceeds(resp, MAX_JSON_DEPTH, raw):
        return f"a reply nesting JSON more than {MAX_JSON_DEPTH} levels deep"
    if upstream_kind == turn.dialect:
        return resp, resp, raw
    try:
        translated = reply_for(turn.dialect, upstream_kind, resp, turn.model)
    except JSONTooDeep as e:
        return f"a reply whose {e}"
    return resp, translated, orjson.dumps(translated)
