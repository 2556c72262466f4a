"""The session's side of a turn: read it for the holder of its lock, refuse a turn the store
could not commit before it is sent, and commit the judged turn with its ledger rows, under
the cancellation rules (once started, a commit finishes; the lock is released only after).
The rows a commit did not take are written when the turn is over (``close_ledger``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from contextlib import AsyncExitStack

from ..cancelsafe import shielded, uncancellable
from ..config import Settings
from ..cost.ledgerwrites import LedgerWrites
from ..cost.meter import TurnMeter
from ..engine.verdict import Outcome
from ..errors import ProxyError
from ..sessions.locks import Hold, TurnLocks
from ..store import (
    KeptAlready,
    KeptReply,
    SessionCommit,
    SessionRecord,
    StepConflict,
    Store,
    StoredResponse,
    StoreError,
    TransitionRecord,
)
from .idempotency import Idempotency, hold_key
from .types import Turn, TurnMeta

log = logging.getLogger("skillstate")


class Committer:
    """Reads and commits a session for the turn (or the operator) holding its lock, and
    writes the ledger rows a commit did not take."""

    def __init__(
        self, settings: Settings, store: Store, ledger: LedgerWrites | None = None
    ) -> None:
        self.settings = settings
        self.store = store
        self.ledger = ledger if ledger is not None else LedgerWrites(store)

    async def load(self, session: str, hold: Hold) -> SessionRecord | None:
        """The session as last committed, for the holder of its lock: read again from the
        database when the store's copy is behind another replica's commit. A store that
        cannot answer (a PostgreSQL store down) is the client's 503 before anything is sent."""
        try:
            record = await self.store.load(session)
            if record is not None and not hold.current(record):
                record = await self.store.load(session, fresh=True)
        except StoreError as e:
            raise e.for_client("could not load the session; the turn was not sent") from e
        return record

    async def ensure_writable(self) -> None:
        """A store known unable to write refuses the turn before it is sent (and billed):
        its commit would fail."""
        try:
            await self.store.ensure_writable(self.settings.health_timeout)
        except StoreError as e:
            raise e.for_client("the store cannot write; the turn was not sent") from e

    def ensure_room(self) -> None:
        """A new session beyond ``max_sessions`` is refused before it spends tokens."""
        try:
            self.store.ensure_room_for_session()
        except StoreError as e:
            raise e.for_client("cannot start a new session") from e

    async def kept_reply(
        self, idem: Idempotency, locks: TurnLocks, stack: AsyncExitStack
    ) -> KeptReply | None:
        """The reply kept under the turn's Idempotency-Key, if any, read while holding the
        key's lock (on ``stack``, until the turn is done): see ``idempotency.hold_key``."""
        return await hold_key(idem, locks, self.store, stack, self.settings.lease_wait)

    def kept(
        self,
        meta: TurnMeta,
        status: int,
        headers: Mapping[str, str],
        body: bytes | None,
        *,
        step: int | None = None,
        stream: bool = False,
        verdict: str | None = None,
    ) -> KeptReply | None:
        """What the turn keeps under its Idempotency-Key (None without one, or when the key
        keeps only valid turns and ``verdict`` is another): its reply, the body dropped past
        ``idempotency_max_reply_bytes``."""
        idem = meta.turn.idempotency
        if idem is None or (idem.only_valid and verdict != "valid"):
            return None
        limit = self.settings.idempotency_max_reply_bytes
        session = meta.turn.session
        return idem.keep(session, status, headers, body, stream=stream, step=step, limit=limit)

    async def keep_uncommitted(
        self, meta: TurnMeta, kept: KeptReply | None, response: StoredResponse | None = None
    ) -> None:
        """Keep the reply of a turn that commits no transition, with its ledger rows, in one
        transaction. Failing that, the client still gets the reply (it was answered and
        billed) and the rows are written the usual way (the turn's meter); a retry would
        run again. Its stored response (a Responses turn with ``store``) is written first,
        on its own (there is no commit to write it with): a failure leaves the answer as it
        is, and only a later ``previous_response_id`` misses it."""
        if response is not None and meta.turn.stored is not None:
            with contextlib.suppress(StoreError):
                await self.store.put_response(response)
                meta.turn.stored.done = True
        idem = meta.turn.idempotency
        if kept is None or idem is None:
            return
        await _unused_holds_dropped(meta.turn)
        idem.test_hook("before-commit")
        try:
            await self.store.keep_reply(kept, meta.meter.unwritten())
        except StoreError as e:
            how = "kept by another turn" if isinstance(e, KeptAlready) else f"not kept ({e})"
            log.warning("Idempotency-Key reply of session %s %s", kept.session, how)
            return
        meta.meter.mark_written()
        idem.test_hook("after-commit")

    async def commit(
        self,
        meta: TurnMeta,
        outcome: Outcome,
        kept: KeptReply | None,
        response: StoredResponse | None = None,
        *,
        alone: bool = False,
    ) -> int:
        """Commit the judged turn with its ledger rows, its kept reply (a turn sent with an
        Idempotency-Key) and its stored response (a Responses turn with ``store``), see
        ``commit_transition``; ``alone``: no other turn is in flight."""
        new_state, state_json = outcome.state, outcome.state_json
        if new_state is None and (meta.is_new or meta.folded):
            # create the session with its initial state; or keep what the folds made of it
            new_state, state_json = meta.state, None
        transition = TransitionRecord(
            step=meta.step + 1,
            status=outcome.status,
            patch=outcome.patch,
            action=outcome.action,
            errors=outcome.errors,
            ts=time.time(),
            context=str(meta.shape),
            estimate=meta.figures(outcome.status),
        )
        rows = meta.meter.unwritten()
        tel = meta.turn.telemetry
        idem = meta.turn.idempotency
        await _unused_holds_dropped(meta.turn)
        if idem is not None:
            idem.test_hook("before-commit")
        with tel.span("commit state"):
            c = SessionCommit(
                meta.turn.session,
                meta.step,
                new_state,
                meta.schema,
                transition,
                transition.ts,
                rows,
                kept,
                response,
                state_json,
            )
            step = await self.commit_transition(c, meta.hold, alone=alone)
        if response is not None and meta.turn.stored is not None:
            meta.turn.stored.done = True
        if idem is not None:
            idem.test_hook("after-commit")
        tel.transition(outcome.status, outcome.patch, outcome.action)
        meta.meter.mark_written()
        return step

    async def commit_transition(
        self, c: SessionCommit, hold: Hold | None = None, *, alone: bool = False
    ) -> int:
        """Commit one transition of a session whose lock (``hold``) the caller holds.

        ``alone`` (no other turn in flight, so no batch of commits to join): the store may
        commit it at once, on this thread, when it can without waiting
        (``Store.commit_at_once``); nothing can cancel that midway.

        The store's commit and its cache update are one unit that cancellation cannot split:
        a client that goes away while it runs does not release the session (the caller's
        lock stays held until it is done), so the next turn never sees the cache behind the
        database. Once started, the commit finishes; the cancellation is re-raised after.
        A step conflict (another writer of the same database) is a 409, never a 500; so is
        a lock lost meanwhile (a Redis lease not renewed in time), found out before the
        commit. Either way the turn's ledger rows stay unwritten here, and the caller's
        meter writes them: the upstream call was made and billed.
        """
        if hold is not None:
            hold.check()
        if alone:
            try:
                step = self.store.commit_at_once(c)
            except StoreError as e:
                if hold is not None:
                    hold.unsure()
                raise _not_committed(e) from e
            if step is not None:
                if hold is not None:
                    hold.committed(step)
                return step
        work = asyncio.ensure_future(self.store.commit(c))
        try:
            return await uncancellable(work)
        except StoreError as e:
            raise _not_committed(e) from e
        finally:
            if hold is not None:  # also when cancelled after the commit finished
                ok = work.done() and not work.cancelled() and work.exception() is None
                if ok:
                    hold.committed(work.result())
                else:
                    hold.unsure()

    async def write_ahead(self, turn: Turn, meter: TurnMeter) -> None:
        """Write the rows of the turn's calls so far before it waits on another (a re-ask):
        the upstream billed them, and a process killed meanwhile would lose them with the
        turn. Once written, their budget holds end (the ledger has their real cost; the
        next call reserves its own). A write that fails leaves them to the commit or
        ``close_ledger``; a cancellation waits for the write, so no row is written twice."""
        rows = meter.unwritten()
        if not rows:
            return
        await _unused_holds_dropped(turn)
        work = asyncio.ensure_future(self.store.add_ledger_rows(rows))
        try:
            await uncancellable(work)
        except StoreError:
            return
        finally:
            if work.done() and not work.cancelled() and work.exception() is None:
                meter.mark_written()
        if turn.budgets is not None:
            await turn.budgets.release()

    async def close_ledger(self, turn: Turn, meter: TurnMeter) -> None:
        """Write whatever the commit did not take (failures, passthrough, errors): off the
        critical path, with other turns' rows (``LedgerWrites``), not cancelled with the
        turn. A turn holding budget reservations writes them before its reply goes out and
        then ends its holds: the next call reads the real cost."""
        if turn.budgets is not None and turn.budgets.holding:
            await shielded(_written_then_released(self.store, meter, turn))
        else:
            rows = meter.unwritten()
            meter.mark_written()
            self.ledger.add(rows)

    async def settle(self) -> None:
        """Wait for the ledger rows handed over off the critical path to be written."""
        await self.ledger.settle()


