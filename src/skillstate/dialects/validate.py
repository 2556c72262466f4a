"""Early checks of OpenAI chat requests, so malformed input gets a precise 400 here
instead of a confusing error from the upstream after the context was rewritten."""

from __future__ import annotations

from typing import Any

from ..errors import ProxyError

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def validate_openai_request(body: dict[str, Any]) -> None:
    def bad(message: str, param: str) -> ProxyError:
        return ProxyError("invalid_request", message, param=param)

    if not isinstance(body.get("model"), str) or not body["model"]:
        raise bad("'model' is required and must be a non-empty string", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty array", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}] must be an object", f"messages[{i}]")
        role = m.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise bad(
                f"messages[{i}].role must be one of {', '.join(sorted(_ROLES))}; got {role!r}",
                f"messages[{i}].role",
            )
        if role == "tool" and not isinstance(m.get("tool_call_id"), str):
            raise bad(f"messages[{i}]: a tool message needs tool_call_id", f"messages[{i}]")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise bad("'stream' must be a boolean", "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad("'stream_options' must be an object", "stream_options")
