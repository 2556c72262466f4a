"""Persistence behind one narrow interface, so backends are interchangeable without
touching the pipeline. Each backend is a folder with its store, its schema versions and its
preflight/migrate: SQLite (store/sqlite/, the default) and PostgreSQL (store/postgres/,
shared by replicas), named by the ``store`` URL's scheme in store/schemes.py and made by
store/factory.py. What every backend shares: the protocol (base.py), the records
(records.py), their row forms (rows.py), the session cache (cache.py), the ledger's SQL
sums (ledgersql.py), the migration step (migrations.py) and ``store copy`` (copy.py)."""

from .base import KeptAlready, StepConflict, Store, StoreError, StoreFull, StoreUnavailable
from .records import (
    KeptReply,
    LedgerRow,
    LedgerSums,
    SessionCommit,
    SessionRecord,
    StoredResponse,
    TransitionRecord,
)

__all__ = [
    "KeptAlready",
    "KeptReply",
    "LedgerRow",
    "LedgerSums",
    "SessionCommit",
    "SessionRecord",
    "StepConflict",
    "Store",
    "StoreError",
    "StoreFull",
    "StoreUnavailable",
    "StoredResponse",
    "TransitionRecord",
]
