"""One turn of the window form (``mode: window``, and ``auto`` once it moved a session
there): where the window starts, whether this turn checkpoints, the body sent, and the
window mark the turn's commit leaves for the next one.

The mark is stored with each of the session's transitions (its ``estimate``: the figures the
turn was decided on), so it survives a restart and is shared by replicas. A session may carry
several conversations (``engine.window.conversation_root``: a sub-agent's, a side call's),
each with its own mark; this process keeps the latest of each per session in memory and
reads the store only when that copy is not the session's latest step.

A checkpoint turn is one callable unit (:meth:`WindowKeeper.checkpoint_body`): the context,
then the instruction after the latest observation. The first checkpoint of a session with no
window yet (``auto``'s switch) sends the client's transcript as it is, the contract, the state
and the instruction after it, so the transcript's cached prefix is still read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..choices import ContextShape
from ..cost.baseline import CacheRegime
from ..cost.checkpoint import CONTEXT_SHARE, CheckpointDecision, CheckpointPolicy, WindowSizes
from ..cost.pricing import Prices
from ..cost.tokens import estimate_tokens
from ..engine import context
from ..engine.context import DialectContext
from ..engine.toolchoice import forces_tool_call
from ..engine.window import (
    WindowMark,
    WindowMarks,
    WindowPlan,
    build_fold,
    build_window,
    checkpoint_text,
    fold_parts,
    kept_exchanges,
    kept_start,
    plan_window,
    prefix_task,
    window_contract_text,
)
from ..sessions.lru import SessionLRU
from ..store import SessionRecord, Store

__all__ = ["WindowKeeper", "WindowTurn"]

ENVELOPE_PRIOR_TOKENS = 130.0  # a coding agent's envelope (issue 23), before one is seen
# Transitions read back for the marks (an operator's patch carries none), when this process's
# copy is not the session's latest step (a restart, another replica's turn): a conversation
# with no turn among them (a sub-agent ran longer) starts its window afresh.
MARK_LOOKBACK = 64
# Marks kept per session: the conversations most recently in a turn. Claude Code makes a side
# call (a command's prefix, a title) per tool call, each a conversation of its own: a round of
# parallel tool calls must not push the main conversation's mark out.
MAX_CONVERSATIONS = 32


@dataclass(frozen=True, slots=True)
class WindowTurn:
    """What one window turn sends, and what it was decided on."""

    adapter: DialectContext
    messages: list[Any]  # the client's transcript
    plan: WindowPlan
    decision: CheckpointDecision
    body: dict[str, Any]  # the context sent upstream (checkpoint instruction included)
    keep: int
    kept_room: int | None = None  # tokens the kept exchanges may fill (the model's context)
    # A window too big for the model's context: the parts of the client's body folded
    # into the state first, one call each (``fold_body``), and the mark of the window the
    # turn then sends.
    folds: tuple[tuple[int, int], ...] = ()
    after_folds: WindowMark | None = None
    client_body: dict[str, Any] | None = None

    def fold_body(self, part: tuple[int, int], schema: list[str], state: dict[str, Any]) -> Any:
        """The body of the fold call of ``part``, with the state as folded so far."""
        assert self.client_body is not None
        return build_fold(self.adapter, self.client_body, self.plan, part, schema, state)

    @property
    def folds_optional(self) -> bool:
        """The folds stand in for a checkpoint (the client forces a tool call, which leaves
        its reply no room for the envelope): the turn may go out without them."""
        return self.decision.reason == "forced_tool"

    def unfolded(self) -> WindowTurn:
        """This turn without its optional folds: a window turn, its start kept."""
        decision = CheckpointDecision(False, "forced_tool_unfolded")
        return dataclasses.replace(self, folds=(), after_folds=None, decision=decision)

    def recorded_as(self, reason: str) -> WindowTurn:
        """This turn with ``reason`` as its record's ``window_start`` (a turn re-planned
        after its folds keeps why its window restarted)."""
        return dataclasses.replace(self, plan=dataclasses.replace(self.plan, reason=reason))

    @property
    def shape(self) -> ContextShape:
        return ContextShape.CHECKPOINT if self.decision.checkpoint else ContextShape.WINDOW

    def next_mark(self, status: str) -> WindowMark:
        """The window the next turn continues: after a valid checkpoint, the last ``keep``
        exchanges of this turn's transcript; otherwise this turn's."""
        if self.decision.checkpoint and status == "valid":
            start = kept_start(
                self.messages, self.adapter, self.plan.start, self.keep, self.kept_room
            )
            return WindowPlan(self.plan.split, start, "kept", 0).mark(self.messages)
        return self.plan.mark(self.messages)

    def figures(self, status: str) -> dict[str, Any]:
        """The transition's record of this turn: the mark it leaves, and the decision."""
        return {
            "form": str(self.shape),
            "window": self.next_mark(status).as_dict(),
            "window_start": self.plan.reason,
            "exchanges": self.plan.exchanges,
            **{k: v for k, v in self.decision.as_dict().items() if k != "checkpoint"},
        }


