"""Idempotent turns: a client's ``Idempotency-Key`` makes retrying a turn safe.

A turn sent with ``Idempotency-Key: <1-255 visible ASCII>`` (any turn route, JSON or
streamed) is recorded with its reply, **in the same transaction as the turn's commit**
(``SessionCommit.kept``), per client key and session (the ``scope``), for
``idempotency_ttl``. Then:

- a request with a key already kept gets the kept reply: the same body (a JSON reply, or a
  stream's bytes replayed), its headers, and ``x-skillstate-replayed: true``; nothing is
  sent upstream, and no ledger row or step is added;
- a request whose key is in flight (on any replica) waits for that turn: the turn holds a
  lock named after its key and scope (``TurnLocks``: the Redis lease with coordination, a
  local lock without), taken before the session's own; after ``lease_wait`` the waiter gets
  a 409 ``idempotency_in_flight``. When the turn it waited for was not committed (an
  upstream error, a failed commit), the waiter runs the turn itself;
- a request that reuses a kept key with another body (its ``fingerprint``: a hash of the
  route and the body, canonical: the same JSON in any spacing or member order is the same
  request) is a 422 ``idempotency_key_reused``.

Turns that commit no transition (``passthrough`` and ``mask`` modes, ``auto`` while it sends
the transcript untouched) keep their reply with their ledger rows in one transaction
(``Store.keep_reply``): a retry gets that reply, and the call is in the ledger once. Only
replies the client got whole are kept: an upstream error, a failed commit or a stream cut
short keeps nothing, and a retry with the key is a new turn. A reply larger than
``idempotency_max_reply_bytes`` is committed with its key but not kept: a retry gets a 409
``idempotency_reply_not_kept`` (the turn is not run again).

Test hook (``SKILLSTATE_TEST_KILL=<point>:<key>``, for the scale tier's kill -9 tests): the
turn with that Idempotency-Key SIGKILLs its own process at ``before-commit`` (after the
upstream's whole reply, before the commit) or ``after-commit`` (committed, before the reply
is sent). Unset in production; reading it costs one dict lookup per keyed turn.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import signal
import time
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..errors import ProxyError
from ..sessions.locks import TurnLocks
from ..store import KeptReply, Store, StoreError

log = logging.getLogger("skillstate")

IDEMPOTENCY_HEADER = "idempotency-key"
KILL_HOOK = "SKILLSTATE_TEST_KILL"
_KEY = re.compile(r"[\x21-\x7e]{1,255}")
# Headers of a reply that describe this answer and not the turn: never kept.
_NOT_KEPT = frozenset({"content-length", "date", "server", "transfer-encoding", "connection"})


@dataclass(frozen=True, slots=True)
class Idempotency:
    """A turn's Idempotency-Key: where it applies (``scope``: the caller's key namespace and
    the session id the client named, "" when none) and which request it names."""

    scope: str
    key: str
    fingerprint: str
    # Keep a reply only for a turn judged valid (a compaction's checkpoint: one that folded
    # nothing is answered with an error, and a retry under the key must run it again).
    only_valid: bool = False
    # The route and body the fingerprint hashes, for ``answers`` (hashed again only when a
    # kept fingerprint differs from this one).
    request: tuple[str, Mapping[str, Any]] | None = field(default=None, compare=False, repr=False)

    @property
    def lock(self) -> str:
        """The name the turn holds while it runs (the same for this key and scope on every
        replica). ``#`` is in no session id, so it never names a session's own lock."""
        digest = hashlib.sha256(f"{self.scope}\n{self.key}".encode()).hexdigest()[:32]
        return f"idempotency#{digest}"

    def part(self, name: str, *, only_valid: bool = False) -> Idempotency:
        """The key of one part of a request that runs several turns (a compaction's
        checkpoint, then the turn): kept on its own, so a retry replays each part and no
        part answers for another. A space is in no client's key, so none names a part."""
        return Idempotency(
            self.scope, f"{self.key} {name}", self.fingerprint, only_valid, self.request
        )

    def answers(self, fingerprint: str) -> bool:
        """Whether a reply kept under ``fingerprint`` is this request's: the same canonical
        fingerprint, or (a key kept by a release before fingerprints were canonical, within
        its ``idempotency_ttl``, or by such a replica during a rolling upgrade) the hash of
        this very body as that release made it, its members in the order they came. Only
        a mismatch computes the second: a replay that matches costs nothing more."""
        if fingerprint == self.fingerprint:
            return True
        return self.request is not None and fingerprint == _fingerprint(*self.request, 0)

    def replay(self, kept: KeptReply) -> KeptReply:
        """``kept`` if it answers this request; a 422 when the key came with another body,
        a 409 when its reply was too big to keep."""
        if not self.answers(kept.fingerprint):
            raise ProxyError(
                "invalid_request",
                "this Idempotency-Key was used with another request body (or route); a key "
                "names one request: send a new key for a new request",
                status=422,
                code="idempotency_key_reused",
                param=IDEMPOTENCY_HEADER,
            )
        if kept.body is None:
            at = f" at step {kept.step}" if kept.step is not None else ""
            raise ProxyError(
                "conflict",
                f"the turn with this Idempotency-Key was committed{at}, but its reply was "
                "larger than idempotency_max_reply_bytes and was not kept; it is not run "
                "again (GET /state shows the session)",
                code="idempotency_reply_not_kept",
            )
        return kept

    def keep(
        self,
        session: str,
        status: int,
        headers: Mapping[str, str],
        body: bytes | None,
        *,
        stream: bool,
        step: int | None = None,
        limit: int,
    ) -> KeptReply:
        """The reply to keep under this key (its body dropped past ``limit`` bytes)."""
        shown = {k: v for k, v in headers.items() if k.lower() not in _NOT_KEPT}
        kept = body if body is not None and len(body) <= limit else None
        return KeptReply(
            self.scope,
            self.key,
            self.fingerprint,
            session,
            time.time(),
            status,
            stream,
            shown,
            kept,
            step,
        )

    def test_hook(self, point: str) -> None:
        """The scale tier's kill -9 at ``point`` (see the module docstring)."""
        if os.environ.get(KILL_HOOK) == f"{point}:{self.key}":
            log.warning("test hook %s: killing this process at %s", KILL_HOOK, point)
            os.kill(os.getpid(), signal.SIGKILL)


