"""`skillstate keys create|list|revoke|rotate`: client keys managed straight in the store
(the proxy may be running: it sees a change within ``auth_cache_ttl``). Every failure is one
line (ConfigError); a new key is printed once and never stored."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any

import orjson

from ..auth.keys import KeyHasher, check_name, new_key, parse_duration, server_secret
from ..auth.record import KeyRecord
from ..config import ConfigError, Settings
from ..store import Store, StoreError
from ..store.factory import make_store


def add_keys_parser(sub: Any) -> None:
    """The ``keys`` command and its subcommands."""
    keys = sub.add_parser("keys", help="client keys: create, list, revoke, rotate")
    keys.add_argument("--data-dir", metavar="DIR", default=argparse.SUPPRESS)
    keys.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS)
    ks = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    create = ks.add_parser("create", help="make a key; it is printed once")
    create.add_argument("--name", required=True)
    create.add_argument("--budget-usd-per-day", type=float, default=None, metavar="USD")
    create.add_argument("--rpm", type=int, default=None, help="requests per minute")
    create.add_argument("--tpm", type=int, default=None, help="tokens per minute")
    create.add_argument("--expires", default=None, metavar="DURATION", help="e.g. 30d, 12h")
    create.add_argument("--admin", action="store_true", help="may see and change every key's data")
    create.add_argument(
        "--max-session-budget-usd",
        type=float,
        default=None,
        metavar="USD",
        help="the most a session's budget may be (also the budget of sessions that set none)",
    )
    create.add_argument(
        "--allow-unpriced",
        action="store_true",
        help="under a budget, let calls to models without a price through (counted at the"
        " most expensive known model's price)",
    )
    listing = ks.add_parser("list", help="the keys (names and limits, never secrets)")
    listing.add_argument("--json", action="store_true")
    for action, text in (("revoke", "refuse a key from now on"), ("rotate", "new secret")):
        p = ks.add_parser(action, help=text)
        p.add_argument("name")


def run_keys(settings: Settings, args: argparse.Namespace) -> int:
    """Run one ``keys`` subcommand against the store in the data dir."""
    action: Callable[[Store, KeyHasher, argparse.Namespace], Awaitable[str]] = _ACTIONS[
        args.keys_command
    ]

    async def run() -> str:
        store = make_store(settings)
        try:
            await store.open()
            return await action(store, await _hasher(settings, store), args)
        finally:
            await store.close()

    try:
        out = asyncio.run(run())
    except StoreError as e:
        raise ConfigError(f"keys: {e}") from None
    print(out)
    return 0


async def _hasher(settings: Settings, store: Store) -> KeyHasher:
    """The store's shared secret (PostgreSQL), else the data dir's file (SQLite)."""
    shared = await store.shared_secret()
    if shared is not None:
        return KeyHasher(shared)
    try:
        return KeyHasher(server_secret(settings.data_dir))
    except StoreError as e:
        raise ConfigError(f"data_dir: {e}") from None


async def _create(store: Store, hasher: KeyHasher, args: argparse.Namespace) -> str:
    try:
        name = check_name(args.name)
        expires = time.time() + parse_duration(args.expires) if args.expires else None
    except ValueError as e:
        raise ConfigError(f"keys create: {e}") from None
    for flag in ("rpm", "tpm", "budget_usd_per_day", "max_session_budget_usd"):
        value = getattr(args, flag)
        if value is not None and not value > 0:
            raise ConfigError(f"keys create: --{flag.replace('_', '-')} must be > 0")
    key = new_key()
    record = KeyRecord(
        name=name,
        digest=hasher.digest(key),
        admin=bool(args.admin),
        rpm=args.rpm,
        tpm=args.tpm,
        budget_usd_per_day=args.budget_usd_per_day,
        created=time.time(),
        expires=expires,
        max_session_budget_usd=args.max_session_budget_usd,
        allow_unpriced=bool(args.allow_unpriced),
    )
    await store.save_key(record, new=True)
    return key


async def _find(store: Store, name: str) -> KeyRecord:
    for record in await store.keys():
        if record.name == name:
            return record
    raise ConfigError(f"keys: no key named {name!r}")


async def _revoke(store: Store, hasher: KeyHasher, args: argparse.Namespace) -> str:
    record = await _find(store, args.name)
    if record.revoked is None:
        await store.save_key(dataclasses.replace(record, revoked=time.time()), new=False)
    return f"revoked {record.name}"


async def _rotate(store: Store, hasher: KeyHasher, args: argparse.Namespace) -> str:
    record = await _find(store, args.name)
    if record.revoked is not None:
        raise ConfigError(f"keys rotate: {record.name!r} is revoked; create a new key instead")
    key = new_key()
    await store.save_key(dataclasses.replace(record, digest=hasher.digest(key)), new=False)
    return key


async def _list(store: Store, hasher: KeyHasher, args: argparse.Namespace) -> str:
    rows = [_shown(r) for r in await store.keys()]
    if args.json:
        return orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode()
    if not rows:
        return "no keys (auth is off unless auth: required)"
    lines = []
    for r in rows:
        limits = " ".join(f"{k}={r[k]}" for k in _LIMITS if r[k] is not None)
        marks = [m for m in ("admin", "allow_unpriced") if r[m]]
        flags = " ".join([*marks, r["status"]])
        expires = f" expires={r['expires']}" if r["expires"] else ""
        lines.append(f"{r['name']}  {flags}{expires} {limits}".rstrip())
    return "\n".join(lines)


_LIMITS = ("rpm", "tpm", "budget_usd_per_day", "max_session_budget_usd")


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, timezone.utc).isoformat()


def _shown(r: KeyRecord) -> dict[str, Any]:
    """What ``keys list`` shows of a key: everything but its digest."""
    status = r.refusal(time.time())
    return {
        "name": r.name,
        "admin": r.admin,
        "status": "revoked" if r.revoked else ("expired" if status else "active"),
        "rpm": r.rpm,
        "tpm": r.tpm,
        "budget_usd_per_day": r.budget_usd_per_day,
        "max_session_budget_usd": r.max_session_budget_usd,
        "allow_unpriced": r.allow_unpriced,
        "created": _iso(r.created),
        "expires": _iso(r.expires),
    }


_ACTIONS: dict[str, Callable[[Store, KeyHasher, argparse.Namespace], Awaitable[str]]] = {
    "create": _create,
    "list": _list,
    "revoke": _revoke,
    "rotate": _rotate,
}
