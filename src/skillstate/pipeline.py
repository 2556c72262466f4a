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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

import aiohttp
import orjson

from . import constrain, context
from .config import Settings
from .context import EnvelopeForm
from .dialects import sse
from .dialects.relay import StreamRelay, make_relay
from .dialects.replies import error_reply, reply_cut_off, reply_model, reply_text, reply_usage
from .dialects.translate import (
    anthropic_request_to_openai,
    anthropic_response_to_openai,
    openai_request_to_anthropic,
    openai_response_to_anthropic,
)
from .errors import Dialect, ProxyError
from .ledger import Kind, LedgerRow, Usage, make_row
from .patch import PatchPolicy, extract_envelope, infer_key_types, validate_and_merge
from .pricing import PriceBook
from .session import SESSION_HEADER, SessionLocks
from .store import Store, StoreError, TransitionRecord
from .tokens import estimate_tokens
from .upstream.client import Exchange, Outbound, UpstreamPool

log = logging.getLogger("skillstate")

MODES = ("state", "passthrough", "auto")
CONSTRAIN_VALUES = ("off", "json_schema")
CONSTRAINED_ACTION_MAX_LENGTH = 32  # chars of "action" allowed by the constrained envelope
CUT_OFF_ECHO_CHARS = 200  # of a reply cut off at max_tokens, echoed in the re-ask


@dataclass
class Turn:
    """A parsed client request."""

    dialect: str  # "openai" | "anthropic"
    body: dict[str, Any]
    headers: Mapping[str, str]  # lower-case names
    session: str
    mode: str
    constrain: bool = False

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def model(self) -> str:
        m = self.body.get("model")
        return m if isinstance(m, str) else ""

    @cached_property
    def envelope_form(self) -> EnvelopeForm:
        """How the reply carries the envelope (see skillstate.context.EnvelopeForm)."""
        return "none" if constrain.has_own_format(self.body) else "block"


@dataclass
class Reply:
    status: int
    body: bytes
    headers: dict[str, str]


@dataclass
class StreamReply:
    headers: dict[str, str]
    chunks: AsyncIterator[bytes]
    # Idempotent: drops the upstream and releases the session. The response calls it when
    # it is done, so nothing leaks even if `chunks` was never started (early disconnect).
    abort: Callable[[], Awaitable[None]]


@dataclass
class Outcome:
    """The verdict on one model reply."""

    status: str  # valid | invalid | tool-noop | format-noop
    state: dict[str, Any] | None = None  # the new state, when it changed
    patch: dict[str, Any] | None = None
    action: str | None = None
    errors: list[str] = field(default_factory=list)


def _est(body: Mapping[str, Any]) -> int:
    """Tokens of what an upstream would read: system, messages and tool definitions."""
    return estimate_tokens([body.get("system"), body.get("messages"), body.get("tools")])


def header_safe(text: str, limit: int = 200) -> str:
    """Header values must be latin-1 and one line; keep them short and readable."""
    flat = " ".join(text.split())
    if len(flat) > limit:
        flat = flat[: limit - 1] + "…"
    return flat.encode("ascii", "backslashreplace").decode("ascii")


