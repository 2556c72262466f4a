"""The state a compaction token pins, rebuilt from the session's transitions (a small
in-memory history stands in for the store: only ``history_page`` is read)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from skillstate.compaction.pinned import PinnedStates, Unrebuildable
from skillstate.store import SessionRecord, TransitionRecord


class History:
    def __init__(self, transitions: list[TransitionRecord]) -> None:
        self.transitions = transitions
        self.reads = 0

    async def history_page(self, session: str, limit: int, after_step: int = 0) -> list[Any]:
        self.reads += 1
        return [t for t in self.transitions if t.step > after_step][:limit]


def tr(step: int, status: str, patch: Any) -> TransitionRecord:
    return TransitionRecord(step, status, patch, "act", [], float(step))


STEPS = [
    tr(1, "valid", {"facts": ["a"], "todo": "x"}),
    tr(2, "invalid", {"facts": ["wrong"]}),  # rejected: never merged
    tr(3, "operator", {"todo": None}),
    tr(4, "tool-noop", None),
    tr(5, "valid", {"facts": ["a", "b"]}),
]
NOW = {"facts": ["a", "b"], "n": 1}


def record(state: dict[str, Any]) -> SessionRecord:
    return SessionRecord("s", state, [], 5, 0.0, 0.0)


def test_each_step_rebuilds_and_is_kept() -> None:
    store = History(STEPS)
    pinned = PinnedStates(store, {"n": 1})  # type: ignore[arg-type]
    at = [asyncio.run(pinned.at(record(NOW), k)) for k in (1, 2, 3, 4, 5)]
    assert at[0] == {"n": 1, "facts": ["a"], "todo": "x"}
    assert at[1] == at[0] and at[2] == at[3] == {"n": 1, "facts": ["a"]}
    assert at[4] == NOW  # the current step: the record itself, no read
    reads = store.reads
    assert asyncio.run(pinned.at(record(NOW), 1)) == at[0] and store.reads == reads


def test_a_history_that_does_not_rebuild_the_state_is_refused() -> None:
    pinned = PinnedStates(History(STEPS), {"n": 2})  # type: ignore[arg-type]  # config changed
    with pytest.raises(Unrebuildable):
        asyncio.run(pinned.at(record(NOW), 1))
