"""A Responses reply that is no reply: one whose ``status`` is ``failed`` (the error it
reports, kept for a client of any format) and one of a shape the API never sends; and the
code a failed response says another format's error with."""

from __future__ import annotations

from typing import Any

from ...errors import ProxyError, kind_for_status
from ..base import JSON, BadReply, shape_of, typed_items_problem

# A failed response's ``error.code`` (the openai SDK's ResponseError.code) -> the HTTP
# status that failure means to a client: too many requests, the API's own fault, a tool's
# store timing out. The other codes the API documents (``invalid_prompt``, the image
# codes) are the request's fault: a 400.
_FAILED_STATUS = {"rate_limit_exceeded": 429, "server_error": 500, "vector_store_timeout": 504}


def failed_response_error(response: Any) -> ProxyError:
    """The error a failed response reports (``response.error``: its message and code), as
    the client's own error: the status its code means (``_FAILED_STATUS``; an unknown or
    missing code is the upstream's failure, a 502)."""
    err = response.get("error") if isinstance(response, dict) else None
    err = err if isinstance(err, dict) else {}
    code = err.get("code") if isinstance(err.get("code"), str) else None
    message = err.get("message")
    message = message if isinstance(message, str) and message else "the response failed"
    if code in _FAILED_STATUS:
        status = _FAILED_STATUS[code]
    elif code is not None and (code.startswith("invalid_") or "image" in code):
        status = 400
    else:
        status = 502
    return ProxyError(kind_for_status(status), message, status=status, code=code)


# The codes a failed response's ``error.code`` takes that clients act on: the SDK's
# ResponseError codes, and those Codex reads from ``response.failed`` (context_length_exceeded
# starts its context-window handling; insufficient_quota and usage_not_included stop the
# turn; server_is_overloaded and slow_down are "the model is at capacity"; the rest is
# retried, rate_limit_exceeded after the wait its message names).
_FAILURE_CODES = frozenset(
    {
        "server_error",
        "rate_limit_exceeded",
        "invalid_prompt",
        "context_length_exceeded",
        "insufficient_quota",
        "usage_not_included",
        "server_is_overloaded",
        "slow_down",
    }
)
# A ProxyError kind -> the failure code that says it (any other kind: ``server_error``).
_CODE_OF_KIND = {"rate_limit": "rate_limit_exceeded", "overloaded": "server_is_overloaded"}
# Anthropic reports a prompt past the context window as an invalid request saying so.
_CONTEXT_WINDOW_WORDS = ("prompt is too long",)


def failure_code(err: ProxyError) -> str:
    """The Responses ``error.code`` of an error another format's upstream reported: its own
    code when a Responses client knows it, a prompt past the context window as
    ``context_length_exceeded``, else the code of its kind."""
    if err.code in _FAILURE_CODES:
        return err.code
    if err.kind in ("invalid_request", "request_too_large") and any(
        words in err.message.lower() for words in _CONTEXT_WINDOW_WORDS
    ):
        return "context_length_exceeded"
    return _CODE_OF_KIND.get(err.kind, "server_error")


def response_problem(resp: JSON) -> BadReply | None:
    """What makes a Responses reply no reply (``Dialect.reply_problem``): ``status``
    ``failed`` (the error it reports), or ``output`` that is not a list of items, each an
    object with a ``type``, a message's ``content`` a list of parts. ``incomplete`` is a
    reply (cut off at its limit, or filtered). An error object under status 200 without a
    failed status is named as such."""
    if resp.get("status") == "failed":
        failure = failed_response_error(resp)
        return BadReply(f"a failed response ({failure.message})", failure)
    problem = typed_items_problem(resp, "output", "a response whose", "items", "an item")
    if problem is not None:
        return problem
    for i, item in enumerate(resp["output"]):
        content = item.get("content")
        if item["type"] == "message" and not isinstance(content, list):
            return BadReply(
                f"a response whose output[{i}] (a message) has content {shape_of(content)},"
                " not a list of parts"
            )
    return None