class Pipeline:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        pool: UpstreamPool,
        prices: PriceBook,
    ) -> None:
        self.settings = settings
        self.store = store
        self.pool = pool
        self.prices = prices
        self.locks = SessionLocks()
        self._background: set[asyncio.Task[Any]] = set()

    # -- policy and context ----------------------------------------------------------------

    @lru_cache(maxsize=64)  # noqa: B019 - one pipeline per process; keys are small tuples
    def policy(self, schema: tuple[str, ...]) -> PatchPolicy:
        s = self.settings
        return PatchPolicy(
            allowed_keys=frozenset(schema),
            key_types=infer_key_types(s.initial_state),
            schema_violation=s.schema_violation,
            max_patch_bytes=s.max_patch_bytes,
            max_state_bytes=s.max_state_bytes,
            state_schema=s.state_schema,
        )

    def check_patch(self, state: dict[str, Any], patch: dict[str, Any], schema: list[str]) -> Any:
        """Validate an operator's patch exactly like a model's."""
        return validate_and_merge(state, patch, self.policy(tuple(schema)))

    def judge(
        self,
        text: str,
        has_tool_calls: bool,
        state: dict[str, Any],
        schema: list[str],
        form: EnvelopeForm = "block",
    ) -> Outcome:
        if form == "none":
            # The reply follows the client's own format, so it has no envelope to read and
            # nothing to re-ask: the state stays as it is.
            return Outcome("tool-noop" if has_tool_calls else "format-noop")
        extraction = extract_envelope(text)
        env = extraction.envelope
        errors = list(extraction.errors)
        if env is not None:
            tr = validate_and_merge(state, env.state_patch, self.policy(tuple(schema)))
            if tr.ok:
                return Outcome("valid", tr.new_state, tr.applied_patch, env.action, tr.warnings)
            errors = tr.errors
        if has_tool_calls:
            return Outcome("tool-noop", errors=errors if env is not None else [])
        return Outcome("invalid", errors=errors or ["no valid state envelope"])

    def _outbound(
        self,
        turn: Turn,
        body: dict[str, Any],
        schema: list[str],
        state: dict[str, Any],
        *,
        bounded: bool = False,
    ) -> Outbound:
        openai_extra: dict[str, Any] = {}
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
            fmt = constrain.response_format_for(schema_doc, strict=False)
            openai_extra["response_format"] = fmt
        if turn.stream:
            openai_extra["stream_options"] = {
                **_stream_options(body),
                "include_usage": True,
            }

        def translate(kind: str, b: dict[str, Any], max_tokens_field: str) -> dict[str, Any]:
            if kind == "openai":
                return anthropic_request_to_openai(b, max_tokens_field=max_tokens_field)
            return openai_request_to_anthropic(b)

        return Outbound(
            client_dialect=turn.dialect,
            body=body,
            stream=turn.stream,
            est_tokens=_est(body),
            client_headers=turn.headers,
            translate=translate,
            openai_extra=openai_extra,
        )

    def build_context(
        self, turn: Turn, state: dict[str, Any], schema: list[str]
    ) -> tuple[dict[str, Any], str]:
        if turn.mode == "passthrough":
            return turn.body, "passthrough"
        form = turn.envelope_form
        compact = context.build_compact(turn.dialect, turn.body, schema, state, form)
        if turn.mode == "state":
            return compact, "compact"
        full = context.build_full(turn.dialect, turn.body, schema, form)
        return (compact, "compact") if _est(compact) < _est(full) else (full, "full")

    async def preview(self, turn: Turn) -> dict[str, Any]:
        """The body this turn would send upstream now (in the client's dialect): nothing is
        sent or committed and no lock is taken (e.g. for ``/v1/messages/count_tokens``)."""
        if turn.mode == "passthrough":
            return turn.body
        record = await self.store.load(turn.session)
        state = record.state if record else self.settings.initial_state
        schema = record.schema if record else self.settings.allowed_keys
        return self.build_context(turn, state, schema)[0]

    # -- the turn ----------------------------------------------------------------------------

    async def run(self, turn: Turn) -> Reply | StreamReply:
        stack = AsyncExitStack()
        handed_over = False
        try:
            if turn.mode != "passthrough":
                await stack.enter_async_context(self.locks.hold(turn.session))
                record = await self.store.load(turn.session)
            else:
                record = None
            state = record.state if record else self.settings.initial_state
            step = record.step if record else 0
            schema = record.schema if record else self.settings.allowed_keys
            sent, shape = self.build_context(turn, state, schema)
            est_client = _est(turn.body) if turn.mode != "passthrough" else None
            meta = _TurnMeta(turn, state, step, schema, record is None, shape, est_client)
            out = self._outbound(turn, sent, schema, state)
            if turn.stream:
                ex = await self._dispatch(out, meta)
                if not ex.ok:
                    failed = [
                        self._failure_row(meta, a.upstream, a.status) for a in ex.failed_attempts
                    ]
                    return await self._relay_error(ex, meta, failed)
                handed_over = True

                async def abort() -> None:
                    ex.close()
                    await stack.aclose()

                chunks = self._stream(ex, out, meta, stack)
                return StreamReply(self._base_headers(meta, ex), chunks, abort)
            return await self._complete(out, meta)
        finally:
            if not handed_over:
                await stack.aclose()

    async def _dispatch(self, out: Outbound, meta: _TurnMeta) -> Exchange:
        try:
            return await self.pool.dispatch(out)
        except ProxyError as e:
            rows = [self._failure_row(meta, a.upstream, a.status) for a in e.attempts]
            await self._write_ledger(rows)
            raise

    async def _complete(self, out: Outbound, meta: _TurnMeta) -> Reply:
        turn = meta.turn
        rows: list[LedgerRow] = []
        retries = 0
        # The last model reply, kept so that a rollback-retry that fails upstream still
        # answers the client with that reply (an invalid turn) instead of an error.
        previous: tuple[Exchange, bytes, Outcome] | None = None
        # That reply's ledger row as a "generation", and where it is: it was relabelled
        # "rollback-retry" when the re-ask went out, and is restored if the re-ask fails.
        answered: tuple[int, LedgerRow] | None = None
        while True:
            try:
                ex = await self._dispatch(out, meta)
            except ProxyError:
                if previous is None:
                    raise
                assert answered is not None  # a loop after a reply is a re-ask
                rows[answered[0]] = answered[1]
                break
            rows += [self._failure_row(meta, a.upstream, a.status) for a in ex.failed_attempts]
            try:
                raw = await ex.read()
            except BaseException:
                ex.close()  # cancelled or failed mid-body: the upstream sees it go away
                raise
            ex.release()
            if not ex.ok:
                if previous is None:
                    return await self._relay_error(ex, meta, rows, raw)
                assert answered is not None
                rows[answered[0]] = answered[1]
                rows.append(self._failure_row(meta, ex.upstream.name, ex.status))
                break
            try:
                resp = orjson.loads(raw)
            except orjson.JSONDecodeError:
                resp = None
            if not isinstance(resp, dict):
                raise ProxyError(
                    "upstream_unreachable",
                    f"upstream {ex.upstream.name} returned a body that is not a JSON object",
                )
            up_kind = ex.upstream.kind
            usage = reply_usage(up_kind, resp)
            self._reconcile(ex, usage, out)
            model = reply_model(resp)
            rows.append(self._row(meta, ex, usage, "generation", ex.status, model, out))
            if up_kind != turn.dialect:
                resp = self._translate_reply(up_kind, resp, turn)
                raw = orjson.dumps(resp)
            if turn.mode == "passthrough":
                self._spawn(self._write_ledger(rows))  # off the critical path
                return self._reply(ex, meta, raw, None, None, rows, retries)
            text, tools = reply_text(turn.dialect, resp)
            outcome = self.judge(text, tools, meta.state, meta.schema, turn.envelope_form)
            previous = (ex, raw, outcome)
            if outcome.status != "invalid" or retries >= self.settings.max_retries:
                break
            # Discarded answer: a rollback-retry row (zero baseline). The attempt whose answer
            # reaches the client is the turn's one "generation" row (see skillstate.ledger).
            answered = (len(rows) - 1, rows[-1])
            rows[-1] = self._row(meta, ex, usage, "rollback-retry", ex.status, model, out)
            retries += 1
            errors = outcome.errors
            if reply_cut_off(turn.dialect, resp):
                # Echoing a reply that ran to max_tokens costs those tokens again on the re-ask
                # and shows the model its own loop; its opening is enough to say what went wrong.
                text = text[:CUT_OFF_ECHO_CHARS] + " …"
                errors = [*errors, "the reply was cut off at max_tokens: patch only what changed"]
            asked = context.add_correction(turn.dialect, out.body, text, errors)
            out = self._outbound(turn, asked, meta.schema, meta.state, bounded=True)
        assert previous is not None
        ex, raw, outcome = previous
        step = await self._commit(meta, outcome, rows)
        return self._reply(ex, meta, raw, outcome, step, rows, retries)

    def _translate_reply(self, up_kind: str, resp: dict[str, Any], turn: Turn) -> dict[str, Any]:
        if up_kind == "openai":
            return openai_response_to_anthropic(resp, request_model=turn.model)
        return anthropic_response_to_openai(resp)

    def _reconcile(self, ex: Exchange, usage: Usage | None, out: Outbound) -> None:
        if ex.ticket is not None and usage is not None:
            ex.upstream.limits.reconcile(ex.ticket, usage.input_tokens + usage.output_tokens)

    async def _stream(
        self, ex: Exchange, out: Outbound, meta: _TurnMeta, stack: AsyncExitStack
    ) -> AsyncIterator[bytes]:
        turn = meta.turn
        relay: StreamRelay = make_relay(
            turn.dialect,
            ex.upstream.kind,
            request_model=turn.model,
            client_wants_usage=bool(_stream_options(turn.body).get("include_usage")),
            capture_limit=self.settings.capture_limit_bytes,
        )
        rows = [self._failure_row(meta, a.upstream, a.status) for a in ex.failed_attempts]
        parser = sse.SSEParser()
        clean = False
        problem: str | None
        try:
            try:
                chunk = ex.first_chunk
                content = ex.response.content
                while chunk:
                    # One write per upstream read, however many events it carried.
                    ready = [b for event in parser.feed(chunk) for b in relay.feed(event)]
                    if ready:
                        yield b"".join(ready)
                    chunk = await content.readany()
                ready = [b for event in parser.flush() for b in relay.feed(event)]
                if ready:
                    yield b"".join(ready)
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                problem = "upstream timed out" if isinstance(e, asyncio.TimeoutError) else (
                    f"upstream connection failed mid-stream ({type(e).__name__})"
                )  # fmt: skip
            else:
                problem = relay.upstream_error or (
                    None if relay.complete else "upstream closed the stream before it finished"
                )
            self._reconcile(ex, relay.usage, out)
            status = ex.status if problem is None else 502
            rows.append(self._row(meta, ex, relay.usage, "stream", status, relay.model, out))
            if problem is not None:
                await self._write_ledger(rows)
                if not relay.error_forwarded:
                    yield relay.error(problem)
                return
            tail = relay.finish()
            if turn.mode == "passthrough":
                self._spawn(self._write_ledger(rows))  # off the stream's critical path
            else:
                # Commit before the terminal event: a client that reads /state right after
                # the stream ends sees the new state.
                form = turn.envelope_form
                try:
                    outcome = self.judge(
                        relay.text, relay.has_tool_calls, meta.state, meta.schema, form
                    )
                    step = await self._commit(meta, outcome, rows)
                except Exception as e:
                    # The reply is out but not committed: say so in-band, as an upstream error
                    # would be, rather than by cutting the connection.
                    if not isinstance(e, ProxyError):
                        log.exception("turn %s: judging or committing a stream", turn.session)
                    self._spawn(self._write_ledger(rows))
                    internal = f"internal proxy error ({type(e).__name__})"
                    yield relay.error(str(e) if isinstance(e, ProxyError) else internal)
                    clean = True
                    return
                # Headers are long gone: the cost travels in the same comment.
                costs = ledger_headers(rows).items()
                extra = "".join(f" {k.removeprefix('x-skillstate-')}={v}" for k, v in costs)
                note = f"skillstate transition={outcome.status} step={step}{extra}"
                tail.insert(0, sse.comment(note))
            yield b"".join(tail)
            clean = True
        finally:
            if clean:
                ex.release()
            else:
                ex.close()  # the upstream sees the request cancelled
                if not rows or rows[-1].kind != "stream":
                    rows.append(self._row(meta, ex, relay.usage, "stream", 499, relay.model, out))
                    self._spawn(self._write_ledger(rows))
            await _shielded(stack.aclose())

    # -- commit, ledger and replies -----------------------------------------------------------

    async def _commit(self, meta: _TurnMeta, outcome: Outcome, rows: list[LedgerRow]) -> int:
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
        )
        try:
            step = await self.store.commit(
                meta.turn.session,
                expected_step=meta.step,
                state=new_state,
                schema=meta.schema,
                transition=transition,
                now=transition.ts,
                ledger=rows,
            )
        except StoreError as e:
            raise ProxyError("api_error", f"could not commit the turn: {e}") from e
        meta.outcome = outcome
        return step

    async def _write_ledger(self, rows: list[LedgerRow]) -> None:
        if rows:
            # The ledger is best effort: a turn never fails because of it.
            with contextlib.suppress(StoreError):
                await self.store.add_ledger_rows(rows)

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

    def _row(
        self,
        meta: _TurnMeta,
        ex: Exchange,
        usage: Usage | None,
        kind: Kind,
        status: int,
        model: str | None,
        out: Outbound,
    ) -> LedgerRow:
        compare = meta.est_client is not None and kind in ("generation", "stream")
        return make_row(
            book=self.prices,
            usage=usage,
            kind=kind,
            status=status,
            mode=meta.turn.mode,
            session=meta.turn.session,
            upstream=ex.upstream.name,
            model=model or meta.turn.model or None,
            est_transcript=meta.est_client if compare else None,
            est_sent=out.est_tokens if compare else None,
            provider_hint=ex.upstream.cfg.url,
        )

    def _failure_row(
        self, meta: _TurnMeta, upstream: str, status: int, kind: Kind = "transport-retry"
    ) -> LedgerRow:
        return make_row(
            book=self.prices,
            usage=None,
            kind=kind,
            status=status,
            mode=meta.turn.mode,
            session=meta.turn.session,
            upstream=upstream,
            model=meta.turn.model or None,
        )

    def _base_headers(self, meta: _TurnMeta, ex: Exchange | None) -> dict[str, str]:
        h = {SESSION_HEADER: meta.turn.session, "x-skillstate-mode": meta.turn.mode}
        if meta.shape != "passthrough":
            h["x-skillstate-context"] = meta.shape
        if ex is not None:
            h.update(ex.relay_headers())
        return h

    def _reply(
        self,
        ex: Exchange,
        meta: _TurnMeta,
        raw: bytes,
        outcome: Outcome | None,
        step: int | None,
        rows: list[LedgerRow],
        retries: int,
    ) -> Reply:
        h = self._base_headers(meta, ex)
        h["content-type"] = "application/json"
        h["x-skillstate-retries"] = str(retries)
        if outcome is not None and step is not None:
            h["x-skillstate-step"] = str(step)
            h["x-skillstate-transition"] = outcome.status
            if outcome.errors:
                h["x-skillstate-validation"] = header_safe("; ".join(outcome.errors), 500)
            if outcome.action:
                h["x-skillstate-action"] = header_safe(outcome.action)
        h.update(ledger_headers(rows))
        return Reply(ex.status, raw, h)

    async def _relay_error(
        self, ex: Exchange, meta: _TurnMeta, rows: list[LedgerRow], raw: bytes | None = None
    ) -> Reply:
        """An upstream error answer, relayed with its status in the client's dialect."""
        if raw is None:
            raw = await ex.read()
        ex.release()
        rows = [*rows, self._failure_row(meta, ex.upstream.name, ex.status, "generation")]
        await self._write_ledger(rows)
        dialect: Dialect = "anthropic" if meta.turn.dialect == "anthropic" else "openai"
        status, raw = error_reply(raw, ex.status, ex.upstream.kind, dialect)
        h = self._base_headers(meta, ex)
        h["content-type"] = "application/json"
        return Reply(status, raw, h)


