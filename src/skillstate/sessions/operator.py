"""The operator's use cases on sessions: read one as last committed (``GET /state``), patch
it (``PATCH /state``), delete it (``DELETE /state``) and purge the expired ones (the TTL
purge). Each runs under the session's lock, as a turn would (``sessions.locks``), and a
patch commits like a turn (``turn.commit``)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from ..config import Settings
from ..engine.verdict import Verdicts
from ..errors import ProxyError
from ..store import SessionCommit, SessionRecord, Store, TransitionRecord
from ..turn.commit import Committer
from .locks import TurnLocks

log = logging.getLogger("skillstate")


@dataclass(frozen=True)
class OperatorChange:
    """The result of an operator's patch: the new step and state, and what was dropped."""

    step: int
    state: dict[str, Any]
    warnings: list[str]


class SessionOperator:
    """The operator's reads and changes of sessions, serialised with their turns by the
    same ``locks`` the pipeline holds."""

    def __init__(self, settings: Settings, store: Store, locks: TurnLocks) -> None:
        self.store = store
        self.locks = locks
        self.verdicts = Verdicts(settings)
        self.commits = Committer(settings, store)

    @property
    def active_sessions(self) -> int:
        """Sessions with a turn running or waiting (for /health)."""
        return len(self.locks)

    async def operator_patch(
        self,
        session: str,
        patch: dict[str, Any],
        by: str | None = None,
        source: bytes | None = None,
    ) -> OperatorChange:
        """Apply an operator's patch (``PATCH /state``) as one more transition of the
        session: validated like a model's patch, committed like a turn, under its lock.
        ``by`` (the operator's key name) is recorded as the action ``operator:<by>``.
        ``source``: the request body ``patch`` was parsed from (an integer beyond 64 bits
        in it is refused, not kept as a float: ``Verdicts.check_patch``)."""
        async with self.locks.hold(session) as hold:
            record = await self.commits.load(session, hold)
            if record is None:
                raise ProxyError("not_found", f"unknown session {session}")
            tr = self.verdicts.check_patch(record.state, patch, record.schema, source)
            if not tr.ok or tr.new_state is None:
                raise ProxyError("invalid_request", "; ".join(tr.errors) or "invalid patch")
            transition = TransitionRecord(
                record.step + 1,
                "operator",
                tr.applied_patch,
                "operator" if by is None else f"operator:{by}",
                tr.warnings,
                time.time(),
            )
            change = SessionCommit(
                session, record.step, tr.new_state, record.schema, transition, transition.ts,
                state_json=tr.new_state_json,
            )  # fmt: skip
            step = await self.commits.commit_transition(change, hold)
        return OperatorChange(step, tr.new_state, tr.warnings)

    async def purge_expired(self, older_than: float) -> int:
        """Delete the sessions not updated since ``older_than`` (the TTL purge), except those
        with a turn running or waiting: that turn's commit makes them fresh again. New turns
        wait for the purge (one store transaction). While Redis is unreachable under
        ``coordination_down: refuse`` the purge cannot pause the other replicas: it is
        skipped (0), and the next one runs as usual."""
        try:
            async with self.locks.pause_new() as busy:
                return await self.store.purge_sessions(older_than, keep=busy)
        except ProxyError as e:
            if e.code != "coordination_unavailable":
                raise
            log.warning("session purge skipped (Redis is unreachable); tried again next interval")
            return 0

    async def delete_session(self, session: str) -> bool:
        """Forget a session (``DELETE /state``), after any turn of it in flight. False when
        there was no such session."""
        async with self.locks.hold(session) as hold:
            deleted = await self.store.delete(session)
            hold.committed(0)
            return deleted

    async def load_current(self, session: str) -> SessionRecord | None:
        """The session as last committed, read without holding it (``GET /state``): from
        the store's cache only while that is current (another replica may have committed)."""
        record = await self.store.load(session)
        if record is not None and not await self.locks.current(record):
            record = await self.store.load(session, fresh=True)
        return record
