"""``mode: auto`` picks each turn's context form by its expected bill (issue 14 §4). Pure.

A session starts in ``passthrough``: the client's transcript untouched, no contract, no
envelope, no state upkeep, so a short session costs exactly what it would without the
proxy. Each passthrough turn, :meth:`AutoPlanner.decide` estimates, per coming turn, what
``passthrough`` and ``compact`` would be billed, under the upstream's cache regime and
rates:

* passthrough: the transcript (growing by the session's mean growth per turn), its prefix
  read from the cache when the provider caches it (``openai``: always; ``anthropic``: only
  when the client marks breakpoints);
* window (``skillstate.engine.window``): the stable prefix (system, tools, task, contract) and the
  state, cached (the proxy marks them on ``anthropic``), then the recent messages: the
  ``window_keep`` exchanges a checkpoint keeps plus what the window grew since (half the
  checkpoint interval on average), read from the cache where the provider caches the
  client's transcript; and one checkpoint per interval (its envelope, a running mean of what
  the session's envelopes cost, with a prior before the first one, and the state and kept
  exchanges written into the cache again). The interval is the one that minimises the bill
  per turn (``skillstate.cost.checkpoint``).

Over the expected coming turns (as many as the session has had: a session that has run n
turns is expected to run about n more), when the window's saving exceeds the cost of the
switch (the contract and an envelope on one checkpoint turn sent after the client's
transcript as it is, whose prefix is still cache-warm, and the window's prefix written into
the cache once), the session moves to ``window`` and stays there (hysteresis: switching back
would throw away a warm prefix and the state's upkeep, so it never flaps). Its first window
turn is a checkpoint, which builds the state. A session whose state already exists (e.g.
after a restart) resumes in window.

All estimates are in the estimator's tokens (``skillstate.cost.tokens``) and USD per million
tokens; unknown prices fall back to relative rates (input 1, output 4, cache read and
write as the regime's multipliers), which is enough to compare forms.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

from ..choices import ContextShape
from .baseline import CacheRegime
from .pricing import Prices

__all__ = ["AutoEstimate", "AutoPlanner", "TurnSizes"]

ENVELOPE_PRIOR_TOKENS = 40.0  # the envelope's output before the session has shown one
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
    switch_usd: float | None = None  # once
    saving_usd: float | None = None  # over the coming turns, the switch paid

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


class AutoPlanner:
    """Per-session decisions of ``auto`` (bounded: the least recently used session is
    forgotten beyond ``max_sessions``, and starts over in passthrough, or in compact when its
    state exists)."""

    def __init__(self, max_sessions: int = 10_000) -> None:
        self._max = max(max_sessions, 1)
        self._sessions: OrderedDict[str, _Session] = OrderedDict()

    def _get(self, session: str) -> _Session:
        s = self._sessions.pop(session, None)
        if s is None:
            s = _Session()
            while len(self._sessions) >= self._max:
                self._sessions.popitem(last=False)
        self._sessions[session] = s
        return s

    def decide(
        self,
        session: str,
        sizes: TurnSizes,
        *,
        has_state: bool,
        regime: CacheRegime,
        prices: Prices | None,
    ) -> AutoEstimate:
        """The form of this turn, and the estimates behind it."""
        s = self._get(session)
        if s.turns == 0 and has_state:
            s.form = ContextShape.WINDOW
        if s.last_transcript is not None:
            delta = max(sizes.transcript - s.last_transcript, 0)
            s.growth += (delta - s.growth) / s.turns
        s.turns += 1
        s.last_transcript = sizes.transcript
        if s.form != ContextShape.PASSTHROUGH:
            return AutoEstimate(s.form, s.turns, 0)
        return self._weigh(s, sizes, regime, prices)

    def _weigh(
        self, s: _Session, sizes: TurnSizes, regime: CacheRegime, prices: Prices | None
    ) -> AutoEstimate:
        inp, out, read, write = rates(regime, prices)
        coming = s.turns
        g = s.growth
        minimum = regime.min_tokens

        def billed(tokens: float, cached: float) -> float:
            cached = cached if cached >= minimum else 0.0
            return ((tokens - cached) * inp + cached * read) / 1e6

        pass_caches = regime.pricing == "openai" or (
            regime.pricing == "anthropic" and sizes.client_breakpoints
        )
        compact_caches = regime.pricing == "openai" or (
            regime.pricing == "anthropic" and sizes.proxy_breakpoint
        )
        mean_transcript = sizes.transcript + g * (coming + 1) / 2
        passthrough = billed(mean_transcript, mean_transcript - g if pass_caches else 0.0)
        # The stable prefix: the compact context less the state and the latest observation.
        prefix = max(sizes.compact - sizes.state - g, 0.0)
        head = prefix + sizes.state  # cached behind the proxy's breakpoint
        kept = sizes.keep * g
        rewrite = (write if regime.pricing == "anthropic" else inp) - read
        checkpoint = s.envelope * out / 1e6
        if pass_caches:
            checkpoint += (sizes.state + kept) * rewrite / 1e6
        carry = read if pass_caches else inp
        interval = float(max(coming, 1))
        if g > 0 and carry > 0:
            interval = max(min(interval, math.sqrt(2 * checkpoint * 1e6 / (carry * g))), 1.0)
        recent = kept + g * interval / 2
        # Cached: up to the previous turn where the client's transcript is cached, else the
        # prefix and the state behind the proxy's breakpoint.
        cached = head + recent if pass_caches else (head if compact_caches else 0.0)
        window = billed(head + recent + g, cached) + checkpoint / interval
        # The switch: the checkpoint turn's contract and envelope after the transcript as it
        # is, and the window's prefix written into the cache once.
        cold = head * rewrite / 1e6 if compact_caches and head >= minimum else 0.0
        switch = (sizes.contract * inp + s.envelope * out) / 1e6 + cold
        saving = coming * (passthrough - window) - switch
        form = ContextShape.WINDOW if saving > 0 else ContextShape.PASSTHROUGH
        if form == ContextShape.WINDOW:
            s.form = ContextShape.WINDOW
        return AutoEstimate(form, s.turns, coming, passthrough, window, switch, saving)

    def envelope_cost(self, session: str, output_tokens: float) -> None:
        """The output tokens one of the session's envelopes took (running mean)."""
        s = self._sessions.get(session)
        if s is not None and output_tokens >= 0:
            s.envelopes += 1
            s.envelope += (output_tokens - s.envelope) / s.envelopes


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
