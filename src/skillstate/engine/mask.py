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
``is_error``), so every tool call stays paired with its result. What a tool result or a
user message is, and where its content sits, is the dialect's (``Dialect.mask_observation``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from ..dialects.registry import get_dialect
from .context import DialectContext

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
    wire = get_dialect(dialect)
    d = wire.context
    key = d.transcript_key
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
                out[k] = wire.mask_observation(messages[k], min_chars, placeholder)
    return {**body, key: out}
