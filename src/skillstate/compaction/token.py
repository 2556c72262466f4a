"""The compaction token: what a ``compaction`` item's ``encrypted_content`` holds when the
proxy served the compaction (``skillstate.compaction``).

It is an opaque, versioned and authenticated reference to (session, step, client key): the
proxy finds the state the checkpoint committed at that step by it. It is not the state,
and a client cannot read it: the reference is encrypted and then MACed, both under keys
derived from the server secret that hashes client keys (``skillstate.auth.keys``)::

    ssc1_ + base64url(nonce[16] || ciphertext || tag[32])
    nonce      = HMAC-SHA256(k_iv, payload)[:16]
    ciphertext = payload XOR HMAC-SHA256(k_enc, nonce || counter) blocks
    tag        = HMAC-SHA256(k_mac, "ssc1" || nonce || ciphertext)

(encrypt-then-MAC with HMAC-SHA256 as the PRF of a counter-mode keystream: nothing beyond
the standard library). The nonce is synthetic (derived from the payload, as in SIV): one
reference always seals to the same token, so a compaction retried under its
Idempotency-Key gets the same item again; tokens show only that two of them are equal,
which the reference they name says anyway. A token that does not verify is refused as a
whole; the version prefix lets a later format coexist with this one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass

import orjson

__all__ = ["PREFIX", "CompactionRef", "TokenError", "TokenSealer", "looks_like_token"]

PREFIX = "ssc1_"
_VERSION = b"ssc1"
_NONCE = 16
_TAG = 32
_MAX_TOKEN_CHARS = 4096  # a session id is at most a few hundred characters


class TokenError(ValueError):
    """A compaction token that is not one this proxy made (or was altered)."""


@dataclass(frozen=True, slots=True)
class CompactionRef:
    """What a token refers to: the session (the store's id), the step its checkpoint
    committed, and the name of the client key that asked for it ("" with auth off)."""

    session: str
    step: int
    key: str


def looks_like_token(text: object) -> bool:
    """Whether ``text`` claims to be this proxy's token (its version prefix)."""
    return isinstance(text, str) and text.startswith(PREFIX)


class TokenSealer:
    """Seals and opens compaction tokens under keys derived from the server secret."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the server secret is too short")
        # Derived keys: a token's MAC is never a client key's digest, and back.
        self._enc = hmac.new(secret, b"skillstate compaction token: encryption", "sha256").digest()
        self._mac = hmac.new(
            secret, b"skillstate compaction token: authentication", "sha256"
        ).digest()
        self._iv = hmac.new(secret, b"skillstate compaction token: nonce", "sha256").digest()

    def seal(self, ref: CompactionRef) -> str:
        payload = orjson.dumps({"s": ref.session, "n": ref.step, "k": ref.key})
        nonce = hmac.new(self._iv, payload, hashlib.sha256).digest()[:_NONCE]
        body = nonce + _xor(payload, self._keystream(nonce, len(payload)))
        tag = hmac.new(self._mac, _VERSION + body, hashlib.sha256).digest()
        return PREFIX + base64.urlsafe_b64encode(body + tag).rstrip(b"=").decode()

    def open(self, token: str) -> CompactionRef:
        """The reference in ``token``; TokenError when it is not one this proxy sealed."""
        if not looks_like_token(token) or len(token) > _MAX_TOKEN_CHARS:
            raise TokenError("not a compaction token of this proxy")
        text = token[len(PREFIX) :]
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            raise TokenError("a compaction token that is not base64url") from None
        if len(raw) < _NONCE + _TAG + 1:
            raise TokenError("a compaction token too short to be one")
        body, tag = raw[:-_TAG], raw[-_TAG:]
        want = hmac.new(self._mac, _VERSION + body, hashlib.sha256).digest()
        if not hmac.compare_digest(tag, want):
            raise TokenError("a compaction token that does not verify (altered, or made elsewhere)")
        nonce, sealed = body[:_NONCE], body[_NONCE:]
        try:
            doc = orjson.loads(_xor(sealed, self._keystream(nonce, len(sealed))))
            ref = CompactionRef(str(doc["s"]), int(doc["n"]), str(doc["k"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            raise TokenError("a compaction token whose content is unreadable") from None
        if ref.step < 0 or not ref.session:
            raise TokenError("a compaction token whose content is unreadable")
        return ref

    def _keystream(self, nonce: bytes, n: int) -> bytes:
        blocks = (n + 31) // 32
        return b"".join(
            hmac.new(self._enc, nonce + k.to_bytes(4, "big"), hashlib.sha256).digest()
            for k in range(blocks)
        )[:n]


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))
