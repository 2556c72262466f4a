"""What a turn sends upstream: the mode's context form (``auto``'s choice among them), built
once per turn, and the outbound request around it (token estimate, grammar, cache hints).

Also what ``auto`` learns from a turn (the envelope's output cost, the commit's verdict) and
what the turn's ledger rows share (the baseline: the client's transcript without the
envelopes the proxy caused)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import partial
from typing import Any

from ..choices import CacheBreakpoints, ContextShape, Mode
from ..config import Settings, Upstream
from ..cost.auto import AutoEstimate, AutoPlanner, TurnSizes
from ..cost.baseline import CacheRegime, SessionPrefixCaches
from ..cost.cachehints import CacheHints, count_breakpoints, marked_message, prompt_cache_key
from ..cost.meter import BaselineSource, MeterContext, TurnMeter
from ..cost.pricing import PriceBook
from ..cost.remask import RemaskRule
from ..cost.tokens import estimate_tokens, json_size, request_tokens
from ..cost.usage import Usage
from ..cost.worstcase import WorstCase
from ..engine import constrain, context
from ..engine.mask import mask_transcript
from ..sessions.ids import SESSION_HEADER
from ..sessions.transcripts import SessionTranscripts, TranscriptView
from ..store import SessionRecord, Store, StoreError
from ..upstream.client import Outbound, UpstreamPool
from .types import Turn, TurnMeta
from .window import WindowKeeper, WindowMarks, WindowTurn

CONSTRAINED_ACTION_MAX_LENGTH = 32  # chars of "action" allowed by the constrained envelope


@dataclass
class Plan:
    """A turn's plan: the body to send, its shape, auto's choice and the turn's meter."""

    sent: dict[str, Any]
    shape: ContextShape
    decision: AutoEstimate | None
    meter: TurnMeter
    window: WindowTurn | None = None  # the window form's turn