@dataclass(slots=True)
class _Session:
    step: int = -1  # the step the marks are as of
    marks: WindowMarks = dataclasses.field(default_factory=dict)
    envelope: float = ENVELOPE_PRIOR_TOKENS
    envelopes: int = 0


def _with(marks: WindowMarks, mark: WindowMark) -> WindowMarks:
    """``marks`` with ``mark`` as its conversation's latest (a new mapping: a turn holding
    the old one keeps it as it was), the least recently marked conversations dropped past
    ``MAX_CONVERSATIONS``."""
    out = {root: m for root, m in marks.items() if root != mark.root}
    out[mark.root] = mark
    while len(out) > MAX_CONVERSATIONS:
        del out[next(iter(out))]
    return out


class WindowKeeper:
    """The window turns of one proxy: the checkpoint policy and each session's mark."""

    def __init__(self, keep: int, max_tokens: int, max_sessions: int = 10_000) -> None:
        self.keep = keep
        self.policy = CheckpointPolicy(keep, max_tokens)
        self._sessions = SessionLRU(_Session, max(max_sessions, 1))

    async def marks(self, store: Store, record: SessionRecord | None) -> WindowMarks:
        """The window marks the session's transitions left, by conversation (empty: no
        window yet)."""
        if record is None:
            return {}  # (its first commit, at step 1, finds no step 0 in memory: see below)
        s = self._sessions.get(record.session)
        if s.step == record.step:
            return s.marks
        after = max(record.step - MARK_LOOKBACK, 0)
        history = await store.history_page(record.session, MARK_LOOKBACK, after_step=after)
        found: WindowMarks = {}
        for t in history:  # oldest first: a later mark of a conversation replaces its own
            if isinstance(t.estimate, Mapping) and "window" in t.estimate:
                mark = WindowMark.from_dict(t.estimate["window"])
                if mark is not None:
                    found = _with(found, mark)
        s.step, s.marks = record.step, found
        return found

    def committed(self, session: str, step: int, mark: WindowMark) -> None:
        """The mark a turn's commit at ``step`` left. The marks in memory stay this
        session's only when they were as of the step before (another replica's turns in
        between, or a fold's own commits, have them read from the store again)."""
        s = self._sessions.get(session)
        if s.step == step - 1 or step == 1:  # (step 1: a new session, no marks before it)
            s.step, s.marks = step, _with(s.marks if step > 1 else {}, mark)
        else:
            s.step = -1

    def _envelope(self, session: str) -> float:
        """The session's expected envelope tokens (read without making an entry: a preview
        of a session that never runs a turn leaves none)."""
        s = self._sessions.peek(session)
        return s.envelope if s is not None else ENVELOPE_PRIOR_TOKENS

    def envelope_cost(self, session: str, output_tokens: float) -> None:
        """The output tokens one of the session's checkpoint envelopes took (running mean)."""
        s = self._sessions.get(session)
        if output_tokens >= 0:
            s.envelopes += 1
            s.envelope += (output_tokens - s.envelope) / s.envelopes

    def plan(
        self,
        session: str,
        adapter: DialectContext,
        body: dict[str, Any],
        marks: WindowMarks | None,
        state: dict[str, Any],
        schema: list[str],
        *,
        turns: int,
        regime: CacheRegime,
        prices: Prices | None,
        window_caches: bool,
        force: bool = False,
        can_checkpoint: bool = True,
        context_limit: int | None = None,
        whole_unless_kept: bool = False,
    ) -> WindowTurn:
        """This turn of ``session``: its window, the checkpoint decision and the body.
        ``force``: checkpoint now (``auto``'s switch builds the state this way).
        ``can_checkpoint`` False: the request brought its own output format, which leaves
        no room for an envelope. ``whole_unless_kept``: a transcript the mark does not
        continue is sent as the client sent it, as if the session had no window yet (a
        compaction's: the prefix the client's own requests cached is read again)."""
        messages = body[adapter.transcript_key]
        plan = plan_window(messages, adapter, marks)
        if whole_unless_kept and plan.reason == "changed":
            plan = plan_window(messages, adapter, None)
        window = build_window(adapter, body, plan, schema, state)
        sizes = room = None
        if context_limit is not None or (can_checkpoint and not force):
            sizes = self._sizes(plan, messages, adapter, window, state, turns, window_caches)
        if context_limit is not None and sizes is not None:
            # what the kept exchanges may fill so that the next turn's request fits the model
            room = int(context_limit * CONTEXT_SHARE - sizes.prefix - sizes.state - sizes.growth)
        # Folded first when too big for the model's context (``turn.fold``); not a
        # compaction, nor auto's switch (it sends the client's transcript as it came).
        foldable = can_checkpoint and not whole_unless_kept and not (force and plan.reason == "new")
        if foldable and context_limit is not None and sizes is not None:
            folded = self._folds(adapter, messages, plan, sizes, context_limit)
            if folded is not None:
                decision = CheckpointDecision(True, "context_limit")
                parts, after = folded
                return WindowTurn(
                    adapter, messages, plan, decision, window, self.keep, room, parts, after, body
                )
        if not can_checkpoint:
            decision = CheckpointDecision(False, "format")
        elif force or sizes is None:
            decision = CheckpointDecision(True, "switch")
        else:
            decision = self.policy.decide(
                sizes,
                regime=regime,
                prices=prices,
                envelope_tokens=self._envelope(session),
                context_limit=context_limit,
            )
        if decision.checkpoint and foldable and not force and forces_tool_call(body):
            forced = self._forced_fold(adapter, messages, plan, room)
            if forced is not None:
                # Its reply must be a tool call, which cannot carry the envelope: what
                # leaves is folded by a call of its own (``turn.fold``), and the turn goes
                # out after it as a window turn (no instruction), its tool_choice kept.
                parts, after = forced
                decision = dataclasses.replace(decision, checkpoint=False, reason="forced_tool")
                return WindowTurn(
                    adapter, messages, plan, decision, window, self.keep, room, parts, after, body
                )
        if decision.checkpoint:
            window = self.checkpoint_body(adapter, body, window, plan, schema, state)
        return WindowTurn(adapter, messages, plan, decision, window, self.keep, room)

    def switch_waits(
        self,
        session: str,
        adapter: DialectContext,
        body: dict[str, Any],
        state: dict[str, Any],
        schema: list[str],
        **terms: Any,
    ) -> bool:
        """Whether ``auto``'s switch into the window should wait for a later turn: the
        switch is the first checkpoint of a window that is the whole transcript, and the
        checkpoint rule (:meth:`plan`'s, on ``terms``) would not take it this turn (where
        the client forces a tool call the rule's checkpoint is a fold: it would take it)."""
        probe = self.plan(session, adapter, body, None, state, schema, **terms)
        return not (probe.decision.checkpoint or probe.folds_optional)

    @staticmethod
    def checkpoint_body(
        adapter: DialectContext,
        body: dict[str, Any],
        window: dict[str, Any],
        plan: WindowPlan,
        schema: list[str],
        state: dict[str, Any],
    ) -> dict[str, Any]:
        """A checkpoint turn's body: the window context and the instruction after the
        latest observation. A session with no window yet (``plan.reason == "new"``) sends
        the client's transcript as it is instead, with the contract and the state in the
        instruction, so the prefix its earlier turns cached is read again."""
        if plan.reason == "new":
            note = "\n\n".join(
                (window_contract_text(schema), context.state_text(state), checkpoint_text())
            )
            return adapter.instruct(body, note)
        return adapter.instruct(window, checkpoint_text())

    @staticmethod
    def _folds(
        adapter: DialectContext,
        messages: list[Any],
        plan: WindowPlan,
        sizes: WindowSizes,
        context_limit: int,
    ) -> tuple[tuple[tuple[int, int], ...], WindowMark] | None:
        """The fold calls of a window whose request would pass the model's context (its
        ``CONTEXT_SHARE``) with more than one exchange: a transcript the client changed
        restarts the window at its start, and none of it may leave unfolded (None: it
        fits). The turn is planned again from the returned mark, with the folded state."""
        room = int(context_limit * CONTEXT_SHARE - sizes.prefix - sizes.state - sizes.instruction)
        if sizes.window <= room or plan.exchanges <= 1:
            return None
        parts, fit = fold_parts(messages, adapter, plan.start, max(room, 0))
        if not parts:
            return None
        return tuple(parts), WindowPlan(plan.split, fit, "kept", 0).mark(messages)

    def _forced_fold(
        self, adapter: DialectContext, messages: list[Any], plan: WindowPlan, room: int | None
    ) -> tuple[tuple[tuple[int, int], ...], WindowMark] | None:
        """The fold of what a checkpoint would let leave (all but the kept exchanges), as one
        part: it went upstream in the previous request, so it fits the model. None when
        nothing would leave."""
        fit = kept_start(messages, adapter, plan.start, self.keep, room)
        if fit <= plan.start:
            return None
        return ((plan.start, fit),), WindowPlan(plan.split, fit, "kept", 0).mark(messages)

    def _sizes(
        self,
        plan: WindowPlan,
        messages: list[Any],
        adapter: DialectContext,
        window: dict[str, Any],
        state: dict[str, Any],
        turns: int,
        window_caches: bool,
    ) -> WindowSizes:
        task = prefix_task(plan.split, plan.start, messages, adapter)
        # the window's own messages: after the task when the prefix carries it
        first = plan.start if task is None else max(plan.start, plan.split.task_end)
        window_tokens = estimate_tokens(messages[first:])
        kept = tuple(
            estimate_tokens(messages[a:b])
            for a, b in kept_exchanges(messages, adapter, first, self.keep)
        )
        state_tokens = estimate_tokens(context.state_text(state))
        total = estimate_tokens([window.get("system"), window.get(adapter.transcript_key)])
        total += estimate_tokens([window.get("tools"), window.get("instructions")])
        return WindowSizes(
            prefix=max(total - window_tokens - state_tokens, 0),
            state=state_tokens,
            window=window_tokens,
            kept=sum(kept),
            exchanges=plan.exchanges,
            growth=window_tokens / max(plan.exchanges, 1),
            turns=turns,
            instruction=estimate_tokens(checkpoint_text()),
            window_caches=window_caches,
            kept_exchanges=kept,
        )
