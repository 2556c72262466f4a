"""When a ``window`` session checkpoints (issue 23). Pure.

A checkpoint asks the model for the envelope (output tokens), and afterwards the window
restarts at the last ``window_keep`` exchanges: the state and those exchanges are written
into the provider's cache again. What it buys: the messages that leave the window are no
longer sent (read from the cache, or billed in full where nothing caches them) on each turn
until the next checkpoint.

:meth:`CheckpointPolicy.decide` checkpoints

* always when the whole request (stable prefix, state, window, the next turn's growth)
  would pass ``CONTEXT_SHARE`` of the model's context limit (the upstream entry's
  ``context_tokens``, else genai-prices' context window for the model,
  :meth:`skillstate.cost.pricing.PriceBook.context_window`), and the window holds more than
  one exchange, however few that is: the estimate runs up to 1.2 times short of a real
  tokenizer (``skillstate.cost.worstcase.INPUT_MARGIN``), and the checkpoint instruction
  and the reply need room in the same context. Such a checkpoint keeps fewer than ``keep``
  exchanges where ``keep`` would not fit (``engine.window.kept_start``'s room);
* never while the window holds no more than ``keep`` exchanges (nothing would leave it);
* always when the window would pass ``max_tokens`` (``window_max_tokens``) with the next
  turn's growth;
* otherwise by bill. A window growing by g tokens a turn, checkpointed every T turns, costs
  C / T + r g T / 2 a turn over what it keeps (checkpoint cost C, carry rate r: the cache
  read price, or the input price where nothing caches the window); that is least at
  T* = sqrt(2C / (r g)), where it costs L = r g T* a turn. C is the steady checkpoint's:
  one that keeps ``keep`` exchanges of the mean size g. With exchanges all of one size the
  window checkpoints once what would leave it has grown to T* turns' worth (g T*).
  Real exchanges are not of one size (a file read is ten times a ``cd``), and a checkpoint
  rewrites the ``keep`` exchanges it keeps: one taken while a large exchange is among them
  pays for it again (at the write or input price, not the read price), one taken a few turns
  later, once it has moved out of them, drops it. So the turn checkpoints only if no later
  turn would checkpoint for less: waiting j turns costs, on each of them, the carry of what
  would leave (r times it) less L (what those turns would cost in the steady rhythm), and
  then the checkpoint of that turn, whose kept exchanges are the current ones less the j
  oldest, plus j new ones of the mean size. With exchanges of one size this is the rule
  above. A session expected to run fewer than T* more turns (as many as it has run, as
  ``auto`` reckons) checkpoints only when carrying what would leave until its end costs
  more than one checkpoint.

Prices and cache regimes are ``auto``'s (``skillstate.cost.auto``): USD per million tokens,
relative rates when the model's prices are unknown.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from .auto import rates
from .baseline import CacheRegime
from .pricing import Prices

__all__ = ["CONTEXT_SHARE", "CheckpointDecision", "CheckpointPolicy", "WindowSizes"]

DEFAULT_WINDOW_KEEP = 3
DEFAULT_WINDOW_MAX_TOKENS = 32_000
# Of the model's context limit, what a window turn's request may fill by estimate: with the
# estimator up to 1.2x short (cost.worstcase.INPUT_MARGIN, 1.25), 0.6 of the limit by estimate
# is at most 0.75 of it in real tokens, leaving a quarter for the instruction and the reply.
CONTEXT_SHARE = 0.6


@dataclass(frozen=True, slots=True)
class WindowSizes:
    """Estimated tokens of one window turn's parts."""

    prefix: int  # the stable prefix (system, tools, task, contract)
    state: int  # the state block
    window: int  # the window's messages
    kept: int  # the last ``keep`` exchanges of the window (what a checkpoint keeps)
    exchanges: int  # exchanges in the window
    growth: float  # the window's mean growth per turn
    turns: int  # turns of the session so far, this one included
    instruction: int  # the checkpoint instruction
    window_caches: bool  # the provider reads the window from its cache (client breakpoints)
    # each kept exchange's tokens, oldest first (summing to ``kept``); () when not measured:
    # ``keep`` exchanges of equal size
    kept_exchanges: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class CheckpointDecision:
    """Whether this turn checkpoints, why, and the figures (USD) it was decided on."""

    checkpoint: bool
    reason: str  # keep | max_tokens | context_limit | bill | wait | forced_tool[_unfolded]
    carry_usd: float | None = None  # carrying what would leave until the next checkpoint
    checkpoint_usd: float | None = None  # one checkpoint
    horizon: float | None = None  # turns to the next checkpoint

    def as_dict(self) -> dict[str, Any]:
        return {
            k: (round(v, 9) if isinstance(v, float) else v)
            for k, v in asdict(self).items()
            if v is not None
        }


