"""The store interface the pipeline depends on."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any, Protocol

from ..auth.record import KeyRecord
from ..errors import ProxyError
from .records import (
    KeptReply,
    LedgerRow,
    LedgerSums,
    SessionCommit,
    SessionRecord,
    StoredResponse,
    TransitionRecord,
)


class StoreError(Exception):
    """The store could not do what was asked (I/O, corruption, a conflicting commit).

    ``status`` is the HTTP status a client sees for it; ``retry_after`` is set when trying
    again later can succeed."""

    status = 500
    retry_after: float | None = None

    def for_client(self, doing: str) -> ProxyError:
        """This failure as the error a client gets, e.g. doing="could not commit the turn"."""
        kind = "overloaded" if self.status == 503 else "api_error"
        code = {503: "store_unavailable", 507: "store_full"}.get(self.status)
        return ProxyError(
            kind, f"{doing}: {self}", status=self.status, code=code, retry_after=self.retry_after
        )


class StoreUnavailable(StoreError):
    """The store cannot write right now (locked by another process, disk full, read-only,
    unresponsive): nothing was written, and a retry later may succeed."""

    status = 503
    retry_after = 1.0


class StoreFull(StoreError):
    """Writing would exceed a configured capacity (the ``max_sessions`` setting)."""

    status = 507


class StepConflict(StoreError):
    """A commit expected a step the session is no longer at: another writer committed
    first. Nothing was written."""


class KeptAlready(StepConflict):
    """A turn's Idempotency-Key was kept already (by another turn with the same key that
    ran at the same time: a lost lease). Nothing was written."""


class Store(Protocol):
    """What the proxy asks of a backend. store/factory.py makes one from the settings,
    unopened; the first four are asked before the proxy runs (no event loop yet)."""

    @property
    def home(self) -> Path | None:
        """The directory of a store kept in local files, where the client keys' secret file
        lives beside it; None for a server's store, which keeps the secret itself."""
        ...

    def exists(self) -> bool:
        """Whether there is a store to read (commands that only read refuse to make one)."""
        ...

    def preflight(self) -> None:
        """Check that the proxy can open the store as it will, before it binds its port:
        an unusable store is one line (ConfigError) rather than a traceback after
        "listening". Runs outside any event loop."""
        ...

    def migrate(self) -> list[str]:
        """``skillstate migrate``: bring the schema to this release's version; a line per
        migration applied, or one saying there was nothing to do. A failure is one line
        (ConfigError). Runs outside any event loop."""
        ...

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def check(self, timeout: float) -> str | None:
        """None when the store can write now, else why not; waits at most ``timeout``."""
        ...

    async def ensure_writable(self, timeout: float) -> None:
        """Raise StoreUnavailable when the store is known to be unable to write: checked
        before a turn spends upstream tokens it could not commit. Free while writes succeed;
        after a failed write, a probe (waiting at most ``timeout``) decides."""
        ...

    def ensure_room_for_session(self) -> None:
        """Raise StoreFull when a new session would exceed the store's capacity
        (``max_sessions``): checked before a new session's turn spends upstream tokens."""
        ...

    async def load(self, session: str, *, fresh: bool = False) -> SessionRecord | None:
        """The session as last committed, None when there is none. A store may answer
        from a cache of its own commits; ``fresh`` reads the database (another replica
        committed since: see ``skillstate.sessions.locks.Hold.current``)."""
        ...

    async def commit(self, c: SessionCommit) -> int:
        """Create the session if needed, append the transition and (when ``c.state`` is not
        None) replace the state, with the turn's ledger rows, its kept reply (``c.kept``:
        a turn sent with an Idempotency-Key) and its stored response (``c.response``, kept
        or replaced as ``put_response`` does), atomically. Fails if the step moved
        meanwhile (StepConflict) or the key is kept already (KeptAlready). Returns the new
        step."""
        ...

    def commit_at_once(self, c: SessionCommit) -> int | None:
        """``commit`` without waiting, for a turn with no other in flight, when the store
        can do it now on the caller's thread without blocking it (SQLite: its thread idle,
        the file not locked); None when it cannot, with nothing written: the caller
        awaits ``commit`` then. Fails as ``commit`` does."""
        ...

    async def kept_reply(self, scope: str, key: str) -> KeptReply | None:
        """The reply kept under ``key`` in ``scope``, read from the database (another
        replica may have kept it); None when there is none."""
        ...

    async def keep_reply(self, kept: KeptReply, ledger: list[LedgerRow]) -> None:
        """Keep the reply of a turn that commits no transition (passthrough, mask) with its
        ledger rows, in one transaction; KeptAlready when the key is kept already."""
        ...

    async def purge_kept_replies(self, older_than: float) -> int:
        """Delete the replies kept before ``older_than`` (``idempotency_ttl``)."""
        ...

    async def sessions_page(
        self, limit: int, after: tuple[float, str] | None = None, prefix: str | None = None
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` sessions, most recently updated first (ties by id), after the
        ``(updated, id)`` of the previous page's last one; only ids in ``prefix``'s namespace
        when given (``<key>:``, or ``UNKEYED``: the ids in none)."""
        ...

    async def history_page(
        self, session: str, limit: int, after_step: int = 0
    ) -> list[TransitionRecord]:
        """Up to ``limit`` transitions of ``session`` after step ``after_step``, in order."""
        ...

    async def delete(self, session: str) -> bool:
        """Forget a session: its state, transitions, stored responses and kept replies."""
        ...

    async def purge_sessions(self, older_than: float, keep: Collection[str] = ()) -> int:
        """Delete the sessions not updated since ``older_than``, except those in ``keep``."""
        ...

    async def put_response(self, record: StoredResponse) -> None:
        """Keep (or replace) a response under its id."""
        ...

    async def response_chain(self, response_id: str, limit: int) -> list[StoredResponse]:
        """The response and the ones it chains on (``previous``), oldest first, at most
        ``limit`` of them; empty when ``response_id`` is unknown. A link that was deleted
        ends the chain there."""
        ...

    async def delete_response(self, response_id: str) -> bool: ...

    async def add_ledger_rows(self, rows: list[LedgerRow]) -> None: ...
    async def ledger_rows(
        self, since: float, until: float, session: str | None = None, prefix: str | None = None
    ) -> list[LedgerRow]: ...
    async def ledger_sums(
        self,
        since: float,
        until: float,
        session: str | None = None,
        prefix: str | None = None,
        group_by: str | None = None,
    ) -> list[LedgerSums]:
        """The rows of ``ledger_rows(since, until, session, prefix)`` summed in the database
        per ``group_by`` group (a ``GroupBy``; None: one group) and kind, for
        ``skillstate.cost.ledger.summarize_sums``."""
        ...

    async def ledger_spend(
        self,
        prefix: str,
        since: float,
        *,
        whole: bool = False,
        unpriced: tuple[float, float] | None = None,
        pending: LedgerRow | None = None,
        in_flight: tuple[str, float] | None = None,
    ) -> float:
        """USD of the rows since ``since`` whose session id starts with ``prefix`` (is
        ``prefix``, when ``whole``). A row without a price counts at ``unpriced`` (input and
        output USD per million tokens), when given; else as nothing. ``pending``: a row
        written in the same transaction, durably before this returns (not counted: the
        reservation it is of holds it). ``in_flight``: the pending rows left out (a LIKE
        pattern of row ids, and a time from which all are), see ``cost.pending``."""
        ...

    async def drop_ledger_rows(self, row_ids: list[str]) -> None:
        """Delete the pending rows with these ids (of holds no call used); a row written
        over one (``TurnBudgets.claim``) is no longer pending and stays."""
        ...

    async def settle_pending(self, older_than: float) -> int:
        """Mark the pending rows older than ``older_than`` interrupted (``cost.pending``): the
        calls of a process that died with them out. How many there were."""
        ...

    # Session budgets (cost.budgets): kept apart from the session's row, so that sessions
    # with no state (passthrough) have them too; they go with the session.
    async def session_budget(self, session: str) -> float | None:
        """The session's budget in USD; None when it has none."""
        ...

    async def set_session_budget(
        self, session: str, usd: float | None, *, replace: bool
    ) -> float | None:
        """Set the session's budget (None removes it); unless ``replace``, only when it has
        none. Returns the budget it has now."""
        ...

    # Client keys (skillstate.auth): stored by name, found by the digest of the secret.
    async def save_key(self, record: KeyRecord, *, new: bool) -> None:
        """Insert (``new``; StoreError when the name is taken) or replace a key."""
        ...

    async def keys(self) -> list[KeyRecord]: ...
    async def has_keys(self) -> bool:
        """Whether any key exists (one EXISTS query: auth turns on with the first key)."""
        ...

    async def key_by_digest(self, digest: str) -> KeyRecord | None: ...
    async def purge_ledger(self, older_than: float) -> int: ...

    async def shared_secret(self) -> bytes | None:
        """The secret client keys are hashed with when the store keeps it for every process
        that shares it (PostgreSQL); None when it is the data dir's file (SQLite)."""
        ...

    async def set_shared_secret(self, secret: bytes) -> bool:
        """Make ``secret`` the shared one (``store copy``: the copied keys were hashed with
        it); False when the store keeps none (SQLite: the data dir's file)."""
        ...

    # Export and import, for ``skillstate store copy`` (skillstate.store.copy): everything
    # as it is stored, in pages, so that a big store never has to fit in memory.
    async def counts(self) -> dict[str, int]:
        """How many rows each kind of data has: ``COUNTED`` are the names."""
        ...

    async def export_sessions(self, after: str | None, limit: int) -> list[SessionRecord]:
        """Up to ``limit`` sessions with their states, by id, after the id ``after``."""
        ...

    async def import_session(self, record: SessionRecord) -> None:
        """Insert a session as it is (its step, created and updated); StoreError when the
        id is taken. Its transitions come with ``import_transitions``."""
        ...

    async def import_transitions(self, session: str, history: list[TransitionRecord]) -> None:
        """Insert transitions of ``session`` as they are (their steps and times)."""
        ...

    async def export_responses(self, after: str | None, limit: int) -> list[StoredResponse]:
        """Up to ``limit`` stored responses, by id, after the id ``after``."""
        ...

    async def export_session_budgets(
        self, after: str | None, limit: int
    ) -> list[tuple[str, float]]:
        """Up to ``limit`` (session, budget in USD), by session id, after the id ``after``."""
        ...

    async def export_kept_replies(
        self, after: tuple[str, str] | None, limit: int
    ) -> list[KeptReply]:
        """Up to ``limit`` replies kept under their Idempotency-Key, by (scope, key), after
        ``after``; ``keep_reply`` writes each back as it is."""
        ...

    async def export_ledger(self, after: int, limit: int) -> tuple[list[LedgerRow], int]:
        """Up to ``limit`` ledger rows in insertion order after position ``after`` (0: from
        the first), and the position to ask for the next page."""
        ...


# The kinds of data ``Store.counts`` counts.
COUNTED = (
    "sessions",
    "transitions",
    "ledger",
    "keys",
    "responses",
    "session_budgets",
    "kept_replies",
)
