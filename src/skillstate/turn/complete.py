"""A non-streamed turn's call: send upstream (the pool retries and fails over), read and meter
the answer, judge it, and re-ask while it is invalid (up to ``max_retries``)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from fractions import Fraction
from typing import Any

from ..config import Settings
from ..cost.baseline import envelope_output_share
from ..dialects.anthropic import ANTHROPIC
from ..dialects.base import BadReply
from ..dialects.registry import error_reply, read_reply
from ..dialects.translate.outputlimit import default_max_tokens, model_max_output
from ..engine import context
from ..engine.stripper import Stripped, strip_envelope
from ..engine.verdict import Outcome, Verdicts
from ..errors import ProxyError
from ..store import SessionRecord
from ..store.records import Kind
from ..upstream.client import (
    AttemptRecord,
    Exchange,
    Outbound,
    ReadReply,
    ReplyReader,
    UpstreamPool,
    attempted,
)
from . import render
from .commit import Committer
from .fold import Folder
from .plan import Planner
from .types import Answer, Reply, TurnMeta, with_envelope

CUT_OFF_ECHO_CHARS = 200  # of a reply cut off at max_tokens, echoed in the re-ask


class HoldPerBilledAttempt:
    """A budget holds the worst case of each attempt the upstream may bill: the call's first
    hold covers its first attempt; each retry or failover after an attempt that may have
    been billed (``AttemptRecord.billed``: its row is charged the worst case) takes a hold
    of its own first, or the dispatch ends with the budget's refusal."""

    def __init__(self, reserve: Callable[[], Awaitable[float | None]]) -> None:
        self._reserve = reserve
        self._holds = 1

    @classmethod
    def of(
        cls, reserve: Callable[[], Awaitable[float | None]] | None
    ) -> HoldPerBilledAttempt | None:
        """One for a dispatch whose first attempt is held (None: under no budget)."""
        return None if reserve is None else cls(reserve)

    async def __call__(self, billed: int) -> None:
        while self._holds <= billed:
            await self._reserve()
            self._holds += 1


