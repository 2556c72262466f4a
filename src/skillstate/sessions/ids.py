"""Session ids: the header a client names its session with, what a valid id is, and the
store id of a keyed client's session (``<key name>:<client id>``, skillstate.auth.tenancy)."""

from __future__ import annotations

import re
import secrets
import time

from ..errors import ProxyError

SESSION_HEADER = "x-skillstate-session"
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


# Keyed clients' sessions are stored as ``<key name>:<client id>`` (skillstate.auth.tenancy);
# ``:`` is not allowed in a client's id, so the split below is unambiguous.
NAMESPACE_SEP = ":"

# The namespace of the ids without the separator (sessions made while there were no keys):
# ``?key=`` names it so, and a store's listing and ledger take it as their ``prefix``. It is
# no key's name (``(`` is not allowed in one) and no prefix of a key's (those end with ``:``).
UNKEYED = "(none)"


def split_session(store_id: str) -> tuple[str | None, str]:
    """``(key name or None, client session id)`` of a store id."""
    key, sep, session = store_id.partition(NAMESPACE_SEP)
    return (key, session) if sep else (None, store_id)


def minted_session_id() -> str:
    """A new session id: ``s_``, the milliseconds since the epoch (12 hex digits), then 96
    random bits (16 characters), as unguessable as the random ids before it. Ids that grow
    with time go in at the end of the ledger's ``(session, ts)`` index instead of at random
    pages of it: every forwarded request without a session header mints one. The prefix
    tells whoever sees the id (its client, the operator) when it was minted, which the
    reply's time and the ledger show them already."""
    return "s_%012x" % (time.time_ns() // 1_000_000) + secrets.token_urlsafe(12).replace("-", "_")


def is_valid_session_id(value: str) -> bool:
    """Session ids are short and header-, URL- and log-safe: ``[A-Za-z0-9_-]{1,128}``."""
    return _SESSION_ID.fullmatch(value) is not None


def resolve_session_id(header: str | None) -> str:
    """The id from the request header, or a new one when absent (``minted_session_id``)."""
    if header is None:
        return minted_session_id()
    if not is_valid_session_id(header):
        raise ProxyError(
            "invalid_request",
            f"invalid {SESSION_HEADER} header: must match ^[A-Za-z0-9_-]{{1,128}}$",
            param=SESSION_HEADER,
        )
    return header
