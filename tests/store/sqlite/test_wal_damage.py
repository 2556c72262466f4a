"""``wal_damage``: a WAL as SQLite writes it, copied while its writer is open (as a kill -9
leaves it), then damaged. What a crash can leave (a torn last transaction) is not damage;
what drops earlier commits is."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from skillstate.store.sqlite.wal import wal_damage

COMMITS = 5


@pytest.fixture
def crashed(tmp_path: Path) -> Iterator[Path]:
    """A database whose last COMMITS transactions are only in its WAL."""
    live = tmp_path / "live"
    live.mkdir()
    db = sqlite3.connect(live / "s.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA wal_autocheckpoint=0")
    db.execute("CREATE TABLE t (v BLOB)")
    for i in range(COMMITS):
        db.execute("INSERT INTO t VALUES (?)", (bytes([i]) * 3000,))
    out = tmp_path / "crashed"
    shutil.copytree(live, out)  # the writer still open: the WAL as a kill -9 leaves it
    db.close()
    yield out / "s.db"


def frames(db: Path) -> tuple[bytearray, int]:
    raw = bytearray(Path(f"{db}-wal").read_bytes())
    return raw, int.from_bytes(raw[8:12], "big")


def rows(db: Path) -> int:
    """The rows SQLite reads (0 when it dropped even the table's creation)."""
    with sqlite3.connect(db) as c:
        try:
            return int(c.execute("SELECT count(*) FROM t").fetchone()[0])
        except sqlite3.OperationalError:
            return 0


def test_a_wal_left_by_a_crash_is_no_damage(crashed: Path) -> None:
    assert wal_damage(crashed) is None
    assert rows(crashed) == COMMITS


def test_a_torn_last_frame_is_what_a_crash_leaves(crashed: Path) -> None:
    raw, page = frames(crashed)
    raw[-page // 2] ^= 0xFF  # the last frame's page, written in part
    Path(f"{crashed}-wal").write_bytes(bytes(raw))
    assert wal_damage(crashed) is None
    raw, page = frames(crashed)
    Path(f"{crashed}-wal").write_bytes(bytes(raw[: -page // 2]))  # cut inside the frame
    assert wal_damage(crashed) is None


def test_a_damaged_frame_before_later_commits_is_damage(crashed: Path) -> None:
    raw, _ = frames(crashed)
    raw[32 + 24 + 100] ^= 0xFF  # the first frame's page
    Path(f"{crashed}-wal").write_bytes(bytes(raw))
    found = wal_damage(crashed)
    assert found is not None and "damaged at frame 1" in found, found
    assert "committed transaction(s) after it" in found
    assert rows(crashed) < COMMITS  # what SQLite would have done with it: dropped them


def test_a_damaged_header_is_damage(crashed: Path) -> None:
    raw, _ = frames(crashed)
    raw[16] ^= 0x01  # a salt: the header's checksum fails
    Path(f"{crashed}-wal").write_bytes(bytes(raw))
    assert "damaged header" in (wal_damage(crashed) or "")


def test_an_emptied_database_under_its_wal_is_damage(crashed: Path) -> None:
    crashed.write_bytes(b"")
    assert "no database header" in (wal_damage(crashed) or "")
    crashed.unlink()
    assert "no database header" in (wal_damage(crashed) or "")


def test_no_wal_or_a_short_one_is_no_damage(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    assert wal_damage(db) is None
    Path(f"{db}-wal").write_bytes(b"\x01" * 20)
    assert wal_damage(db) is None
