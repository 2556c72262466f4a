"""The store backends' registry (skillstate.store.schemes): config validation, the factory
and the CLI find a backend only through it, so a backend added there (one folder, one line)
is configured, made and described like the built-in ones."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest
from pydantic import ValidationError

from skillstate.config import Settings
from skillstate.store import schemes
from skillstate.store.factory import describe_store, make_store
from skillstate.store.sqlite import SQLiteStore


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("sqlite:///var/lib/ss.db", None),
        ("postgresql://u:secret@db/ss", None),
        ("postgres://db/ss", None),
        ("sqlite:///", "sqlite:///path needs a file path, e.g. sqlite:///var/lib/ss/ss.db"),
        ("mysql://u:secret@db/ss", "must be sqlite:///path or postgresql://…, not mysql:"),
        ("nothing", "must be sqlite:///path or postgresql://…, not a URL"),
    ],
)
def test_url_problem_names_the_scheme_only(url: str, problem: str | None) -> None:
    assert schemes.url_problem(url) == problem
    if problem is not None:
        assert "secret" not in problem
        with pytest.raises(ValidationError, match=re.escape(problem)):
            Settings(store=url)


def test_backend_for_and_sharing() -> None:
    assert schemes.backend_for("postgres://db/x") is schemes.backend_for("postgresql://db/x")
    assert schemes.backend_for("sqlite:///x") is schemes.DEFAULT
    assert schemes.backend_for("mysql://db/x") is None
    assert schemes.shares_database("postgresql://db/x")
    assert not schemes.shares_database("sqlite:///x")
    assert not schemes.shares_database(None)  # the default: SQLite in the data dir


def test_the_default_is_the_data_dirs_sqlite_file(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    store = make_store(settings)
    assert isinstance(store, SQLiteStore)
    assert describe_store(settings) == str(tmp_path / "skillstate.db")
    explicit = Settings(store=f"sqlite://{tmp_path}/other.db")
    assert describe_store(explicit) == str(tmp_path / "other.db")


def test_a_third_backend_is_one_registry_line(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[str | None, bool]] = []
    folder = types.ModuleType("skillstate_test_backend")

    def make(settings: Settings, *, exclusive: bool) -> object:
        made.append((settings.store, exclusive))
        return "a store"

    folder.make_store = make  # type: ignore[attr-defined]
    folder.describe = lambda settings: "the third one"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "skillstate_test_backend", folder)
    third = schemes.Backend(("third",), "third://…", "skillstate_test_backend", shared=True)
    monkeypatch.setattr(schemes, "BACKENDS", (*schemes.BACKENDS, third))

    settings = Settings(store="third://host/db")  # config validation consults the registry
    assert make_store(settings, exclusive=True) == "a store"
    assert made == [("third://host/db", True)]
    assert describe_store(settings) == "the third one"
    assert schemes.shares_database("third://host/db")


def test_a_postgresql_url_asyncpg_cannot_read_is_refused_without_quoting_it() -> None:
    """A password holding an unencoded "/" ends the host at it: asyncpg reads what follows as
    the port when the pool first connects, and its ValueError quotes the password."""
    import asyncio

    from skillstate.store import StoreError

    settings = Settings(store="postgresql://u:pa/ss9secret@127.0.0.1:1/db")
    store = make_store(settings)

    async def open_it() -> StoreError:
        with pytest.raises(StoreError) as e:
            await store.open()
        return e.value

    err = asyncio.run(open_it())
    assert "not a usable PostgreSQL URL" in str(err)
    assert "ss9secret" not in str(err) and "pa/" not in str(err), str(err)
