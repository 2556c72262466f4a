"""The shared store backend: PostgreSQL through an asyncpg pool, for replicas behind a load
balancer (store.py), and its schema versions (migrations.py). Its preflight and migrate are
``PostgresStore.preflight`` / ``migrate``. asyncpg is the ``scale`` extra: this module
imports it only when a store is made."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...urltext import redacted
from ..base import Store, StoreError

if TYPE_CHECKING:
    from ...config import Settings

__all__ = ["describe", "make_store"]


def make_store(settings: Settings, *, exclusive: bool) -> Store:
    """The PostgreSQL store ``settings.store`` names (``exclusive`` means nothing: it is
    shared)."""
    try:
        from .store import PostgresStore
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


def describe(settings: Settings) -> str:
    return redacted(str(settings.store))
