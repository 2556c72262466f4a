"""The route table: every path the proxy serves, with and without the ``/v1`` prefix."""

from __future__ import annotations

from starlette.routing import Route

from ..dialects.registry import DIALECTS
from ..ui import ui_routes
from .info import cost, health, metrics, models
from .responses import DIALECT as RESPONSES
from .responses import response_input_items, response_item, responses_compact, responses_turn
from .state import state
from .turns import messages_count_tokens, turn_endpoint

# Dialects whose turn route does more than the shared handler (Responses: stored chains).
_TURN_HANDLERS = {RESPONSES: responses_turn}

# One turn route per dialect in the registry (/v1/chat/completions, /v1/messages, ...).
_TURN_ROUTES = [
    Route(
        prefix + d.client_path,
        _TURN_HANDLERS.get(d.name) or turn_endpoint(d.name),
        methods=["POST"],
    )
    for d in DIALECTS.values()
    for prefix in ("/v1", "")
]
# Path -> handler of the turn routes, for the direct entry in front of the router (fastpath).
TURN_HANDLERS = {r.path: r.endpoint for r in _TURN_ROUTES}

ROUTES = [
    *_TURN_ROUTES,
    Route("/v1/messages/count_tokens", messages_count_tokens, methods=["POST"]),
    Route("/messages/count_tokens", messages_count_tokens, methods=["POST"]),
    *(
        route
        for prefix in ("/v1", "")
        for route in (
            Route(prefix + "/responses/compact", responses_compact, methods=["POST"]),
            Route(prefix + "/responses/{response_id}", response_item, methods=["GET", "DELETE"]),
            Route(prefix + "/responses/{response_id}/input_items", response_input_items),
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
    *ui_routes(),
]
