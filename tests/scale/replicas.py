"""N real proxy processes (``python -m skillstate``) sharing one PostgreSQL store and one
Redis, in front of one fake provider: the replicas of the #17 acceptance tests.

Each replica is its own process with its own data dir (and config file), so a test can
kill -9 it, pause it (SIGSTOP) and resume it (SIGCONT), or restart it (a new port)::

    reps = start_replicas(fake.url + "/v1", pg_url, redis_url, n=3, config={"rpm": ...})
    reps[0].post_chat("s1", "hello")      # one turn on replica 0
    reps.any().history("s1")              # the committed transitions, read from the store
    reps[1].kill9(); reps[1].start()

Stdout and stderr of each replica go to ``<root>/rN/proxy.log`` (a pipe nobody drains
would block a busy replica); ``ReplicaSet.logs()`` is printed when a test fails.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import proxy_argv, proxy_env
from tests.helpers import SESSION_HEADER

START_TIMEOUT = 60.0
_URL = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")


class Replica:
    """One ``python -m skillstate`` process; ``start()`` again after a kill is a restart."""

    def __init__(self, name: str, root: Path, argv: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.root = root
        self.argv = argv
        self.env = env
        self.log_path = root / "proxy.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.paused = False
        self.http = httpx.Client(timeout=30)

    # ---- the process ---------------------------------------------------------------------
    def spawn(self) -> None:
        """Start the process; ``wait_ready`` finds its URL (several can start at once)."""
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child's stdout and stderr
        log.write(f"---- start {time.strftime('%H:%M:%S')}\n".encode())
        log.flush()
        self._log_offset = log.tell()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "skillstate", *self.argv],
            env=self.env,
            cwd=self.root,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.paused = False
        self.url = ""

    def wait_ready(self, *, healthy: bool = True) -> Replica:
        """Until the process printed its URL and /health answers (200 unless ``healthy`` is
        False: then any answer, e.g. a 503 while the store is down)."""
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
            if not self.url:
                with open(self.log_path, "rb") as f:
                    f.seek(self._log_offset)
                    m = _URL.search(f.read().decode(errors="replace"))
                self.url = m.group(1) if m else ""
            if self.url:
                try:
                    r = self.http.get(self.url + "/health", timeout=5)
                    if r.status_code == 200 or not healthy:
                        return self
                except httpx.HTTPError:
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not become ready:\n{self.log()}")

    def start(self, *, healthy: bool = True) -> Replica:
        self.spawn()
        return self.wait_ready(healthy=healthy)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILL: no shutdown, no lease release, nothing flushed."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)
        self.paused = False

    def pause(self) -> None:
        """SIGSTOP: the process freezes mid-whatever (a GC pause, a partition)."""
        os.kill(self.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        """SIGTERM (graceful), SIGKILL if it does not exit."""
        if self.proc is None or self.proc.poll() is not None:
            return
        if self.paused:
            self.resume()
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)

    def log(self, tail: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    # ---- its HTTP API --------------------------------------------------------------------
    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def chat(
        self,
        session: str,
        content: str,
        *,
        model: str = "m",
        timeout: float = 60,
        http: httpx.Client | None = None,
    ) -> httpx.Response:
        """One chat-completions turn on ``session`` (a raw response: any status)."""
        return (http or self.http).post(
            self.v1 + "/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": content}]},
            headers={SESSION_HEADER: session, "authorization": "Bearer sk-client"},
            timeout=timeout,
        )

    def health(self) -> httpx.Response:
        return self.http.get(self.url + "/health")

    def state(self, session: str) -> dict[str, Any]:
        r = self.http.get(self.url + "/state", params={"session": session})
        assert r.status_code == 200, (self.name, r.status_code, r.text)
        return dict(r.json())

    def history(self, session: str) -> list[dict[str, Any]]:
        """Every committed transition of ``session`` in step order (all pages)."""
        out: list[dict[str, Any]] = []
        params = {"session": session, "history": "1", "limit": "1000"}
        while True:
            r = self.http.get(self.url + "/state", params=params)
            assert r.status_code == 200, (self.name, r.status_code, r.text)
            doc = r.json()
            out += doc["history"]
            if doc.get("next_cursor") is None:
                return out
            params["cursor"] = doc["next_cursor"]

    def cost(self, **params: str) -> dict[str, Any]:
        r = self.http.get(self.url + "/cost", params=params)
        assert r.status_code == 200, (self.name, r.status_code, r.text)
        return dict(r.json())

    def upstream(self, name: str | None = None) -> dict[str, Any]:
        """An upstream's entry in /health (breaker and limits), whatever /health's status;
        the first one unless ``name`` is given."""
        for up in self.health().json()["upstreams"]:
            if name is None or up["name"] == name:
                return dict(up)
        raise KeyError(name)

    def close(self) -> None:
        self.stop()
        self.http.close()


class ReplicaSet:
    """N replicas with the same settings, sharing ``store`` and ``coordination``."""

    def __init__(
        self,
        root: Path,
        upstream: str,
        *,
        store: str,
        coordination: str | None,
        n: int = 3,
        config: dict[str, Any] | None = None,
        args: tuple[str, ...] = ("--schema", "facts,notes,step"),
    ) -> None:
        cfg: dict[str, Any] = {"store": store, **(config or {})}
        if coordination is not None:
            cfg["coordination"] = coordination
        if "upstreams" in cfg:
            upstream_arg: str | None = None  # the config names them (with rpm/tpm)
        else:
            upstream_arg = upstream
        env = proxy_env(SKILLSTATE_API_KEY="sk-upstream")
        self.replicas: list[Replica] = []
        for i in range(n):
            home = root / f"r{i}"
            home.mkdir(parents=True, exist_ok=True)
            argv = proxy_argv(home, upstream_arg, args, cfg)
            self.replicas.append(Replica(f"r{i}", home, argv, env))

    def start(self) -> ReplicaSet:
        for r in self.replicas:  # in parallel: each costs about a second of start-up
            r.spawn()
        for r in self.replicas:
            r.wait_ready()
        return self

    def __getitem__(self, i: int) -> Replica:
        return self.replicas[i]

    def __len__(self) -> int:
        return len(self.replicas)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.replicas)

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.running and not r.paused and r.url]

    def pick(self, rng: random.Random) -> Replica:
        """A random live replica."""
        return rng.choice(self.live())

    def any(self) -> Replica:
        return self.live()[0]

    def logs(self) -> str:
        return "\n".join(f"==== {r.name} ({r.log_path})\n{r.log()}" for r in self.replicas)

    def close(self) -> None:
        for r in self.replicas:
            r.close()


def seeded(name: str, default: int) -> random.Random:
    """A random generator with a fixed seed (``SKILLSTATE_SCALE_SEED`` overrides it), printed
    so that a failure can be replayed."""
    seed = int(os.environ.get("SKILLSTATE_SCALE_SEED", default))
    print(f"{name}: seed={seed} (SKILLSTATE_SCALE_SEED={seed} replays it)")
    return random.Random(seed)
