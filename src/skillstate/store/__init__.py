"""Persistence behind one narrow interface, so backends (SQLite now, Redis later) are
interchangeable without touching the pipeline."""

from .base import (
    SessionRecord,
    StepConflict,
    Store,
    StoredResponse,
    StoreError,
    StoreFull,
    StoreUnavailable,
    TransitionRecord,
)

__all__ = [
    "SessionRecord",
    "StepConflict",
    "Store",
    "StoreError",
    "StoreFull",
    "StoreUnavailable",
    "StoredResponse",
    "TransitionRecord",
]
