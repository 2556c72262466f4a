"""Sessions: ids, the session header and per-session turn serialisation (local locks; the Redis
leases live in skillstate.coordination)."""

from .locks import SESSION_HEADER, Hold, SessionLocks, TurnLocks

__all__ = ["SESSION_HEADER", "Hold", "SessionLocks", "TurnLocks"]
