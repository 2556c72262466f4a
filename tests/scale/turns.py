"""What the replica tests' fake model answers, and how they check a session's history.

Each client turn carries a marker ``MARK[<session>/<request id>]``; the fake model answers
it with a valid state patch naming that request id, so every committed transition says
which request made it, and a lost, duplicated or foreign transition shows."""

from __future__ import annotations

import json
import re
from typing import Any

from skillstate.engine.patch import merge_patch
from tests.fakeprovider import RecordedRequest, Reply
from tests.helpers import envelope

_MARK = re.compile(r"MARK\[([\w-]+)/([\w-]+)\]")


def mark(session: str, rid: str) -> str:
    return f"MARK[{session}/{rid}] continue the task"


def marked(req: RecordedRequest) -> tuple[str, str] | None:
    """The (session, request id) of the last marker in what the proxy sent upstream."""
    found = _MARK.findall(json.dumps(req.json.get("messages", []) if req.json else []))
    return found[-1] if found else None


def patch_for(rid: str) -> dict[str, Any]:
    """The patch the fake model writes for request ``rid``: a fact of its own, and the
    notes overwritten (so the order of the transitions shows in the state)."""
    return {"facts": {rid: len(rid)}, "notes": rid}


def marked_reply(req: RecordedRequest) -> Reply:
    """The fake provider's responder: a valid patch naming the request."""
    found = marked(req)
    if found is None:
        return Reply(text=envelope({}))
    return Reply(text=envelope(patch_for(found[1])))


def replay(history: list[dict[str, Any]], initial: dict[str, Any] | None = None) -> Any:
    """The state the transitions make when applied one after the other (RFC 7386 merge,
    the proxy's own ``merge_patch``): what the stored state must equal."""
    state: Any = dict(initial or {})
    for t in history:
        if t["status"] in ("valid", "operator"):
            state = merge_patch(state, t["patch"])
    return state


def check_history(session: str, history: list[dict[str, Any]]) -> dict[int, str]:
    """Assert the steps are exactly 1..n, each committed by a different request; returns
    step -> request id."""
    steps = [t["step"] for t in history]
    assert steps == list(range(1, len(history) + 1)), (session, steps)
    by_step = {t["step"]: (t["patch"] or {}).get("notes") for t in history}
    rids = [r for r in by_step.values() if r is not None]
    assert len(rids) == len(set(rids)), (session, "a request committed twice", by_step)
    return by_step