class CheckpointPolicy:
    """The checkpoint rule of one proxy (``window_keep``, ``window_max_tokens``)."""

    def __init__(
        self, keep: int = DEFAULT_WINDOW_KEEP, max_tokens: int = DEFAULT_WINDOW_MAX_TOKENS
    ) -> None:
        self.keep = keep
        self.max_tokens = max_tokens

    def decide(
        self,
        sizes: WindowSizes,
        *,
        regime: CacheRegime,
        prices: Prices | None,
        envelope_tokens: float,
        context_limit: int | None = None,
    ) -> CheckpointDecision:
        upcoming = sizes.window + sizes.growth
        total = sizes.prefix + sizes.state + upcoming
        # The model's context is a hard bound, before window_keep: a request past it fails
        # upstream, so the checkpoint keeps fewer exchanges (WindowTurn's kept room) instead.
        past = context_limit is not None and total > context_limit * CONTEXT_SHARE
        if past and sizes.exchanges > 1:
            return CheckpointDecision(True, "context_limit")
        if sizes.exchanges <= self.keep:
            return CheckpointDecision(False, "keep")
        if upcoming > self.max_tokens:
            return CheckpointDecision(True, "max_tokens")
        inp, out, read, write = rates(regime, prices)
        leaving = max(sizes.window - sizes.kept, 0)
        cached = sizes.window_caches and regime.pricing != "none"
        whole = sizes.prefix + sizes.state + sizes.window  # the cached prefix, up to last turn
        carry_rate = read if cached and whole >= regime.min_tokens else inp
        # what rewriting a token costs over reading it (nothing is rewritten uncached)
        rewrite_rate = ((write if regime.pricing == "anthropic" else inp) - read) if cached else 0
        fixed = envelope_tokens * out + sizes.instruction * inp + sizes.state * rewrite_rate
        one = (fixed + sizes.kept * rewrite_rate) / 1e6
        per_turn = leaving * carry_rate / 1e6
        turns = float(max(sizes.turns, 1))
        interval = math.inf
        if sizes.growth > 0 and carry_rate > 0:
            steady = fixed + self.keep * sizes.growth * rewrite_rate  # keeps `keep` mean ones
            interval = math.sqrt(2 * steady / (carry_rate * sizes.growth))
        if interval <= turns:
            # The steady rhythm, timed by the kept exchanges' sizes.
            pays = self._cheapest_now(sizes, leaving, carry_rate, rewrite_rate, interval)
            horizon = interval
        else:
            # Fewer turns to come than one interval: only if carrying what would leave for
            # the rest of the session costs more than the checkpoint.
            horizon = turns
            pays = per_turn * horizon > one
        reason = "bill" if pays else "wait"
        return CheckpointDecision(pays, reason, per_turn * horizon, one, horizon)

    def _cheapest_now(
        self, sizes: WindowSizes, leaving: int, carry: float, rewrite: float, interval: float
    ) -> bool:
        """Whether a checkpoint now costs no more than one at any later turn (the module
        docstring): ``carry`` and ``rewrite`` are the rates (USD per million tokens) of
        carrying a token one turn and of rewriting a kept one, ``interval`` T*."""
        even = (sizes.kept / max(self.keep, 1),) * max(self.keep, 1)
        queue: tuple[float, ...] = tuple(sizes.kept_exchanges) or even
        steady = carry * sizes.growth * interval  # L: a turn's cost in the steady rhythm
        out, waited, kept_change = float(leaving), 0.0, 0.0
        # Past the kept exchanges each turn's carry only grows (by g r), and it passes L
        # within T* turns: no later turn can be cheaper after that.
        for j in range(len(queue) + math.ceil(interval) + 1):
            step = out * carry - steady
            if j >= len(queue) and step >= 0:
                break
            oldest = queue[j] if j < len(queue) else sizes.growth
            waited += step
            out += oldest
            kept_change += sizes.growth - oldest
            if waited + kept_change * rewrite < 0:
                return False  # checkpointing j + 1 turns later costs less
        return True