@dataclass
class _TurnMeta:
    turn: Turn
    state: dict[str, Any]
    step: int
    schema: list[str]
    is_new: bool
    shape: str
    est_client: int | None
    outcome: Outcome | None = None


def ledger_headers(rows: list[LedgerRow]) -> dict[str, str]:
    if not rows:
        return {}
    h: dict[str, str] = {}
    statuses = {r.pricing for r in rows if r.pricing != "usage-unavailable" or r is rows[-1]}
    if rows[-1].pricing == "usage-unavailable":
        h["x-skillstate-pricing"] = "usage-unavailable"
    elif "unknown" in statuses:
        h["x-skillstate-pricing"] = "unknown"
    else:
        h["x-skillstate-pricing"] = rows[-1].pricing
    costs = [r.cost_usd for r in rows if r.cost_usd is not None]
    if costs and h["x-skillstate-pricing"] in ("known", "override"):
        h["x-skillstate-cost-usd"] = f"{sum(costs):.8f}"
    # Over all the turn's attempts (retries have a zero baseline), so the headers of a
    # session's turns add up to its /cost saved_input_tokens.
    saved = [
        r.baseline_input_tokens - r.input_tokens
        for r in rows
        if r.baseline_input_tokens is not None and r.input_tokens is not None
    ]
    if saved:
        h["x-skillstate-saved-tokens"] = str(sum(saved))
    return h


async def _shielded(coro: Any) -> None:
    """Finish cleanup even if the surrounding task is being cancelled."""
    task = asyncio.ensure_future(coro)
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.shield(task)
    if not task.done():
        await task


def _stream_options(body: Mapping[str, Any]) -> Mapping[str, Any]:
    # OpenAI's field; an Anthropic body may carry anything under that name (it is dropped).
    options = body.get("stream_options")
    return options if isinstance(options, dict) else {}
