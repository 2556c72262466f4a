"""The route table: every path the proxy serves, with and without the ``/v1`` prefix."""

from __future__ import annotations

from starlette.routing import Route

from ..dialects.registry import DIALECTS
from ..ui import ui_routes
from .adminkeys import admin_key, admin_keys
from .failures import post_only
from .info import cost, health, metrics, models
from .responses import DIALECT as RESPONSES
from .responses import (
    ResponsesTurn,
    compact_hooks,
    response_cancel,
    response_input_items,
    response_item,
    responses_input_tokens,
)
from .state import state
from .turns import messages_count_tokens, turn_endpoint

# Dialects whose turn route does more around the shared turn (Responses: stored chains).
_TURN_HOOKS = {RESPONSES: ResponsesTurn}

# One turn route per dialect in the registry (/v1/chat/completions, /v1/messages, ...).
_TURN_ROUTES = [
    Route(
        prefix + d.client_path,
        turn_endpoint(d.name, _TURN_HOOKS.get(d.name)),
        methods=["POST"],
    )
    for d in DIALECTS.values()
    for prefix in ("/v1", "")
]
# Path -> handler of the turn routes, for the direct entry in front of the router (fastpath).
TURN_HANDLERS = {r.path: r.endpoint for r in _TURN_ROUTES}
# The Responses API's compaction endpoint: a turn route of its own (web.compaction).
_COMPACT = turn_endpoint(RESPONSES, compact_hooks, "/responses/compact")

ROUTES = [
    *_TURN_ROUTES,
    Route("/v1/messages/count_tokens", messages_count_tokens, methods=["POST"]),
    Route("/messages/count_tokens", messages_count_tokens, methods=["POST"]),
    *(
        route
        for prefix in ("/v1", "")
        for route in (
            Route(prefix + "/responses/compact", _COMPACT, methods=["POST"]),
            # Before /responses/{response_id}, which would take the path as a response id.
            Route(prefix + "/responses/input_tokens", responses_input_tokens, methods=["POST"]),
            Route(prefix + "/responses/input_tokens", post_only, methods=["GET", "DELETE"]),
            Route(prefix + "/responses/{response_id}", response_item, methods=["GET", "DELETE"]),
            Route(prefix + "/responses/{response_id}/input_items", response_input_items),
            Route(prefix + "/responses/{response_id}/cancel", response_cancel, methods=["POST"]),
        )
    ),
    Route("/v1/models", models, methods=["GET"]),
    Route("/models", models, methods=["GET"]),
    Route("/v1/models/{model_id:path}", models, methods=["GET"]),
    Route("/models/{model_id:path}", models, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/state", state, methods=["GET", "DELETE", "PATCH"]),
    Route("/cost", cost, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/admin/keys", admin_keys, methods=["GET", "POST"]),
    Route("/admin/keys/{name}", admin_key, methods=["DELETE"]),
    Route("/admin/keys/{name}/rotate", admin_key, methods=["POST"]),
    *ui_routes(),
]
