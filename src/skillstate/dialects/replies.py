"""Non-streamed replies: what the state engine reads from them, and error bodies."""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import Dialect, ProxyError, kind_for_status
from ..ledger import Usage, usage_from_anthropic, usage_from_openai


def reply_text(dialect: str, resp: dict[str, Any]) -> tuple[str, bool]:
    """(all text content, whether the reply calls tools)."""
    if dialect == "anthropic":
        blocks = resp.get("content") or []
        text = "".join(
            b.get("text") or "" for b in blocks if isinstance(b, dict) and b.get("type") == "text"
        )
        tools = any(isinstance(b, dict) and b.get("type") == "tool_use" for b in blocks)
        return text, tools
    choices = resp.get("choices") or [{}]
    msg = (choices[0] or {}).get("message") or {}
    content = msg.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    text = content if isinstance(content, str) else ""
    return text, bool(msg.get("tool_calls") or msg.get("function_call"))


def reply_cut_off(dialect: str, resp: dict[str, Any]) -> bool:
    """Whether the reply stopped at the token limit (``max_tokens``)."""
    if dialect == "anthropic":
        return resp.get("stop_reason") == "max_tokens"
    choices = resp.get("choices") or [{}]
    return (choices[0] or {}).get("finish_reason") == "length"


def reply_usage(dialect: str, resp: dict[str, Any]) -> Usage | None:
    u = resp.get("usage")
    return usage_from_anthropic(u) if dialect == "anthropic" else usage_from_openai(u)


def reply_model(resp: dict[str, Any]) -> str | None:
    m = resp.get("model")
    return m if isinstance(m, str) else None


def error_message(raw: bytes) -> str:
    """The human message inside an upstream error body of either dialect (or the raw text)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", errors="replace")[:500] or "upstream error"
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if body.get("message"):
            return str(body["message"])
    return raw.decode("utf-8", errors="replace")[:500]


def _is_error_object(raw: bytes, dialect: str) -> bool:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return False
    return body.get("type") == "error" if dialect == "anthropic" else True


def error_reply(raw: bytes, status: int, upstream_kind: str, dialect: Dialect) -> tuple[int, bytes]:
    """An upstream's error answer as the client sees it: untouched when it already is an error
    object of the client's dialect; otherwise (the other dialect, an HTML page from a load
    balancer, plain text, another server's JSON) rewritten into one, keeping its message."""
    if upstream_kind == dialect and _is_error_object(raw, dialect):
        # 529 is Anthropic's "overloaded", also behind OpenAI-format gateways; OpenAI clients
        # know 503.
        return (503 if dialect == "openai" and status == 529 else status), raw
    err = ProxyError(kind_for_status(status), error_message(raw), status=status)
    return err.status_for(dialect), orjson.dumps(err.body(dialect))
