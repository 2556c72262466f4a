"""Wrong keys, counted per client address: the negative cache in front of the key check.

A client that keeps sending wrong keys (a guesser, or a misconfigured agent retrying in a
loop) costs an HMAC, and maybe a store lookup, per try. After ``limit`` wrong keys from
one address within ``window`` seconds, the gate answers that address with a 429 and
``Retry-After`` (the rest of the window) *before* the key is hashed or looked up. A right
key from another address is unaffected; from the same address it waits out the window too
(nothing about a key is known before it is hashed).

Memory is bounded: at most ``max_addresses`` addresses are tracked, the least recently
failing one forgotten first, so a flood from many addresses costs a fixed amount. The
address is the TCP peer (``scope["client"]``): behind a load balancer every client shares
its address, and one misbehaving client then limits all of them (docs/security.md).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

MAX_ADDRESSES = 10_000


class WrongKeyLimiter:
    """Wrong keys per client address in fixed windows (see the module docstring)."""

    def __init__(
        self,
        limit: int,
        window: float,
        *,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.window = window
        self.max_addresses = max_addresses
        self._clock = clock
        # address -> (wrong keys in its window, when the window started); oldest first
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def __len__(self) -> int:
        """Addresses tracked now (at most ``max_addresses``)."""
        return len(self._failures)

    def refused_for(self, address: str) -> float | None:
        """Seconds ``address`` must wait before its next key is checked; None when it may
        try now."""
        if self.limit <= 0:
            return None
        entry = self._failures.get(address)
        if entry is None:
            return None
        count, started = entry
        left = started + self.window - self._clock()
        if left <= 0:
            del self._failures[address]  # the window is over: a clean slate
            return None
        return left if count >= self.limit else None

    def failed(self, address: str) -> None:
        """One more wrong key from ``address``."""
        if self.limit <= 0:
            return
        now = self._clock()
        count, started = self._failures.pop(address, (0, now))
        if now - started >= self.window:
            count, started = 0, now
        self._failures[address] = (count + 1, started)  # now the most recent
        while len(self._failures) > self.max_addresses:
            self._failures.popitem(last=False)
