"""The start-up rule: a listen address other than loopback needs client keys."""

from __future__ import annotations

import asyncio
import ipaddress

from ..app.guards import LOOPBACK_HOSTS, host_name
from ..choices import AuthMode
from ..config import ConfigError, Settings
from ..store import StoreError
from ..store.factory import make_store


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a listen address or name) only accepts local connections."""
    name = host_name(host)
    if name in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost: whatever it resolves to may be public


def has_keys(settings: Settings) -> bool:
    """Whether the store holds any client key (after the store's pre-flight check)."""

    async def ask() -> bool:
        store = make_store(settings)
        await store.open()
        try:
            return await store.has_keys()
        finally:
            await store.close()

    try:
        return asyncio.run(ask())
    except StoreError as e:
        raise ConfigError(f"store: {e}") from None


def check_listen(settings: Settings) -> None:
    """Refuse (one line) a non-loopback listen without auth, unless --insecure-no-auth."""
    if is_loopback(settings.host) or settings.insecure_no_auth:
        return
    if settings.auth == AuthMode.REQUIRED or has_keys(settings):
        return
    raise ConfigError(
        f"host: listening on {settings.host} needs client keys: create one with "
        "`skillstate keys create --name NAME` (or set auth: required); "
        "--insecure-no-auth starts without them"
    )
