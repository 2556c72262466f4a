"""When ``mask`` re-masks (issue 23): only when the saving over the coming turns pays for
the cache it throws away. Pure.

Re-masking replaces more old observations with placeholders. Every message from the first
newly masked one to the end of the transcript then differs from what the provider cached,
so it is billed again: written at the cache-write price (Anthropic's 1.25x input) or sent
uncached (OpenAI's automatic cache), where it would otherwise be read at the cache-read
price. What it buys: the masked tokens are no longer read on each coming turn. So, at a
request with ``turns`` observations (a session that has run n turns is expected to run
about n more, as ``auto`` reckons),

    re-mask  when  saving x carry_rate x turns  >  rewrite x (rewrite_rate - read_rate)

with ``saving`` the tokens the re-mask takes out of every coming request, ``rewrite`` the
tokens from the first newly masked message to the end, ``carry_rate`` the cache-read price
(the input price where nothing caches the transcript: no cache, or an Anthropic client that
marks no breakpoints; then a re-mask costs nothing and pays at once). Unknown prices use
``auto``'s relative rates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .auto import rates
from .baseline import CacheRegime
from .cachehints import MAX_BREAKPOINTS, count_breakpoints
from .pricing import Prices

__all__ = ["RemaskRule"]


@dataclass(frozen=True, slots=True)
class RemaskRule:
    """The re-mask rule of one session's upstream: its cache regime and rates, and whether
    the client's transcript is cached there at all."""

    regime: CacheRegime
    prices: Prices | None
    client_breakpoints: bool  # the client marks cache_control breakpoints (anthropic)
    anthropic_client: bool = False  # the request is in the Messages format

    def marks(self, body: Mapping[str, Any]) -> bool:
        """Whether ``mask`` marks the end of its masked part with a breakpoint: on an
        Anthropic cache that the client uses, which reads the cache only at breakpoints
        (without one there a re-mask would find nothing before it cached and rewrite the
        whole transcript, not the tail this rule reckons with), while a breakpoint is free
        (at most 4 a request)."""
        return (
            self.anthropic_client
            and self.cached
            and self.regime.pricing == "anthropic"
            and count_breakpoints(dict(body)) < MAX_BREAKPOINTS
        )

    @property
    def cached(self) -> bool:
        """Whether the provider reads the client's transcript from its cache."""
        if self.regime.pricing == "none":
            return False
        return self.regime.pricing == "openai" or self.client_breakpoints

    def pays(self, saving: int, rewrite: int, whole: int, turns: int) -> bool:
        """Whether masking ``saving`` more tokens, which rewrites ``rewrite`` tokens of the
        ``whole`` request into the cache, pays over ``turns`` coming turns (see the module
        docstring)."""
        if saving <= 0:
            return False
        inp, _, read, write = rates(self.regime, self.prices)
        if not self.cached or whole < self.regime.min_tokens:
            return True  # nothing cached to lose: every masked token is saved at input price
        rewrite_rate = (write if self.regime.pricing == "anthropic" else inp) - read
        return saving * read * turns > rewrite * rewrite_rate
