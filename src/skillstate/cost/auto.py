"""``mode: auto`` picks each turn's context form by its expected bill (issue 14 §4, issue 23).
Pure.

A session starts in ``passthrough``: the client's transcript untouched, no contract, no
envelope, no state upkeep, so a short session costs exactly what it would without the
proxy. Each passthrough turn, :meth:`AutoPlanner.decide` estimates, per coming turn, what
each form would be billed, under the upstream's cache regime and rates:

* passthrough: the transcript (growing by the session's mean growth per turn), its prefix
  read from the cache when the provider caches it (``openai``: always; ``anthropic``: only
  when the client marks breakpoints, and then the new tail is written at the write price);
* window (``skillstate.engine.window``): the stable prefix (system, tools, task, contract) and the
  state, cached (the proxy marks them on ``anthropic``), then the recent messages: the
  ``window_keep`` exchanges a checkpoint keeps plus what the window grew since (half the
  checkpoint interval on average), read from the cache where the provider caches the
  client's transcript; and one checkpoint per interval (its envelope, and the state and kept
  exchanges written into the cache again: the stable prefix too when it is below the
  cache's minimum). The interval is the one that minimises the bill per turn
  (``skillstate.cost.checkpoint``);
* compact (``state`` mode's context), a candidate only with ``auto_compact`` (off by default:
  the issue keeps the recent turns verbatim): the stable prefix, cached where the provider
  caches it, then the state and the latest observation, new on every turn, and an envelope
  on every turn.

The envelope is a running mean of what the session's envelopes cost, with a prior (a coding
agent's, 130 tokens) before the first one; the state, before it exists, one envelope's
worth. Over the expected coming turns (as many as the session has had: a session that has
run n turns is expected to run about n more), when the cheaper of window and compact saves
more than the cost of the switch (the contract and an envelope on one checkpoint turn sent
after the client's transcript as it is, whose prefix is still cache-warm, and the new form's
prefix written into the cache once), the session leaves passthrough for good (switching back
would throw away a warm prefix and the state's upkeep). The switch turn is a checkpoint
either way: it builds the state. The switch into the window is that window's first
checkpoint, so the planner (``skillstate.turn.plan``) takes it only at a turn the window's
checkpoint rule (``skillstate.cost.checkpoint``) would, on the window the whole transcript
forms (:meth:`AutoPlanner.wait` puts it off otherwise: a large exchange the switch would keep
and write again is about to leave the kept ones). Under prefix caching (``openai``) the new
form's prefix begins with the client's own (tools, system, task), which passthrough's requests
cached, so the switch writes only the rest of it. Once an envelope's real size is known
(the switch, and each later checkpoint of a window session), a window session weighs window
against compact again and moves to compact when that saves more than writing compact's
prefix into the cache; a compact session stays. A session whose state already exists (e.g.
after a restart) resumes in window. Only the turns that weigh (passthrough ones, and a window
turn after an envelope) need the compact context's size: :meth:`AutoPlanner.observe` says
which.

All estimates are in the estimator's tokens (``skillstate.cost.tokens``) and USD per million
tokens; unknown prices fall back to relative rates (input 1, output 4, cache read and
write as the regime's multipliers), which is enough to compare forms.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..choices import ContextShape
from ..sessions.lru import SessionLRU
from .baseline import CacheRegime
from .pricing import Prices

__all__ = ["AutoEstimate", "AutoPlanner", "TurnSizes"]

ENVELOPE_PRIOR_TOKENS = 130.0  # a coding agent's envelope (issue 23), before one is seen
STATE_ENVELOPES = 1.0  # the state's size in envelopes before it has one: the switch writes one
WINDOW_KEEP = 3  # exchanges a checkpoint keeps (the default window_keep), for the estimates
_READ = {"none": 1.0, "openai": 0.5, "anthropic": 0.1}  # relative to input, prices unknown
_WRITE = {"none": 1.0, "openai": 1.0, "anthropic": 1.25}


@dataclass(frozen=True, slots=True)
class TurnSizes:
    """Estimated tokens of this turn's candidate parts."""

    transcript: int  # the client's transcript (what passthrough sends)
    compact: int  # this turn's compact context (stable prefix, state, latest observation)
    state: int  # the state block
    contract: int  # the contract alone (what full adds to the transcript)
    client_breakpoints: bool  # the client marks cache_control breakpoints itself
    proxy_breakpoint: bool  # the proxy may mark compact's stable prefix (anthropic)
    keep: int = WINDOW_KEEP  # window_keep


