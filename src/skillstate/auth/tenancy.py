"""Sessions namespaced by key: key A's ``s1`` and key B's ``s1`` are different sessions.

The store id of a session a keyed client names ``s1`` is ``<key name>:s1``. Clients never
see it: ``:`` is not allowed in a client's session id, so no client id can reach into
another namespace, and the proxy answers with the client's own id. Ledger rows carry the
store id, so each row records the key that spent it (``GET /cost`` filters on the prefix).

Sessions created while there were no keys keep their plain id (no namespace): listings show
them with ``"key": null``, and an admin names them ``?key=(none)`` (``UNKEYED``, no key's
name: ``(`` is not allowed in one) to list them, sum their cost, or read, patch or delete one.
An id is in no namespace when it has no ``:`` at all, as ``split_session`` reads it: one
with a ``:`` is its prefix's, whether or not a key of that name exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ProxyError
from ..sessions.ids import NAMESPACE_SEP as SEP
from ..sessions.ids import UNKEYED, split_session
from .gate import Principal
from .keys import KEY_NAME

__all__ = ["UNKEYED", "View", "store_session", "view_of"]


def store_session(caller: Principal | None, session: str) -> str:
    """The store id of the caller's session ``session`` (unchanged when auth is off)."""
    return session if caller is None else caller.name + SEP + session


@dataclass(frozen=True, slots=True)
class View:
    """What one request to ``/state`` or ``/cost`` may see.

    ``owner`` is the namespace ``?session=ID`` refers to (None: auth is off, no namespace);
    ``prefix`` limits listings (None: everything, for an admin without ``?key=``)."""

    owner: str | None
    prefix: str | None
    keyed: bool = True  # False: auth is off, listings show no key

    def store_id(self, session: str) -> str:
        return session if self.owner is None else self.owner + SEP + session

    def shown(self, store_id: str) -> dict[str, Any]:
        """A session as a listing shows it: its client id, and its key when auth is on."""
        if not self.keyed:
            return {"session": store_id}
        key, session = split_session(store_id)
        return {"session": session, "key": key}


def view_of(caller: Principal | None, key: str | None) -> View:
    """The caller's view; ``key`` (``?key=NAME``) picks another key's namespace, which only
    an admin may: for anyone else it is a 404, as if there were nothing there. ``UNKEYED``
    picks the sessions without one (the stores take it as the prefix of those)."""
    if caller is None:
        return View(None, None, keyed=False)
    if key is not None and key != UNKEYED and not KEY_NAME.match(key):
        raise ProxyError(
            "invalid_request", f"key must match {KEY_NAME.pattern} or be {UNKEYED}", param="key"
        )
    if key is not None and key != caller.name and not caller.admin:
        raise ProxyError("not_found", "unknown session")
    if key == UNKEYED:
        return View(None, UNKEYED)
    owner = key or caller.name
    prefix = None if caller.admin and key is None else owner + SEP
    return View(owner, prefix)
