"""Per-key rate limits, checked before a turn reaches the upstream pool (and its own
limits): requests and tokens per minute (the exact rolling windows of
``skillstate.upstream.limits``, with their Retry-After). The tokens are those of the request
as the client sent it, its Responses API input and instructions included.

A key's daily USD budget is held per upstream call, like a session's budget: see
``skillstate.cost.budgets``.

With ``coordination`` configured, the windows are in Redis, shared by every replica
(``coordination.windows``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from ..coordination.link import CoordinationLink
from ..cost.tokens import request_tokens
from ..errors import ProxyError
from ..upstream.limits import RateLimits, UpstreamLimits
from .gate import Principal


class KeyQuotas:
    """The rpm/tpm windows of every key: in this process, or shared by replicas through
    ``link`` when coordination is configured."""

    def __init__(
        self,
        monotonic: Callable[[], float] = time.monotonic,
        link: CoordinationLink | None = None,
    ) -> None:
        self._monotonic = monotonic
        self._windows: dict[str, RateLimits] = {}
        self._link = link if link is not None and link.configured else None

    async def admit(self, caller: Principal, body: Mapping[str, Any]) -> None:
        """Let one turn of ``caller`` through, or raise a 429 (or a 413 over its tpm)."""
        record = caller.record
        if record.rpm is None and record.tpm is None:
            return
        await self._admit_rate(caller, request_tokens(body))

    def _window(self, caller: Principal) -> RateLimits:
        record = caller.record
        window = self._windows.get(caller.name)
        if window is None or (window.rpm, window.tpm) != (record.rpm or None, record.tpm or None):
            local = UpstreamLimits(record.rpm, record.tpm, self._monotonic)
            if self._link is not None:
                from ..coordination.windows import SharedWindows

                window = SharedWindows(
                    self._link, "key:" + caller.name, record.rpm, record.tpm, local=local
                )
            else:
                window = local
            self._windows[caller.name] = window
        return window

    async def _admit_rate(self, caller: Principal, tokens: int) -> None:
        record = caller.record
        if record.rpm is None and record.tpm is None:
            return
        admission = await self._window(caller).reserve(tokens)
        if admission.never_fits:
            raise ProxyError(
                "request_too_large",
                f"this request (~{tokens} tokens) is larger than key {caller.name!r}'s tpm",
                code="tpm_exceeded",
            )
        if not admission.ok:
            raise ProxyError(
                "rate_limit",
                f"key {caller.name!r}: rate limit reached; retry after the given time",
                retry_after=admission.retry_after,
                code="key_rate_limit",
            )