@dataclass(frozen=True, slots=True)
class AutoEstimate:
    """One decision and the figures it was made on (USD; per coming turn, or in all)."""

    form: ContextShape
    turns: int  # turns of the session so far, this one included
    expected_turns: int  # coming turns the saving is reckoned over
    passthrough_usd: float | None = None  # per coming turn
    window_usd: float | None = None  # per coming turn
    compact_usd: float | None = None  # per coming turn
    switch_usd: float | None = None  # once
    saving_usd: float | None = None  # over the coming turns, the switch paid
    # the switch pays, but is put off to a turn the window's checkpoint rule would take it
    put_off: bool | None = None

    @property
    def leaves_passthrough(self) -> bool:
        """This turn moves the session out of passthrough (its switch: a checkpoint)."""
        return self.passthrough_usd is not None and self.form != ContextShape.PASSTHROUGH

    def as_dict(self) -> dict[str, Any]:
        """The figures that were estimated (rounded), for a header or the history."""
        d = asdict(self)
        d["form"] = str(self.form)
        return {
            k: (round(v, 9) if isinstance(v, float) else v) for k, v in d.items() if v is not None
        }


@dataclass(slots=True)
class _Session:
    form: ContextShape = ContextShape.PASSTHROUGH
    turns: int = 0
    last_transcript: int | None = None
    growth: float = 0.0  # mean growth of the transcript per turn, tokens
    envelope: float = ENVELOPE_PRIOR_TOKENS  # mean output tokens of the envelope
    envelopes: int = 0
    reweigh: bool = False  # a window session saw an envelope: weigh window against compact


@dataclass(frozen=True, slots=True)
class _Forms:
    """Per coming turn, what each form is expected to bill (USD), and the switch into the
    cheaper of window and compact (once)."""

    passthrough: float
    window: float
    compact: float
    switch_window: float
    switch_compact: float
    cold_compact: float  # compact's prefix written into the cache (from window: the switch)


