"""`skillstate migrate [--store URL]`: bring the store's schema to this release's version,
one line per migration applied (store/migrations.py says what each backend does at start-up
instead). Every failure is one line (ConfigError)."""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
from pathlib import Path
from typing import Any

from ..config import ConfigError, Settings
from ..store import StoreError
from ..store.datadir import prepare_path
from ..store.factory import describe_store, make_store, sqlite_path, store_url
from ..store.migrations import (
    POSTGRES_MIGRATIONS,
    SQLITE_MIGRATIONS,
    migrate_postgres,
    migrate_sqlite,
)


def add_migrate_parser(sub: Any) -> None:
    migrate = sub.add_parser("migrate", help="upgrade the store's schema to this release's")
    migrate.add_argument(
        "--store", metavar="URL", default=argparse.SUPPRESS,
        help="sqlite:///path or postgresql://… (default: the configured store)",
    )  # fmt: skip
    migrate.add_argument("--data-dir", metavar="DIR", default=argparse.SUPPRESS)
    migrate.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS)


def run_migrate(settings: Settings) -> int:
    """Migrate the configured store (``--store`` is part of the settings)."""
    where = store_url(settings)
    path = sqlite_path(settings)
    try:
        if path is not None:
            lines = _migrate_sqlite(path, where, settings.store_busy_timeout)
        else:
            lines = asyncio.run(_migrate_postgres(settings))
    except StoreError as e:
        raise ConfigError(f"store: {e}") from None
    except sqlite3.Error as e:
        raise ConfigError(f"store: {path} is not a usable SQLite database ({e})") from None
    for line in lines:
        print(line)
    if not lines:
        latest = (SQLITE_MIGRATIONS if path is not None else POSTGRES_MIGRATIONS)[-1].version
        print(f"{describe_store(settings)}: at schema {latest}, this release's: nothing to do")
    return 0


def _migrate_sqlite(path: Path, where: str, busy_timeout: float) -> list[str]:
    from ..store.sqlite import connect

    prepare_path(path)
    db = connect(path, busy_timeout=busy_timeout, migrate=False)
    try:
        return migrate_sqlite(db, where)
    finally:
        db.close()


async def _migrate_postgres(settings: Settings) -> list[str]:
    from ..store.postgres import PostgresStore

    make_store(settings)  # asyncpg installed (else one line saying what to install)
    # No bound on a statement: a migration's DDL on a big table may take long.
    store = PostgresStore(
        str(settings.store), pool_size=1, timeout=settings.store_timeout, unbounded_statements=True
    )
    await store.open_pool()
    try:
        async with store.connection() as conn:
            return await migrate_postgres(conn, store.where, upgrade=True)
    finally:
        await store.close()
