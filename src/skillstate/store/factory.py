"""Which store a configuration means, by its ``store`` URL: unset, today's SQLite file in
the data dir; ``sqlite:///path``, that file; ``postgresql://…`` (or ``postgres://``), the
shared PostgreSQL store (asyncpg, in the ``scale`` extra, imported only then)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

from ..config import Settings
from ..urltext import redacted
from .base import Store, StoreError
from .sqlite import SQLiteStore


def sqlite_path(settings: Settings) -> Path | None:
    """The SQLite file the settings mean, None for PostgreSQL."""
    if settings.store is None:
        return settings.db_path
    parts = urlsplit(settings.store)
    if parts.scheme != "sqlite":
        return None
    return Path(unquote(parts.path)).expanduser()


def store_url(settings: Settings) -> str:
    """The store as a URL (a SQLite one for the data dir's default file)."""
    path = sqlite_path(settings)
    return f"sqlite://{path}" if path is not None else str(settings.store)


def describe_store(settings: Settings) -> str:
    """What the start-up line and errors name: the SQLite file, or the redacted URL."""
    path = sqlite_path(settings)
    return str(path) if path is not None else redacted(str(settings.store))


def make_store(settings: Settings, *, exclusive: bool = False) -> Store:
    """The (unopened) store the settings mean. ``exclusive``: a serving proxy's SQLite
    store, holding the data dir's lock (one proxy per SQLite file); PostgreSQL is shared."""
    path = sqlite_path(settings)
    if path is not None:
        return SQLiteStore(
            path,
            exclusive=exclusive,
            cache_bytes=settings.session_cache_bytes,
            max_sessions=settings.max_sessions,
            busy_timeout=settings.store_busy_timeout,
        )
    try:
        from .postgres import PostgresStore
    except ImportError:
        raise StoreError(
            "a postgresql:// store needs asyncpg: pip install 'skillstate-proxy[scale]'"
        ) from None
    return PostgresStore(
        str(settings.store),
        pool_size=settings.store_pool_size,
        timeout=settings.store_timeout,
        max_sessions=settings.max_sessions,
        # A cached copy is verified by the turn's lease (Redis): without coordination
        # nothing could tell it is behind another replica's commit, so none is kept.
        cache_bytes=settings.session_cache_bytes if settings.coordination else 0,
    )
