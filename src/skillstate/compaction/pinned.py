"""The state a session had at a step (a compaction token pins one): the state as committed
then, rebuilt from the session's transitions when the session has moved on.

The transitions hold the patch each commit merged (RFC 7386); replaying the valid and the
operator's ones over ``initial_state`` gives the state at any step. The replay is checked
against the state the store holds now: a session whose history does not rebuild its state
(its ``initial_state`` changed since, say) is reported, never answered with a wrong state.
States already rebuilt are kept (a client sends the same compaction item on every turn
after it), per process, bounded.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ..engine.patch import merge_patch
from ..store import SessionRecord, Store

JSON = dict[str, Any]
_APPLIED = ("valid", "operator")  # transitions whose patch changed the state
_PAGE = 500


class Unrebuildable(Exception):
    """The session's history does not rebuild the state it holds."""


class PinnedStates:
    """States at pinned steps, from the store (a bounded cache per process)."""

    def __init__(self, store: Store, initial_state: JSON, size: int = 1024) -> None:
        self.store = store
        self.initial_state = initial_state
        self.size = size
        self._cache: OrderedDict[tuple[str, int], JSON] = OrderedDict()

    async def at(self, record: SessionRecord, step: int) -> JSON:
        """The state of ``record``'s session right after ``step`` (0 < step <= its step)."""
        if step == record.step:
            return record.state
        key = (record.session, step)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        state = await self._rebuild(record, step)
        self._cache[key] = state
        if len(self._cache) > self.size:
            self._cache.popitem(last=False)
        return state

    async def _rebuild(self, record: SessionRecord, step: int) -> JSON:
        state: Any = self.initial_state
        pinned: Any = None
        after = 0
        while page := await self.store.history_page(record.session, _PAGE, after):
            for tr in page:
                if tr.status in _APPLIED and isinstance(tr.patch, dict):
                    state = merge_patch(state, tr.patch)
                if tr.step == step:
                    pinned = state
            after = page[-1].step
            if after >= record.step:
                break
        if pinned is None or state != record.state:
            raise Unrebuildable(
                f"the history of session {record.session} does not rebuild its state"
            )
        return dict(pinned)
