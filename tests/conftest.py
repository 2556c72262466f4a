"""Shared fixtures: the fake provider and the real proxy, in-process or as a process.

How to write an end-to-end test
-------------------------------
Use the in-process proxy unless the test is about the process itself::

    def test_something(fake: FakeProvider, start_proxy: StartProxy) -> None:
        p = start_proxy(fake.url + "/v1", "--schema", "facts", config={"session_ttl": 5})
        fake.enqueue(Reply(text="..."))
        client = openai.OpenAI(base_url=p.v1, api_key="sk-client")
        ...
        assert p.state("my-session")["state"] == {...}

- ``fake`` is the wire-faithful fake provider (``tests/fakeprovider.py``): aiohttp on
  127.0.0.1, a free port, its own event loop in a thread, new for every test.
- ``start_proxy(upstream_url, *cli_flags, config=dict, env=dict)`` starts the real proxy: the
  flags, config file (written to ``tmp_path/skillstate.json``) and environment are read by
  the CLI's own parser and ``load_settings``, and the app is ``create_app`` under the same
  uvicorn config as ``skillstate serve`` (uvloop, httptools, lifespan, graceful shutdown) in
  a thread of the test process, on 127.0.0.1 and a free port, with the test's own data dir
  ``tmp_path/data``. Starting one costs milliseconds, so give each test its own. ``proxy``
  is one with the default schema ``facts,notes,step`` in front of ``fake``.
- What you get has ``.url``, ``.v1``, ``.get(path)``, ``.state(session)``, ``.stop()``
  and ``.start()`` (again, on the same data dir: a restart). Every test has its own data
  dir, so sessions, ledger rows and breakers never leak between tests; a proxy shared by a
  module (``launch_in_process`` in a module-scoped fixture, see test_e2e_resilience.py) is
  only for tests that each use their own sessions and models.
- ``start_proxy_process`` has the same signature and starts ``python -m skillstate`` as a
  separate process, exactly as a user would. Use it only when the process is what is tested:
  the CLI and its output, start-up errors, signals (SIGTERM), kill -9, stderr logging,
  file permissions. It costs about a second per start.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, settings

from skillstate.app.server import ProxyServer
from skillstate.cli.main import _cli_layer, build_parser
from skillstate.config import Settings, load_settings
from tests.fakeprovider import FakeProvider

# No timing thresholds in tests: hypothesis's per-example deadline and its "too slow" health
# check judge the machine's speed, not the code (they flaked on a loaded 2-core machine).
settings.register_profile("skillstate", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("skillstate")

_URL = re.compile(r"http://127\.0\.0\.1:(\d+)")


class Proxy:
    """What every test sees of a running proxy, in-process or not."""

    url = ""
    _http: httpx.Client | None = None

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    @property
    def http(self) -> httpx.Client:
        """One HTTP client per proxy: a new `httpx.Client` (what `httpx.get` makes each call)
        loads the CA bundle, about 30 ms of CPU, for plain HTTP on loopback."""
        if self._http is None:
            self._http = httpx.Client(timeout=10)
        return self._http

    def _close_http(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.http.get(self.url + path, **kw)

    def state(self, session: str) -> dict[str, Any]:
        r = self.get("/state", params={"session": session})
        assert r.status_code == 200, r.text
        return r.json()


def settings_from_cli(argv: list[str], env: Mapping[str, str], cwd: Path) -> Settings:
    """The settings `skillstate <argv>` would run with: the CLI's parser and layering."""
    return load_settings(_cli_layer(build_parser(with_benches=False).parse_args(argv)), env, cwd)


