"""The client runs in its own interpreter: a pickled spec goes in on stdin, progress lines
and the result come back as length-prefixed pickled messages on a pipe."""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from .measure import client_run


def client_stdio() -> None:
    """Client process entry: a pickled spec on stdin; length-prefixed pickled messages on
    the file descriptor named by argv[1] (not stdout, which a library might write to)."""
    spec = pickle.load(sys.stdin.buffer)
    out = os.fdopen(int(sys.argv[1]), "wb")

    def send(msg: tuple[str, Any]) -> None:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        out.write(struct.pack("!I", len(data)) + data)
        out.flush()

    try:
        send(("result", client_run(spec, lambda m: send(("progress", m)))))
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


def run_client(spec: dict[str, Any], progress: Callable[[str], None]) -> dict[str, Any]:
    """Run the client in its own interpreter (so it shares no GIL with anything);
    ``progress`` gets its progress lines."""
    code = "from skillstate.bench.overhead.client_process import client_stdio; client_stdio()"
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
                    progress(payload)
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
