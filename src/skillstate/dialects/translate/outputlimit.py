"""The output limit (``max_tokens``) an OpenAI-format request that sets none goes to the
Messages API with: the API requires one, and OpenAI's formats read no limit as the model's
own maximum.

A streamed request gets the model's maximum output where the model is known (Anthropic's
models overview), so that an agent writing a long file is not cut at a few thousand tokens
that it never asked for. A non-streamed one, and a model not in the table (an older Claude,
another vendor's model behind a Messages-compatible server, whose maximum may be lower), get
``DEFAULT_MAX_TOKENS``: a non-streamed answer arrives whole at the end, and one of tens of
thousands of tokens outlives idle connections and the proxy's ``first_byte_timeout``
(Anthropic's SDKs refuse such a request without streaming: "Streaming is required for
operations that may take longer than 10 minutes")."""

from __future__ import annotations

import re
from typing import Any

DEFAULT_MAX_TOKENS = 4096

# Model-id families and their maximum output tokens, the first match wins (so a later
# version of a family is listed before its prefix). Read anywhere in the id, so that a
# provider prefix (``anthropic/``) or a cloud's form (``anthropic.claude-…-v1:0``,
# ``claude-…@20250929``) is found too.
_MAX_OUTPUT = tuple(
    (re.compile(pattern), tokens)
    for pattern, tokens in (
        (r"claude-opus-4-6(?!\d)", 128_000),
        # 4.5 on (a later 4.x no less): not 4-2025…, Opus 4's dated id
        (r"claude-(opus|sonnet|haiku)-4-[5-9](?!\d)", 64_000),
        (r"claude-opus-4", 32_000),  # 4, 4.1
        (r"claude-sonnet-4", 64_000),
        (r"claude-3-7-sonnet", 64_000),
        (r"claude-3-5-(sonnet|haiku)", 8_192),
    )
)


def model_max_output(model: Any) -> int | None:
    """The maximum output tokens of the Claude model ``model`` (None: not a model known
    here)."""
    name = str(model).lower()
    for pattern, tokens in _MAX_OUTPUT:
        if pattern.search(name):
            return tokens
    return None


def default_max_tokens(model: Any, stream: bool) -> int:
    """The ``max_tokens`` a request for ``model`` that sets no output limit is sent with
    (see the module docstring)."""
    known = model_max_output(model) if stream else None
    return DEFAULT_MAX_TOKENS if known is None else known
