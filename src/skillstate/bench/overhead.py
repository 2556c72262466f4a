"""``skillstate bench overhead``: the latency a proxy adds in front of a fast upstream.

Measured the way independent gateway benchmarks do it:

* a fast local OpenAI-compatible upstream (:mod:`skillstate.bench.fastupstream`) in its
  own process answers immediately, so whatever is added on the proxied path is the proxy;
* the proxy under test runs in its own process (by default the real ``skillstate``
  started as ``python -m skillstate --port 0 --upstream <fast>/v1 --data-dir <tmp>``;
  ``--target URL`` measures any other OpenAI-compatible gateway instead);
* the client runs in a third process over persistent keep-alive connections: sequential
  rounds alternate direct and proxied calls (the order flips every round) so that a noisy
  machine hits both paths alike, and a concurrency phase drives N connections for a fixed
  time per path (segments alternate direct/proxied/proxied/direct).

Modes: ``forward`` sends ``x-skillstate-mode: passthrough``; ``state`` sends
``x-skillstate-mode: state`` with many session ids (``x-skillstate-session``), a
2-8 KiB initial state, and an upstream reply that carries a valid envelope, so every turn
commits a small state patch. ``--stream`` measures SSE pass-through to the last byte.
``--turn-profile`` runs one session for many turns and compares the proxy's CPU time per
turn early vs late (it should stay flat).

Standalone: ``python -m skillstate.bench.overhead --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import http.client
import json
import math
import os
import pickle
import platform
import re
import secrets
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import httptools
import orjson

__all__ = [
    "TARGETS",
    "add_overhead_parser",
    "build_parser",
    "initial_state",
    "main",
    "percentile",
    "proc_cpu_seconds",
    "run_overhead",
]

SCHEMA_VERSION = 1
TARGETS = {
    # (metric, limit): forward mode sequential added p50; state mode p50 and throughput.
    "forward": {"added_p50_ms_max": 1.0},
    "state": {"added_p50_ms_max": 2.0, "proxied_rps_min": 1000.0},
}
_LOCAL_URL = re.compile(r"https?://(?:127\.0\.0\.1|localhost|0\.0\.0\.0|\[::1\]):(\d+)[^\s'\"<>]*")


# ------------------------------------------------------------------------------ arguments
def _add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what to measure")
    g.add_argument(
        "--mode",
        choices=("forward", "state"),
        default="forward",
        help="forward: x-skillstate-mode: passthrough (default); state: sessions commit a "
        "state patch every turn",
    )
    g.add_argument("--stream", action="store_true", help="stream: true (time to last byte)")
    g.add_argument(
        "--target",
        metavar="URL",
        help="measure this OpenAI-compatible gateway instead of starting skillstate "
        "(it must forward to the same upstream as the direct path)",
    )
    g.add_argument(
        "--target-pid",
        type=int,
        metavar="PID",
        help="with --target: its process id, for --turn-profile CPU time",
    )
    g.add_argument(
        "--direct",
        metavar="URL",
        help="use this existing upstream instead of starting the fast one",
    )
    g.add_argument(
        "--upstream-port",
        type=int,
        default=0,
        metavar="N",
        help="port for the fast upstream (default 0: a free one), e.g. to point a --target "
        "gateway at it",
    )
    g.add_argument("--api-key", default="sk-bench", help="bearer key sent on both paths")
    g.add_argument("--model", default="bench-model")
    g.add_argument(
        "--proxy-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for the skillstate proxy (repeatable; use --proxy-arg=--flag)",
    )

    g.add_argument(
        "--proxy-module",
        default="skillstate",
        metavar="MOD",
        help="start `python -m MOD` with the same flags instead of skillstate (e.g. a "
        "profiling or experiment wrapper that must be importable)",
    )

    g = p.add_argument_group("sequential (one keep-alive connection per path)")
    g.add_argument(
        "--warmup", type=int, default=15, metavar="N", help="warm-up requests per path (15)"
    )
    g.add_argument(
        "--rounds", type=int, default=7, metavar="N", help="interleaved rounds, 0 skips (7)"
    )
    g.add_argument(
        "--requests", type=int, default=25, metavar="N", help="requests per round per path (25)"
    )

    g = p.add_argument_group("concurrency")
    g.add_argument("--concurrency", type=int, default=64, metavar="N", help="connections (64)")
    g.add_argument(
        "--duration",
        type=float,
        default=5.0,
        help="seconds per path, 0 skips (5); run as alternating segments",
    )
    g.add_argument(
        "--segments",
        type=int,
        default=2,
        help="segments per path, alternating direct/proxied (2: D P P D)",
    )

    g = p.add_argument_group("state mode")
    g.add_argument(
        "--sessions",
        type=int,
        default=256,
        help="distinct session ids (256), each seeded with one turn before measuring",
    )
    g.add_argument(
        "--state-kib", type=float, default=4.0, help="initial state size in KiB (4; 2-8 is real)"
    )
    g.add_argument(
        "--turn-profile",
        action="store_true",
        help="also run one state session for --turns turns and compare the proxy's CPU "
        "time per turn early vs late",
    )
    g.add_argument(
        "--turns", type=int, default=1000, metavar="N", help="turns for --turn-profile (1000)"
    )
    g.add_argument(
        "--turn-batch",
        type=int,
        default=25,
        help="turns per CPU-measurement window in --turn-profile (25)",
    )

    g = p.add_argument_group("output")
    g.add_argument("--json", metavar="FILE", help="write the numbers and machine info here")
    g.add_argument("--quiet", action="store_true", help="no progress lines")
    g.add_argument(
        "--start-timeout", type=float, default=30.0, help="seconds to wait for servers (30)"
    )


def build_parser(prog: str = "python -m skillstate.bench.overhead") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=_DESCRIPTION)
    _add_args(p)
    return p


_DESCRIPTION = (
    "Added-latency benchmark: direct calls to a fast local upstream vs the same calls "
    "through the proxy, interleaved, from a separate client process."
)


def add_overhead_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``overhead`` subcommand (for ``skillstate bench overhead``)."""
    p = cast(
        argparse.ArgumentParser,
        subparsers.add_parser(
            "overhead",
            help="latency the proxy adds in front of a fast upstream",
            description=_DESCRIPTION,
        ),
    )
    _add_args(p)
    p.set_defaults(func=run_overhead)
    return p


