"""Client keys' operations: create, list, revoke, rotate. One definition each, for
``skillstate keys`` (the CLI, straight on the store) and ``/admin/keys`` (HTTP, an admin
key's). Every change writes one audit line (logger ``skillstate.audit``): what was done to
which key, and by whom (``cli``, or ``key:<admin key name>`` with the client's address).

A new key (create, rotate) is returned once and never stored: the store keeps its digest.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..store import Store
from .keys import KeyHasher, check_name, new_key, parse_duration
from .record import KeyRecord

audit_log = logging.getLogger("skillstate.audit")
audit_log.setLevel(logging.INFO)  # shown by the server's log at its default level too

LIMITS = ("rpm", "tpm", "budget_usd_per_day", "max_session_budget_usd")
# The largest limit a key takes: the largest integer a JSON reader (the dashboard's
# JavaScript) keeps exact, far below what the stores' 64-bit integers hold.
MAX_LIMIT = 2**53 - 1


class KeyRefused(Exception):
    """An operation refused, in one line; ``status`` is its HTTP status (400: a bad value,
    404: no such key, 409: the name is taken or the key is revoked)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class KeySpec:
    """What a new key is made with; ``expires``: a duration such as ``30d`` or ``12h``."""

    name: str
    admin: bool = False
    rpm: int | None = None
    tpm: int | None = None
    budget_usd_per_day: float | None = None
    expires: str | None = None
    max_session_budget_usd: float | None = None  # what its sessions may set (and their default)
    allow_unpriced: bool = False  # calls to unpriced models go through under a budget


@dataclass(frozen=True, slots=True)
class KeyChange:
    """A key as it is after an operation, and its new secret (create, rotate) shown once."""

    record: KeyRecord
    secret: str | None = None


class KeyAdmin:
    """The operations on one store's keys, done by ``by`` (named in the audit lines)."""

    def __init__(self, store: Store, hasher: KeyHasher, by: str) -> None:
        self.store = store
        self.hasher = hasher
        self.by = by

    async def create(self, spec: KeySpec) -> KeyChange:
        try:
            name = check_name(spec.name)
            expires = time.time() + parse_duration(spec.expires) if spec.expires else None
        except ValueError as e:
            raise KeyRefused(str(e)) from None
        for limit in LIMITS:
            value = getattr(spec, limit)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise KeyRefused(f"{limit} must be a finite number > 0")
            if value is not None and value > MAX_LIMIT:
                raise KeyRefused(f"{limit} must be at most {MAX_LIMIT:,}")
        if any(r.name == name for r in await self.store.keys()):
            raise KeyRefused(f"a key named {name!r} already exists", 409)
        key = new_key()
        record = KeyRecord(
            name=name,
            digest=self.hasher.digest(key),
            admin=spec.admin,
            rpm=spec.rpm,
            tpm=spec.tpm,
            budget_usd_per_day=spec.budget_usd_per_day,
            created=time.time(),
            expires=expires,
            max_session_budget_usd=spec.max_session_budget_usd,
            allow_unpriced=spec.allow_unpriced,
        )
        await self.store.save_key(record, new=True)
        limits = "".join(f" {k}={getattr(spec, k)}" for k in LIMITS if getattr(spec, k))
        unpriced = " allow_unpriced=true" if spec.allow_unpriced else ""
        self._audit("created", name, f" admin={str(spec.admin).lower()}{limits}{unpriced}")
        return KeyChange(record, key)

    async def list(self) -> list[KeyRecord]:
        return await self.store.keys()

    async def revoke(self, name: str, *, keep_an_admin: bool = False) -> KeyChange:
        """Revoke the key (again: unchanged). ``keep_an_admin`` (``/admin/keys``): refuse
        (409) to revoke the last active admin key, which would leave no key that can manage
        the keys over HTTP; the CLI on the host may (``keys create --admin`` is its way back)."""
        records = await self.store.keys()
        record = next((r for r in records if r.name == name), None)
        if record is None:
            raise KeyRefused(f"no key named {name!r}", 404)
        now = time.time()
        if keep_an_admin and record.admin and record.refusal(now) is None:
            others = [r for r in records if r.admin and r.name != name and r.refusal(now) is None]
            if not others:
                raise KeyRefused(
                    f"{name!r} is the last active admin key: revoked, no key could manage the"
                    " keys over HTTP; create another admin key first, or revoke it on the host"
                    f" with `skillstate keys revoke {name}`",
                    409,
                )
        if record.revoked is None:
            record = dataclasses.replace(record, revoked=time.time())
            await self.store.save_key(record, new=False)
            self._audit("revoked", name)
        return KeyChange(record)

    async def rotate(self, name: str) -> KeyChange:
        record = await self.find(name)
        if record.revoked is not None:
            raise KeyRefused(f"{name!r} is revoked; create a new key instead", 409)
        key = new_key()
        record = dataclasses.replace(record, digest=self.hasher.digest(key))
        await self.store.save_key(record, new=False)
        self._audit("rotated", name)
        return KeyChange(record, key)

    async def find(self, name: str) -> KeyRecord:
        for record in await self.store.keys():
            if record.name == name:
                return record
        raise KeyRefused(f"no key named {name!r}", 404)

    def _audit(self, done: str, name: str, details: str = "") -> None:
        audit_log.info("audit: key %s name=%s%s by=%s", done, name, details, self.by)


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    try:
        return datetime.fromtimestamp(ts, timezone.utc).isoformat()
    except (OverflowError, OSError, ValueError):  # kept before durations had a bound
        return datetime.max.replace(tzinfo=timezone.utc).isoformat()


def shown(r: KeyRecord) -> dict[str, Any]:
    """What a listing shows of a key: everything but its digest."""
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
