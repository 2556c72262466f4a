"""A minimal, very fast OpenAI-compatible upstream for overhead benchmarks.

It answers ``POST /v1/chat/completions`` immediately with a fixed, small
``chat.completion`` (or, for ``"stream": true``, a short SSE stream that ends with a
usage chunk and ``[DONE]``), plus ``GET /v1/models`` and ``GET /health``. The reply
content is a valid skillstate envelope::

    ```json
    {"reasoning": "...", "state_patch": {"step": N, "last_action": "..."}, "action": "..."}
    ```

so that a proxy in state mode commits a small update each turn (``step`` counts the
replies this server has sent; ``last_action`` is fixed), while a proxy in passthrough
mode just forwards it.

It is a raw ``asyncio.Protocol`` on uvloop with the httptools parser (no framework), and
runs in its own process so it never shares a GIL with the client or the proxy::

    python -m skillstate.bench.fastupstream --port 0
    # prints: fastupstream listening on http://127.0.0.1:PORT

``start_fast_upstream()`` starts one as a subprocess and returns it with its URL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any, cast

import httptools
import orjson

__all__ = ["FastUpstream", "envelope_text", "main", "start_fast_upstream"]

READY_PREFIX = "fastupstream listening on "
_URL_RE = re.compile(r"http://127\.0\.0\.1:\d+")

_BAD_BODY = b'{"error":{"message":"body must be a JSON object","type":"invalid_request_error"}}'
_ACTION = "run_tests"
_REASONING = "Tests were written; next run them."


def envelope_text(step: int) -> str:
    """The reply content: a fenced JSON envelope with a small state patch."""
    env = {
        "reasoning": _REASONING,
        "state_patch": {"step": step, "last_action": _ACTION},
        "action": _ACTION,
    }
    return "```json\n" + orjson.dumps(env).decode() + "\n```"


def _usage(prompt_bytes: int) -> dict[str, int]:
    prompt = max(1, prompt_bytes // 4)
    return {"prompt_tokens": prompt, "completion_tokens": 24, "total_tokens": prompt + 24}


def _head(status: bytes, ctype: bytes, length: int | None, keep_alive: bool) -> bytes:
    parts = [b"HTTP/1.1 ", status, b"\r\ncontent-type: ", ctype, b"\r\n"]
    if length is None:
        parts.append(b"transfer-encoding: chunked\r\n")
    else:
        parts += [b"content-length: ", str(length).encode(), b"\r\n"]
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _State:
    """Per-process counters shared by all connections."""

    __slots__ = ("created", "replies")

    def __init__(self) -> None:
        self.replies = 0
        self.created = int(time.time())


class _HttpProtocol(asyncio.Protocol):
    __slots__ = ("_body", "_keep_alive", "_method", "_parser", "_state", "_transport", "_url")

    def __init__(self, state: _State) -> None:
        self._state = state
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._body: list[bytes] = []
        self._method = b""
        self._keep_alive = True

    # asyncio callbacks --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reply(b"400 Bad Request", b"application/json", b'{"error":"upgrade"}', False)
        except httptools.HttpParserError:
            self._reply(b"400 Bad Request", b"application/json", b'{"error":"bad request"}', False)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    # httptools callbacks ------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url = b""
        self._body = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._method = self._parser.get_method()
        self._keep_alive = self._parser.should_keep_alive()
        path = self._url.split(b"?", 1)[0]
        if path.endswith(b"/chat/completions") and self._method == b"POST":
            self._chat(b"".join(self._body))
        elif path.endswith(b"/models") and self._method == b"GET":
            body = orjson.dumps(
                {
                    "object": "list",
                    "data": [
                        {
                            "id": "bench-model",
                            "object": "model",
                            "created": self._state.created,
                            "owned_by": "fastupstream",
                        }
                    ],
                }
            )
            self._reply(b"200 OK", b"application/json", body, self._keep_alive)
        elif path in (b"/health", b"/v1/health", b"/healthz"):
            self._reply(b"200 OK", b"application/json", b'{"status":"ok"}', self._keep_alive)
        else:
            self._reply(
                b"404 Not Found",
                b"application/json",
                b'{"error":{"message":"not found","type":"invalid_request_error"}}',
                self._keep_alive,
            )

    # replies ------------------------------------------------------------------------
    def _reply(self, status: bytes, ctype: bytes, body: bytes, keep_alive: bool) -> None:
        t = self._transport
        if t is None:
            return
        t.write(_head(status, ctype, len(body), keep_alive) + body)
        if not keep_alive:
            t.close()

    def _chat(self, raw: bytes) -> None:
        try:
            req: Any = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            req = None
        if not isinstance(req, dict):
            self._reply(
                b"400 Bad Request",
                b"application/json",
                _BAD_BODY,
                self._keep_alive,
            )
            return
        st = self._state
        st.replies += 1
        n = st.replies
        model = req.get("model") or "bench-model"
        if not isinstance(model, str):
            model = "bench-model"
        content = envelope_text(n)
        cid = f"chatcmpl-fast{n}"
        usage = _usage(len(raw))
        if req.get("stream") is True:
            self._stream(cid, model, content, usage)
            return
        body = orjson.dumps(
            {
                "id": cid,
                "object": "chat.completion",
                "created": st.created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            }
        )
        self._reply(b"200 OK", b"application/json", body, self._keep_alive)

    def _stream(self, cid: str, model: str, content: str, usage: dict[str, int]) -> None:
        t = self._transport
        if t is None:
            return
        created = self._state.created

        def event(delta: dict[str, Any], finish: str | None) -> bytes:
            obj = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return _chunk(b"data: " + orjson.dumps(obj) + b"\n\n")

        # A short stream: role, content in a few pieces, finish, usage, [DONE].
        q = max(1, len(content) // 4)
        pieces = [content[i : i + q] for i in range(0, len(content), q)]
        out = [_head(b"200 OK", b"text/event-stream", None, self._keep_alive)]
        out.append(event({"role": "assistant", "content": ""}, None))
        out += [event({"content": p}, None) for p in pieces]
        out.append(event({}, "stop"))
        tail = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage,
        }
        out.append(_chunk(b"data: " + orjson.dumps(tail) + b"\n\n"))
        out.append(_chunk(b"data: [DONE]\n\n"))
        out.append(b"0\r\n\r\n")
        t.write(b"".join(out))
        if not self._keep_alive:
            t.close()


async def serve(host: str, port: int, *, ready: Any = None) -> None:
    """Serve until cancelled. ``ready(url)`` is called once the socket listens."""
    loop = asyncio.get_running_loop()
    state = _State()
    server = await loop.create_server(lambda: _HttpProtocol(state), host, port, backlog=1024)
    sock = server.sockets[0]
    url = f"http://{host}:{sock.getsockname()[1]}"
    if ready is not None:
        ready(url)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def _run(host: str, port: int) -> None:
    def ready(url: str) -> None:
        print(READY_PREFIX + url, flush=True)

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency of uvicorn[standard]
        asyncio.run(serve(host, port, ready=ready))
    else:
        uvloop.run(serve(host, port, ready=ready))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m skillstate.bench.fastupstream",
        description="A minimal, fast OpenAI-compatible upstream for overhead benchmarks.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    a = p.parse_args(argv)
    _run(a.host, a.port)
    return 0


class FastUpstream:
    """A fastupstream running in a subprocess (its own interpreter and GIL)."""

    def __init__(self, proc: subprocess.Popen[str], url: str) -> None:
        self.proc = proc
        self.url = url

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 5.0) -> None:
        p = self.proc
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout)

    def __enter__(self) -> FastUpstream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_fast_upstream(port: int = 0, *, timeout: float = 15.0) -> FastUpstream:
    """Start ``python -m skillstate.bench.fastupstream`` and wait for its URL."""
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "skillstate.bench.fastupstream", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    found: list[str] = []
    tail: deque[str] = deque(maxlen=40)
    got = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
            if not found:
                m = _URL_RE.search(line)
                if m:
                    found.append(m.group(0))
                    got.set()
        got.set()

    threading.Thread(target=reader, name="fastupstream-out", daemon=True).start()
    if not got.wait(timeout) or not found:
        proc.kill()
        proc.wait()
        raise RuntimeError("fastupstream did not start:\n" + "\n".join(tail))
    return FastUpstream(proc, found[0])


if __name__ == "__main__":
    sys.exit(main())
