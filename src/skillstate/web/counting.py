"""Token counting (``POST /v1/messages/count_tokens``, ``POST /v1/responses/input_tokens``):
the tokens a turn would send upstream now.

In state mode that is the compact context built from the session's current state, not the
client's transcript, since that is what the proxy would send; in window mode (and in ``auto``
once it moved the session into the window), the window turn's own body (its start read from
the store as the turn reads it, the checkpoint instruction when the turn would checkpoint).
An upstream whose format has a counting endpoint (``Dialect.token_count``) counts it with its
own tokenizer: one of the client's kind, or one the turn reaches through a bridge whose
format counts (a Responses request at an Anthropic upstream: translated as the turn would
be, counted at ``/messages/count_tokens``). Otherwise the count is the local estimate
(``skillstate.cost.tokens``) and the response says so in ``x-skillstate-token-count:
estimate``. Nothing is committed, metered or rate-limited: counting is free at the APIs too.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..cost.tokens import request_tokens
from ..dialects.base import TokenCount
from ..dialects.registry import BRIDGES, error_reply, request_for
from ..errors import ProxyError
from ..sessions.ids import SESSION_HEADER
from ..sessions.operator import SessionOperator
from ..turn.plan import Planner
from ..turn.types import Reply, Turn
from ..upstream.client import UpstreamPool, UpstreamRuntime


async def count_tokens(
    planner: Planner,
    sessions: SessionOperator,
    pool: UpstreamPool,
    turn: Turn,
    original: Turn | None = None,
) -> Reply:
    """The count of what ``turn`` would send upstream, answered as the client's format's
    counting endpoint answers. ``original``: the request before the proxy applied its
    ``context_management`` (when it did): a local estimate then reports its count too, as
    Anthropic's answer does (an Anthropic upstream counts both itself)."""
    body = await planner.preview(turn, sessions.load_current, sessions.store)
    headers = {SESSION_HEADER: turn.shown_session, "content-type": "application/json"}
    ours = turn.wire.token_count
    assert ours is not None  # only the formats that have the endpoint route here
    counters = _counters(pool, turn)
    if counters:
        counted_there = await _count_upstream(pool, turn, body, counters, headers)
        if counted_there is not None:
            return counted_there
    headers["x-skillstate-token-count"] = "estimate"
    counted: dict[str, Any] = ours.answer(request_tokens(body))
    if original is not None:
        before = await planner.preview(original, sessions.load_current, sessions.store)
        counted["context_management"] = {"original_input_tokens": request_tokens(before)}
    return Reply(200, orjson.dumps(counted), headers)


def _counters(pool: UpstreamPool, turn: Turn) -> list[UpstreamRuntime]:
    """The upstreams that may serve the turn and count natively: of the client's kind, or of
    a kind its bridge reaches; all of the first such one's kind (one request fits one). A
    request without a model (``/responses/input_tokens`` takes one optionally) is counted
    only by an upstream of its own kind, which takes it so; a bridged format's counting
    endpoint needs the model (Anthropic's ``count_tokens``): the estimate then."""
    model = turn.model or None
    found = [
        up
        for up in pool.candidates(model)
        if up.dialect.token_count is not None
        and (up.kind == turn.dialect or ((turn.dialect, up.kind) in BRIDGES and model))
    ]
    return [up for up in found if up.kind == found[0].kind]


async def _count_upstream(
    pool: UpstreamPool,
    turn: Turn,
    body: dict[str, Any],
    counters: list[UpstreamRuntime],
    headers: dict[str, str],
) -> Reply | None:
    """``body`` counted at the upstreams' own endpoint, with only the fields it takes (a
    request of another format translated first), answered in the client's format. None
    when the upstream has no such endpoint (``_no_endpoint``): the caller estimates."""
    kind = counters[0].kind
    theirs: TokenCount | None = counters[0].dialect.token_count
    assert theirs is not None
    sent = request_for(turn.dialect, kind, body)
    payload = orjson.dumps({k: v for k, v in sent.items() if k in theirs.fields})
    ex = await pool.fetch(theirs.path, turn.headers, post=payload, upstreams=counters)
    raw = await ex.read()
    ex.release()
    if _no_endpoint(ex.status, raw):
        return None
    headers.update(ex.relay_headers())
    if ex.status >= 400:
        return Reply(*error_reply(raw, ex.status, kind, turn.dialect), headers)
    if kind == turn.dialect:
        return Reply(ex.status, raw, headers)
    ours = turn.wire.token_count
    assert ours is not None
    return Reply(200, orjson.dumps(ours.answer(_input_tokens(raw, ex.upstream.name))), headers)


def _input_tokens(raw: bytes, upstream: str) -> int:
    """The count in an upstream's 2xx answer (of another format than the client's)."""
    try:
        found = orjson.loads(raw).get("input_tokens")
    except (orjson.JSONDecodeError, AttributeError):
        found = None
    if type(found) is not int or found < 0:
        raise ProxyError(
            "upstream_unreachable", f"upstream {upstream} answered a count without input_tokens"
        )
    return found


def _no_endpoint(status: int, raw: bytes) -> bool:
    """Whether an upstream's answer says it has no counting endpoint, rather than refusing
    the request: a 405 or 501, or the bare 404 of a FastAPI server (vLLM, SGLang and LiteLLM
    serve the chat and Responses APIs without every counting route; vLLM's 405 comes from
    its ``GET /v1/responses/{id}``). A provider's own 404 (an unknown model) names its
    error, and is relayed."""
    if status in (405, 501):
        return True
    return status == 404 and raw.strip() == b'{"detail":"Not Found"}'
