"""`skillstate migrate [--store URL]`: bring the store's schema to this release's version,
one line per migration applied (store/migrations.py says what each backend does at start-up
instead). Every failure is one line (ConfigError)."""

from __future__ import annotations

import argparse
from typing import Any

from ..config import ConfigError, Settings
from ..store import StoreError
from ..store.factory import make_store
from ..store.schemes import URL_FORMS


def add_migrate_parser(sub: Any) -> None:
    migrate = sub.add_parser("migrate", help="upgrade the store's schema to this release's")
    migrate.add_argument(
        "--store", metavar="URL", default=argparse.SUPPRESS,
        help=f"{URL_FORMS} (default: the configured store)",
    )  # fmt: skip
    migrate.add_argument("--data-dir", metavar="DIR", default=argparse.SUPPRESS)
    migrate.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS)


def run_migrate(settings: Settings) -> int:
    """Migrate the configured store (``--store`` is part of the settings)."""
    try:
        store = make_store(settings)  # for PostgreSQL: asyncpg installed, else what to install
    except StoreError as e:
        raise ConfigError(f"store: {e}") from None
    for line in store.migrate():
        print(line)
    return 0