class InProcessProxy(Proxy):
    """The real app under the CLI's uvicorn config in a thread of the test process."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.settings = settings_from_cli(args, env, cwd)
        self._server: ProxyServer | None = None
        self.start()

    def start(self) -> None:
        self._server = ProxyServer(self.settings).start()
        self.url = self._server.url

    def stop(self) -> None:
        self._close_http()
        if self._server is not None:
            self._server.stop()
            self._server = None


class ProxyProcess(Proxy):
    """A running `python -m skillstate` process."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.args = args
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen[str] | None = None
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

    def stop(self, sig: int = signal.SIGTERM) -> str:
        """Stop the process; returns what it wrote to stderr."""
        self._close_http()
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
        self._close_http()
        assert self.proc is not None
        self.proc.kill()
        self.proc.communicate()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


StartProxy = Callable[..., InProcessProxy]
StartProxyProcess = Callable[..., ProxyProcess]


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    fp = FakeProvider().start()
    try:
        yield fp
    finally:
        fp.stop()


@pytest.fixture
def refused_url() -> Iterator[str]:
    """The URL of a loopback port that refuses every connection for the whole test: bound and
    never listening. (A port bound and released at once could be handed to another test's
    server by the time the proxy connects, and answer: it did, under load.)"""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def proxy_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLSTATE_")}
    env.update(extra)
    return env


def proxy_argv(
    tmp: Path, upstream: str | None, args: tuple[str, ...], config: dict[str, Any] | None
) -> list[str]:
    """Flags for a proxy on a free port with its data in `tmp/data` (config in `tmp`)."""
    argv = ["--port", "0", "--data-dir", str(tmp / "data")]
    if upstream:
        argv += ["--upstream", upstream]
    if config is not None:
        cfg = tmp / "skillstate.json"
        cfg.write_text(json.dumps(config))
        argv += ["--config", str(cfg)]
    return argv + list(args)


def launch_in_process(
    tmp: Path,
    upstream: str | None = None,
    *args: str,
    config: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> InProcessProxy:
    """An in-process proxy with its data dir under `tmp`; the caller stops it."""
    argv = proxy_argv(tmp, upstream, args, config)
    return InProcessProxy(argv, proxy_env(SKILLSTATE_API_KEY="sk-upstream", **(env or {})), tmp)


@pytest.fixture(scope="session")
def _stopping() -> Iterator[list[threading.Thread]]:
    """Proxies whose shutdown (uvicorn's, about 0.2 s of waiting) overlaps the next test."""
    threads: list[threading.Thread] = []
    yield threads
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "an in-process proxy did not stop"


@pytest.fixture
def start_proxy(tmp_path: Path, _stopping: list[threading.Thread]) -> Iterator[StartProxy]:
    """start_proxy(upstream_url, *extra_args, config=dict|None, env=dict|None), in-process."""
    started: list[InProcessProxy] = []

    def start(
        upstream: str | None = None,
        *args: str,
        config: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
    ) -> InProcessProxy:
        p = launch_in_process(tmp_path, upstream, *args, config=config, env=env)
        started.append(p)
        return p

    yield start
    # Each test has its own data dir, so nothing the next test sees depends on this stop.
    for p in started:
        t = threading.Thread(target=p.stop, name="stop-in-process-proxy")
        t.start()
        _stopping.append(t)


@pytest.fixture
def start_proxy_process(tmp_path: Path) -> Iterator[StartProxyProcess]:
    """Like start_proxy, as a separate `python -m skillstate` process."""
    started: list[ProxyProcess] = []

    def start(
        upstream: str | None = None,
        *args: str,
        config: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
    ) -> ProxyProcess:
        argv = proxy_argv(tmp_path, upstream, args, config)
        env = proxy_env(SKILLSTATE_API_KEY="sk-upstream", **(env or {}))
        p = ProxyProcess(argv, env, tmp_path)
        started.append(p)
        return p

    yield start
    for p in started:
        if p.running:
            p.stop()


@pytest.fixture
def proxy(fake: FakeProvider, start_proxy: StartProxy) -> InProcessProxy:
    return start_proxy(fake.url + "/v1", "--schema", "facts,notes,step")
