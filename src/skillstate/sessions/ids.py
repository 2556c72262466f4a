"""Session ids: the header a client names its session with, what a valid id is, and the
store id of a keyed client's session (``<key name>:<client id>``, skillstate.auth.tenancy)."""

from __future__ import annotations

import re
import secrets

from ..errors import ProxyError

SESSION_HEADER = "x-skillstate-session"
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


# Keyed clients' sessions are stored as ``<key name>:<client id>`` (skillstate.auth.tenancy);
# ``:`` is not allowed in a client's id, so the split below is unambiguous.
NAMESPACE_SEP = ":"


def split_session(store_id: str) -> tuple[str | None, str]:
    """``(key name or None, client session id)`` of a store id."""
    key, sep, session = store_id.partition(NAMESPACE_SEP)
    return (key, session) if sep else (None, store_id)


def is_valid_session_id(value: str) -> bool:
    """Session ids are short and header-, URL- and log-safe: ``[A-Za-z0-9_-]{1,128}``."""
    return _SESSION_ID.fullmatch(value) is not None


def resolve_session_id(header: str | None) -> str:
    """The id from the request header, or a new random one when absent."""
    if header is None:
        return "s_" + secrets.token_urlsafe(12).replace("-", "_")
    if not is_valid_session_id(header):
        raise ProxyError(
            "invalid_request",
            f"invalid {SESSION_HEADER} header: must match ^[A-Za-z0-9_-]{{1,128}}$",
            param=SESSION_HEADER,
        )
    return header
