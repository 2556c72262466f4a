"""Versioned schemas, what every store backend shares: a migration step, the errors for a
schema this code cannot use, and the log line of a step applied. Each backend's steps and
how it applies them are in its folder (store/sqlite/migrations.py,
store/postgres/migrations.py).

Each backend has an ordered list of migrations; a ``schema_version`` table holds one row
per migration applied (version, when, what). What happens at start-up:
- a schema NEWER than this code knows is refused in one line (:class:`SchemaTooNew`);
- SQLite (one process per database) upgrades an older schema when it opens it;
- PostgreSQL creates the schema in an empty database (replicas starting together take an
  advisory lock, so exactly one of them runs it), but refuses a non-empty database at an
  older version (:class:`SchemaTooOld`): replicas of the previous release may still be
  running against it, so an upgrade is the operator's step, ``skillstate migrate``, before
  the rollout; each migration runs in its own transaction, all under that advisory lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .base import StoreError


class SchemaTooNew(StoreError):
    """The database was migrated by a newer skillstate-proxy than this one."""


class SchemaTooOld(StoreError):
    """The database needs ``skillstate migrate`` before this code can use it."""


@dataclass(frozen=True, slots=True)
class Migration:
    """One step: DDL statements run in one transaction, then an optional ``fixup`` (given
    the backend's connection) that adapts what an older release left (returns what it did,
    for the log line)."""

    version: int
    description: str
    statements: tuple[str, ...]
    fixup: Callable[[Any], str | None] | None = field(default=None)


def ddl_statements(script: str) -> tuple[str, ...]:
    """A DDL script's statements (our DDL has no ';' inside a statement)."""
    return tuple(s.strip() for s in script.split(";") if s.strip())


def refuse_newer(version: int, latest: int, where: str) -> None:
    """SchemaTooNew for a database at a version past this code's ``latest``."""
    if version > latest:
        raise SchemaTooNew(
            f"{where} has schema version {version}, newer than this skillstate-proxy knows"
            f" ({latest}); run the release that migrated it, or a newer one"
        )


def applied_line(where: str, before: int, m: Migration, legacy: bool, done: str | None) -> str:
    """The line ``skillstate migrate`` and the start-up log print for one step applied."""
    what = m.description
    if legacy:
        what = f"adopted the tables made before schema_version ({what})"
    if done:
        what += f"; {done}"
    return f"{where}: schema {before} -> {m.version}: {what}"
