"""SessionLRU: made on first use, the least recently used dropped past the bound, and
``peek`` neither makes nor refreshes."""

from __future__ import annotations

import pytest

from skillstate.sessions.lru import SessionLRU


def test_get_makes_once_and_drops_the_least_recently_used() -> None:
    made: list[int] = []

    def make() -> list[int]:
        made.append(1)
        return []

    lru: SessionLRU[list[int]] = SessionLRU(make, 2)
    a = lru.get("a")
    assert lru.get("a") is a and len(made) == 1
    lru.get("b")
    lru.get("a")  # a is now the most recent: b goes first
    lru.get("c")
    assert len(lru) == 2
    assert lru.peek("b") is None
    assert lru.peek("a") is a


def test_peek_neither_makes_nor_refreshes() -> None:
    lru: SessionLRU[object] = SessionLRU(object, 2)
    assert lru.peek("x") is None and len(lru) == 0
    x = lru.get("x")
    lru.get("y")
    assert lru.peek("x") is x  # not refreshed: x is still the oldest
    lru.get("z")
    assert lru.peek("x") is None
    assert lru.peek("y") is not None


@pytest.mark.parametrize("bound", [0, -1])
def test_a_bound_below_one_is_refused(bound: int) -> None:
    with pytest.raises(ValueError, match="max_sessions must be positive"):
        SessionLRU(object, bound)