def _validate(a: argparse.Namespace) -> str | None:
    if a.warmup < 0 or a.rounds < 0 or a.requests < 1:
        return "--warmup and --rounds must be >= 0, --requests >= 1"
    if a.concurrency < 1 or a.duration < 0 or a.segments < 1:
        return "--concurrency and --segments must be >= 1, --duration >= 0"
    if a.sessions < 1 or a.state_kib <= 0:
        return "--sessions must be >= 1 and --state-kib > 0"
    if a.turn_profile and (a.turn_batch < 1 or a.turns < 2 * a.turn_batch):
        return "--turn-profile needs --turn-batch >= 1 and --turns >= 2 * --turn-batch"
    for flag in ("target", "direct"):
        url = getattr(a, flag)
        if url and urlsplit(url).scheme != "http":
            return f"--{flag}: only http:// URLs are supported, got {url!r}"
    if a.target_pid and not a.target:
        return "--target-pid only makes sense with --target"
    return None


# ------------------------------------------------------------------------------ workload
@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    path: str  # of chat completions
    netloc: str

    @classmethod
    def from_base(cls, url: str) -> Endpoint:
        """``http://h:p``, ``http://h:p/v1`` or a full ``.../chat/completions`` URL."""
        parts = urlsplit(url)
        path = parts.path.rstrip("/")
        if not path.endswith("/chat/completions"):
            path = (
                path + "/chat/completions"
                if path.endswith("/v1")
                else path + "/v1/chat/completions"
            )
        host = parts.hostname or "127.0.0.1"
        return cls(host, parts.port or 80, path, parts.netloc)


def initial_state(kib: float) -> dict[str, Any]:
    """A deterministic, realistic agent state of about ``kib`` KiB of JSON."""
    target = int(kib * 1024)
    state: dict[str, Any] = {
        "goal": "Add retry with exponential backoff to the HTTP client and cover it with tests.",
        "plan": [
            "read src/client.py and find every place that sends a request",
            "add a RetryPolicy with base delay, cap and jitter",
            "wrap send() and stream() in the retry loop",
            "write unit tests for 429, 503 and connection resets",
            "run the test suite and fix failures",
        ],
        "files": {},
        "facts": [],
        "open_questions": ["should POST be retried when the body was already sent?"],
        "step": 0,
        "last_action": "",
    }
    i = 0
    while len(orjson.dumps(state)) < target:
        if i % 3 == 0:
            state["files"][f"src/module_{i:03d}.py"] = (
                f"{40 + i * 7} lines; defines Handler{i} and parse_{i}(); imports client, "
                "config; no retries yet"
            )
        else:
            state["facts"].append(
                f"fact {i}: test_case_{i} covers status {400 + i % 100} and expects "
                f"a {'retry' if i % 2 else 'failure'} after {i % 5 + 1} attempts"
            )
        i += 1
    return state


_SYSTEM = (
    "You are a careful software engineering agent working in a Python repository. "
    "Each turn you receive the latest tool output. Think briefly, then reply with a JSON "
    "envelope holding a state_patch (an RFC 7386 merge patch of your working state) and the "
    "next action. Keep the state small: record decisions, file summaries and open questions, "
    "not transcripts. Available actions: read_file, edit_file, run_tests, search, finish."
)
_USER = (
    "Tool result (run_tests): 41 passed, 2 failed in 3.18s\n"
    "FAILED tests/test_client.py::test_retry_on_503 - AssertionError: expected 3 attempts, "
    "got 1\nFAILED tests/test_client.py::test_no_retry_on_400 - TypeError: RetryPolicy() got "
    "an unexpected keyword argument 'statuses'\nDecide the next action."
)


