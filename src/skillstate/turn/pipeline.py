"""One client turn, sequenced: lock -> load -> plan -> call (and re-ask) -> judge -> commit.

Each stage lives in the module named after it (``turn.plan``, ``turn.complete``,
``turn.stream``, ``turn.commit``, ``turn.render``); this module only orders them and says
what a cancelled turn leaves behind. Handlers in ``web`` parse and render the wire.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

from ..config import Settings
from ..cost.pricing import PriceBook
from ..engine.verdict import Outcome, Verdicts
from ..sessions.locks import SessionLocks, TurnLocks
from ..store import KeptReply, Store, StoredResponse, StoreError
from ..upstream.client import Outbound, UpstreamPool
from . import render
from .commit import Committer
from .complete import Completer, relay_error
from .plan import Planner
from .stream import StreamPath
from .types import Reply, StreamReply, Turn, TurnMeta


class Pipeline:
    """One client turn through the stages.

    It decides (context shape, re-ask, commit); the stages it calls do the work: planning
    the context (``Planner``), the upstream call and its re-asks (``Completer``), the
    stream (``StreamPath``), the commit (``Committer``) and a ``TurnMeter`` per turn that
    counts every upstream attempt. Turns of one session run one at a time (``locks``:
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
        self.locks: TurnLocks = locks if locks is not None else SessionLocks()
        verdicts = Verdicts(settings)
        self.planner = Planner(settings, pool, prices)
        # Rows no commit took, written in groups (settled before a budget's spend is read).
        self.commits = Committer(settings, store)
        self.ledger = self.commits.ledger  # the budgets settle it before reading spend
        self.calls = Completer(settings, pool, self.planner, verdicts, self.commits)
        self.streams = StreamPath(settings, verdicts, self.planner, self._commit, self.commits)

    async def run(self, turn: Turn) -> Reply | StreamReply:
        """Run one client turn: hold the session, build the context, call upstream, judge
        and commit. Every upstream attempt is metered, whichever way the turn ends."""
        stack = AsyncExitStack()
        handed_over = False
        meta: TurnMeta | None = None
        try:
            if turn.idempotency is not None:  # a retry of a kept turn: its reply again
                kept = await self.commits.kept_reply(turn.idempotency, self.locks, stack)
                if kept is not None:
                    return render.replayed(kept)
            if turn.keeps_state:
                hold = await stack.enter_async_context(self.locks.hold(turn.session))
                with turn.telemetry.span("load state"):
                    record = await self.commits.load(turn.session, hold)
                if record is None:
                    self.commits.ensure_room()
                await self.commits.ensure_writable()
            else:
                hold, record = None, None
            state = record.state if record else self.settings.initial_state
            step = record.step if record else 0
            schema = record.schema if record else self.settings.allowed_keys
            marks = None
            if self.planner.in_window(turn):
                try:
                    marks = await self.planner.windows.marks(self.store, record)
                except StoreError as e:
                    raise e.for_client("could not load the session; the turn was not sent") from e
            plan = self.planner.plan(turn, state, schema, record, marks)
            meta = TurnMeta(
                turn,
                state,
                step,
                schema,
                record is None,
                plan.shape,
                plan.meter,
                plan.decision,
                hold,
                window=plan.window,
            )
            meta, sent = await self.calls.fold(meta, plan.sent, record)  # too big a window
            out = self.planner.outbound(turn, sent, schema, meta.state, shape=meta.shape)
            if not turn.stream:
                return await self._complete(out, meta)
            ex = await self.calls.dispatch(out, meta)
            meta.meter.failed_attempts(ex.failed_attempts)
            if not ex.ok:
                return await relay_error(ex, meta)
            handed_over = True
            chunks = self.streams.relay(ex, out, meta, stack)
            abort = self.streams.closer(ex, meta, stack)
            return StreamReply(render.base_headers(meta, ex), chunks, abort)
        finally:
            if not handed_over:
                if meta is not None:
                    turn.telemetry.metered(meta.meter.rows)
                    await self.commits.close_ledger(turn, meta.meter)
                await stack.aclose()

    async def _complete(self, out: Outbound, meta: TurnMeta) -> Reply:
        """A non-streamed turn: call and re-ask (judging each answer), then commit the last
        answer and reply with it."""
        asked = await self.calls.ask(out, meta)
        if isinstance(asked, Reply):
            return asked  # an upstream error, relayed
        answer, retries = asked
        strip = self.settings.reply_envelope
        if answer.outcome is None:  # nothing to commit (passthrough): kept with its rows
            reply = render.reply(answer, meta, None, None, retries, strip)
            response = _stored(meta, reply)
            kept = self.commits.kept(meta, reply.status, reply.headers, reply.body)
            await self.commits.keep_uncommitted(meta, kept, response)
            return reply
        # Made before the commit (its step is the one the commit writes): a turn sent with
        # an Idempotency-Key keeps it, and a Responses turn its response, in the commit's
        # transaction.
        step = meta.step + 1
        reply = render.reply(answer, meta, answer.outcome, step, retries, strip)
        response = _stored(meta, reply)
        verdict = answer.outcome.status
        kept = self.commits.kept(
            meta, reply.status, reply.headers, reply.body, step=step, verdict=verdict
        )
        await self._commit(meta, answer.outcome, kept, response)
        return reply

    async def _commit(
        self,
        meta: TurnMeta,
        outcome: Outcome,
        kept: KeptReply | None,
        response: StoredResponse | None = None,
    ) -> int:
        """Commit the judged turn with its ledger rows, kept reply and stored response
        (``Committer.commit``); ``auto`` learns the verdict."""
        # With no other turn in flight there is no batch of commits to join: the store may
        # commit this one at once (``Committer.commit_transition``).
        alone = len(self.locks) <= 1
        step = await self.commits.commit(meta, outcome, kept, response, alone=alone)
        self.planner.committed(meta, outcome.status, step)
        return step

    async def settle(self) -> None:
        """Wait for the ledger rows handed over off the critical path to be written.

        `/cost` settles first, so a client that asks for its cost right after a reply sees
        that reply; shutdown settles before the store closes, so no row is dropped.
        """
        await self.commits.settle()


def _stored(meta: TurnMeta, reply: Reply) -> StoredResponse | None:
    """The response a Responses turn with ``store`` keeps (its 2xx reply's), the reply's
    body made the client's (naming the previous response); None for any other turn."""
    link = meta.turn.stored
    if link is None or not 200 <= reply.status < 300:
        return None
    reply.body, response = link.reply(reply.body)
    return response
