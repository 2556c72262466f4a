"""The embedded store backend: stdlib sqlite3 in WAL mode on its own thread (store.py), its
schema versions (migrations.py) and that thread (thread.py). Its preflight and migrate are
``SQLiteStore.preflight`` / ``migrate``. One process per database file (the data dir lock);
the default when no ``store`` URL is set (the data dir's ``skillstate.db``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from .store import SQLiteStore

if TYPE_CHECKING:
    from ...config import Settings

__all__ = ["SQLiteStore", "describe", "make_store"]


def _file(settings: Settings) -> Path:
    if settings.store is None:
        return settings.db_path
    return Path(unquote(urlsplit(settings.store).path)).expanduser()


def make_store(settings: Settings, *, exclusive: bool) -> SQLiteStore:
    """The SQLite file the settings name; ``exclusive`` takes the data dir's lock."""
    return SQLiteStore(
        _file(settings),
        exclusive=exclusive,
        cache_bytes=settings.session_cache_bytes,
        max_sessions=settings.max_sessions,
        busy_timeout=settings.store_busy_timeout,
        synchronous=settings.store_synchronous.upper(),
    )


def describe(settings: Settings) -> str:
    return str(_file(settings))