def chat_body(model: str, stream: bool) -> bytes:
    body: dict[str, Any] = {
        "model": model,
        "messages": [
            {"role": "system", "content": _SYSTEM},
            {"role": "user", "content": _USER},
        ],
        "max_tokens": 256,
        "temperature": 0,
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


def build_request(ep: Endpoint, body: bytes, headers: Sequence[tuple[str, str]]) -> bytes:
    lines = [
        f"POST {ep.path} HTTP/1.1",
        f"host: {ep.netloc}",
        "content-type: application/json",
        "accept: application/json" if b'"stream":true' not in body else "accept: text/event-stream",
        f"content-length: {len(body)}",
        *(f"{k}: {v}" for k, v in headers),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def session_ids(n: int, tag: str) -> list[str]:
    return [f"bench-{tag}-{i:05d}" for i in range(n)]


# ------------------------------------------------------------------------------ stats
def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); q in [0, 100]."""
    if not sorted_values:
        return math.nan
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    k = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo))


def _r(x: float) -> float | None:
    return None if x is None or math.isnan(x) else round(x, 3)


def summarize(lat_ms: Sequence[float]) -> dict[str, Any]:
    s = sorted(lat_ms)
    n = len(s)
    return {
        "n": n,
        "p50_ms": _r(percentile(s, 50)),
        "p90_ms": _r(percentile(s, 90)),
        "p99_ms": _r(percentile(s, 99)),
        "mean_ms": _r(sum(s) / n) if n else None,
        "min_ms": _r(s[0]) if n else None,
        "max_ms": _r(s[-1]) if n else None,
    }


def _diff(a: Any, b: Any) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


# ------------------------------------------------------------------------------ CPU time
def proc_cpu_seconds(pid: int) -> tuple[float, str]:
    """CPU time (user+system) of a process, and which clock gave it.

    Prefers the scheduler's nanosecond counters summed over the process's threads
    (``/proc/PID/task/*/schedstat``), then psutil, then ``/proc/PID/stat`` utime+stime
    (clock ticks, usually 10 ms)."""
    task_dir = Path(f"/proc/{pid}/task")
    try:
        total = 0
        for t in task_dir.iterdir():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                total += int((t / "schedstat").read_text().split()[0])
        if total:
            return total / 1e9, "schedstat"
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil  # type: ignore[import-untyped,unused-ignore]

        ct = psutil.Process(pid).cpu_times()
        return float(ct.user + ct.system), "psutil"
    except Exception:
        pass
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks, "proc-stat"


# ------------------------------------------------------------------------------ clients
class ResponseError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300]!r}")
        self.status = status
        self.body = body


class _Resp:
    """httptools callbacks for one response at a time."""

    __slots__ = ("body", "done", "got_bytes", "keep_alive", "parser", "status")

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.body: list[bytes] = []
        self.done = False
        self.got_bytes = False
        self.status = 0
        self.keep_alive = True

    def on_message_begin(self) -> None:
        self.body = []
        self.done = False

    def on_body(self, b: bytes) -> None:
        self.body.append(b)

    def on_message_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        self.done = True


class SyncConn:
    """One persistent HTTP/1.1 connection; blocking sockets, httptools parsing."""

    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep
        self.sock: socket.socket | None = None
        self.resp = _Resp()
        self.reconnects = -1

    def _connect(self) -> socket.socket:
        s = socket.create_connection((self.ep.host, self.ep.port), timeout=60)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = s
        self.resp = _Resp()
        self.reconnects += 1
        return s

    def fresh(self) -> None:
        """Reconnect now if the server closed the idle connection (keep-alive timeout), so
        that the next timed request does not pay for it. Call outside the timed region."""
        s = self.sock
        if s is None:
            self._connect()
            return
        try:
            readable, _, _ = select.select([s], [], [], 0)
            if readable and not s.recv(1, socket.MSG_PEEK):
                self.close()
                self._connect()
        except OSError:
            self.close()
            self._connect()

    def request(self, data: bytes) -> tuple[int, bytes]:
        try:
            return self._request(data)
        except ConnectionError:
            if self.resp.got_bytes:
                raise
            self.close()  # a stale keep-alive connection: one retry on a new one
            return self._request(data)

    def _request(self, data: bytes) -> tuple[int, bytes]:
        s = self.sock or self._connect()
        r = self.resp
        r.done = False
        r.got_bytes = False
        s.sendall(data)
        recv = s.recv
        feed = r.parser.feed_data
        while not r.done:
            chunk = recv(262144)
            if not chunk:
                self.close()
                raise ConnectionError("server closed the connection")
            r.got_bytes = True
            feed(chunk)
        if not r.keep_alive:
            self.close()
        return r.status, b"".join(r.body)

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
        self.sock = None


class _AsyncConn(asyncio.Protocol):
    __slots__ = ("closed", "fut", "resp", "transport")

    def __init__(self) -> None:
        self.resp = _Resp()
        self.fut: asyncio.Future[int] | None = None
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        r = self.resp
        try:
            r.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(e)
            return
        if r.done:
            r.done = False
            fut, self.fut = self.fut, None
            if fut is not None and not fut.done():
                fut.set_result(r.status)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(exc or ConnectionError("server closed the connection"))

    def _fail(self, exc: BaseException) -> None:
        fut, self.fut = self.fut, None
        if fut is not None and not fut.done():
            fut.set_exception(exc)


async def _open(ep: Endpoint) -> _AsyncConn:
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_connection(_AsyncConn, ep.host, ep.port)
    return proto


async def _conc_segment(
    ep: Endpoint, conns: list[_AsyncConn], reqs: list[list[bytes]], seconds: float
) -> dict[str, Any]:
    """Every connection sends back-to-back requests for ``seconds``."""
    loop = asyncio.get_running_loop()
    lat: list[float] = []
    errors = 0
    first_error: list[str] = []
    pc = time.perf_counter_ns
    start = pc()
    deadline = start + int(seconds * 1e9)

    async def worker(i: int) -> None:
        nonlocal errors
        conn = conns[i]
        mine = reqs[i]
        k = 0
        while pc() < deadline:
            if conn.closed or conn.transport is None:
                conn = conns[i] = await _open(ep)
            data = mine[k % len(mine)]
            k += 1
            fut: asyncio.Future[int] = loop.create_future()
            conn.fut = fut
            t0 = pc()
            conn.transport.write(data)  # type: ignore[union-attr]
            try:
                status = await fut
            except Exception as e:
                errors += 1
                if not first_error:
                    first_error.append(repr(e))
                conn.closed = True
                continue
            t1 = pc()
            if status != 200:
                errors += 1
                if not first_error:
                    first_error.append(f"HTTP {status}: {b''.join(conn.resp.body)[:300]!r}")
            else:
                lat.append((t1 - t0) / 1e6)
            if not conn.resp.keep_alive:
                conn.closed = True

    await asyncio.gather(*(worker(i) for i in range(len(conns))))
    elapsed = (pc() - start) / 1e9
    return {"lat": lat, "errors": errors, "elapsed": elapsed, "first_error": first_error}


# ------------------------------------------------------------------------------ client process
def _sequential(
    spec: dict[str, Any],
    d: SyncConn,
    p: SyncConn,
    d_reqs: list[bytes],
    p_reqs: list[bytes],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    rounds, per, pid = spec["rounds"], spec["requests"], spec.get("proxy_pid")
    cpu_s = 0.0
    pc = time.perf_counter_ns
    lat: dict[str, list[float]] = {"direct": [], "proxied": []}
    per_round: list[dict[str, Any]] = []
    cursor = {"direct": 0, "proxied": 0}
    conns = {"direct": d, "proxied": p}
    reqs = {"direct": d_reqs, "proxied": p_reqs}

    def run(path: str, n: int, out: list[float] | None) -> None:
        c, rs = conns[path], reqs[path]
        for _ in range(n):
            data = rs[cursor[path] % len(rs)]
            cursor[path] += 1
            c.fresh()
            t0 = pc()
            status, body = c.request(data)
            t1 = pc()
            if status != 200:
                raise ResponseError(status, body)
            if out is not None:
                out.append((t1 - t0) / 1e6)

    for path in ("direct", "proxied"):
        run(path, spec["warmup"], None)
    for i in range(rounds):
        progress(f"sequential round {i + 1}/{rounds}")
        order = ("direct", "proxied") if i % 2 == 0 else ("proxied", "direct")
        this: dict[str, list[float]] = {"direct": [], "proxied": []}
        for path in order:
            if path == "proxied" and pid:
                c0 = proc_cpu_seconds(pid)[0]
                run(path, per, this[path])
                cpu_s += proc_cpu_seconds(pid)[0] - c0
            else:
                run(path, per, this[path])
        for path in order:
            lat[path] += this[path]
        per_round.append(
            {
                "order": "direct-first" if i % 2 == 0 else "proxied-first",
                "direct_p50_ms": percentile(sorted(this["direct"]), 50),
                "proxied_p50_ms": percentile(sorted(this["proxied"]), 50),
            }
        )
    cpu = cpu_s * 1000 / (rounds * per) if pid and rounds else None
    return {"lat": lat, "per_round": per_round, "proxy_cpu_ms_per_request": cpu}


def _turn_profile(
    spec: dict[str, Any], p: SyncConn, ep: Endpoint, progress: Callable[[str], None]
) -> dict[str, Any]:
    turns, batch, pid = spec["turns"], spec["turn_batch"], spec.get("proxy_pid")
    sid = f"bench-turnprof-{secrets.token_hex(4)}"
    headers = [h for h in spec["proxied_headers"] if h[0] != "x-skillstate-mode"]
    headers += [("x-skillstate-mode", "state"), ("x-skillstate-session", sid)]
    data = build_request(ep, spec["body"], headers)
    last = turns - batch + 1
    first = max(1, min(10, last - batch))
    starts = sorted({s for s in (100, 250, 500) if s + batch - 1 < last} | {first, last})
    # windows never overlap: a later start is moved past the previous window's end
    windows: list[tuple[int, int]] = []
    for s in starts:
        s = max(s, windows[-1][1] + 1) if windows else s
        if s + batch - 1 <= turns:
            windows.append((s, s + batch - 1))
    pc = time.perf_counter_ns
    wall: list[float] = []
    cpu_at: dict[int, float] = {}
    clock = None
    edges = {a - 1 for a, _ in windows} | {b for _, b in windows}
    if pid and 0 in edges:
        cpu_at[0], clock = proc_cpu_seconds(pid)
    for turn in range(1, turns + 1):
        p.fresh()
        t0 = pc()
        status, body = p.request(data)
        t1 = pc()
        if status != 200:
            raise ResponseError(status, body)
        wall.append((t1 - t0) / 1e6)
        if pid and turn in edges:
            cpu_at[turn], clock = proc_cpu_seconds(pid)
        if turn % 100 == 0:
            progress(f"turn profile {turn}/{turns}")
    rows: list[dict[str, Any]] = []
    for a, b in windows:
        w = sorted(wall[a - 1 : b])
        cpu = (cpu_at[b] - cpu_at[a - 1]) * 1000 / (b - a + 1) if pid else None
        rows.append(
            {
                "turns": [a, b],
                "proxy_cpu_ms_per_turn": _r(cpu) if cpu is not None else None,
                "wall_p50_ms": _r(percentile(w, 50)),
                "wall_mean_ms": _r(sum(w) / len(w)),
            }
        )
    c0, c1 = rows[0]["proxy_cpu_ms_per_turn"], rows[-1]["proxy_cpu_ms_per_turn"]
    ratio = round(c1 / c0, 3) if c0 and c1 is not None else None
    w0, w1 = rows[0]["wall_p50_ms"], rows[-1]["wall_p50_ms"]
    wall_ratio = round(w1 / w0, 3) if w0 and w1 is not None else None
    return {
        "session": sid,
        "turns": turns,
        "batch": batch,
        "cpu_clock": clock,
        "windows": rows,
        "cpu_ratio_last_vs_first": ratio,
        "wall_ratio_last_vs_first": wall_ratio,
    }


async def _concurrency(
    spec: dict[str, Any],
    eps: dict[str, Endpoint],
    reqs: dict[str, list[list[bytes]]],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    n = spec["concurrency"]
    conns = {path: [await _open(ep) for _ in range(n)] for path, ep in eps.items()}
    for path in ("direct", "proxied"):
        progress(f"concurrency warm-up ({path})")
        await _conc_segment(eps[path], conns[path], reqs[path], min(1.0, spec["duration"] / 4))
    segs = spec["segments"]
    seconds = spec["duration"] / segs
    order: list[str] = []
    for i in range(segs):
        order += ["direct", "proxied"] if i % 2 == 0 else ["proxied", "direct"]
    agg: dict[str, dict[str, Any]] = {
        p: {"lat": [], "errors": 0, "elapsed": 0.0, "first_error": [], "proxy_cpu_s": 0.0}
        for p in eps
    }
    pid = spec.get("proxy_pid")
    for i, path in enumerate(order):
        progress(f"concurrency segment {i + 1}/{len(order)} ({path}, {seconds:g} s)")
        gc.collect()
        c0 = proc_cpu_seconds(pid)[0] if pid and path == "proxied" else 0.0
        r = await _conc_segment(eps[path], conns[path], reqs[path], seconds)
        a = agg[path]
        if pid and path == "proxied":
            a["proxy_cpu_s"] += proc_cpu_seconds(pid)[0] - c0
        a["lat"] += r["lat"]
        a["errors"] += r["errors"]
        a["elapsed"] += r["elapsed"]
        a["first_error"] = a["first_error"] or r["first_error"]
    for cs in conns.values():
        for c in cs:
            if c.transport is not None:
                c.transport.close()
    return agg


def _state_check(ep: Endpoint, headers: Sequence[tuple[str, str]], sid: str) -> dict[str, Any]:
    """Ask a skillstate proxy (``GET /state?session=ID``) whether turns really committed."""
    lines = [f"GET /state?session={sid} HTTP/1.1", f"host: {ep.netloc}"]
    lines += [f"{k}: {v}" for k, v in headers]
    c = SyncConn(ep)
    try:
        status, body = c.request(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    except OSError as e:
        return {"session": sid, "error": repr(e)}
    finally:
        c.close()
    if status != 200:
        return {"session": sid, "status": status}
    try:
        rec = orjson.loads(body)
        return {
            "session": sid,
            "step": rec.get("step"),
            "state_bytes": len(orjson.dumps(rec.get("state"))),
        }
    except (orjson.JSONDecodeError, AttributeError):
        return {"session": sid, "status": status, "error": "not a state record"}


def _client_run(spec: dict[str, Any], progress: Callable[[str], None]) -> dict[str, Any]:
    eps = {"direct": Endpoint(*spec["direct_ep"]), "proxied": Endpoint(*spec["proxied_ep"])}
    body: bytes = spec["body"]
    dh = [tuple(h) for h in spec["direct_headers"]]
    ph = [tuple(h) for h in spec["proxied_headers"]]
    state = spec["mode"] == "state"
    out: dict[str, Any] = {}

    d, p = SyncConn(eps["direct"]), SyncConn(eps["proxied"])
    # probe both paths once, so a misconfiguration fails fast with the server's words
    for name, c, hs in (("direct", d, dh), ("proxied", p, ph)):
        status, rbody = c.request(build_request(eps[name], body, hs))
        if status != 200:
            raise RuntimeError(f"{name} path: HTTP {status}: {rbody[:500]!r}")
        out[f"{name}_sample"] = rbody[:2000].decode("utf-8", "replace")

    sids = session_ids(spec["sessions"], secrets.token_hex(3)) if state else []
    if state:
        p_reqs = [
            build_request(eps["proxied"], body, [*ph, ("x-skillstate-session", s)]) for s in sids
        ]
        for i, req in enumerate(p_reqs):  # seed: each session exists before it is measured
            status, rbody = p.request(req)
            if status != 200:
                raise RuntimeError(f"seeding session {sids[i]}: HTTP {status}: {rbody[:500]!r}")
            if i % 64 == 63:
                progress(f"seeded {i + 1}/{len(p_reqs)} sessions")
    else:
        p_reqs = [build_request(eps["proxied"], body, ph)]
    d_reqs = [build_request(eps["direct"], body, dh)]

    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        if spec["rounds"] > 0:
            out["sequential"] = _sequential(spec, d, p, d_reqs, p_reqs, progress)
        if spec["turn_profile"]:
            out["turn_profile"] = _turn_profile(spec, p, eps["proxied"], progress)
    finally:
        gc.enable()
    d.close()
    p.close()

    if state:
        out["state_check"] = {"seeded": _state_check(eps["proxied"], ph, sids[0])}
        tp = out.get("turn_profile")
        if tp:
            out["state_check"]["turn_profile"] = _state_check(eps["proxied"], ph, tp["session"])

    if spec["duration"] > 0:
        n = spec["concurrency"]
        conc_reqs: dict[str, list[list[bytes]]] = {"direct": [d_reqs] * n}
        if state:
            # connection i owns sessions i, i+n, i+2n, ... so no two in-flight turns share one
            conc_reqs["proxied"] = [p_reqs[i::n] or [p_reqs[i % len(p_reqs)]] for i in range(n)]
        else:
            conc_reqs["proxied"] = [p_reqs] * n
        try:
            import uvloop
        except ImportError:  # pragma: no cover
            out["concurrency"] = asyncio.run(_concurrency(spec, eps, conc_reqs, progress))
        else:
            out["concurrency"] = uvloop.run(_concurrency(spec, eps, conc_reqs, progress))
    return out


# ------------------------------------------------------------------------------ servers
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


def _base_of(url: str) -> str:
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
    raise RuntimeError(f"GET {_base_of(url)}/health never returned 200 ({last})\n{tail}")


def _start_proxy(
    upstream: str,
    data_dir: str,
    state: dict[str, Any],
    extra: list[str],
    timeout: float,
    module: str = "skillstate",
) -> tuple[_Proc, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLSTATE_")}
    env["SKILLSTATE_API_KEY"] = "sk-bench"
    env["SKILLSTATE_INITIAL_STATE"] = orjson.dumps(state).decode()
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [
        sys.executable,
        "-m",
        module,
        "--port",
        "0",
        "--upstream",
        upstream.rstrip("/") + "/v1",
        "--data-dir",
        data_dir,
        *extra,
    ]
    popen = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=data_dir,  # no stray ./skillstate.json is picked up
    )
    proc = _Proc("skillstate proxy", popen)
    up_port = urlsplit(upstream).port or 80
    url = proc.wait_url(timeout, {up_port})
    _wait_health(url, timeout, proc)
    return proc, _base_of(url)


# ------------------------------------------------------------------------------ machine info
def _git_revision() -> dict[str, Any]:
    here = Path(__file__).resolve().parent

    def git(*a: str) -> str | None:
        try:
            r = subprocess.run(
                ["git", "-C", str(here), *a], capture_output=True, text=True, timeout=5
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    rev = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"revision": rev or "unknown", "dirty": bool(dirty) if dirty is not None else None}


def machine_info() -> dict[str, Any]:
    from importlib import metadata

    cpu_model = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    versions: dict[str, str | None] = {}
    for pkg in (
        "skillstate-proxy",
        "uvicorn",
        "starlette",
        "aiohttp",
        "uvloop",
        "httptools",
        "orjson",
    ):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    affinity = None
    with contextlib.suppress(AttributeError, OSError):
        affinity = len(os.sched_getaffinity(0))
    load = None
    with contextlib.suppress(OSError, AttributeError):
        load = [round(x, 2) for x in os.getloadavg()]
    return {
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "cpu_model": cpu_model,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "git": _git_revision(),
        "packages": versions,
        "loadavg_start": load,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# ------------------------------------------------------------------------------ orchestration
def _say(quiet: bool, msg: str) -> None:
    if not quiet:
        print(f"  {msg}", file=sys.stderr, flush=True)


def _client_stdio() -> None:
    """Client process entry: a pickled spec on stdin; length-prefixed pickled messages on
    the file descriptor named by argv[1] (not stdout, which a library might write to)."""
    spec = pickle.load(sys.stdin.buffer)
    out = os.fdopen(int(sys.argv[1]), "wb")

    def send(msg: tuple[str, Any]) -> None:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        out.write(struct.pack("!I", len(data)) + data)
        out.flush()

    try:
        send(("result", _client_run(spec, lambda m: send(("progress", m)))))
    except Exception as e:  # report, never hang the parent
        send(("error", f"{type(e).__name__}: {e}"))
    finally:
        out.close()


def _read_exact(f: Any, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _run_client(spec: dict[str, Any], quiet: bool) -> dict[str, Any]:
    """Run the client in its own interpreter (so it shares no GIL with anything)."""
    code = "from skillstate.bench.overhead import _client_stdio; _client_stdio()"
    rfd, wfd = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(wfd)], stdin=subprocess.PIPE, pass_fds=(wfd,)
        )
    finally:
        os.close(wfd)
    assert proc.stdin is not None
    result: dict[str, Any] | None = None
    error = None
    with os.fdopen(rfd, "rb") as msgs:
        try:
            pickle.dump(spec, proc.stdin)
            proc.stdin.close()
            while True:
                head = _read_exact(msgs, 4)
                if head is None:
                    break
                data = _read_exact(msgs, struct.unpack("!I", head)[0])
                if data is None:
                    break
                kind, payload = pickle.loads(data)
                if kind == "progress":
                    _say(quiet, payload)
                elif kind == "result":
                    result = payload
                else:
                    error = payload
        finally:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
    if error:
        raise RuntimeError(f"client: {error}")
    if result is None:
        raise RuntimeError(f"client process died (exit code {proc.returncode})")
    return result


def _report(a: argparse.Namespace, raw: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    rep: dict[str, Any] = {
        "tool": "skillstate bench overhead",
        "schema": SCHEMA_VERSION,
        "config": info["config"],
        "machine": info["machine"],
        "samples": {k: raw.get(f"{k}_sample") for k in ("direct", "proxied")},
    }
    seq = raw.get("sequential")
    if seq:
        d, p = summarize(seq["lat"]["direct"]), summarize(seq["lat"]["proxied"])
        rounds = [r["proxied_p50_ms"] - r["direct_p50_ms"] for r in seq["per_round"]]
        rep["sequential"] = {
            "direct": d,
            "proxied": p,
            "added": {
                "p50_ms": _diff(p["p50_ms"], d["p50_ms"]),
                "p99_ms": _diff(p["p99_ms"], d["p99_ms"]),
                "mean_ms": _diff(p["mean_ms"], d["mean_ms"]),
                "p50_ms_median_of_rounds": _r(percentile(sorted(rounds), 50)),
                "p50_ms_per_round": [_r(x) for x in rounds],
            },
            "proxy_cpu_ms_per_request": _r(seq["proxy_cpu_ms_per_request"])
            if seq["proxy_cpu_ms_per_request"] is not None
            else None,
        }
    conc = raw.get("concurrency")
    if conc:
        out: dict[str, Any] = {"connections": a.concurrency}
        for path in ("direct", "proxied"):
            c = conc[path]
            s = summarize(c["lat"])
            s["rps"] = round(len(c["lat"]) / c["elapsed"], 1) if c["elapsed"] else None
            s["errors"] = c["errors"]
            s["seconds"] = round(c["elapsed"], 3)
            if c["first_error"]:
                s["first_error"] = c["first_error"][0]
            out[path] = s
        pc_s = conc["proxied"]["proxy_cpu_s"]
        n_p = len(conc["proxied"]["lat"])
        cpu_ms = pc_s * 1000 / n_p if pc_s and n_p else None
        out["proxy_cpu_ms_per_request"] = _r(cpu_ms) if cpu_ms else None
        # the GIL keeps the proxy on about one core: this is its throughput on an idle core
        out["proxy_cpu_bound_rps"] = round(1000 / cpu_ms) if cpu_ms else None
        d, p = out["direct"], out["proxied"]
        out["added"] = {
            "p50_ms": _diff(p["p50_ms"], d["p50_ms"]),
            "p99_ms": _diff(p["p99_ms"], d["p99_ms"]),
            "rps_ratio": round(p["rps"] / d["rps"], 3) if d["rps"] and p["rps"] else None,
        }
        rep["concurrency"] = out
    if raw.get("state_check"):
        rep["state_check"] = raw["state_check"]
    if raw.get("turn_profile"):
        rep["turn_profile"] = raw["turn_profile"]
    rep["targets"] = _targets(a, rep)
    return rep


def _targets(a: argparse.Namespace, rep: dict[str, Any]) -> dict[str, Any]:
    t = TARGETS[a.mode]
    res: dict[str, Any] = {"applies_to": "skillstate" if not a.target else "target gateway"}
    seq = rep.get("sequential")
    if seq and seq["added"]["p50_ms"] is not None:
        v = seq["added"]["p50_ms"]
        res["added_p50_ms"] = {
            "value": v,
            "max": t["added_p50_ms_max"],
            "met": v <= t["added_p50_ms_max"],
        }
    conc = rep.get("concurrency")
    if "proxied_rps_min" in t and conc and conc["proxied"]["rps"] is not None:
        v = conc["proxied"]["rps"]
        res["proxied_rps"] = {
            "value": v,
            "min": t["proxied_rps_min"],
            "met": v >= t["proxied_rps_min"],
        }
    return res


def _f(x: Any, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return str(x)


def print_report(rep: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    if not con.is_terminal:
        con = Console(width=110)
    cfg = rep["config"]
    m = rep["machine"]
    title = (
        f"skillstate bench overhead: mode={cfg['mode']}{' stream' if cfg['stream'] else ''}, "
        f"proxy={cfg['proxy']}"
    )
    con.print(f"[bold]{title}[/bold]")
    con.print(
        f"[dim]{m['cpu_count']} CPUs ({m['cpu_model']}), Python {m['python']}, "
        f"git {m['git']['revision'][:12]}{'+dirty' if m['git']['dirty'] else ''}, "
        f"load {m['loadavg_start']}[/dim]"
    )
    seq = rep.get("sequential")
    if seq:
        con.print(
            f"[bold]sequential[/bold]: {cfg['rounds']} interleaved rounds x {cfg['requests']} "
            f"requests per path, {cfg['warmup']} warm-ups, one keep-alive connection each (ms)"
        )
        t = Table()
        for col in ("path", "n", "p50", "p99", "mean", "min", "max"):
            t.add_column(col, justify="left" if col == "path" else "right")
        for path in ("direct", "proxied"):
            s = seq[path]
            t.add_row(
                path,
                str(s["n"]),
                *(_f(s[k]) for k in ("p50_ms", "p99_ms", "mean_ms", "min_ms", "max_ms")),
            )
        ad = seq["added"]
        t.add_row(
            "[bold]added[/bold]",
            "",
            f"[bold]{_f(ad['p50_ms'])}[/bold]",
            f"[bold]{_f(ad['p99_ms'])}[/bold]",
            _f(ad["mean_ms"]),
            "",
            "",
        )
        con.print(t)
        con.print(
            f"  added p50, median of per-round differences: {_f(ad['p50_ms_median_of_rounds'])} ms"
            f"  (rounds: {', '.join(_f(x) for x in ad['p50_ms_per_round'])})"
        )
        if seq.get("proxy_cpu_ms_per_request") is not None:
            con.print(
                f"  proxy CPU per request: {_f(seq['proxy_cpu_ms_per_request'])} ms "
                "(less sensitive to a busy machine than wall time)"
            )
    conc = rep.get("concurrency")
    if conc:
        con.print(
            f"[bold]concurrency[/bold]: {conc['connections']} connections, {cfg['duration']:g} s "
            f"per path in {cfg['segments'] * 2} alternating segments (ms)"
        )
        t = Table()
        for col in ("path", "req/s", "n", "errors", "p50", "p99", "mean"):
            t.add_column(col, justify="left" if col == "path" else "right")
        for path in ("direct", "proxied"):
            s = conc[path]
            t.add_row(
                path,
                _f(s["rps"], 0),
                str(s["n"]),
                str(s["errors"]),
                *(_f(s[k]) for k in ("p50_ms", "p99_ms", "mean_ms")),
            )
        ad = conc["added"]
        t.add_row(
            "[bold]added[/bold]",
            f"x{_f(ad['rps_ratio'])}",
            "",
            "",
            f"[bold]{_f(ad['p50_ms'])}[/bold]",
            _f(ad["p99_ms"]),
            "",
        )
        con.print(t)
        if conc.get("proxy_cpu_ms_per_request") is not None:
            con.print(
                f"  proxy CPU per request: {_f(conc['proxy_cpu_ms_per_request'])} ms, so about "
                f"{conc['proxy_cpu_bound_rps']:,} req/s if the proxy had one core to itself"
            )
        for path in ("direct", "proxied"):
            if conc[path].get("first_error"):
                con.print(f"  [red]{path} first error:[/red] {conc[path]['first_error']}")
    tp = rep.get("turn_profile")
    if tp:
        con.print(
            f"[bold]turn profile[/bold]: one state session, {tp['turns']} turns, proxy CPU "
            f"clock: {tp['cpu_clock'] or 'unavailable (no pid)'}"
        )
        t = Table()
        for col in ("turns", "proxy CPU ms/turn", "wall p50 ms", "wall mean ms"):
            t.add_column(col, justify="right")
        for w in tp["windows"]:
            a, b = w["turns"]
            t.add_row(
                f"{a}-{b}",
                _f(w["proxy_cpu_ms_per_turn"]),
                _f(w["wall_p50_ms"]),
                _f(w["wall_mean_ms"]),
            )
        con.print(t)
        con.print(
            f"  last/first window: CPU x{_f(tp['cpu_ratio_last_vs_first'])}, "
            f"wall p50 x{_f(tp['wall_ratio_last_vs_first'])}"
        )
    sc = rep.get("state_check")
    if sc:
        for label, c in sc.items():
            if "step" in c:
                con.print(
                    f"  state check ({label}): session {c['session']} at step {c['step']}, "
                    f"state {c['state_bytes']:,} bytes"
                )
            else:
                con.print(f"  [yellow]state check ({label}) failed:[/yellow] {c}")
    tg = rep["targets"]
    parts = []
    for key, label in (("added_p50_ms", "added p50"), ("proxied_rps", "proxied req/s")):
        if key in tg:
            x = tg[key]
            bound = f"<= {x['max']}" if "max" in x else f">= {x['min']:,.0f}"
            mark = "[green]met[/green]" if x["met"] else "[red]missed[/red]"
            val = _f(x["value"], 0 if key == "proxied_rps" else 3)
            parts.append(f"{label} {val} ({bound}): {mark}")
    if parts:
        con.print(f"targets ({cfg['mode']} mode): " + "; ".join(parts))


def run_overhead(args: argparse.Namespace) -> int:
    """Run the benchmark described by ``args``; 0 on success."""
    err = _validate(args)
    if err:
        print(f"skillstate bench overhead: {err}", file=sys.stderr)
        return 2
    q = args.quiet
    info: dict[str, Any] = {"machine": machine_info()}
    upstream = proxy = None
    tmp = tempfile.TemporaryDirectory(prefix="skillstate-bench-")
    state = initial_state(args.state_kib)
    try:
        if args.direct:
            direct_url = args.direct
        else:
            from skillstate.bench.fastupstream import start_fast_upstream

            upstream = start_fast_upstream(args.upstream_port, timeout=args.start_timeout)
            direct_url = upstream.url
            _say(q, f"fast upstream: {direct_url} (pid {upstream.pid})")
        proxy_pid: int | None
        if args.target:
            proxied_url = args.target
            proxy_pid = args.target_pid
            proxy_name = args.target
        else:
            proxy, proxied_url = _start_proxy(
                _base_of(direct_url),
                tmp.name,
                state,
                args.proxy_arg,
                args.start_timeout,
                args.proxy_module,
            )
            proxy_pid = proxy.proc.pid
            proxy_name = "skillstate" if args.proxy_module == "skillstate" else args.proxy_module
            _say(q, f"skillstate proxy: {proxied_url} (pid {proxy_pid})")

        auth = ("authorization", f"Bearer {args.api_key}")
        direct_headers = [auth]
        mode_header = "passthrough" if args.mode == "forward" else "state"
        proxied_headers = [auth, ("x-skillstate-mode", mode_header)]
        d_ep, p_ep = Endpoint.from_base(direct_url), Endpoint.from_base(proxied_url)
        spec = {
            "mode": args.mode,
            "direct_ep": [d_ep.host, d_ep.port, d_ep.path, d_ep.netloc],
            "proxied_ep": [p_ep.host, p_ep.port, p_ep.path, p_ep.netloc],
            "body": chat_body(args.model, args.stream),
            "direct_headers": direct_headers,
            "proxied_headers": proxied_headers,
            "warmup": args.warmup,
            "rounds": args.rounds,
            "requests": args.requests,
            "concurrency": args.concurrency,
            "duration": args.duration,
            "segments": args.segments,
            "sessions": args.sessions,
            "turn_profile": args.turn_profile,
            "turns": args.turns,
            "turn_batch": args.turn_batch,
            "proxy_pid": proxy_pid,
        }
        info["config"] = {
            "mode": args.mode,
            "stream": args.stream,
            "proxy": proxy_name,
            "direct": direct_url,
            "proxied": proxied_url,
            "mode_header": mode_header,
            "warmup": args.warmup,
            "rounds": args.rounds,
            "requests": args.requests,
            "concurrency": args.concurrency,
            "duration": args.duration,
            "segments": args.segments,
            "sessions": args.sessions if args.mode == "state" else None,
            "state_bytes": len(orjson.dumps(state)) if not args.target else None,
            "request_body_bytes": len(spec["body"]),
            "turn_profile": args.turn_profile,
            "proxy_args": args.proxy_arg,
            "client": "separate process; raw sockets + httptools (sequential), uvloop "
            "protocol (concurrency)",
        }
        raw = _run_client(spec, q)
    except (RuntimeError, OSError) as e:
        print(f"skillstate bench overhead: {e}", file=sys.stderr)
        return 1
    finally:
        if proxy is not None:
            proxy.stop()
        if upstream is not None:
            upstream.stop()
        tmp.cleanup()
    with contextlib.suppress(OSError, AttributeError):
        info["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    rep = _report(args, raw, info)
    print_report(rep)
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=2) + "\n")
        _say(q, f"wrote {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_overhead(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
