"""Per-session objects of one process, bounded: made on a session's first use, the least
recently used dropped beyond ``max_sessions`` (each user decides what a dropped session's
next turn starts from)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SessionLRU(Generic[T]):
    def __init__(self, make: Callable[[], T], max_sessions: int) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be positive, not {max_sessions!r}")
        self._make = make
        self._max = max_sessions
        self._items: OrderedDict[str, T] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, session: str) -> T:
        """The session's object, made on first use; the session becomes the most recent."""
        item = self._items.pop(session, None)
        if item is None:
            item = self._make()
            while len(self._items) >= self._max:
                self._items.popitem(last=False)
        self._items[session] = item
        return item

    def peek(self, session: str) -> T | None:
        """The session's object if it has one, without making it or touching its recency."""
        return self._items.get(session)
