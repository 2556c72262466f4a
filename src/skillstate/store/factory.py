"""Which store a configuration means, by its ``store`` URL: unset, the default backend's file
in the data dir (SQLite's ``skillstate.db``); otherwise the backend store/schemes.py names
for the URL's scheme, made by its folder (``sqlite:///path``, ``postgresql://…``), which is
imported only then."""

from __future__ import annotations

import importlib
from typing import Protocol, cast

from ..config import Settings
from .base import Store, StoreError
from .schemes import DEFAULT, backend_for, url_problem


class BackendModule(Protocol):
    """What a backend's folder (its ``__init__``) provides."""

    def make_store(self, settings: Settings, *, exclusive: bool) -> Store:
        """The unopened store ``settings.store`` names (None: the default backend's file in
        the data dir). ``exclusive``: a serving proxy's store (a backend that allows one
        process per database takes its lock)."""
        ...

    def describe(self, settings: Settings) -> str:
        """What the start-up line and errors name for the store (never a password)."""
        ...


def _backend(settings: Settings) -> BackendModule:
    if settings.store is None:
        backend = DEFAULT
    else:
        found = backend_for(settings.store)
        if found is None:  # Settings validated it: only a Settings built without validation
            raise StoreError(url_problem(settings.store) or "no store backend for this URL")
        backend = found
    return cast(BackendModule, importlib.import_module(backend.package))


def describe_store(settings: Settings) -> str:
    """What the start-up line and errors name: the file, or the redacted URL."""
    return _backend(settings).describe(settings)


def make_store(settings: Settings, *, exclusive: bool = False) -> Store:
    """The (unopened) store the settings mean. ``exclusive``: a serving proxy's store,
    holding the database's lock where its backend allows one process (SQLite's data dir
    lock); a shared backend (PostgreSQL) ignores it."""
    return _backend(settings).make_store(settings, exclusive=exclusive)
