"""`skillstate keys create|list|revoke|rotate`: client keys managed straight in the store
(the proxy may be running: it sees a change within ``auth_cache_ttl``). Every failure is one
line (ConfigError); a new key is printed once and never stored. The operations and their
audit lines (on stderr) are ``skillstate.auth.admin``'s, shared with ``/admin/keys``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from ..auth.admin import LIMITS, KeyAdmin, KeyRefused, KeySpec, shown
from ..auth.keys import KeyHasher, server_secret
from ..config import ConfigError, Settings
from ..cost.budgets import usd_amount
from ..numbertext import whole_number
from ..store import Store, StoreError
from ..store.factory import describe_store, make_store


def _usd(text: str) -> float:
    """A budget option's USD, in the budget header's grammar (``cost.budgets.usd_amount``):
    argparse's ``float`` would take ``1_000`` as 1000 and a full-width ``１`` as 1."""
    usd = usd_amount(text)
    if usd is None:
        raise argparse.ArgumentTypeError(
            f"must be a positive number of USD, like 5.00 (got {text!r})"
        )
    return usd


def _per_minute(text: str) -> int:
    """A rate limit: a whole number >= 1 in ASCII digits (``int`` also takes ``1_000``)."""
    text = text.strip()
    rate = whole_number(text)
    if rate is None or rate < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1 (got {text!r})")
    return rate


def add_keys_parser(sub: Any) -> None:
    """The ``keys`` command and its subcommands."""
    keys = sub.add_parser("keys", help="client keys: create, list, revoke, rotate")
    _store_flags(keys)
    ks = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    create = ks.add_parser("create", help="make a key; it is printed once")
    _store_flags(create)
    create.add_argument("--name", required=True)
    create.add_argument("--budget-usd-per-day", type=_usd, default=None, metavar="USD")
    create.add_argument("--rpm", type=_per_minute, default=None, help="requests per minute")
    create.add_argument("--tpm", type=_per_minute, default=None, help="tokens per minute")
    create.add_argument("--expires", default=None, metavar="DURATION", help="e.g. 30d, 12h")
    create.add_argument("--admin", action="store_true", help="may see and change every key's data")
    create.add_argument(
        "--max-session-budget-usd",
        type=_usd,
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
    _store_flags(listing)
    listing.add_argument("--json", action="store_true")
    for action, text in (("revoke", "refuse a key from now on"), ("rotate", "new secret")):
        p = ks.add_parser(action, help=text)
        _store_flags(p)
        p.add_argument("name")


def _store_flags(p: argparse.ArgumentParser) -> None:
    """Which store: on ``keys`` and after each action too (``keys list --data-dir X``, as
    ``cost`` takes them after the command). SUPPRESS keeps a value given earlier on the line."""
    p.add_argument("--data-dir", metavar="DIR", default=argparse.SUPPRESS)
    p.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS)


def run_keys(settings: Settings, args: argparse.Namespace) -> int:
    """Run one ``keys`` subcommand against the store in the data dir."""
    action = _ACTIONS[args.keys_command]
    # The audit line goes to stderr (the output to stdout); a no-op when logging is set up.
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)

    try:
        store = make_store(settings)
    except StoreError as e:
        raise ConfigError(f"store: {e}") from None
    # Only `create` makes a store (the first key, before a proxy ever ran): the others on a
    # mistyped --data-dir would leave a new empty store behind and report no keys.
    if args.keys_command != "create" and not store.exists():
        raise ConfigError(f"data_dir: no store at {describe_store(settings)}")

    async def run() -> str:
        try:
            await store.open()
            admin = KeyAdmin(store, await _hasher(settings, store), by="cli")
            return await action(admin, args)
        finally:
            await store.close()

    try:
        out = asyncio.run(run())
    except StoreError as e:
        raise ConfigError(f"keys: {e}") from None
    except KeyRefused as e:
        raise ConfigError(f"keys {args.keys_command}: {e}") from None
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


async def _create(admin: KeyAdmin, args: argparse.Namespace) -> str:
    spec = KeySpec(
        name=args.name,
        admin=bool(args.admin),
        rpm=args.rpm,
        tpm=args.tpm,
        budget_usd_per_day=args.budget_usd_per_day,
        expires=args.expires,
        max_session_budget_usd=args.max_session_budget_usd,
        allow_unpriced=bool(args.allow_unpriced),
    )
    change = await admin.create(spec)
    assert change.secret is not None
    return change.secret


async def _revoke(admin: KeyAdmin, args: argparse.Namespace) -> str:
    return f"revoked {(await admin.revoke(args.name)).record.name}"


async def _rotate(admin: KeyAdmin, args: argparse.Namespace) -> str:
    change = await admin.rotate(args.name)
    assert change.secret is not None
    return change.secret


async def _list(admin: KeyAdmin, args: argparse.Namespace) -> str:
    rows = [shown(r) for r in await admin.list()]
    if args.json:
        return orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode()
    if not rows:
        return "no keys (auth is off unless auth: required)"
    lines = []
    for r in rows:
        limits = " ".join(f"{k}={r[k]}" for k in LIMITS if r[k] is not None)
        marks = [m for m in ("admin", "allow_unpriced") if r[m]]
        flags = " ".join([*marks, r["status"]])
        expires = f" expires={r['expires']}" if r["expires"] else ""
        lines.append(f"{r['name']}  {flags}{expires} {limits}".rstrip())
    return "\n".join(lines)


_ACTIONS: dict[str, Callable[[KeyAdmin, argparse.Namespace], Awaitable[str]]] = {
    "create": _create,
    "list": _list,
    "revoke": _revoke,
    "rotate": _rotate,
}
