"""Start-up with a hostile or broken data directory (issue 13 items 9 and 10): each problem is
one line on stderr and exit 2 before the proxy binds, never a traceback, and never a write
through a planted link."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import proxy_env

UNREACHABLE = "http://127.0.0.1:9"  # start-up never calls the upstream


def start_up(data: Path) -> subprocess.CompletedProcess[str]:
    """Run the proxy on `data`; it must refuse to start (a proxy that starts is a failure)."""
    argv = [sys.executable, "-m", "skillstate", "--port", "0", "--upstream", UNREACHABLE,
            "--data-dir", str(data)]  # fmt: skip
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=30, env=proxy_env(), cwd=data.parent
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the proxy started instead of refusing: {e.stdout!r}")


def refused(r: subprocess.CompletedProcess[str], needle: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "listening" not in r.stdout  # refused before binding
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("skillstate: data_dir: "), r.stderr
    assert needle in lines[0], lines[0]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir(mode=0o700)
    return d


def real_db(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE sessions (id TEXT PRIMARY KEY, state BLOB NOT NULL, schema TEXT NOT NULL,"
        " step INTEGER NOT NULL, created REAL NOT NULL, updated REAL NOT NULL)"
    )
    db.executemany(
        "INSERT INTO sessions VALUES (?, ?, '[]', 1, 0, 0)",
        [(f"s{i}", b"{}" + b" " * 3000) for i in range(50)],
    )
    db.commit()
    db.close()


def test_a_file_that_is_not_a_database_is_one_line_before_binding(data: Path) -> None:
    (data / "skillstate.db").write_bytes(b"this is not a database\n" * 400)
    refused(start_up(data), "is not a usable SQLite database")


def test_a_database_with_a_corrupt_table_is_one_line_before_binding(data: Path) -> None:
    db = data / "skillstate.db"
    real_db(db)
    raw = bytearray(db.read_bytes())
    page = 4096
    raw[page : 2 * page] = b"\xff" * page  # the sessions table's root page
    db.write_bytes(bytes(raw))
    refused(start_up(data), "is not a usable SQLite database")


def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(
    data: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (data / "skillstate.db.lock").symlink_to(victim)
    refused(start_up(data), "skillstate.db.lock is a symbolic link")
    assert victim.read_text() == "precious\n"


def test_a_symlinked_database_is_refused_and_its_target_keeps_its_mode(
    data: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.db"
    victim.write_text("")
    victim.chmod(0o644)
    (data / "skillstate.db").symlink_to(victim)
    refused(start_up(data), "skillstate.db is a symbolic link")
    assert oct(victim.stat().st_mode & 0o777) == "0o644"


def test_a_symlinked_wal_file_is_refused(data: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (data / "skillstate.db-wal").symlink_to(victim)
    refused(start_up(data), "skillstate.db-wal is a symbolic link")
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_a_data_dir_others_can_write_into_is_refused(data: Path, mode: int) -> None:
    os.chmod(data, mode)
    refused(start_up(data), f"writable by other users (mode {mode:o})")
    assert not (data / "skillstate.db").exists()  # refused before creating anything


def test_a_private_existing_data_dir_is_accepted(data: Path) -> None:
    # The refusals above are about the problems, not about any existing directory: this one
    # starts (and is stopped by us).
    argv = [sys.executable, "-m", "skillstate", "--port", "0", "--upstream", UNREACHABLE,
            "--data-dir", str(data)]  # fmt: skip
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=proxy_env(), cwd=data.parent)  # fmt: skip
    try:
        assert p.stdout is not None and "listening" in p.stdout.readline()
    finally:
        p.terminate()
        p.communicate(timeout=30)
