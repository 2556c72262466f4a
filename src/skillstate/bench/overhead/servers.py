"""Child server processes: the skillstate proxy under test, and waiting for health."""

from __future__ import annotations

import http.client
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any
from urllib.parse import urlsplit

import orjson

_LOCAL_URL = re.compile(r"https?://(?:127\.0\.0\.1|localhost|0\.0\.0\.0|\[::1\]):(\d+)[^\s'\"<>]*")


class _Proc:
    """A child server whose stdout/stderr are drained by threads (last lines kept)."""

    def __init__(self, name: str, proc: subprocess.Popen[str]) -> None:
        self.name = name
        self.proc = proc
        self.tail: deque[str] = deque(maxlen=60)
        self.urls: list[tuple[str, int]] = []
        self._seen = threading.Condition()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                threading.Thread(target=self._drain, args=(stream,), daemon=True).start()

    def _drain(self, stream: Any) -> None:
        for line in stream:
            line = line.rstrip("\n")
            with self._seen:
                self.tail.append(line)
                for m in _LOCAL_URL.finditer(line):
                    self.urls.append((m.group(0), int(m.group(1))))
                self._seen.notify_all()
        with self._seen:
            self._seen.notify_all()

    def wait_url(self, timeout: float, skip_ports: set[int]) -> str:
        deadline = time.monotonic() + timeout
        with self._seen:
            while True:
                for url, port in self.urls:
                    if port not in skip_ports:
                        return url
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"{self.name} exited with {self.proc.returncode} before printing its "
                        "URL:\n" + "\n".join(self.tail)
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(
                        f"{self.name} printed no URL within {timeout:g} s:\n" + "\n".join(self.tail)
                    )
                self._seen.wait(min(left, 0.2))

    def stop(self, timeout: float = 10.0) -> None:
        p = self.proc
        if p.poll() is not None:
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            p.send_signal(sig)
            try:
                p.wait(timeout / 2)
                return
            except subprocess.TimeoutExpired:
                continue
        p.kill()
        p.wait(5)


def base_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _wait_health(url: str, timeout: float, proc: _Proc | None) -> None:
    parts = urlsplit(url)
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if proc is not None and proc.proc.poll() is not None:
            raise RuntimeError(
                f"{proc.name} exited with {proc.proc.returncode}:\n" + "\n".join(proc.tail)
            )
        try:
            c = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=2)
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            c.close()
            if r.status == 200:
                return
            last = f"HTTP {r.status}"
        except OSError as e:
            last = repr(e)
        time.sleep(0.05)
    tail = "\n".join(proc.tail) if proc else ""
    raise RuntimeError(f"GET {base_of(url)}/health never returned 200 ({last})\n{tail}")


def _serve(
    name: str, cmd: list[str], env: dict[str, str], upstream: str, timeout: float, cwd: str | None
) -> tuple[_Proc, str]:
    """Start a server child in front of ``upstream`` and wait until its /health answers."""
    popen = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**env, "PYTHONUNBUFFERED": "1"},
        cwd=cwd,
    )
    proc = _Proc(name, popen)
    url = proc.wait_url(timeout, {urlsplit(upstream).port or 80})
    _wait_health(url, timeout, proc)
    return proc, base_of(url)


def start_proxy(
    upstream: str,
    data_dir: str,
    state: dict[str, Any],
    extra: list[str],
    timeout: float,
    module: str = "skillstate",
    settings_env: dict[str, str] | None = None,
) -> tuple[_Proc, str]:
    """A proxy child in front of ``upstream``; ``settings_env`` adds SKILLSTATE_* settings
    (the store and coordination URLs of replicas)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLSTATE_")}
    env.update(settings_env or {})
    env["SKILLSTATE_API_KEY"] = "sk-bench"
    env["SKILLSTATE_INITIAL_STATE"] = orjson.dumps(state).decode()
    cmd = [sys.executable, "-m", module, "--port", "0", "--upstream", upstream.rstrip("/") + "/v1"]
    cmd += ["--data-dir", data_dir, *extra]
    # cwd: no stray ./skillstate.json is picked up
    return _serve("skillstate proxy", cmd, env, upstream, timeout, cwd=data_dir)


# The servers the floor forwarder (:mod:`.floor`) runs on; the first (aiohttp's) is the default.
FLOOR_SERVERS = ("aiohttp", "uvicorn")


def start_floor(upstream: str, timeout: float, server: str = FLOOR_SERVERS[0]) -> tuple[_Proc, str]:
    """Start the minimal forwarder (:mod:`.floor`) in front of ``upstream``, served by
    aiohttp's server or by uvicorn (``server``)."""
    cmd = [sys.executable, "-m", "skillstate.bench.overhead.floor", "--upstream", upstream]
    cmd += ["--server", server]
    return _serve("floor forwarder", cmd, dict(os.environ), upstream, timeout, cwd=None)
