"""A Messages request's effort (``output_config.effort``) as OpenAI's reasoning effort (chat's
``reasoning_effort``, the Responses API's ``reasoning.effort``): the effort the reply is
asked for, and whether the OpenAI model takes one."""

from __future__ import annotations

import re
from typing import Any

from .common import JSON

# Anthropic's effort -> OpenAI's: the same words up to xhigh; max, Anthropic's most, as
# xhigh (OpenAI's max is taken by fewer of its models than xhigh).
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "xhigh", "max": "xhigh"}
# OpenAI's reasoning models, which take a reasoning effort (o1, o3, o4, gpt-5 and later,
# codex, gpt-oss); the others (gpt-4o, gpt-4.1, a gpt-5 chat variant, o1-mini and
# o1-preview) refuse it ("Unsupported parameter"). A provider prefix (``openai/``) is read
# past.
_REASONING_FAMILY = re.compile(r"(o[1-9]|gpt-([5-9]|[1-9]\d)|gpt-oss|codex)([-.]|$)")
_NO_EFFORT = re.compile(r"o1-(mini|preview)|gpt-[\d.]+-chat")


def takes_reasoning_effort(model: Any) -> bool:
    """Whether the OpenAI model ``model`` takes a reasoning effort."""
    name = str(model).rsplit("/", 1)[-1].lower()
    return bool(_REASONING_FAMILY.match(name)) and not _NO_EFFORT.match(name)


def reasoning_effort(body: JSON) -> str | None:
    """OpenAI's reasoning effort for the reply a Messages request asks for (None: none
    asked, or none the model takes): the top-level ``output_config.effort``, changed by a
    mid-conversation system message's ``output_config.effort`` (beta
    ``mid-conversation-output-config-2026-07-01``, as Claude Code sends it)."""
    effort = reply_effort(body)
    if effort is None or not takes_reasoning_effort(body.get("model")):
        return None
    return EFFORTS.get(effort)


def reply_effort(body: JSON) -> str | None:
    """The Anthropic effort in force for the reply. A system message's effort placed right
    after a user turn with new input is that turn's (so the reply's, when it is the last);
    placed anywhere else it starts at the next user turn with new input (a user turn of
    tool results only is none); it holds until another changes it."""
    effort = _effort_of(body.get("output_config"))
    pending: str | None = None
    previous: Any = None  # the last message that is no system message
    for msg in body.get("messages") or ():
        if not isinstance(msg, dict):
            continue
        if msg.get("role") == "system":
            changed = _effort_of(msg.get("output_config"))
            if changed is not None and _new_input(previous):
                effort, pending = changed, None
            elif changed is not None:
                pending = changed
            continue
        if pending is not None and _new_input(msg):
            effort, pending = pending, None
        previous = msg
    return effort


def _effort_of(config: Any) -> str | None:
    effort = config.get("effort") if isinstance(config, dict) else None
    return effort if isinstance(effort, str) else None


def _new_input(msg: Any) -> bool:
    """Whether ``msg`` is a user turn with new input: not only ``tool_result`` blocks."""
    if not isinstance(msg, dict) or msg.get("role") != "user":
        return False
    content = msg.get("content")
    if not isinstance(content, list):
        return True
    return any(not isinstance(b, dict) or b.get("type") != "tool_result" for b in content)