def idempotency_of(header: str, scope: str, route: str, body: Mapping[str, Any]) -> Idempotency:
    """The request's Idempotency-Key (``header``: its value); a 400 for a malformed one. The
    fingerprint hashes the route and the body as parsed, canonically: the members of each
    object sorted by name at every depth (RFC 8259: an object is unordered, so a retry that
    serialises the same request in another order, or in any spacing, is the same request),
    arrays in their order (another order is another request). Only keyed requests get one."""
    if not _KEY.fullmatch(header):
        raise ProxyError(
            "invalid_request",
            f"{IDEMPOTENCY_HEADER} must be 1 to 255 visible ASCII characters",
            param=IDEMPOTENCY_HEADER,
        )
    fingerprint = _fingerprint(route, body, orjson.OPT_SORT_KEYS)
    return Idempotency(scope, header, fingerprint, request=(route, body))


def _fingerprint(route: str, body: Mapping[str, Any], option: int) -> str:
    """The hash of the route and the body serialised with ``option`` (``OPT_SORT_KEYS``:
    canonical; 0: the members as they came, the fingerprint of releases before it)."""
    digest = hashlib.sha256(route.encode())
    digest.update(b"\n")
    digest.update(orjson.dumps(body, option=option))
    return digest.hexdigest()


async def hold_key(
    idem: Idempotency, locks: TurnLocks, store: Store, stack: AsyncExitStack, wait: float
) -> KeptReply | None:
    """Hold the key's lock (on ``stack``: until the turn is done), waiting at most ``wait``
    for a turn with the same key in flight; then the reply kept under the key, if any (a
    422 or 409 when it does not answer this request: ``Idempotency.replay``)."""
    try:
        await asyncio.wait_for(stack.enter_async_context(locks.hold(idem.lock)), wait)
    except (asyncio.TimeoutError, ProxyError) as e:
        if isinstance(e, ProxyError) and e.code != "session_busy":
            raise  # Redis unreachable (503) and the like: as for any turn
        raise ProxyError(
            "conflict",
            "a request with this Idempotency-Key is still in flight (for the whole "
            "lease_wait); retry it later to get its reply",
            code="idempotency_in_flight",
            retry_after=1.0,
        ) from None
    try:
        kept = await store.kept_reply(idem.scope, idem.key)
    except StoreError as e:
        raise e.for_client("could not look up the Idempotency-Key; the turn was not sent") from e
    return None if kept is None else idem.replay(kept)


class StreamCapture:
    """The bytes of a stream as the client gets them, for keeping under its key; stops
    holding them past ``limit`` (then the reply is committed but not kept)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._chunks: list[bytes] = []
        self._size = 0

    def add(self, chunk: bytes) -> bytes:
        if self._size <= self.limit:
            self._size += len(chunk)
            if self._size <= self.limit:
                self._chunks.append(chunk)
            else:
                self._chunks = []  # too big: nothing is kept, and nothing more is held
        return chunk

    def body(self, tail: bytes = b"") -> bytes | None:
        """Everything sent, then ``tail``; None when it was too big to keep."""
        if self._size + len(tail) > self.limit:
            return None
        return b"".join([*self._chunks, tail])
