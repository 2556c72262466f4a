"""The store backends by URL scheme: the one list that config validation, the factory, the
CLI's help and the benchmarks consult. A backend is a folder of this package whose
``__init__`` has ``make_store(settings, *, exclusive)`` and ``describe(settings)`` (see
``store.factory.BackendModule``); adding one is that folder plus one line in
:data:`BACKENDS`. The folder is imported (by the factory) only when a URL names it, so a
backend whose driver is an optional extra (PostgreSQL: asyncpg) costs nothing to the
others."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True, slots=True)
class Backend:
    """One store backend: the URL schemes that name it (the first is its name), how its
    URL is written (help texts and errors), its folder, whether the URL must name a file,
    and whether replicas can share one database."""

    schemes: tuple[str, ...]
    form: str
    package: str
    file: bool = False
    shared: bool = False

    @property
    def name(self) -> str:
        return self.schemes[0]


BACKENDS = (
    Backend(("sqlite",), "sqlite:///path", "skillstate.store.sqlite", file=True),
    Backend(("postgresql", "postgres"), "postgresql://…", "skillstate.store.postgres", shared=True),
)
# An unset ``store``: the default backend's file in the data dir (Settings.db_path).
DEFAULT = BACKENDS[0]
# "sqlite:///path or postgresql://…", for help texts and errors.
URL_FORMS = " or ".join(b.form for b in BACKENDS)


def backend_for(url: str) -> Backend | None:
    """The backend a store URL names, None for a scheme no backend answers."""
    scheme = urlsplit(url).scheme
    return next((b for b in BACKENDS if scheme in b.schemes), None)


def url_problem(url: str) -> str | None:
    """Why the URL names no store, in one line that shows only its scheme (the URL may carry
    a password); None for a usable one."""
    backend = backend_for(url)
    if backend is None:
        scheme = urlsplit(url).scheme
        return f"must be {URL_FORMS}, not {scheme + ':' if scheme else 'a URL'}"
    if backend.file and not urlsplit(url).path.strip("/"):
        return f"{backend.name}:///path needs a file path, e.g. {backend.name}:///var/lib/ss/ss.db"
    return None


def shares_database(url: str | None) -> bool:
    """Whether replicas can run against the store the URL names (unset: the default)."""
    backend = DEFAULT if url is None else backend_for(url)
    return backend is not None and backend.shared
