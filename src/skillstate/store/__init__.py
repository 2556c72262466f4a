"""Persistence behind one narrow interface, so backends are interchangeable without
touching the pipeline: SQLite (store/sqlite.py, the default) and PostgreSQL
(store/postgres.py, shared by replicas), chosen by the ``store`` URL (store/factory.py),
with versioned schemas (store/migrations.py)."""

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
