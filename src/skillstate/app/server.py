"""Running the app: the foreground server for the CLI, and an in-process server in a
background thread for the demo, benchmarks and tests."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import __version__
from ..auth.listen import check_listen
from ..config import ConfigError, Settings
from ..store import StoreError
from ..store.factory import describe_store, make_store
from ..urltext import masked
from .factory import create_app
from .httplimits import HttpLimits, LimitedHttpToolsProtocol, limited_protocol


def bind(host: str, port: int) -> socket.socket:
    """Bind before start-up so that a busy port is one clear line, and port 0 is known."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"port: cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def preflight_store(settings: Settings) -> None:
    """Open the store once, exactly as the proxy will, so that an unusable store is one
    line before binding rather than a traceback after "listening" (``Store.preflight``)."""
    try:
        store = make_store(settings)
    except StoreError as e:
        raise ConfigError(f"store: {e}") from None
    store.preflight()


class StartupErrors:
    """The app, with a start-up that fails for a known reason (a store that cannot be opened
    after the pre-flight, e.g. in-process) reported in one line instead of the traceback
    uvicorn logs. ``failure`` is that line; the server's runner shows it. Anything else
    still fails with its traceback."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.failure: str | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        held: list[Message] = []

        async def hold_failure(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed":
                held.append(message)  # sent once the exception says what failed
            else:
                await send(message)

        try:
            await self.app(scope, receive, hold_failure)
        except (StoreError, ConfigError, OSError) as e:
            self.failure = str(e)
            await send({"type": "lifespan.startup.failed", "message": ""})
        except BaseException:
            for message in held:
                await send(message)
            raise

    def filter(self, record: logging.LogRecord) -> bool:
        """Drops uvicorn's own "Application startup failed" once ``failure`` says why."""
        return not (self.failure and record.getMessage().startswith("Application startup failed"))


def _uvicorn_config(
    settings: Settings,
    tracer_provider: Any = None,
    clock: Callable[[], float] = time.time,
    app: StartupErrors | None = None,
) -> uvicorn.Config:
    limits = HttpLimits(
        max_header_bytes=settings.max_header_bytes,
        header_timeout=settings.header_timeout,
        body_timeout=settings.body_timeout,
        max_connections=settings.max_connections,
    )
    return uvicorn.Config(
        app or create_app(settings, tracer_provider=tracer_provider, clock=clock),
        loop="uvloop",
        http=limited_protocol(limits),
        # No WebSocket protocol: a handshake is refused with a JSON 426 (``httprefusals``),
        # whether or not a WebSocket library happens to be installed.
        ws="none",
        # Nothing reads the client address, so no X-Forwarded-For rewriting on every request.
        proxy_headers=False,
        lifespan="on",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=30,
        server_header=False,
    )


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}"


# The cyclic GC's first threshold for a serving process (CPython's default: 700). The objects
# of the turns in flight count towards it: at 64 connections of state turns the default ran a
# collection every ~8 turns, 12% of the proxy's CPU (gc.callbacks around an in-process run of
# 1,500 turns: 0.21 ms of 1.75 ms per turn); at 20,000 none ran in 1,500 turns. What it
# delays is freeing reference cycles, which a turn rarely makes: memory stays bounded by it.
GC_THRESHOLD = 20_000


def tune_gc() -> None:
    """Make the cyclic GC cheap for a long-running server: what exists after start-up
    (modules, the app) is moved out of the collected generations (``gc.freeze``: a full
    collection then scans only what turns made), and the first threshold is raised."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])


def serve(settings: Settings, before_listening: Callable[[], None] | None = None) -> int:
    """Serve in the foreground until SIGINT/SIGTERM; in-flight requests finish first.
    ``before_listening``: called once the app is built, before the proxy says it listens
    and serves (the CLI raises there a Ctrl-C that start-up could not raise)."""
    preflight_store(settings)
    check_listen(settings)
    sock = bind(settings.host, settings.port)
    if settings.verbose:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    else:
        logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    app = _startup_errors(create_app(settings))
    server = _Server(_uvicorn_config(settings, app=app))
    if before_listening is not None:
        before_listening()
    ups = ", ".join(f"{u.name}={masked(u.url)}" for u in settings.upstreams) or "none"
    print(
        f"skillstate-proxy {__version__} listening on {_url(sock)}"
        f"  mode={settings.mode} upstreams: {ups}  store: {describe_store(settings)}",
        flush=True,
    )
    print(dashboard_line(sock), flush=True)
    tune_gc()  # the process is this server from now on (not the in-process ProxyServer)
    try:
        server.run(sockets=[sock])
    except SystemExit:  # uvicorn's exit when the start-up failed
        if app.failure is not None:
            raise ConfigError(app.failure) from None
        raise
    return 0


class _Server(uvicorn.Server):
    """uvicorn's server, which also writes the HTTP refusals counted since the log's last
    line on them as it shuts down (``RefusalLog.flush``: that line comes a minute after
    the first refusal). Here, not after ``run``: after a SIGTERM, uvicorn raises it again
    once shut down, and the process ends there."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets=sockets)
        protocol = self.config.http
        if isinstance(protocol, type) and issubclass(protocol, LimitedHttpToolsProtocol):
            protocol.refusals.flush()


def _startup_errors(app: ASGIApp) -> StartupErrors:
    wrapped = StartupErrors(app)
    logging.getLogger("uvicorn.error").addFilter(wrapped)
    return wrapped


def dashboard_line(sock: socket.socket) -> str:
    """Where a person opens the dashboard. A wildcard listener's own address is no URL: the
    loopback one works on this machine, and a name others use must be in allowed_hosts."""
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", "::"):
        local = f"http://{'[::1]' if host == '::' else '127.0.0.1'}:{port}/ui/"
        return (
            f"dashboard: {local} on this machine; from others http://<name>:{port}/ui/ "
            "with <name> in allowed_hosts"
        )
    return f"dashboard: {_url(sock)}/ui/"


class ProxyServer:
    """A real proxy on loopback in a background thread (its own event loop).

    with ProxyServer(settings) as proxy:
        client = OpenAI(base_url=proxy.url + "/v1", api_key="x")
    """

    def __init__(
        self,
        settings: Settings,
        tracer_provider: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._sock = bind(settings.host, settings.port)
        self.url = _url(self._sock)
        # tracer_provider: an OpenTelemetry TracerProvider of the caller's (a test's in-memory
        # exporter) instead of the OTLP one the settings would make.
        self._app = _startup_errors(
            create_app(settings, tracer_provider=tracer_provider, clock=clock)
        )
        self._server = _Server(_uvicorn_config(settings, app=self._app))
        # uvicorn installs signal handlers only on the main thread, so none here.
        self._thread = threading.Thread(target=self._run, name="skillstate-proxy", daemon=True)

    def _run(self) -> None:
        try:
            import uvloop

            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._server.serve(sockets=[self._sock]))
        except SystemExit:  # uvicorn's exit when the start-up failed: start() says why
            if self._app.failure is None:
                raise
        finally:
            loop.close()

    def start(self) -> ProxyServer:
        self._thread.start()
        try:
            while not self._server.started:
                if not self._thread.is_alive():
                    failure = self._app.failure or "see the log"
                    raise RuntimeError(f"the in-process proxy failed to start: {failure}")
                threading.Event().wait(0.01)
        finally:
            logging.getLogger("uvicorn.error").removeFilter(self._app)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
