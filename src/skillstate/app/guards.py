"""Refuse requests a web browser could send on a web page's behalf, on every route.

The proxy has no authentication of its own: whoever reaches its port spends the operator's
keys and reads every session's state. A browser reaches loopback too, from any page the user
opens, in two ways this module closes:

* **DNS rebinding**: a page on ``evil.example`` makes its name resolve to 127.0.0.1 and then
  talks to the proxy as "same origin". The browser still sends ``Host: evil.example``, so only
  the configured host names are served: loopback names by default, plus ``allowed_hosts``
  (the listen host too when it is a specific address). A request without a Host header is
  refused too (HTTP/1.1 requires one; every browser sends it).
* **Cross-site requests**: a page's ``fetch`` carries its ``Origin``. Any ``Origin`` other
  than the proxy's own (a page it serves itself) or one listed in ``allowed_origins`` is
  refused. (Bodies that need no CORS preflight are refused by their content type, see
  ``skillstate.web.wire.read_json_object``.)

Refusals are 403 in the client's dialect. The cost is one pass over the request headers.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from ..config import Settings
from ..errors import ProxyError
from ..web.wire import dialect_for, error_response

__all__ = ["LOOPBACK_HOSTS", "BrowserGuard", "host_name"]

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})
_WILDCARD_LISTEN = frozenset({"", "0.0.0.0", "[::]"})
_SHOWN = 100  # characters of a refused header value repeated in the error
_HOSTS_REMEMBERED = 64  # distinct Host values whose verdict is kept


def host_name(value: str) -> str:
    """The host part of a Host header or listen address, as compared: lower case, no port,
    no trailing dot, IPv6 in brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        name = value[: value.find("]") + 1] if "]" in value else value
    elif value.count(":") > 1:  # a bare IPv6 address (a listen host, never a Host header)
        name = f"[{value}]"
    else:
        name = value.partition(":")[0]
    return name.rstrip(".")


class BrowserGuard:
    """Pure ASGI middleware: 403 for a Host not configured or an Origin not allowed."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        hosts = {host_name(h) for h in settings.allowed_hosts}
        self.any_host = "*" in hosts
        listen = host_name(settings.host)
        if listen not in _WILDCARD_LISTEN:
            hosts.add(listen)
        self.hosts = frozenset(LOOPBACK_HOSTS | hosts)
        origins = {o.strip().rstrip("/").lower() for o in settings.allowed_origins}
        self.any_origin = "*" in origins
        self.origins = frozenset(o.encode("latin-1") for o in origins)
        # Host header values already judged, as sent: the verdict depends on the bytes and
        # the settings alone, and a client sends the same Host on every request. Bounded,
        # since the values are the client's: past the bound, new values are judged anew.
        self._hosts_judged: dict[bytes, bool] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = origin = None
        anthropic_version = False
        for name, value in scope["headers"]:
            if name == b"host":
                host = value
            elif name == b"origin":
                origin = value
            elif name == b"anthropic-version":
                anthropic_version = True
        refusal = self._refusal(host, origin)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        response = error_response(refusal, dialect_for(scope["path"], anthropic_version))
        await response(scope, receive, send)

    def _refusal(self, host: bytes | None, origin: bytes | None) -> ProxyError | None:
        if host is None:
            return ProxyError("permission", "a Host header is required")
        if not self._host_served(host):
            shown = host.decode("latin-1")[:_SHOWN]
            return ProxyError(
                "permission",
                f"Host {shown!r} is not served here (DNS rebinding protection); "
                "add its name to allowed_hosts to serve it",
            )
        if origin is None or self.any_origin:
            return None
        lowered = origin.lower().rstrip(b"/")
        if lowered in self.origins or lowered == b"http://" + host.lower():
            return None  # listed, or the proxy's own page (its Host was checked above)
        shown = origin.decode("latin-1")[:_SHOWN]
        return ProxyError(
            "permission",
            f"Origin {shown!r} may not call this proxy (cross-origin requests are refused); "
            "add it to allowed_origins to allow it",
        )

    def _host_served(self, host: bytes) -> bool:
        served = self._hosts_judged.get(host)
        if served is None:
            served = self.any_host or host_name(host.decode("latin-1")) in self.hosts
            if len(self._hosts_judged) < _HOSTS_REMEMBERED:
                self._hosts_judged[host] = served
        return served
