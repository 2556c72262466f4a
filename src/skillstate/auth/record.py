"""A client key as stored (no plaintext: only the digest of its secret)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """One client key as stored: its name, the digest of its secret and its limits."""

    name: str
    digest: str  # hex HMAC-SHA256 of the key under the server secret
    admin: bool = False
    rpm: int | None = None
    tpm: int | None = None
    budget_usd_per_day: float | None = None
    created: float = 0.0
    expires: float | None = None  # unix time; None = never
    revoked: float | None = None  # unix time of the revocation; None = live
    max_session_budget_usd: float | None = None  # the most a session's budget may be
    allow_unpriced: bool = False  # calls to unpriced models under a budget (cost.budgets)

    def refusal(self, now: float) -> str | None:
        """Why this key cannot be used at ``now`` (revoked, expired), else None."""
        if self.revoked is not None:
            return "this API key was revoked"
        if self.expires is not None and now >= self.expires:
            return "this API key has expired"
        return None
