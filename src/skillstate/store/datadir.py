"""The data directory on disk, treated as hostile: a private directory that nobody else can
write into, regular files that are never symbolic links, and one proxy at a time.

Every refusal is a :class:`StoreError` whose message is one line naming the path."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import stat
from pathlib import Path
from urllib.parse import quote

from .base import StoreError

# Files SQLite and we keep next to the database; a link in their place would make us write
# (or chmod) whatever it points at.
_COMPANIONS = ("-wal", "-shm", "-journal", ".lock")


def check_dir(directory: Path) -> None:
    """Refuse a data directory that another user could write into (plant a link, swap the
    database): group- or world-writable, or owned by someone else."""
    try:
        st = os.stat(directory)
    except OSError as e:
        raise StoreError(f"cannot use {directory}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise StoreError(f"{directory} is not a directory")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StoreError(
            f"{directory} is writable by other users (mode {stat.S_IMODE(st.st_mode):o});"
            f" run `chmod go-w {directory}` or choose another data_dir"
        )
    if st.st_uid != os.getuid():
        raise StoreError(f"{directory} belongs to another user (uid {st.st_uid})")


def open_private(path: Path, flags: int = os.O_RDWR) -> int:
    """Open (creating with mode 0600) a regular file that is not a symbolic link, and make
    it private. Returns the descriptor."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if os.path.islink(path):
            raise StoreError(f"{path} is a symbolic link; refusing to follow it") from None
        raise StoreError(f"cannot open {path}: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise StoreError(f"{path} is not a regular file")
    if stat.S_IMODE(st.st_mode) != 0o600:
        os.fchmod(fd, 0o600)  # the descriptor's file, never a link's target
    return fd


def prepare_path(path: Path) -> None:
    """A private directory (0700 when we create it; refused when others can write into it)
    and a private database file (0600). SQLite's WAL and SHM files inherit the database
    file's mode; none of them may be a symbolic link."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        raise StoreError(f"cannot create {path.parent}: {e.strerror}") from None
    check_dir(path.parent)
    for suffix in _COMPANIONS:
        companion = Path(f"{path}{suffix}")
        if companion.is_symlink():
            raise StoreError(f"{companion} is a symbolic link; refusing to follow it")
    _refuse_other_files(path)
    os.close(open_private(path))


SQLITE_HEADER = b"SQLite format 3\x00"


def _refuse_other_files(path: Path) -> None:
    """Refuse (sqlite3.DatabaseError) an existing, non-empty file that is not a SQLite
    database BEFORE anything touches it: making it private (0600) or placing a lock file
    next to it would change a file that was never ours (a mistyped --data-dir or store URL
    naming /etc/passwd)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return
    except OSError as e:
        if os.path.islink(path):
            raise StoreError(f"{path} is a symbolic link; refusing to follow it") from None
        raise StoreError(f"cannot open {path}: {e.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StoreError(f"{path} is not a regular file")
        head = os.pread(fd, len(SQLITE_HEADER), 0)
    finally:
        os.close(fd)
    if head and head != SQLITE_HEADER:
        # SQLite's own error for such a file, raised before SQLite (or we) touched it: every
        # caller already reports it in one line.
        raise sqlite3.DatabaseError("file is not a database")
    foreign = sorted(foreign_tables(path))
    if foreign:
        # Another application's database (a mistyped --data-dir, store URL or `store copy
        # --from`): migrating would add our tables to it, WAL mode and a lock file beside it.
        shown = ", ".join(foreign[:5]) + (", …" if len(foreign) > 5 else "")
        raise StoreError(
            f"{path} is not a skillstate store (it holds other tables: {shown});"
            " name a skillstate store, or a new or empty file"
        )


# Every table a skillstate SQLite store has had (store/sqlite/migrations.py; a test checks
# a new store has no other). A database with tables but no schema_version is a store from
# before versioning only when these are all it holds.
STORE_TABLES = frozenset(
    {
        "sessions", "transitions", "ledger", "api_keys", "responses", "schema_version",
        "session_budgets", "idempotency_keys",
    }
)  # fmt: skip


def sqlite_tables(path: Path) -> set[str] | None:
    """The tables of the SQLite file at ``path`` (SQLite's own ``sqlite_*`` left out), read
    without changing the file or making any beside it (an immutable read: the WAL is not
    read); None when it cannot be read so (missing, or SQLite refuses it)."""
    uri = f"file:{quote(str(path.absolute()))}?mode=ro&immutable=1"
    try:
        db = sqlite3.connect(uri, uri=True)
    except sqlite3.Error:
        return None
    try:
        rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    except sqlite3.Error:
        return None
    finally:
        db.close()
    return {r[0] for r in rows if not str(r[0]).startswith("sqlite_")}


def foreign_tables(path: Path) -> set[str]:
    """The tables that make ``path`` another application's database (empty: it is a
    skillstate store, an older one, or a new or empty database)."""
    tables = sqlite_tables(path) or set()
    if "schema_version" in tables:
        return set()
    return tables - STORE_TABLES


# Data-dir locks this process holds: lock file -> [descriptor, holds]. Re-entrant, so the
# CLI's pre-flight check can keep its hold until exit while the store takes its own.
_held: dict[str, list[int]] = {}


def _lock_name(path: Path) -> str:
    # The directory resolved (it may legitimately be a link), the file itself never.
    return os.path.join(os.path.realpath(path.parent), f"{path.name}.lock")


def lock_data_dir(path: Path) -> None:
    """Take an exclusive lock on ``<db>.lock`` (released by :func:`unlock_data_dir` or when
    the process dies). The proxy's session cache assumes it is the only writer, so a second
    proxy on the same data dir must not start; readers (``skillstate cost``) need no lock.
    """
    name = _lock_name(path)
    if name in _held:
        _held[name][1] += 1
        return
    fd = open_private(Path(name))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise StoreError(
            f"{path.parent} is in use by another skillstate proxy (pid {holder});"
            " give each proxy its own data_dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _held[name] = [fd, 1]


def unlock_data_dir(path: Path) -> None:
    name = _lock_name(path)
    hold = _held.get(name)
    if hold is None:
        return
    hold[1] -= 1
    if hold[1] == 0:
        del _held[name]
        os.close(hold[0])
