"""Observation masking (``mode: mask``): the client's transcript with old observations
replaced by a short placeholder. Pure: a function of the request body only.

An *observation* is one run of consecutive user-side messages after the leading system
messages: the tool results of one round (OpenAI ``tool`` messages, or an Anthropic user
message of ``tool_result`` blocks) or a user message. In an agent loop each request adds
one. Of G observations, the first M are masked, where

    M = ((G - keep) // keep) * keep      (0 while G < 2 * keep)

so M moves only every ``keep`` requests: the masked transcript of one request is a
byte-prefix of the next one's until the next re-mask, and the provider's prompt cache
keeps hitting in between. The latest ``keep`` to ``2 * keep - 1`` observations are always
whole.

Masked: tool results (always) and user text of at least ``min_chars`` characters; the
task (the first user message) never is, nor is anything an assistant said. A masked
message keeps its role, position and tool-call ids (``tool_call_id`` / ``tool_use_id``,
``is_error``), so every tool call stays paired with its result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from .context import DialectContext
from .dialects.registry import get_dialect

__all__ = [
    "DEFAULT_MASK_KEEP",
    "DEFAULT_MASK_MIN_CHARS",
    "mask_transcript",
    "masked_count",
    "placeholder",
]

DEFAULT_MASK_KEEP = 3
DEFAULT_MASK_MIN_CHARS = 400  # shorter user messages cost little and often matter ("yes")
MASK_MARK = "[skillstate] observation omitted"


def masked_count(observations: int, keep: int) -> int:
    """How many of the oldest observations are masked (see the module docstring)."""
    if keep < 1:
        raise ValueError(f"mask_keep must be a positive integer, not {keep!r}")
    return max(0, (observations - keep) // keep) * keep


def placeholder(original: Any) -> str:
    """The short text that stands for a masked observation (deterministic: same input,
    same bytes)."""
    size = len(original) if isinstance(original, str) else len(orjson.dumps(original, default=str))
    return f"{MASK_MARK} ({size} characters)"


def _text_size(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(
            len(part.get("text") or "")
            if part.get("type") == "text"
            else len(orjson.dumps(part, default=str))
            for part in content
            if isinstance(part, dict)
        )
    return 0


def _mask_openai(msg: dict[str, Any], min_chars: int) -> dict[str, Any]:
    role = msg.get("role")
    content = msg.get("content")
    if role in ("tool", "function") or (role == "user" and _text_size(content) >= min_chars):
        return {**msg, "content": placeholder(content)}
    return msg


def _mask_anthropic(msg: dict[str, Any], min_chars: int) -> dict[str, Any]:
    content = msg.get("content")
    if isinstance(content, str):
        return {**msg, "content": placeholder(content)} if len(content) >= min_chars else msg
    if not isinstance(content, list):
        return msg
    blocks: list[Any] = []
    changed = False
    for block in content:
        new = block
        if isinstance(block, dict):
            kind = block.get("type")
            if kind == "tool_result":
                new = {**block, "content": placeholder(block.get("content", ""))}
            elif kind == "text" and len(block.get("text") or "") >= min_chars:
                new = {**block, "text": placeholder(block.get("text"))}
            elif kind in ("image", "document") and _text_size([block]) >= min_chars:
                new = {"type": "text", "text": placeholder(block)}
                if "cache_control" in block:
                    new["cache_control"] = block["cache_control"]
        changed = changed or new is not block
        blocks.append(new)
    return {**msg, "content": blocks} if changed else msg


def _mask_responses(item: dict[str, Any], min_chars: int) -> dict[str, Any]:
    kind = item.get("type", "message")
    if kind == "function_call_output":
        return {**item, "output": placeholder(item.get("output"))}
    if kind == "message" and item.get("role") == "user":
        content = item.get("content")
        if _text_size(content) >= min_chars:
            return {**item, "content": placeholder(content)}
    return item


# How one user-side message is masked, by dialect (OpenAI chat completions by default).
_MASKS = {"anthropic": _mask_anthropic, "openai-responses": _mask_responses}


def _observations(messages: list[Any], d: DialectContext) -> list[list[int]]:
    """Indexes of each observation (runs of user-side messages), oldest first."""
    runs: list[list[int]] = []
    previous = False
    for k, msg in enumerate(messages):
        user_side = isinstance(msg, dict) and not d.is_system(msg) and d.is_user_turn(msg)
        if user_side:
            if not previous:
                runs.append([])
            runs[-1].append(k)
        previous = user_side
    return runs


def mask_transcript(
    dialect: str,
    body: Mapping[str, Any],
    keep: int = DEFAULT_MASK_KEEP,
    min_chars: int = DEFAULT_MASK_MIN_CHARS,
) -> dict[str, Any]:
    """``body`` with its old observations masked (see the module docstring).

    ``dialect`` is a registry name (chat completions, Messages, Responses). Returns
    a new body; unchanged messages are the same objects and nothing is mutated.
    O(size of the transcript).
    """
    d = get_dialect(dialect).context
    mask = _MASKS.get(dialect, _mask_openai)
    key = getattr(d, "transcript_key", "messages")  # Responses: ``input``
    messages = body.get(key)
    if not isinstance(messages, list):
        return dict(body)
    runs = _observations(messages, d)
    masked = masked_count(len(runs), keep)
    if masked == 0:
        return dict(body)
    task = next((k for run in runs for k in run if d.is_user_turn(messages[k])), None)
    out = list(messages)
    for run in runs[:masked]:
        for k in run:
            if k != task or d.is_tool_result(messages[k]):
                out[k] = mask(messages[k], min_chars)
    return {**body, key: out}
