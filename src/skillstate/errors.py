"""Precise, dialect-neutral errors: a kind, a message and an HTTP status. Each dialect
renders them as its own error object (``Dialect.error_body`` / ``error_status`` in
``skillstate.dialects``)."""

from __future__ import annotations

from typing import Any

Dialect = str  # a dialect's registry name ("openai", "anthropic"): see skillstate.dialects

# kind -> default status. Every dialect maps every kind to its own error type.
KINDS: dict[str, int] = {
    "invalid_request": 400,
    "authentication": 401,
    "permission": 403,
    "not_found": 404,
    "conflict": 409,
    "request_too_large": 413,
    "rate_limit": 429,
    "api_error": 500,
    "upstream_unreachable": 502,
    "timeout": 504,
    "overloaded": 529,
}

# A request its client went away from (nginx's "client closed request"): what a cancelled
# turn and the upstream attempt it cut are recorded with.
CLIENT_CLOSED = 499


class ProxyError(Exception):
    """An error the proxy reports to its client in the client's own dialect."""

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        retry_after: float | None = None,
        param: str | None = None,
        should_retry: bool | None = None,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown error kind {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status if status is not None else KINDS[kind]
        self.code = code or kind
        self.retry_after = retry_after
        self.param = param
        # False: ``x-should-retry: false``, which the openai and anthropic SDKs obey before
        # their own rule (they retry 408, 409, 429 and 5xx): a failure the proxy already
        # re-asked, whose retry would bill the same calls again.
        self.should_retry = should_retry
        self.attempts: list[Any] = []  # upstream attempts that led here (for the ledger)

    def headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.should_retry is not None:
            out["x-should-retry"] = "true" if self.should_retry else "false"
        if self.retry_after is None:
            return out
        # Round up: a client that waits exactly this long must fit.
        secs = int(-(-self.retry_after // 1)) if self.retry_after > 0 else 0
        ms = int(-(-self.retry_after * 1000 // 1)) if self.retry_after > 0 else 0
        # retry-after-ms carries the exact wait; both SDKs prefer it when present.
        return {**out, "retry-after": str(max(secs, 1)), "retry-after-ms": str(ms)}


# An error type or code an upstream reports in its stream (OpenAI's or Anthropic's words) ->
# the kind it means. A code names the error more closely than a type, so it is read first.
_KIND_OF_REPORTED = {
    "invalid_request_error": "invalid_request",
    "context_length_exceeded": "invalid_request",
    "invalid_prompt": "invalid_request",
    "authentication_error": "authentication",
    "invalid_api_key": "authentication",
    "permission_error": "permission",
    "not_found_error": "not_found",
    "request_too_large": "request_too_large",
    "rate_limit_error": "rate_limit",
    "rate_limit_exceeded": "rate_limit",
    "insufficient_quota": "rate_limit",
    "overloaded_error": "overloaded",
    "server_is_overloaded": "overloaded",
    "slow_down": "overloaded",
    "timeout_error": "timeout",
    "api_error": "api_error",
    "server_error": "api_error",
}


def reported_error(err: object) -> ProxyError:
    """The error object an upstream reports inside a stream (``{"message", "type", "code"}``,
    OpenAI's or Anthropic's) as the client's error: the kind its code or type means (an
    unknown one is the upstream's failure, ``api_error``), its message and code kept."""
    fields = err if isinstance(err, dict) else {"message": err}
    code, type_, message = fields.get("code"), fields.get("type"), fields.get("message")
    code = code if isinstance(code, str) and code else None
    kind = _KIND_OF_REPORTED.get(code or "") or _KIND_OF_REPORTED.get(str(type_), "api_error")
    text = message if isinstance(message, str) and message else "upstream error"
    return ProxyError(kind, text, code=code)


def kind_for_status(status: int) -> str:
    """The error kind that best describes an upstream HTTP status."""
    if status == 401:
        return "authentication"
    if status == 403:
        return "permission"
    if status == 404:
        return "not_found"
    if status == 413:
        return "request_too_large"
    if status == 429:
        return "rate_limit"
    if status == 504 or status == 408:
        return "timeout"
    if status == 529:
        return "overloaded"
    if status >= 500:
        return "api_error"
    return "invalid_request"