class Completer:
    """Calls upstream for a turn and re-asks; it judges each answer (``Verdicts``). A
    window too big for the model's context is folded first (``fold``)."""

    def __init__(
        self,
        settings: Settings,
        pool: UpstreamPool,
        planner: Planner,
        verdicts: Verdicts,
        commits: Committer,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.planner = planner
        self.verdicts = verdicts
        self.commits = commits  # writes the rows of a discarded answer before its re-ask
        self.folds = Folder(planner, self, commits)

    async def fold(
        self, meta: TurnMeta, sent: dict[str, Any], record: SessionRecord | None
    ) -> tuple[TurnMeta, dict[str, Any]]:
        """The turn's meta and body once a window too big for the model's context is
        folded into the state by calls of their own (``turn.fold``), as they came when
        it needs none."""
        if meta.window is None or not meta.window.folds:
            return meta, sent
        return await self.folds.fold(meta, sent, record)

    async def dispatch(self, out: Outbound, meta: TurnMeta) -> Exchange:
        """Send upstream (the pool retries and fails over); failed attempts are metered.
        The call's worst case is held against the turn's budgets first (or it is refused)."""
        turn = meta.turn
        budgets = turn.budgets
        held = reserve = None
        if budgets is not None:
            upstreams = [(u.name, u.cfg.url) for u in self.pool.candidates(turn.model or None)]
            # Held at the output it may write: a native endpoint takes no limit.
            unlimited = not out.takes_output_limit
            reserve = functools.partial(
                budgets.reserve,
                turn.model,
                out.est_tokens,
                out.body,
                upstreams,
                unlimited=unlimited,
            )
            held = await reserve()
            if held is None:  # under no budget
                reserve = None
        claim = budgets.claim if budgets is not None else None
        meta.meter.sending(out.est_tokens, out.body, held, claim)
        if budgets is not None and held is not None:
            # The output its hold assumed, no more than the model's own maximum where it is
            # known (a limit above it is refused: a wasted call before the resend below).
            known = model_max_output(turn.model)
            limit = self.settings.budget_max_tokens
            out.limit_output(limit if known is None else min(limit, known))
        failures: list[AttemptRecord] = []
        read = reply_reader(meta)
        try:
            ex = await self.pool.dispatch(out, failures, HoldPerBilledAttempt.of(reserve), read)
            if (
                ex.status == 400
                and out.capped
                and _about_the_output_limit(ex.body)
                and self._resend_within_hold(turn.model, turn.stream)
            ):
                # The upstream refused the limit the budget added: above the model's own
                # output maximum, which then bounds the answer below what the budget held.
                # Sent again as the client wrote it; the refused attempt cost nothing, so
                # its hold covers the new call's first attempt. (Any other 400, a prompt
                # too long, is relayed: sent again it would be refused again.)
                meta.meter.failed_attempts(ex.failed_attempts)
                meta.meter.failed(ex.upstream_name, ex.status)
                ex.release()
                out.limit_output(None)
                failures = []
                ex = await self.pool.dispatch(out, failures, HoldPerBilledAttempt.of(reserve), read)
            return ex
        except ProxyError as e:
            meta.meter.unanswered(e.attempts)
            raise
        except asyncio.CancelledError:
            # The turn is cancelled with a call out (its answer maybe generated and billed):
            # every attempt is metered, the cut one (499) as the turn's answer if it has none.
            meta.meter.cancelled(attempted(failures))
            raise

    def _resend_within_hold(self, model: str, stream: bool) -> bool:
        """Whether a call whose added limit (``budget_max_tokens``) was refused can go again
        as the client wrote it within what its budget held: to a Messages upstream it goes
        with the translation's ``default_max_tokens`` (the API requires a limit); when that
        is more than a smaller ``budget_max_tokens`` held, it does not go again (a limit
        that small was not refused as above the model's maximum: the 400 is relayed)."""
        if self.settings.budget_max_tokens >= default_max_tokens(model, stream):
            return True
        return all(u.cfg.kind != ANTHROPIC.name for u in self.pool.candidates(model or None))

    async def ask(self, out: Outbound, meta: TurnMeta) -> tuple[Answer, int] | Reply:
        """Call, judge, re-ask while the answer is invalid (up to ``max_retries``): the answer
        to reply with (judged when the turn has an envelope) and the re-asks it took, or an
        upstream error's reply."""
        turn = meta.turn
        retries = 0
        # The last model answer: a re-ask that fails upstream still answers the client with
        # it (an invalid turn) instead of an error.
        previous: Answer | None = None
        while True:
            answer = await self._attempt(out, meta, reasking=previous is not None)
            if isinstance(answer, Reply):
                return answer  # an upstream error, relayed
            if answer is None:  # the re-ask failed: the previous answer stands
                meta.meter.restore()
                break
            if meta.window is not None and not with_envelope(meta.shape):
                # A window turn: no envelope asked, the reply untouched, the turn recorded.
                answer.outcome = Outcome("window")
                return answer, retries
            if not with_envelope(meta.shape):
                return answer, retries
            answer.outcome = self.verdicts.judge(
                answer.text,
                answer.has_tool_calls,
                meta.state,
                meta.schema,
                turn.envelope_form,
                answer.sole_envelope,
            )
            previous = answer
            if answer.outcome.status != "invalid" or retries >= self.settings.max_retries:
                break
            # The discarded answer becomes a rollback-retry row (zero baseline): the attempt
            # whose answer reaches the client is the turn's one "generation" row.
            meta.meter.discard_last()
            await self.commits.write_ahead(turn, meta.meter)
            retries += 1
            out = self._reask(out, meta, answer)
        assert previous is not None and previous.outcome is not None
        return previous, retries

    async def _attempt(
        self, out: Outbound, meta: TurnMeta, *, reasking: bool
    ) -> Answer | Reply | None:
        """One upstream call, metered. A first call that fails gives the error reply (or
        raises ProxyError); a re-ask that fails gives None, so the turn keeps its answer."""
        meter = meta.meter
        try:
            ex = await self.dispatch(out, meta)
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
                return await relay_error(ex, meta, raw)
            meter.failed(ex.upstream_name, ex.status)
            return None
        read = ex.reading
        assert read is not None  # read by the pool (``reply_reader``)
        if isinstance(read, BadReply):
            # The upstream answered (and may bill the call) with something that is no reply
            # the client can be given: nothing of it is committed.
            kind: Kind = "transport-retry" if reasking else "generation"
            meter.failed(ex.upstream_name, read.status, kind, billed=True)
            if reasking:
                return None
            raise read.error(ex.upstream_name)
        resp, client_resp, raw = read
        usage = ex.usage_of(resp)
        await ex.settle(usage)
        model = resp.get("model") if isinstance(resp.get("model"), str) else None
        share = Fraction(0)
        stripped: tuple[str, Stripped] | None = None
        has_tool_calls = False
        if with_envelope(meta.shape):
            wire = meta.turn.wire
            text, has_tool_calls = wire.reply_text(client_resp)
            tools = wire.tool_call_chars(client_resp)
            stripped = (text, strip_envelope(text))  # kept: the client's copy strips it too
            share = envelope_output_share(text, stripped[1].removed_chars, tools)
            self.planner.envelope_seen(meta, usage, share)
        meter.answered(
            upstream=ex.upstream_name,
            provider_hint=ex.provider_hint,
            usage=usage,
            status=ex.status,
            model=model,
            est_sent=out.est_tokens,
            regime=ex.regime(model or meta.turn.model),
            envelope_share=share,
        )
        return Answer(ex, raw, client_resp, stripped=stripped, has_tool_calls=has_tool_calls)

    def _reask(self, out: Outbound, meta: TurnMeta, answer: Answer) -> Outbound:
        """The request again, with the invalid answer and what was wrong with it."""
        turn = meta.turn
        assert answer.outcome is not None
        text = answer.text
        errors = answer.outcome.errors
        if turn.wire.reply_cut_off(answer.resp):
            # Echoing a reply that ran to max_tokens costs those tokens again on the re-ask
            # and shows the model its own loop; its opening is enough to say what went wrong.
            text = text[:CUT_OFF_ECHO_CHARS] + " …"
            errors = [*errors, "the reply was cut off at max_tokens: patch only what changed"]
        asked = context.add_correction(turn.wire.context, out.body, text, errors)
        # The turn's shape: a window checkpoint's re-ask keeps its cache breakpoint (after
        # the state), as it extends the checkpoint's request.
        return self.planner.outbound(
            turn, asked, meta.schema, meta.state, bounded=True, shape=meta.shape
        )


def reply_reader(meta: TurnMeta) -> ReplyReader:
    """How the turn reads a non-streamed 2xx (the pool reads it once, before its breaker's
    verdict on the upstream, which a body that is no reply counts against)."""
    turn = meta.turn
    # A turn that keeps state reads its reply to judge and commit it; a native endpoint's
    # answer (``/responses/compact``) is no turn reply.
    reads = turn.keeps_state and turn.upstream_path is None

    def read(ex: Exchange) -> ReadReply:
        assert ex.body is not None  # a non-streamed answer, read whole by the pool
        return read_reply(ex.body, ex.kind, turn.dialect, turn.model, reads=reads)

    return read


async def relay_error(ex: Exchange, meta: TurnMeta, raw: bytes | None = None) -> Reply:
    """An upstream error answer, relayed with its status in the client's dialect."""
    if raw is None:
        raw = await ex.read()
    ex.release()
    meta.meter.failed(ex.upstream_name, ex.status, "generation")
    status, raw = error_reply(raw, ex.status, ex.kind, meta.turn.dialect)
    return render.error(status, raw, meta, ex)


# The members an output limit is sent in: a 400 that names none is not about the limit.
_LIMIT_FIELDS = (b"max_tokens", b"max_completion_tokens", b"max_output_tokens")


def _about_the_output_limit(error: bytes | None) -> bool:
    """Whether an upstream's 400 answer is about the output limit (it names the member),
    or cannot tell (no body read)."""
    return not error or any(field in error for field in _LIMIT_FIELDS)
