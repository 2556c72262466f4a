"""Exact, pure translation between Anthropic Messages and OpenAI chat completions.

Two directions, each with a request mapping, a full-response mapping and a stream translator:

* Anthropic client -> OpenAI-format upstream: :func:`anthropic_request_to_openai`,
  :func:`openai_response_to_anthropic`, :class:`OpenAIStreamToAnthropic`.
* OpenAI client -> Anthropic upstream: :func:`openai_request_to_anthropic`,
  :func:`anthropic_response_to_openai`, :class:`AnthropicStreamToOpenAI`.

Nothing here does I/O. Input dicts are never mutated. Requests come validated by their
dialect (``skillstate.dialects.openai`` / ``.anthropic``, ``Dialect.validate``), so the
request mappings check only what the other side cannot take.

Decisions worth knowing (each is also stated where it is implemented):

* Text joins (``common``: one rule for every translation, the Responses ones included).
  System texts are joined with a blank line: ``system`` text blocks into one OpenAI system
  string, a mid-conversation system message's blocks likewise, and the parts of an OpenAI
  system or developer message into Anthropic's ``system``; an assistant message's text
  blocks are concatenated with no separator (Anthropic splits one continuous output into
  several text blocks, e.g. around citations); a ``tool_result``'s text blocks, and a
  ``content`` document's chunks, are joined with ``"\\n"``. A user message with several
  blocks becomes an OpenAI content-part array, so block boundaries survive.
* Refusals. An OpenAI reply's ``refusal`` (its safety refusal, under ``finish_reason``
  ``stop``) is Anthropic's ``stop_reason: "refusal"``, its text a text block, as
  ``content_filter`` is; Anthropic's ``refusal`` is ``content_filter`` the other way.
* Tool-call arguments from an OpenAI upstream are turned into an Anthropic ``input`` object
  by :func:`parse_tool_arguments`, which the stream translator runs incrementally, so a
  streamed reply and the same reply unstreamed always give the same ``input``:
  a complete JSON object is taken exactly (raw control characters inside strings are
  tolerated and re-escaped); empty arguments give ``{}``; a JSON string holding a JSON
  object (double encoding) is decoded; anything else (truncated by ``max_tokens``, trailing
  junk, not an object, malformed) is *repaired*: the longest well-formed prefix is closed
  (an unfinished member's value becomes ``null``) and a ``"_raw"`` member carrying the
  upstream's complete argument text is added. So a repaired input is always recognisable
  by its ``"_raw"`` key (and tool-input validators that forbid unknown keys reject it).
* Usage. OpenAI ``prompt_tokens`` includes cached (and cache-write) tokens; Anthropic
  ``input_tokens`` excludes them: ``input_tokens = prompt_tokens - cached - cache_write``.
  A stream's ``message_start`` carries zero input tokens (unknown until the upstream's
  ``include_usage`` chunk); the real numbers arrive in ``message_delta.usage``, which the
  Anthropic SDKs copy over the ``message_start`` values.
* ``reasoning_content`` (OpenAI-compatible servers) and Anthropic ``thinking`` blocks are not
  carried across dialects: a thinking block needs a signature the other side cannot make.
* Stream translators expose ``.text``, ``.tool_calls`` (id, name, arguments JSON as sent to
  the client), ``.usage`` (the *upstream's* own usage object, in the upstream's dialect, or
  None) and ``.client_usage`` (the same, translated to the client's dialect).
* ``role: "system"`` entries in Anthropic ``messages`` (the anthropic SDK's
  ``SystemMessageParam``; text only) are accepted and become OpenAI system messages in place.
"""

from __future__ import annotations

from .common import (
    anthropic_stop_reason,
    anthropic_usage_to_openai,
    openai_finish_reason,
    openai_usage_to_anthropic,
)
from .replies import anthropic_response_to_openai, openai_response_to_anthropic
from .request_to_anthropic import openai_request_to_anthropic
from .request_to_openai import anthropic_request_to_openai
from .stream_to_anthropic import OpenAIStreamToAnthropic
from .stream_to_openai import AnthropicStreamToOpenAI
from .toolargs import ToolArgsStream, parse_tool_arguments

__all__ = [
    "AnthropicStreamToOpenAI",
    "OpenAIStreamToAnthropic",
    "ToolArgsStream",
    "anthropic_request_to_openai",
    "anthropic_response_to_openai",
    "anthropic_stop_reason",
    "anthropic_usage_to_openai",
    "openai_finish_reason",
    "openai_request_to_anthropic",
    "openai_response_to_anthropic",
    "openai_usage_to_anthropic",
    "parse_tool_arguments",
]
