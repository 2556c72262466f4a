"""Who is calling: the key check on every route, and the verified-key cache behind it.

Auth is on when the store holds any key or ``auth: required`` is set. Then every request
but ``/health`` (liveness only without an admin key), ``/metrics`` (``metrics_token`` or an
admin key) and the dashboard's static files needs a key, sent the way its SDK sends it:
``Authorization: Bearer`` (OpenAI) or ``x-api-key`` (Anthropic). A missing, wrong, expired
or revoked key is a 401 in the caller's dialect. The key is removed from the request before
any handler sees it, so it never reaches an upstream.

Wrong keys are counted per client address (``auth.failures``): past ``wrong_key_limit`` in
``wrong_key_window`` the address gets a 429 with ``Retry-After`` before its key is hashed.

Cost per request: one HMAC-SHA256 of the key and a dict lookup; the store is only asked on
a cache miss or after ``auth_cache_ttl`` seconds, which is also how soon a revocation made
by ``skillstate keys`` in another process takes effect.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from ..choices import AuthMode
from ..config import Settings
from ..errors import ProxyError
from ..store import Store, StoreError
from ..web.wire import dialect_for, error_response
from .failures import WrongKeyLimiter
from .keys import KeyHasher, same_digest
from .record import KeyRecord

__all__ = ["PRINCIPAL", "KeyBook", "KeyGate", "Principal", "principal_of"]

PRINCIPAL = "skillstate.key"  # the ASGI scope entry holding the caller's Principal
# Answered without a client key: /health (liveness only), /metrics (its own metrics_token,
# or an admin key). Nothing on them goes upstream, so their headers are left as they are.
_OPEN_PATHS = ("/health", "/metrics")
_OPEN_PREFIXES = ("/ui/",)  # static files with no data in them (the data routes need a key)
_CREDENTIALS = (b"authorization", b"x-api-key")
_MAX_CACHED = 10_000  # entries (wrong keys included) before the cache starts over


@dataclass(frozen=True, slots=True)
class Principal:
    """The verified caller: its key's name (for tenancy, limits and logs), never the key."""

    name: str
    admin: bool
    record: KeyRecord


def principal_of(scope: Scope) -> Principal | None:
    """The caller of this request; None when auth is off (or on an open route, unkeyed)."""
    p: Principal | None = scope.get(PRINCIPAL)
    return p