class AutoPlanner:
    """Per-session decisions of ``auto`` (bounded: the least recently used session is
    forgotten beyond ``max_sessions``, and starts over in passthrough, or in window when its
    state exists)."""

    def __init__(self, max_sessions: int = 10_000, *, allow_compact: bool = False) -> None:
        self.allow_compact = allow_compact  # compact is a candidate (``auto_compact``)
        self._sessions = SessionLRU(_Session, max(max_sessions, 1))

    def form(self, session: str) -> ContextShape | None:
        """The form the session is in (None: not seen, or forgotten)."""
        s = self._sessions.peek(session)
        return s.form if s is not None else None

    def turns(self, session: str) -> int:
        """The session's turns so far, its passthrough ones included (0: not seen, or
        forgotten)."""
        s = self._sessions.peek(session)
        return s.turns if s is not None else 0

    def wait(self, session: str, estimate: AutoEstimate) -> AutoEstimate:
        """The switch ``estimate`` chose is put off to a later turn (its checkpoint costs
        less then): the session stays in passthrough this turn."""
        self._sessions.get(session).form = ContextShape.PASSTHROUGH
        return replace(estimate, form=ContextShape.PASSTHROUGH, put_off=True)

    def observe(self, session: str, transcript: int, *, has_state: bool) -> AutoEstimate | None:
        """Counts this turn (its client transcript's tokens). Returns the form when it is
        settled, or None when this turn is to be weighed: pass its sizes to
        :meth:`decide` (only then is the compact context worth building)."""
        s = self._sessions.get(session)
        if s.turns == 0 and has_state:
            s.form = ContextShape.WINDOW
        if s.last_transcript is not None:
            delta = max(transcript - s.last_transcript, 0)
            s.growth += (delta - s.growth) / s.turns
        s.turns += 1
        s.last_transcript = transcript
        if s.form == ContextShape.PASSTHROUGH or s.reweigh:
            return None
        return AutoEstimate(s.form, s.turns, 0)

    def decide(
        self, session: str, sizes: TurnSizes, *, regime: CacheRegime, prices: Prices | None
    ) -> AutoEstimate:
        """The form of a turn :meth:`observe` left to weigh, and the estimates behind it."""
        s = self._sessions.get(session)
        forms = self._forms(s, sizes, regime, prices)
        coming = s.turns
        if s.form == ContextShape.WINDOW:  # right after a checkpoint: stay, or go compact
            s.reweigh = False
            saving = coming * (forms.window - forms.compact) - forms.cold_compact
            if saving > 0:
                s.form = ContextShape.COMPACT
            return AutoEstimate(
                s.form,
                s.turns,
                coming,
                None,
                forms.window,
                forms.compact,
                forms.cold_compact,
                saving,
            )
        into, per_turn, switch = ContextShape.WINDOW, forms.window, forms.switch_window
        compact = coming * forms.compact + forms.switch_compact
        if self.allow_compact and compact < coming * per_turn + switch:
            into, per_turn, switch = ContextShape.COMPACT, forms.compact, forms.switch_compact
        saving = coming * (forms.passthrough - per_turn) - switch
        form = into if saving > 0 else ContextShape.PASSTHROUGH
        s.form = form
        return AutoEstimate(
            form, s.turns, coming, forms.passthrough, forms.window, forms.compact, switch, saving
        )

    def _forms(
        self, s: _Session, sizes: TurnSizes, regime: CacheRegime, prices: Prices | None
    ) -> _Forms:
        inp, out, read, write = rates(regime, prices)
        coming = s.turns
        g = s.growth
        minimum = regime.min_tokens
        anthropic = regime.pricing == "anthropic"

        def billed(tokens: float, cached: float, new_rate: float = inp) -> float:
            cached = cached if cached >= minimum else 0.0
            return ((tokens - cached) * new_rate + cached * read) / 1e6

        pass_caches = regime.pricing == "openai" or (anthropic and sizes.client_breakpoints)
        compact_caches = regime.pricing == "openai" or (anthropic and sizes.proxy_breakpoint)
        # Where the client marks its newest message, what is not read is written.
        fresh = write if anthropic and pass_caches else inp
        mean_transcript = sizes.transcript + g * (coming + 1) / 2
        passthrough = billed(mean_transcript, mean_transcript - g if pass_caches else 0.0, fresh)
        # The stable prefix: the compact context less the state and the latest observation.
        prefix = max(sizes.compact - sizes.state - g, 0.0)
        # The state a checkpoint writes: a session's envelopes build it; before one is seen,
        # a few envelopes' worth.
        state = max(float(sizes.state), STATE_ENVELOPES * s.envelope)
        head = prefix + state  # cached behind the proxy's breakpoint
        envelope = s.envelope * out / 1e6
        # compact: the prefix cached, then the state and the latest observation (both new
        # every turn: written, where the client marks its newest message and the context
        # reaches the cache's minimum, as the window's new messages are), and an envelope on
        # every turn.
        whole = prefix + state + g
        compact_fresh = fresh if whole >= minimum else inp
        compact = billed(whole, prefix if compact_caches else 0.0, compact_fresh) + envelope
        # window: see the module docstring.
        kept = sizes.keep * g
        rewrite = (write if anthropic else inp) - read
        rewritten = state + kept + (prefix if prefix < minimum else 0.0)
        checkpoint = envelope + (rewritten * rewrite / 1e6 if pass_caches else 0.0)
        carry = read if pass_caches else inp
        interval = float(max(coming, 1))
        if g > 0 and carry > 0:
            interval = max(min(interval, math.sqrt(2 * checkpoint * 1e6 / (carry * g))), 1.0)
        recent = kept + g * interval / 2
        # Cached: up to the previous turn where the client's transcript is cached, else the
        # prefix and the state behind the proxy's breakpoint.
        cached = head + recent if pass_caches else (head if compact_caches else 0.0)
        window = billed(head + recent + g, cached, fresh) + checkpoint / interval
        # The switch: the checkpoint turn's contract and envelope after the transcript as it
        # is, and the new form's prefix written into the cache once.
        checkpoint_turn = (sizes.contract * inp + s.envelope * out) / 1e6
        # Under prefix caching (openai) the new form's prefix begins with the client's own
        # (tools, system, task), which passthrough's requests cached: the rest is new.
        shared = max(prefix - sizes.contract, 0.0) if regime.pricing == "openai" else 0.0
        cold = (head - shared) * rewrite / 1e6 if compact_caches and head >= minimum else 0.0
        warm = compact_caches and prefix >= minimum
        cold_compact = prefix * rewrite / 1e6 if warm else 0.0
        switch_compact = (prefix - shared) * rewrite / 1e6 if warm else 0.0
        return _Forms(
            passthrough,
            window,
            compact,
            checkpoint_turn + cold,
            checkpoint_turn + switch_compact,
            cold_compact,
        )

    def envelope_cost(self, session: str, output_tokens: float) -> None:
        """The output tokens one of the session's envelopes took (running mean); a window
        session weighs window against compact on its next turn."""
        s = self._sessions.peek(session)
        if s is not None and output_tokens >= 0:
            s.envelopes += 1
            s.envelope += (output_tokens - s.envelope) / s.envelopes
            s.reweigh = self.allow_compact and s.form == ContextShape.WINDOW


def rates(regime: CacheRegime, prices: Prices | None) -> tuple[float, float, float, float]:
    """(input, output, cache read, cache write) in USD per million tokens."""
    if prices is not None and prices.input_per_mtok > 0:
        return (
            prices.input_per_mtok,
            prices.output_per_mtok,
            prices.cache_read_per_mtok,
            prices.cache_write_per_mtok,
        )
    return 1.0, 4.0, _READ[regime.pricing], _WRITE[regime.pricing]
