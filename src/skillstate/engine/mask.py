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

With a re-mask rule (``pays``, the proxy's: :class:`skillstate.cost.remask.RemaskRule`)
M moves only when the rule says the saving pays for the rewrite. A re-mask rewrites every
message from the first newly masked one on into the provider's cache, and under the
Anthropic cache that write (1.25x input) of a long transcript every ``keep`` turns cost more
than the masking saved. The mask point is then a function of the transcript alone, walked
request by request from its start: at the request with g observations, M becomes
``g - keep`` if ``pays(saved per turn, rewritten, the whole request, g)`` (in tokens). A
request that extends the previous one walks the same steps first, so it lands on the same M
(the cache keeps hitting) unless this request re-masks; no per-session memory is needed.

Masked: tool results and user text of at least ``min_chars`` characters each; the task
(the first user message and the user messages right after it: ``engine.context.Split``)
never is, nor is anything an assistant said. A shorter result
("ok", an exit status, an id) costs about what its placeholder does, so masking it saves
next to nothing and takes away what the agent did: an agent that reads its progress from its
tool results then does the work again (the tools bench's simulated triage agent re-updated
the issues it had updated until its 65-call limit). A masked
message keeps its role, position and tool-call ids (``tool_call_id`` / ``tool_use_id``,
``is_error``), so every tool call stays paired with its result. What a tool result or a
user message is, and where its content sits, is the dialect's (``Dialect.mask_observation``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import accumulate
from typing import Any

import orjson

from ..cost.tokens import estimate_tokens
from ..dialects.registry import get_dialect
from .context import DialectContext, split_transcript

# pays(tokens saved per coming turn, tokens rewritten into the cache, tokens of the whole
# request, observations so far)
RemaskPays = Callable[[int, int, int, int], bool]

__all__ = [
    "DEFAULT_MASK_KEEP",
    "DEFAULT_MASK_MIN_CHARS",
    "mask_transcript",
    "masked_count",
    "placeholder",
]

DEFAULT_MASK_KEEP = 3
DEFAULT_MASK_MIN_CHARS = 400  # shorter observations cost little and often matter ("yes", "ok")
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
    pays: RemaskPays | None = None,
    mark: Callable[[Any, Sequence[Any]], Any] | None = None,
) -> dict[str, Any]:
    """``body`` with its old observations masked (see the module docstring; ``pays``: the
    re-mask rule, None for the fixed blocks of ``keep``; ``mark``: puts a cache breakpoint
    on the message that ends the masked part, given the messages after it, so that the next
    re-mask finds the prefix before it cached where the provider caches only at breakpoints).

    ``dialect`` is a registry name (chat completions, Messages, Responses). Returns
    a new body; unchanged messages are the same objects and nothing is mutated.
    O(size of the transcript).
    """
    if keep < 1:
        raise ValueError(f"mask_keep must be a positive integer, not {keep!r}")
    wire = get_dialect(dialect)
    d = wire.context
    key = d.transcript_key
    messages = body.get(key)
    if not isinstance(messages, list):
        return dict(body)
    runs = _observations(messages, d)
    split = split_transcript(messages, d)
    masked_messages: dict[int, Any] = {}
    for run in runs[: max(len(runs) - keep, 0)]:
        for k in run:
            if not split.in_task(k):
                masked_messages[k] = wire.mask_observation(messages[k], min_chars, placeholder)
    if pays is None:
        masked = masked_count(len(runs), keep)
    else:
        masked = _paying_mask_point(messages, runs, masked_messages, keep, pays)
    if masked == 0:
        return dict(body)
    out = list(messages)
    for run in runs[:masked]:
        for k in run:
            if k in masked_messages:
                out[k] = masked_messages[k]
    if mark is not None and 0 < masked < len(runs):
        end = runs[masked][0] - 1  # the message before the first observation kept whole
        out[end] = mark(out[end], out[end + 1 :])
    return {**body, key: out}


def _paying_mask_point(
    messages: list[Any],
    runs: list[list[int]],
    masked_messages: dict[int, Any],
    keep: int,
    pays: RemaskPays,
) -> int:
    """The mask point M under the rule ``pays``, walked from the transcript's start (see
    the module docstring)."""
    sizes = [estimate_tokens(m) for m in messages]
    before = [0, *accumulate(sizes)]  # before[k]: tokens of messages[:k]
    saved = [0, *accumulate(
        sum(sizes[k] - estimate_tokens(masked_messages[k]) for k in run if k in masked_messages)
        for run in runs
    )]  # fmt: skip
    point = 0
    for g in range(keep + 1, len(runs) + 1):  # the request with g observations
        candidate = g - keep
        saving = saved[candidate] - saved[point]
        end = before[runs[g - 1][-1] + 1]  # the request's tokens as the client sent them
        whole = end - saved[point]  # as masked so far
        rewrite = end - before[runs[point][0]] - saving  # from the first newly masked on
        if pays(saving, rewrite, whole, g):
            point = candidate
    return point