class Planner:
    """Plans each turn: mode -> context form (``auto``'s decision included), the outbound
    request, and the meter's baseline. It keeps what ``auto`` and the baseline remember per
    session."""

    def __init__(self, settings: Settings, pool: UpstreamPool, prices: PriceBook) -> None:
        self.settings = settings
        self.pool = pool
        self.prices = prices
        # What a call without usage is charged when no budget held it (``TurnMeter``).
        self.worst = WorstCase.of(prices, settings)
        # What each session's baseline request (no proxy) would have in the prompt cache.
        self.baseline_caches = SessionPrefixCaches(max(settings.max_sessions, 1_000))
        self.auto = AutoPlanner(
            max(settings.max_sessions, 1_000), allow_compact=settings.auto_compact
        )
        # Each session's last transcript and the results on it, for the next turn's.
        self.transcripts = SessionTranscripts()
        self.windows = WindowKeeper(
            settings.window_keep, settings.window_max_tokens, max(settings.max_sessions, 1_000)
        )

    def plan(
        self,
        turn: Turn,
        state: dict[str, Any],
        schema: list[str],
        record: SessionRecord | None,
        marks: WindowMarks | None = None,
    ) -> Plan:
        """The turn's context (built once) and its meter. ``marks``: where the session's
        windows start, by conversation (the window form)."""
        client = self._client_transcript(turn)
        est_client = client.est_tokens if client is not None else 0
        has_state = record is not None
        decision, compact = self._auto_decision(turn, state, schema, est_client, has_state)
        form = decision.form if decision is not None else None
        switch = decision is not None and decision.leaves_passthrough
        window = self._window_turn(turn, record, state, schema, form, marks, switch)
        if window is not None:
            sent, shape = window.body, window.shape
        else:
            sent, shape = self.build_context(turn, state, schema, form, compact)
        turn.telemetry.context(shape)
        ctx = self._meter_context(turn, sent, shape, client)
        return Plan(sent, shape, decision, TurnMeter(self.prices, ctx, self.worst), window)

    def in_window(self, turn: Turn) -> bool:
        """Whether this turn may be a window turn (its session's mark is then read): a
        compaction's checkpoint (``shape`` CHECKPOINT) always is; an ``auto`` session that
        settled in compact is not."""
        if turn.shape is not None:
            return turn.shape == ContextShape.CHECKPOINT
        if turn.mode == Mode.AUTO:
            return self.auto.form(turn.session) != ContextShape.COMPACT
        return turn.mode == Mode.WINDOW

    def _window_turn(
        self,
        turn: Turn,
        record: SessionRecord | None,
        state: dict[str, Any],
        schema: list[str],
        form: ContextShape | None,
        marks: WindowMarks | None,
        switch: bool = False,
    ) -> WindowTurn | None:
        """This turn in the window form (``mode: window``, or ``auto`` once it chose it):
        None in the other forms. ``auto``'s first window turn is a checkpoint: it builds the
        state the window starts from; so is a compaction's (``shape`` CHECKPOINT), which
        folds the whole transcript unless the session's window continues it."""
        compaction = turn.shape == ContextShape.CHECKPOINT
        # auto's switch into compact is a checkpoint too: it builds the state compact sends.
        switch = switch and form == ContextShape.COMPACT
        if not compaction and (
            turn.shape is not None
            or (turn.mode != Mode.WINDOW and form != ContextShape.WINDOW and not switch)
        ):
            return None
        return self.windows.plan(
            turn.session,
            turn.wire.context,
            turn.body,
            marks,
            state,
            schema,
            **self._window_terms(turn, record),
            force=compaction or (turn.mode == Mode.AUTO and (not marks or switch)),
            can_checkpoint=turn.envelope_form != "none",
            whole_unless_kept=compaction,
        )

    def _window_terms(self, turn: Turn, record: SessionRecord | None) -> dict[str, Any]:
        """What the checkpoint rule weighs a window turn of ``turn``'s session by: its turns
        so far, the first upstream's cache regime, rates and context limit, and whether that
        cache reads the window."""
        candidates = self.pool.candidates(turn.model or None)
        cfg = candidates[0].cfg if candidates else None
        regime = cfg.cache_regime(turn.model or None) if cfg else CacheRegime("none")
        rates = limit = None
        if cfg is not None:
            rates = self.prices.rates(
                model=turn.model or None, upstream=cfg.name, provider_hint=cfg.url
            )
            limit = cfg.context_limit(turn.model or None) or self.prices.context_window(
                turn.model or None, cfg.url
            )
        client_marks = turn.dialect == "anthropic" and count_breakpoints(turn.body) > 0
        caches = regime.pricing == "openai" or (regime.pricing == "anthropic" and client_marks)
        turns = (record.step if record else 0) + 1
        if turn.mode == Mode.AUTO:  # its passthrough turns committed no step
            turns = max(turns, self.auto.turns(turn.session))
        return {
            "turns": turns,
            "regime": regime,
            "prices": rates,
            "window_caches": caches,
            "context_limit": limit,
        }

    def build_context(
        self,
        turn: Turn,
        state: dict[str, Any],
        schema: list[str],
        chosen: ContextShape | None = None,
        compact: dict[str, Any] | None = None,
    ) -> tuple[dict[str, Any], ContextShape]:
        """The body to send upstream for this turn, and which shape it is. ``chosen``: the
        shape ``auto`` chose (passthrough when it chose none); ``compact``: the compact
        context auto already built to size it."""
        if turn.mode == Mode.AUTO or turn.shape is not None:
            return self._auto_context(turn, state, schema, turn.shape or chosen, compact)
        if turn.mode in (Mode.PASSTHROUGH, Mode.WINDOW):  # window turns: _window_turn
            return turn.body, ContextShape.PASSTHROUGH
        if turn.mode == Mode.MASK:
            rule = self._remask_rule(turn)
            masked = mask_transcript(
                turn.dialect,
                turn.body,
                self.settings.mask_keep,
                pays=rule.pays if rule is not None else None,
                mark=(
                    partial(marked_message, body=turn.body)
                    if rule is not None and rule.marks(turn.body)
                    else None
                ),
            )
            return masked, ContextShape.MASK
        form = turn.envelope_form
        adapter = turn.wire.context
        return context.build_compact(adapter, turn.body, schema, state, form), ContextShape.COMPACT

    def _auto_context(
        self,
        turn: Turn,
        state: dict[str, Any],
        schema: list[str],
        form: ContextShape | None,
        compact: dict[str, Any] | None,
    ) -> tuple[dict[str, Any], ContextShape]:
        adapter = turn.wire.context
        if form == ContextShape.FULL:
            body = context.build_full(adapter, turn.body, schema, turn.envelope_form)
            return body, ContextShape.FULL
        if form == ContextShape.COMPACT:
            if compact is None:
                compact = context.build_compact(
                    adapter, turn.body, schema, state, turn.envelope_form
                )
            return compact, ContextShape.COMPACT
        return turn.body, ContextShape.PASSTHROUGH

    def _remask_rule(self, turn: Turn) -> RemaskRule | None:
        """``mask``'s re-mask rule (``skillstate.cost.remask``) under the cache regime and
        rates of the first upstream that serves the model, as ``auto`` estimates; None when
        no upstream serves it (the fixed blocks of ``mask_keep`` then)."""
        candidates = self.pool.candidates(turn.model or None)
        if not candidates:
            return None
        cfg = candidates[0].cfg
        return RemaskRule(
            regime=cfg.cache_regime(turn.model or None),
            prices=self.prices.rates(
                model=turn.model or None, upstream=cfg.name, provider_hint=cfg.url
            ),
            client_breakpoints=count_breakpoints(turn.body) > 0,
            anthropic_client=turn.dialect == "anthropic",
        )

    def _auto_decision(
        self, turn: Turn, state: dict[str, Any], schema: list[str], est_client: int, has_state: bool
    ) -> tuple[AutoEstimate | None, dict[str, Any] | None]:
        """``auto``'s choice for this turn (``skillstate.cost.auto``), from the sizes of its
        candidates and the first upstream that serves the model (its cache regime and
        rates), with the compact context it built to size them (sent if chosen). None
        outside auto mode or when no upstream serves the model."""
        if turn.mode != Mode.AUTO:
            return None, None
        candidates = self.pool.candidates(turn.model or None)
        if not candidates:
            return None, None
        settled = self.auto.observe(turn.session, est_client, has_state=has_state)
        if settled is not None:  # no estimate to make: no compact context to size
            return settled, None
        decision, compact = self._auto_weigh(turn, state, schema, est_client, candidates[0].cfg)
        if decision.leaves_passthrough and decision.form == ContextShape.WINDOW:
            # The switch is the window's first checkpoint: taken at a turn the checkpoint
            # rule would take it (not while a large exchange it would keep and rewrite is a
            # turn or two from leaving the kept ones).
            terms = self._window_terms(turn, None)
            adapter = turn.wire.context
            if self.windows.switch_waits(turn.session, adapter, turn.body, state, schema, **terms):
                decision = self.auto.wait(turn.session, decision)
        return decision, compact

    def _auto_weigh(
        self,
        turn: Turn,
        state: dict[str, Any],
        schema: list[str],
        est_client: int,
        cfg: Upstream,
    ) -> tuple[AutoEstimate, dict[str, Any]]:
        """``auto``'s estimate of this turn's forms, and the compact context built to size
        it."""
        adapter = turn.wire.context
        compact = context.build_compact(adapter, turn.body, schema, state, turn.envelope_form)
        anthropic_client = turn.dialect == "anthropic"
        sizes = TurnSizes(
            transcript=est_client,
            compact=_est(compact),
            state=estimate_tokens(context.state_text(state)),
            contract=estimate_tokens(context.contract_text(schema, turn.envelope_form)),
            client_breakpoints=anthropic_client and count_breakpoints(turn.body) > 0,
            proxy_breakpoint=anthropic_client and cfg.cache_breakpoints == CacheBreakpoints.AUTO,
            keep=self.settings.window_keep,
        )
        rates = self.prices.rates(
            model=turn.model or None, upstream=cfg.name, provider_hint=cfg.url
        )
        regime = cfg.cache_regime(turn.model or None)
        decision = self.auto.decide(turn.session, sizes, regime=regime, prices=rates)
        return decision, compact

    def _client_transcript(self, turn: Turn) -> TranscriptView | None:
        """The client's request without the envelopes the proxy caused (the baseline's
        transcript), its estimated tokens and prefix hashes; None in passthrough. Worked
        out on the messages new since the session's last turn (a session the client named)."""
        if turn.mode == Mode.PASSTHROUGH:
            return None
        named = turn.session if SESSION_HEADER in turn.headers else None
        return self.transcripts.view(named, turn.wire, turn.body, turn.transcript)

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
            return MeterContext(
                turn.session, str(turn.recorded_mode), turn.model or None, None, shape
            )
        source = BaselineSource(
            self.baseline_caches.get(turn.session),
            client.points,
            untouched=client.clean is turn.body and sent is turn.body,
            now=time.monotonic(),
        )
        return MeterContext(
            turn.session,
            str(turn.recorded_mode),
            turn.model or None,
            client.est_tokens,
            shape,
            source,
        )

    def outbound(
        self,
        turn: Turn,
        body: dict[str, Any],
        schema: list[str],
        state: dict[str, Any],
        *,
        bounded: bool = False,
        shape: ContextShape | None = None,
    ) -> Outbound:
        """The request to send: the body, its token estimate, the envelope's grammar (when
        the turn is constrained and asks for the envelope: a window turn that is no
        checkpoint does not) and the prompt cache's hints."""
        grammar: dict[str, Any] | None = None
        asks_envelope = shape != ContextShape.WINDOW
        if turn.constrain and asks_envelope and constrain.should_constrain(body):
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
            est_tokens=_sent_tokens(turn, body),
            client_headers=turn.headers,
            grammar=grammar,
            cache_hints=_cache_hints(turn, body, schema, _window_prefix_end(shape, state)),
            path=turn.upstream_path,
            raw=_client_bytes(turn, body),
        )

    def envelope_seen(self, meta: TurnMeta, usage: Usage | None, share: Fraction) -> None:
        """What an envelope cost in output tokens, for ``auto``'s and the checkpoint
        policy's estimates."""
        window, auto = meta.window is not None, meta.turn.mode == Mode.AUTO
        if usage is None or not (window or auto):
            return  # (the usual compact turn: nobody keeps the figure)
        # float(output_tokens * share) without building a Fraction (microseconds each)
        tokens = usage.output_tokens * share.numerator / share.denominator
        if window:
            self.windows.envelope_cost(meta.turn.session, tokens)
        if auto:
            self.auto.envelope_cost(meta.turn.session, tokens)

    def committed(self, meta: TurnMeta, status: str, step: int) -> None:
        """A turn was committed with this verdict at ``step``: the window form keeps the
        window mark it leaves."""
        if meta.window is not None:
            self.windows.committed(meta.turn.session, step, meta.window.next_mark(status))

    async def preview(
        self, turn: Turn, read: Callable[[str], Awaitable[SessionRecord | None]], store: Store
    ) -> dict[str, Any]:
        """The body this turn would send upstream now (in the client's dialect), its session
        read with ``read`` (and a window's mark from ``store``, as the turn reads it):
        nothing is sent or committed and no lock is taken (e.g. for
        ``/v1/messages/count_tokens``)."""
        if not turn.keeps_state:
            return self.build_context(turn, self.settings.initial_state, [])[0]
        try:
            record = await read(turn.session)
        except StoreError as e:
            raise e.for_client("could not load the session") from e
        state = record.state if record else self.settings.initial_state
        schema = record.schema if record else self.settings.allowed_keys
        form = self._settled_form(turn, record)
        if turn.mode == Mode.WINDOW or form == ContextShape.WINDOW:
            # the window turn's own plan: its mark, a checkpoint
            try:
                marks = await self.windows.marks(store, record)
            except StoreError as e:
                raise e.for_client("could not load the session") from e
            window = self._window_turn(turn, record, state, schema, form, marks)
            assert window is not None  # window mode, or auto in the window form
            return window.body
        return self.build_context(turn, state, schema, form)[0]

    def _settled_form(self, turn: Turn, record: SessionRecord | None) -> ContextShape | None:
        """The form an ``auto`` session is in before its next turn runs (None outside auto),
        read without counting a turn: as :meth:`AutoPlanner.observe` would find it (a session
        this process does not know resumes in window when its state exists, else starts in
        passthrough). A turn that weighs may still switch form when it runs: that is decided
        only then, on the turn's own figures."""
        if turn.mode != Mode.AUTO:
            return None
        known = self.auto.form(turn.session)
        if known is not None:
            return known
        return ContextShape.WINDOW if record is not None else ContextShape.PASSTHROUGH


