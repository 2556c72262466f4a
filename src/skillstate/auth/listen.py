"""The start-up rule: a listen address other than loopback needs client keys."""

from __future__ import annotations

import asyncio
import ipaddress
import sqlite3

from ..app.guards import LOOPBACK_HOSTS, host_name
from ..choices import AuthMode
from ..config import ConfigError, Settings
from ..store.factory import make_store, sqlite_path


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
    path = sqlite_path(settings)
    if path is None:
        return asyncio.run(_shared_store_has_keys(settings))
    db = sqlite3.connect(path)
    try:
        return bool(db.execute("SELECT count(*) FROM api_keys").fetchone()[0])
    except sqlite3.OperationalError:
        return False  # no keys table yet: a store no key was ever created in
    finally:
        db.close()


async def _shared_store_has_keys(settings: Settings) -> bool:
    store = make_store(settings)
    await store.open()
    try:
        return await store.has_keys()
    finally:
        await store.close()


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
