"""Real PostgreSQL and Redis servers for the scale tier, from Debian's packages
(``postgresql``, ``redis-server``), each started on loopback in its own temporary directory
and stopped after.

PostgreSQL refuses to run as root, so as root (CI) the cluster belongs to the ``postgres``
user the Debian package creates, and its binaries run under ``runuser``.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

START_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes] | None, sig: signal.Signals) -> None:
    """``sig`` to a server still running, killed if it has not ended within 30 s."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} while starting")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on port {port} within {START_TIMEOUT:.0f} s")


def postgres_bindir() -> Path | None:
    """The newest Debian PostgreSQL's bin directory, else where ``initdb`` is on PATH."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PostgresServer:
    """One throwaway cluster. ``url(db)`` is a libpq URL for a database in it;
    ``create_database()`` makes a fresh one (a test's own)."""

    user = "skillstate"

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="skillstate-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._as_root = os.geteuid() == 0
        self._databases = 0
        if self._as_root:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            self.user,
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        )

    def _argv(self, program: str, *args: str) -> list[str]:
        argv = [str(self.bindir / program), *args]
        return ["runuser", "-u", "postgres", "--", *argv] if self._as_root else argv

    def _server_argv(self, program: str, *args: str) -> list[str]:
        return [str(self.bindir / program), *args]

    def _run(self, program: str, *args: str) -> None:
        subprocess.run(self._argv(program, *args), check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        """Start (or restart, on the same port and data) the server."""
        log = open(self.root / "postgres.log", "ab")  # noqa: SIM115 - the server's stdout
        # As root, the server itself runs as postgres (Popen's user=), not under runuser:
        # runuser does not pass stop()'s SIGINT on, and the server would outlive stop().
        self.proc = subprocess.Popen(
            self._server_argv(
                "postgres",
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.root),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "max_connections=200",
                # Nothing here survives the test run: skip the disk flushes, not the WAL.
                "-c",
                "fsync=off",
                "-c",
                "full_page_writes=off",
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            user="postgres" if self._as_root else None,
            group="postgres" if self._as_root else None,
        )
        log.close()
        _wait_port(self.port, self.proc, "postgres")
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Until the server accepts sessions: it listens before it has finished starting
        ("the database system is starting up")."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            ready = subprocess.run(
                [str(self.bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                timeout=30,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.05)
        raise RuntimeError(f"postgres did not get ready within {START_TIMEOUT:.0f} s")

    def stop(self) -> None:
        """Stop the server (fast shutdown: open sessions are cut)."""
        _stop(self.proc, signal.SIGINT)
        self.proc = None

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; returns its URL."""
        self._databases += 1
        name = f"t{self._databases}"
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, name)
        return self.url(name)

    def log(self) -> str:
        try:
            return (self.root / "postgres.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class RedisServer:
    """One throwaway redis-server, without persistence."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.root = Path(tempfile.mkdtemp(prefix="skillstate-redis-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start (or restart, on the same port, empty) the server."""
        log = open(self.root / "redis.log", "ab")  # noqa: SIM115 - the server's stdout
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.root),
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        _wait_port(self.port, self.proc, "redis-server")

    def stop(self) -> None:
        _stop(self.proc, signal.SIGTERM)
        self.proc = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def flush(self) -> None:
        """Empty every database (between tests)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(b"*1\r\n$8\r\nFLUSHALL\r\n")
            if not s.recv(64).startswith(b"+OK"):
                raise RuntimeError("redis FLUSHALL failed")

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
