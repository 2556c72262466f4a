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
  T* = sqrt(2C / (r g)). So the window checkpoints once what would leave it has grown to
  T* turns' worth (g T*). A session expected to run fewer than T* more turns (as many as it
  has run, as ``auto`` reckons) checkpoints only when carrying what would leave until its
  end costs more than one checkpoint.

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


@dataclass(frozen=True, slots=True)
class CheckpointDecision:
    """Whether this turn checkpoints, why, and the figures (USD) it was decided on."""

    checkpoint: bool
    reason: str  # keep | max_tokens | context_limit | bill | wait
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
        rewrite_rate = (write if regime.pricing == "anthropic" else inp) - read
        rewritten = (sizes.state + sizes.kept) if cached else 0
        one = (envelope_tokens * out + sizes.instruction * inp + rewritten * rewrite_rate) / 1e6
        per_turn = leaving * carry_rate / 1e6
        turns = float(max(sizes.turns, 1))
        interval = math.inf
        if sizes.growth > 0 and carry_rate > 0:
            interval = math.sqrt(2 * one * 1e6 / (carry_rate * sizes.growth))
        if interval <= turns:
            # The steady rhythm: the window checkpoints once it has grown one best interval
            # past what it keeps.
            pays = leaving >= sizes.growth * interval
            horizon = interval
        else:
            # Fewer turns to come than one interval: only if carrying what would leave for
            # the rest of the session costs more than the checkpoint.
            horizon = turns
            pays = per_turn * horizon > one
        reason = "bill" if pays else "wait"
        return CheckpointDecision(pays, reason, per_turn * horizon, one, horizon)
