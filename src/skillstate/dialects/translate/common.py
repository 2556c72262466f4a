"""Shared by the translators: small helpers, text joins, and the usage and stop-reason
mappings between the two dialects."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ...cost.usage import MAX_TOKEN_COUNT
from ...jsontext import without_lone_surrogates
from ..checks import bad_request
from ..checks import is_int as _is_int

JSON = dict[str, Any]

TOOL_ERROR_PREFIX = "[tool error] "
# Where a translation makes one string of several text parts (a format whose member takes
# one string, or that the other side's servers read best as one), by what the parts are:
# system (and developer) texts, every one of them (the parts of a system message, of a
# Messages system prompt, of a mid-conversation system message, Responses instructions
# and system input items), apart by a blank line; an assistant's output, one continuous
# text that the APIs split into parts (around citations, say), run together; a tool's
# result, and a document's chunks, one per line. A user message keeps its parts.
SYSTEM_JOIN = "\n\n"
ASSISTANT_TEXT_JOIN = ""
TOOL_RESULT_TEXT_JOIN = "\n"
DOCUMENT_TEXT_JOIN = "\n"


def refuse_moderation(body: JSON, upstream: str) -> None:
    """OpenAI's moderated completions (``moderation``, in chat completions and Responses): a
    translated upstream would answer unmoderated, and its reply has no place for the
    results, so a request that asks for it is a 400 naming it, never sent without it."""
    if body.get("moderation") is not None:
        raise bad_request(
            f"moderation cannot be sent to {upstream}: it would answer unmoderated",
            "moderation",
        )


def tool_media_label(call_id: str) -> str:
    """The text before the images (and files) a tool call returned, where they travel in the
    user message after the tool messages (chat completions' ``tool`` messages take text only:
    an Anthropic ``tool_result``'s images, a Responses call output's images and files)."""
    return f"[image(s) returned by tool call {call_id}]"


def _dumps(value: Any) -> str:
    """Compact JSON text with non-ASCII kept, as tool arguments are written."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


_clean = without_lone_surrogates  # (the name the translations use)


def _joined(parts: list[str]) -> str:
    """``"".join(parts)``, collapsing the list so repeated reads stay linear overall."""
    if len(parts) > 1:
        parts[:] = ["".join(parts)]
    return parts[0] if parts else ""


def _as_int(value: Any) -> int:
    """A token count for the other dialect: 0 for anything that is not a sane count (a
    1e300 from a broken server must not crash the JSON encoder)."""
    if _is_int(value) or (isinstance(value, float) and math.isfinite(value)):
        n = int(value)
        return n if 0 <= n <= MAX_TOKEN_COUNT else 0
    return 0


def openai_usage_to_anthropic(usage: Any) -> JSON:
    """OpenAI ``usage`` -> Anthropic ``usage`` (input tokens exclude cache reads/writes)."""
    u = usage if isinstance(usage, dict) else {}
    details = u.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    prompt = _as_int(u.get("prompt_tokens"))
    cached = _as_int(details.get("cached_tokens")) or _as_int(u.get("prompt_cache_hit_tokens"))
    written = _as_int(details.get("cache_write_tokens"))
    return {
        "input_tokens": max(prompt - cached - written, 0),
        "output_tokens": _as_int(u.get("completion_tokens")),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": cached,
    }


def anthropic_usage_to_openai(usage: Any) -> JSON:
    """Anthropic ``usage`` -> OpenAI ``usage`` (prompt tokens include cache reads/writes)."""
    u = usage if isinstance(usage, dict) else {}
    read = _as_int(u.get("cache_read_input_tokens"))
    written = _as_int(u.get("cache_creation_input_tokens"))
    prompt = _as_int(u.get("input_tokens")) + read + written
    completion = _as_int(u.get("output_tokens"))
    details: JSON = {"cached_tokens": read}
    if written:
        details["cache_write_tokens"] = written
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": details,
    }


def anthropic_stop_reason(
    finish_reason: Any, *, has_tool_calls: bool, matched_stop: Any = None, refused: bool = False
) -> tuple[str, str | None]:
    """OpenAI ``finish_reason`` -> Anthropic ``(stop_reason, stop_sequence)``.

    ``matched_stop`` is vLLM's non-standard ``choice.stop_reason`` (the stop string that
    matched); OpenAI itself does not say which stop sequence fired. ``stop`` with tool calls
    present (some local servers do that) counts as ``tool_use``. ``refused``: the reply
    carries a ``refusal`` (OpenAI's safety refusal, with ``finish_reason`` ``stop``), which
    is Messages' ``refusal`` stop reason, as ``content_filter`` is, unless the reply calls a
    tool or was cut off.
    """
    if finish_reason in ("tool_calls", "function_call"):
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason == "content_filter" or (refused and not has_tool_calls):
        return "refusal", None
    if finish_reason == "stop" and isinstance(matched_stop, str) and matched_stop:
        return "stop_sequence", matched_stop
    return ("tool_use" if has_tool_calls else "end_turn"), None


_FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


def openai_finish_reason(stop_reason: Any, *, has_tool_calls: bool = False) -> str:
    """Anthropic ``stop_reason`` -> OpenAI ``finish_reason``."""
    if isinstance(stop_reason, str) and stop_reason in _FINISH_REASONS:
        return _FINISH_REASONS[stop_reason]
    return "tool_calls" if has_tool_calls else "stop"


def _synth_tool_id(message_id: str, position: int) -> str:
    base = re.sub(r"[^A-Za-z0-9_-]", "_", message_id)
    return f"toolu_{base}_{position}"
