"""``POST /v1/messages/count_tokens``: the tokens a turn would send upstream now.

In state mode that is the compact context built from the session's current state, not the
client's transcript, since that is what the proxy would send; in window mode (and in ``auto``
once it moved the session into the window), the window turn's own body (its start read from
the store as the turn reads it, the checkpoint instruction when the turn would checkpoint).
An Anthropic-kind upstream
counts it with its own tokenizer; otherwise the count is the local estimate
(``skillstate.cost.tokens``) and the response says so in ``x-skillstate-token-count: estimate``.
Nothing is committed, metered or rate-limited: counting is free at Anthropic too.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..cost.tokens import estimate_tokens
from ..dialects.registry import error_reply
from ..sessions.ids import SESSION_HEADER
from ..sessions.operator import SessionOperator
from ..turn.plan import Planner
from ..turn.types import Reply, Turn
from ..upstream.client import UpstreamPool

# The fields Anthropic's count_tokens accepts; it rejects others (max_tokens, stream, ...).
# context_management (beta): the count is after its edits, and the answer reports the count
# before them (``context_management.original_input_tokens``).
COUNT_FIELDS = frozenset(
    {
        "model", "messages", "system", "tools", "tool_choice", "thinking", "mcp_servers",
        "context_management",
    }
)  # fmt: skip


async def count_tokens(
    planner: Planner,
    sessions: SessionOperator,
    pool: UpstreamPool,
    turn: Turn,
    original: Turn | None = None,
) -> Reply:
    """The count of what ``turn`` would send upstream. ``original``: the request before the
    proxy applied its ``context_management`` (when it did): a local estimate then reports
    its count too, as Anthropic's answer does (an Anthropic upstream counts both itself)."""
    body = await planner.preview(turn, sessions.load_current, sessions.store)
    headers = {SESSION_HEADER: turn.shown_session}
    model = body.get("model")
    # Upstreams of the client's own kind whose format has a counting endpoint count natively.
    native = [
        up
        for up in pool.candidates(model if isinstance(model, str) else None)
        if up.kind == turn.dialect and up.dialect.count_tokens_path is not None
    ]
    if native:
        path = native[0].dialect.count_tokens_path
        assert path is not None
        payload = orjson.dumps({k: v for k, v in body.items() if k in COUNT_FIELDS})
        ex = await pool.fetch(path, turn.headers, post=payload, upstreams=native)
        raw = await ex.read()
        ex.release()
        headers.update(ex.relay_headers())
        headers["content-type"] = "application/json"
        if ex.status >= 400:
            return Reply(*error_reply(raw, ex.status, ex.upstream.kind, turn.dialect), headers)
        return Reply(ex.status, raw, headers)
    headers["x-skillstate-token-count"] = "estimate"
    headers["content-type"] = "application/json"
    counted: dict[str, Any] = {"input_tokens": _estimate(body)}
    if original is not None:
        before = await planner.preview(original, sessions.load_current, sessions.store)
        counted["context_management"] = {"original_input_tokens": _estimate(before)}
    return Reply(200, orjson.dumps(counted), headers)


def _estimate(body: dict[str, Any]) -> int:
    return estimate_tokens([body.get("system"), body.get("messages"), body.get("tools")])