def _window_prefix_end(shape: ContextShape | None, state: dict[str, Any]) -> str | None:
    """Where the proxy's cache breakpoint goes in a window turn: after the state block."""
    if shape in (ContextShape.WINDOW, ContextShape.CHECKPOINT):
        return context.state_text(state)
    return None


def _cache_hints(
    turn: Turn, body: dict[str, Any], schema: list[str], prefix_end: str | None = None
) -> CacheHints:
    """The turn's hints for the provider's prompt cache (``skillstate.cost.cachehints``).

    The cache key: only for a session the client named (a generated id is new on every
    request, and would scatter its calls over caches). The breakpoint: where the contract's
    text ends the stable prefix of a compact context (system, tools, task, contract), or at
    ``prefix_end`` (the window form: the state, which changes only at checkpoints); its
    tokens are estimated from those parts. Found in any client format: the breakpoint is
    set on the upstream's request, after translation (``cachehints.with_breakpoint``); the
    breakpoint's place is found only when an upstream asks for it (``CacheHints.find``)."""
    key = prompt_cache_key(turn.session) if SESSION_HEADER in turn.headers else None

    def stable_prefix() -> tuple[str | None, int]:
        contract = prefix_end or context.contract_text(schema, turn.envelope_form)
        head = _head_through(body.get(turn.wire.transcript[0]), contract)
        if head is None:
            return None, 0
        prefix = [body.get("tools"), body.get("system"), body.get("instructions"), head]
        return contract, estimate_tokens(prefix)

    return CacheHints(key, find=stable_prefix)


