"""Reply-envelope stripping, by dialect: the model's reply without the proxy's protocol.
Pure, no I/O.

With ``reply_envelope: strip`` the client sees the reply minus every envelope the
extractor (:mod:`skillstate.engine.patch`) would accept. The machine is
:mod:`skillstate.engine.stripper` (one text, chunk by chunk or whole); where a format keeps the
text of a reply, a stream and a transcript is its dialect's business
(``Dialect.strip_reply`` / ``stream_stripper`` / ``strip_request``, in
:mod:`skillstate.dialects`). This module is the entry by dialect name.
"""

from __future__ import annotations

from typing import Any

from ..dialects.registry import get_dialect
from .stripper import (
    EnvelopeStripper,
    Known,
    Stripped,
    strip_envelope,
    strip_texts,
    strip_transcript,
)

__all__ = [
    "EnvelopeStripper",
    "Known",
    "Stripped",
    "strip_envelope",
    "strip_reply",
    "strip_request",
    "strip_texts",
    "strip_transcript",
]


def strip_reply(
    dialect: str, resp: dict[str, Any], known: Known = None
) -> tuple[dict[str, Any], Stripped]:
    """A non-streamed reply in the client's dialect without envelopes, and what was
    removed from the text the state engine reads (OpenAI: every choice's
    ``message.content``, the first one's summary; Anthropic: the ``text`` blocks, a block
    left empty dropped; Responses: the output_text parts of the message items). ``resp``
    is not mutated; it is returned as is when it had no envelope. ``known``: the reply's
    text already through ``strip_envelope``, and its result."""
    return get_dialect(dialect).strip_reply(resp, known)


def strip_request(dialect: str, body: dict[str, Any]) -> dict[str, Any]:
    """A client request without the envelopes in its earlier assistant turns (``messages``,
    or a Responses request's ``input`` items); ``body`` itself when it had none."""
    return get_dialect(dialect).strip_request(body)