class KeyBook:
    """Verified keys, by digest, for ``ttl`` seconds; and whether auth is on."""

    def __init__(
        self,
        store: Store,
        hasher: KeyHasher,
        settings: Settings,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.hasher = hasher
        self.ttl = settings.auth_cache_ttl
        self.required = settings.auth == AuthMode.REQUIRED
        self.on = self.required
        self._monotonic = monotonic
        self._wall = wall
        self._cache: dict[str, tuple[KeyRecord | None, float]] = {}
        self._mode_checked = -float("inf")
        self.wrong_keys = WrongKeyLimiter(settings.wrong_key_limit, settings.wrong_key_window)

    def __len__(self) -> int:
        """Digests cached now, wrong keys' included (at most ``_MAX_CACHED``)."""
        return len(self._cache)

    def forget(self, name: str) -> None:
        """Drop what is cached of the key ``name`` (revoked or rotated here: the change
        takes effect at once on this replica)."""
        for digest in [d for d, (r, _) in self._cache.items() if r is not None and r.name == name]:
            del self._cache[digest]

    async def refresh_mode(self) -> bool:
        """Auth is on once a key exists (checked at most every ``ttl`` seconds while off)."""
        if self.mode_due():
            self._mode_checked = self._monotonic()
            self.on = self.required or await self.store.has_keys()
        return self.on

    def mode_due(self) -> bool:
        """Whether ``refresh_mode`` would ask the store (auth off, and ``ttl`` is up): a
        request checks this first, so one with nothing to refresh awaits nothing."""
        return not self.on and self._monotonic() - self._mode_checked >= self.ttl

    async def verify(self, key: str) -> Principal:
        """The key's principal, or ProxyError 401 (unknown, revoked or expired); 503 when
        the store cannot answer."""
        digest = self.hasher.digest(key)
        now = self._monotonic()
        hit = self._cache.get(digest)
        if hit is not None and now - hit[1] < self.ttl:
            record = hit[0]
        else:
            try:
                record = await self.store.key_by_digest(digest)
            except StoreError as e:
                raise e.for_client("could not verify the API key") from e
            if len(self._cache) >= _MAX_CACHED:
                self._cache.clear()
            self._cache[digest] = (record, now)
        if record is None or not same_digest(record.digest, digest):
            raise _unauthorized("invalid API key")
        refusal = record.refusal(self._wall())
        if refusal is not None:
            raise _unauthorized(refusal)
        return Principal(record.name, record.admin, record)


def _unauthorized(message: str) -> ProxyError:
    return ProxyError("authentication", message, code="invalid_api_key")


def presented_key(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The key as the SDKs send it: ``Authorization: Bearer KEY`` or ``x-api-key: KEY``."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
        elif name == b"x-api-key" and value.strip():
            return value.decode("latin-1").strip()
    return None


class KeyGate:
    """Pure ASGI middleware: with auth on, a verified key or a 401; the key itself is
    removed from the request (never forwarded upstream)."""

    def __init__(self, app: ASGIApp, keys: KeyBook) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        path: str = scope["path"]
        open_route = path in _OPEN_PATHS or path == "/ui" or path.startswith(_OPEN_PREFIXES)
        try:
            on = await self.keys.refresh_mode() if self.keys.mode_due() else self.keys.on
        except StoreError as e:
            # Whether keys exist is unknown while the store cannot answer (a PostgreSQL
            # store down): refused (503), never let through unauthenticated. Open routes
            # (/health) answer as in the last known mode.
            on = self.keys.on
            if not open_route:
                anthropic = any(n == b"anthropic-version" for n, _ in headers)
                response = error_response(
                    e.for_client("could not check the API keys"), dialect_for(path, anthropic)
                )
                await response(scope, receive, send)
                return
        if not on:
            await self.app(scope, receive, send)
            return
        key = presented_key(headers)
        address = _address(scope)
        wait = None if key is None else self.keys.wrong_keys.refused_for(address)
        if wait is not None:
            key = None  # not hashed: this address sent too many wrong keys lately
            if not open_route:
                await self._refuse(scope, receive, send, _too_many_wrong_keys(wait))
                return
        try:
            if key is None:
                if not open_route:
                    raise _unauthorized(
                        "an API key is required: send it as 'Authorization: Bearer KEY' or "
                        "'x-api-key: KEY'"
                    )
            else:
                scope[PRINCIPAL] = await self.keys.verify(key)
        except ProxyError as e:
            if key is not None and e.status == 401:
                self.keys.wrong_keys.failed(address)
            if not open_route:
                await self._refuse(scope, receive, send, e)
                return
        if not open_route:
            scope["headers"] = [(n, v) for n, v in headers if n not in _CREDENTIALS]
        await self.app(scope, receive, send)

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, err: ProxyError) -> None:
        """Answer ``err`` in the dialect of the route asked for."""
        anthropic = any(n == b"anthropic-version" for n, _ in scope["headers"])
        response = error_response(err, dialect_for(scope["path"], anthropic))
        await response(scope, receive, send)


def _address(scope: Scope) -> str:
    """The client's address (the TCP peer; "" when the server does not say)."""
    client = scope.get("client")
    return str(client[0]) if client else ""


def _too_many_wrong_keys(wait: float) -> ProxyError:
    return ProxyError(
        "rate_limit",
        "too many wrong API keys from this address; try again after the Retry-After delay",
        code="too_many_wrong_keys",
        retry_after=wait,
    )
