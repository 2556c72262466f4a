"""A window too big for the model's context, folded into the state before the turn's call.

A transcript the client changed (its own compaction, an edit, a restart) restarts the
session's window at its start, and none of it may leave the window unfolded (issue 23). When
that whole window would pass the model's context (``cost.checkpoint.CONTEXT_SHARE`` of the
upstream's ``context_tokens``), its oldest exchanges are first folded into the state by
calls of their own (``engine.window.fold_parts``: each shows the stable prefix, the state
as folded so far and one part, and asks for the envelope only). Then the turn is planned
again from where the folded part ends, with the folded state, and sent: a request that
fits. Each fold is judged and re-asked like a checkpoint; its answer never reaches the
client, and its ledger row is an extra attempt (``rollback-retry``: a zero baseline,
written before the next call goes out). The folded state is committed with the turn, in
its one transition; a fold that brings no valid envelope ends the turn (502) with nothing
committed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from ..choices import ContextShape
from ..errors import ProxyError
from ..store import SessionRecord
from ..upstream.client import Outbound
from .commit import Committer
from .plan import Planner
from .types import Answer, Reply, TurnMeta

MAX_FOLD_ROUNDS = 4  # re-plans after folding (a state grown by the folds may fold again)
# What a fold does not send of the client's request: it is answered in full (never
# streamed), and in text (the envelope only), which a tool call the client forces
# (tool_choice "required", "any" or a named tool) could not carry.
_NOT_FOR_FOLD = ("stream", "stream_options", "tool_choice")


class Asks(Protocol):
    """The turn's caller (``turn.complete.Completer``): one call, judged and re-asked."""

    async def ask(self, out: Outbound, meta: TurnMeta) -> tuple[Answer, int] | Reply: ...


class Folder:
    """Runs a window turn's folds (``WindowTurn.folds``) and plans the turn again after.
    The ``Completer`` owns one: folds are the turn's first upstream calls."""

    def __init__(self, planner: Planner, calls: Asks, commits: Committer) -> None:
        self.planner = planner
        self.calls = calls
        self.commits = commits

    async def fold(
        self, meta: TurnMeta, sent: dict[str, Any], record: SessionRecord | None
    ) -> tuple[TurnMeta, dict[str, Any]]:
        """The turn's meta and body once its window's folds are done (as they came when
        it has none)."""
        rounds = 0
        # The turn's record says why its window restarted (``changed``, ``new``), not the
        # ``kept`` of its re-plan from where the folds end.
        why = meta.window.plan.reason if meta.window is not None else "kept"
        while meta.window is not None and meta.window.folds:
            if rounds == MAX_FOLD_ROUNDS:
                raise _failed("the window still did not fit after folding")
            rounds += 1
            window, state = meta.window, meta.state
            reasked = meta.reasked  # with the folds' own re-asks (x-skillstate-retries)
            try:
                for part in window.folds:
                    body = window.fold_body(part, meta.schema, state)
                    state, retries = await self._one(meta, body, state)
                    reasked += retries
            except ProxyError:
                if not window.folds_optional:
                    raise
                # A fold in place of a checkpoint the client's forced tool call left no
                # room for: without it the turn goes out as the window turn it was.
                unfolded = window.unfolded()
                return dataclasses.replace(meta, window=unfolded, reasked=reasked), sent
            after = window.after_folds
            marks = {after.root: after} if after is not None else None
            plan = self.planner.plan(meta.turn, state, meta.schema, record, marks)
            plan.meter.take_over(meta.meter)
            meta = dataclasses.replace(
                meta,
                state=state,
                shape=plan.shape,
                meter=plan.meter,
                window=plan.window.recorded_as(why) if plan.window is not None else None,
                folded=True,
                reasked=reasked,
            )
            sent = plan.sent
        return meta, sent

    async def _one(
        self, meta: TurnMeta, body: dict[str, Any], state: dict[str, Any]
    ) -> tuple[dict[str, Any], int]:
        """One fold call (never streamed), judged and re-asked: the state with its patch,
        and the re-asks it took."""
        unstreamed = {k: v for k, v in meta.turn.body.items() if k not in _NOT_FOR_FOLD}
        turn = dataclasses.replace(meta.turn, body=unstreamed)
        body = {k: v for k, v in body.items() if k not in _NOT_FOR_FOLD}
        shape = ContextShape.CHECKPOINT
        folding = dataclasses.replace(meta, turn=turn, state=state, shape=shape)
        out = self.planner.outbound(turn, body, meta.schema, state, shape=shape)
        asked = await self.calls.ask(out, folding)
        if isinstance(asked, Reply):
            raise _failed(f"the upstream answered {asked.status}", upstream_failed=True)
        answer, retries = asked
        meta.meter.set_aside()  # an extra attempt: the turn's answer is the call after
        await self.commits.write_ahead(meta.turn, meta.meter)
        outcome = answer.outcome
        if outcome is None or outcome.status != "valid":
            errors = "; ".join(outcome.errors) if outcome is not None else ""
            raise _failed(f"its envelope was {outcome.status if outcome else 'missing'}", errors)
        return (outcome.state if outcome.state is not None else state), retries


def _failed(why: str, errors: str = "", *, upstream_failed: bool = False) -> ProxyError:
    """The turn's error. Unless the upstream failed the fold (its status decides), an SDK
    must not retry it on its own: the folds were judged and re-asked, and a retry sends
    every one of them again (``x-should-retry: false``, as an unfolded compaction's)."""
    detail = f" ({errors[:300]})" if errors else ""
    return ProxyError(
        "upstream_unreachable",
        "the session's window does not fit the model's context, and folding its older"
        f" messages into the state failed: {why}{detail}; nothing was committed, the turn"
        " may be retried",
        should_retry=None if upstream_failed else False,
    )
