"""Non-streamed replies: an OpenAI chat completion -> an Anthropic message and back."""

from __future__ import annotations

import time
import uuid
from typing import Any

from .common import (
    ASSISTANT_TEXT_JOIN,
    JSON,
    _clean,
    _dumps,
    _synth_tool_id,
    anthropic_stop_reason,
    anthropic_usage_to_openai,
    openai_finish_reason,
    openai_usage_to_anthropic,
)
from .toolargs import parse_tool_arguments


def _openai_message_text(message: JSON) -> tuple[str, bool]:
    """(the message's text, its refusal after it; whether it has a refusal): ``content``
    (a string, or its ``text`` and ``refusal`` parts) and the ``refusal`` member."""
    content = message.get("content")
    refused = False
    if isinstance(content, list):
        parts = [p for p in content if isinstance(p, dict) and p.get("type") in ("text", "refusal")]
        refused = any(p["type"] == "refusal" and p.get("refusal") for p in parts)
        content = "".join(p.get("text") or p.get("refusal") or "" for p in parts)
    text = content if isinstance(content, str) else ""
    refusal = message.get("refusal")
    if isinstance(refusal, str):
        text += refusal
        refused = refused or bool(refusal)
    return _clean(text), refused


def openai_response_to_anthropic(resp: JSON, *, request_model: str) -> JSON:
    """A non-streamed OpenAI chat completion -> an Anthropic ``message``.

    ``id`` is ``"msg_" + resp["id"]``; ``model`` is the client's ``request_model``. Only
    choice 0 is used. ``message.refusal`` (OpenAI's safety refusal) is the text it says and
    the stop reason ``refusal``, as Messages reports its own (``anthropic_stop_reason``).
    Tool-call arguments are
    parsed with :func:`parse_tool_arguments`; a call without an id gets a stable synthetic
    one derived from the message id and its position.
    """
    upstream_id = resp.get("id")
    message_id = f"msg_{upstream_id}" if isinstance(upstream_id, str) and upstream_id else None
    message_id = message_id or f"msg_{uuid.uuid4().hex}"
    choice = _first_choice(resp.get("choices"))
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    assert isinstance(message, dict)
    content: list[JSON] = []
    text, refused = _openai_message_text(message)
    if text:
        content.append({"type": "text", "text": text})
    raw_calls = message.get("tool_calls")
    for pos, call in enumerate(raw_calls if isinstance(raw_calls, list) else []):
        if not isinstance(call, dict):
            continue
        fn = call.get("function") if isinstance(call.get("function"), dict) else {}
        assert isinstance(fn, dict)
        cid = call.get("id")
        name = fn.get("name")
        content.append(
            {
                "type": "tool_use",
                "id": cid if isinstance(cid, str) and cid else _synth_tool_id(message_id, pos),
                "name": name if isinstance(name, str) else "",
                "input": parse_tool_arguments(fn.get("arguments")),
            }
        )
    has_calls = any(b["type"] == "tool_use" for b in content)
    stop_reason, stop_sequence = anthropic_stop_reason(
        choice.get("finish_reason"),
        has_tool_calls=has_calls,
        matched_stop=choice.get("stop_reason"),
        refused=refused,
    )
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": request_model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": openai_usage_to_anthropic(resp.get("usage")),
    }


def _first_choice(choices: Any) -> JSON:
    if not isinstance(choices, list):
        return {}
    for choice in choices:
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            return choice
    return {}


def anthropic_response_to_openai(
    resp: JSON, *, model: str | None = None, created: int | None = None
) -> JSON:
    """A non-streamed Anthropic message -> an OpenAI ``chat.completion``.

    ``id`` is ``"chatcmpl-" + resp["id"]``; ``model`` defaults to the upstream's. Text
    blocks are concatenated; ``thinking`` and server-tool blocks are not carried over.
    ``created`` defaults to now (the one impure input; pass it for reproducible output).
    """
    text_parts: list[str] = []
    calls: list[JSON] = []
    content = resp.get("content")
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            text_parts.append(block["text"])
        elif block.get("type") == "tool_use":
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {
                        "name": block.get("name"),
                        "arguments": _dumps(block.get("input") or {}),
                    },
                }
            )
    text = ASSISTANT_TEXT_JOIN.join(text_parts)
    message: JSON = {
        "role": "assistant",
        "content": text if (text or not calls) else None,
        "refusal": None,
    }
    if calls:
        message["tool_calls"] = calls
    rid = resp.get("id")
    return {
        "id": f"chatcmpl-{rid}" if isinstance(rid, str) and rid else f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model or resp.get("model") or "",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": openai_finish_reason(
                    resp.get("stop_reason"), has_tool_calls=bool(calls)
                ),
            }
        ],
        "usage": anthropic_usage_to_openai(resp.get("usage")),
    }
