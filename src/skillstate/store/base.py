"""The store interface the pipeline depends on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..ledger import LedgerRow


class StoreError(Exception):
    """The store could not do what was asked (I/O, corruption, a conflicting commit)."""


class StepConflict(StoreError):
    """A commit expected a step the session is no longer at: another writer committed
    first. Nothing was written."""


@dataclass(frozen=True, slots=True)
class SessionRecord:
    session: str
    state: dict[str, Any]
    schema: list[str]
    step: int
    created: float
    updated: float
    state_bytes: int = 0


@dataclass(frozen=True, slots=True)
class TransitionRecord:
    step: int
    status: str  # valid | invalid | tool-noop | format-noop | operator
    patch: Any
    action: str | None
    errors: list[str]
    ts: float


class Store(Protocol):
    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def ping(self) -> bool: ...

    async def load(self, session: str) -> SessionRecord | None: ...
    async def commit(
        self,
        session: str,
        *,
        expected_step: int,
        state: dict[str, Any] | None,
        schema: list[str],
        transition: TransitionRecord,
        now: float,
        ledger: list[LedgerRow] | None = None,
    ) -> int:
        """Create the session if needed, append the transition and (when `state` is not
        None) replace the state, with the turn's ledger rows, atomically. Fails if the
        step moved meanwhile. Returns the new step."""
        ...

    async def list_sessions(self) -> list[dict[str, Any]]: ...
    async def history(self, session: str) -> list[TransitionRecord]: ...
    async def delete(self, session: str) -> bool: ...
    async def purge_sessions(self, older_than: float) -> int: ...

    async def add_ledger_rows(self, rows: list[LedgerRow]) -> None: ...
    async def ledger_rows(
        self, since: float, until: float, session: str | None = None
    ) -> list[LedgerRow]: ...
    async def purge_ledger(self, older_than: float) -> int: ...