def _not_committed(e: StoreError) -> ProxyError:
    """A failed commit as the client's error: a step conflict is a 409, never a 500."""
    if isinstance(e, StepConflict):
        return ProxyError("conflict", f"the turn was not committed: {e}; retry it")
    return e.for_client("could not commit the turn")


async def _unused_holds_dropped(turn: Turn) -> None:
    """Before a write of the turn's rows, the pending rows of its holds no call used go
    (``TurnBudgets.drop_unused``): a kill after the rows' write charges none of them."""
    if turn.budgets is not None:
        await turn.budgets.drop_unused()


async def _written_then_released(store: Store, meter: TurnMeter, turn: Turn) -> None:
    """The turn's rows written, then the budget holds they replace released; with the store
    down, both wait for a later write (``TurnBudgets.release_once_written``)."""
    budgets = turn.budgets
    assert budgets is not None
    rows = meter.unwritten()
    meter.mark_written()
    await budgets.drop_unused()  # first: see _unused_holds_dropped
    try:
        if rows:
            await store.add_ledger_rows(rows)
    except StoreError:
        budgets.release_once_written(rows)
        return
    except BaseException:
        await budgets.release()  # a bug: the holds end all the same
        raise
    if turn.idempotency is not None:
        turn.idempotency.test_hook("after-ledger")
    await budgets.release()
