"""Shared fixtures: the fake provider (in-process thread) and the real `skillstate` proxy
started as a separate process on loopback, exactly as a user would run it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakeprovider import FakeProvider

_URL = re.compile(r"http://127\.0\.0\.1:(\d+)")


class ProxyProcess:
    """A running `python -m skillstate` process."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.args = args
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "skillstate", *self.args],
            env=self.env,
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = _URL.search(line)
        if not m:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
            raise RuntimeError(f"proxy did not start: {line!r} {err!r}")
        self.url = f"http://127.0.0.1:{m.group(1)}"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("proxy /health never answered")

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(self.url + path, timeout=10, **kw)

    def state(self, session: str) -> dict[str, Any]:
        r = self.get("/state", params={"session": session})
        assert r.status_code == 200, r.text
        return r.json()

    def stop(self, sig: int = signal.SIGTERM) -> str:
        """Stop the process; returns what it wrote to stderr."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.communicate()


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    fp = FakeProvider().start()
    try:
        yield fp
    finally:
        fp.stop()


def proxy_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLSTATE_")}
    env.update(extra)
    return env


@pytest.fixture
def start_proxy(tmp_path: Path) -> Iterator[Callable[..., ProxyProcess]]:
    """start_proxy(upstream_url, *extra_args, config=dict|None, env=dict|None)."""
    started: list[ProxyProcess] = []

    def start(
        upstream: str | None = None,
        *args: str,
        config: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
    ) -> ProxyProcess:
        argv = ["--port", "0", "--data-dir", str(tmp_path / "data")]
        if upstream:
            argv += ["--upstream", upstream]
        if config is not None:
            cfg = tmp_path / "skillstate.json"
            cfg.write_text(json.dumps(config))
            argv += ["--config", str(cfg)]
        argv += list(args)
        p = ProxyProcess(argv, proxy_env(SKILLSTATE_API_KEY="sk-upstream", **(env or {})), tmp_path)
        started.append(p)
        return p

    yield start
    for p in started:
        if p.proc is not None and p.proc.poll() is None:
            p.stop()


@pytest.fixture
def proxy(fake: FakeProvider, start_proxy: Callable[..., ProxyProcess]) -> ProxyProcess:
    return start_proxy(fake.url + "/v1", "--schema", "facts,notes,step")
