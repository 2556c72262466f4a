"""Persistence behind one narrow interface, so backends are interchangeable without
touching the pipeline: SQLite (store/sqlite.py, the default) and PostgreSQL
(store/postgres.py, shared by replicas), chosen by the ``store`` URL (store/factory.py),
with versioned schemas (store/migrations.py). The records they keep are plain data in
store/records.py."""

from .base import KeptAlready, StepConflict, Store, StoreError, StoreFull, StoreUnavailable
from .records import (
    KeptReply,
    LedgerRow,
    LedgerSums,
    SessionRecord,
    StoredResponse,
    TransitionRecord,
)

__all__ = [
    "KeptAlready",
    "KeptReply",
    "LedgerRow",
    "LedgerSums",
    "SessionRecord",
    "StepConflict",
    "Store",
    "StoreError",
    "StoreFull",
    "StoreUnavailable",
    "StoredResponse",
    "TransitionRecord",
]