def _head_through(items: Any, end: str) -> list[Any] | None:
    """The transcript's messages up to the text ``end`` (an Anthropic client's text block
    of its own, a chat or Responses client's message that joins the contract and the
    state), before its first assistant turn; None when it has none."""
    if not isinstance(items, list):
        return None
    for i, message in enumerate(items):
        if not isinstance(message, dict) or message.get("role") == "assistant":
            return None
        content = message.get("content")
        if isinstance(content, str):
            if end in content:
                return items[: i + 1]
            continue
        parts = content if isinstance(content, list) else []
        for k, part in enumerate(parts):
            text = part.get("text") if isinstance(part, dict) else None
            if isinstance(text, str) and end in text:
                return [*items[:i], {**message, "content": parts[: k + 1]}]
    return None


_est = request_tokens  # tokens of what an upstream would read of a body


def _sent_tokens(turn: Turn, body: dict[str, Any]) -> int:
    """``request_tokens(body)``; while ``body`` is the one the request checks serialised the
    transcript of (``turn.transcript``), its transcript's length is that serialisation's."""
    text, items = turn.transcript, body.get(turn.wire.transcript[0])
    if text is not None and type(items) is list and text.made_from(body, items):
        return request_tokens(body, (text.items, json_size(text.items, text.blob)))
    return request_tokens(body)


def _client_bytes(turn: Turn, body: dict[str, Any]) -> bytes | None:
    """The client's own bytes of ``body`` when it is the client's body, untouched, and the
    bytes were shown to mean it to any parser (``Turn.client_bytes``)."""
    return None if turn.client_bytes is None else turn.client_bytes.of(body)
