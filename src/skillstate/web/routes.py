"""The route table: every path the proxy serves, with and without the ``/v1`` prefix."""

from __future__ import annotations

from starlette.routing import Route

from ..ui import ui_routes
from .info import cost, health, models
from .state import state
from .turns import chat_completions, messages, messages_count_tokens

ROUTES = [
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/messages", messages, methods=["POST"]),
    Route("/v1/messages/count_tokens", messages_count_tokens, methods=["POST"]),
    Route("/messages/count_tokens", messages_count_tokens, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/models", models, methods=["GET"]),
    Route("/v1/models/{model_id:path}", models, methods=["GET"]),
    Route("/models/{model_id:path}", models, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/state", state, methods=["GET", "DELETE", "PATCH"]),
    Route("/cost", cost, methods=["GET"]),
    *ui_routes(),
]
