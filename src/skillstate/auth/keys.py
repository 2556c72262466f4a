"""Client keys: what is stored (a record with a digest, never the key), how a key is made,
hashed and compared.

Hashing is HMAC-SHA256 under a server secret kept in the data directory (``auth.secret``,
mode 0600), not a slow KDF such as scrypt, because:

* a key is 256 random bits (``secrets.token_urlsafe(32)``), not a password: there is no
  dictionary to slow down, so a KDF's cost buys nothing against guessing;
* every turn verifies its key, and the budget for that is 0.05 ms of CPU: scrypt at safe
  parameters costs tens of milliseconds (a cache would then hold the plaintext key);
* the secret lives outside the database: a leaked ``skillstate.db`` alone does not let
  anyone test a candidate key offline.

Digests are compared with ``hmac.compare_digest`` (constant time, see ``same_digest``).
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import os
import re
import secrets
from pathlib import Path

from ..store.base import StoreError
from ..store.datadir import check_dir, open_private
from .record import KeyRecord

__all__ = ["KeyHasher", "KeyRecord", "new_key", "parse_duration", "same_digest", "server_secret"]

KEY_PREFIX = "sk-ss-"
SECRET_FILE = "auth.secret"
_SECRET_BYTES = 32
KEY_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*([smhdw])$")  # digits 0-9 only
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
MAX_DURATION = 100 * 365 * 86400  # a key's lifetime: 100 years is "never expires" already


def new_key() -> str:
    """A fresh client key, ``sk-ss-`` and 43 URL-safe characters (256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def same_digest(a: str, b: str) -> bool:
    """Whether two digests are equal, in time independent of where they differ."""
    return hmac.compare_digest(a, b)


class KeyHasher:
    """HMAC-SHA256 of client keys under the server secret."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the server secret is too short")
        self._secret = secret

    def digest(self, key: str) -> str:
        data = key.encode("utf-8", "surrogateescape")
        return hmac.new(self._secret, data, hashlib.sha256).hexdigest()

    def derive(self, purpose: bytes) -> bytes:
        """A key for another use of the server secret (compaction tokens), never equal to a
        key's digest: HMAC of ``purpose`` under the secret, with a prefix no key has."""
        return hmac.new(self._secret, b"\x00derive:" + purpose, hashlib.sha256).digest()


def server_secret(data_dir: Path, *, replace: bytes | None = None) -> bytes:
    """The server secret in ``data_dir`` (created, 0600, on first use; set to ``replace``
    when given: ``store copy`` brings the one the copied keys were hashed with). Raises
    StoreError (one line) when the file is unsafe or unreadable."""
    directory = data_dir.expanduser()
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(f"cannot create {directory}: {e.strerror}") from None
    check_dir(directory)
    fd = open_private(directory / SECRET_FILE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # two first users must not make two secrets
        data = os.read(fd, 4096)
        if len(data) < _SECRET_BYTES or (replace is not None and data != replace):
            data = secrets.token_bytes(_SECRET_BYTES) if replace is None else replace
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        return data
    finally:
        os.close(fd)


def parse_duration(text: str) -> float:
    """Seconds in ``30d``, ``12h``, ``90m``, ``45s`` or ``2w``, at most ``MAX_DURATION``;
    ValueError otherwise."""
    m = _DURATION.match(text.strip().lower())
    if m is None or float(m.group(1)) <= 0:
        raise ValueError(f"expected a duration like 30d, 12h or 90m, got {text!r}")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if seconds > MAX_DURATION:  # a time past year 9999 cannot be shown, nor kept in PostgreSQL
        raise ValueError(f"a duration of at most {MAX_DURATION // 86400}d, got {text!r}")
    return seconds


def check_name(name: str) -> str:
    if not KEY_NAME.match(name):
        raise ValueError(f"key name must match {KEY_NAME.pattern}, got {name!r}")
    return name
