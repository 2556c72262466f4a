"""Precise, dialect-neutral errors. Each one knows its HTTP status and how to render itself
as an OpenAI or an Anthropic error object."""

from __future__ import annotations

from typing import Any, Literal

Dialect = Literal["openai", "anthropic"]

# kind -> (default status, OpenAI error type, Anthropic error type)
_KINDS: dict[str, tuple[int, str, str]] = {
    "invalid_request": (400, "invalid_request_error", "invalid_request_error"),
    "authentication": (401, "authentication_error", "authentication_error"),
    "permission": (403, "permission_error", "permission_error"),
    "not_found": (404, "not_found_error", "not_found_error"),
    # Anthropic has no conflict type; 409 with invalid_request_error is what its API sends.
    "conflict": (409, "invalid_request_error", "invalid_request_error"),
    "request_too_large": (413, "invalid_request_error", "request_too_large"),
    "rate_limit": (429, "rate_limit_error", "rate_limit_error"),
    "api_error": (500, "api_error", "api_error"),
    "upstream_unreachable": (502, "api_error", "api_error"),
    "timeout": (504, "timeout_error", "timeout_error"),
    "overloaded": (529, "overloaded_error", "overloaded_error"),
}


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
    ) -> None:
        if kind not in _KINDS:
            raise ValueError(f"unknown error kind {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status if status is not None else _KINDS[kind][0]
        self.code = code or kind
        self.retry_after = retry_after
        self.param = param
        self.attempts: list[Any] = []  # upstream attempts that led here (for the ledger)

    def status_for(self, dialect: Dialect) -> int:
        """The HTTP status for a client of ``dialect``: 529 is Anthropic's "overloaded";
        OpenAI clients know 503."""
        return 503 if self.kind == "overloaded" and dialect == "openai" else self.status

    def body(self, dialect: Dialect) -> dict[str, Any]:
        _, openai_type, anthropic_type = _KINDS[self.kind]
        if dialect == "anthropic":
            return {"type": "error", "error": {"type": anthropic_type, "message": self.message}}
        return {
            "error": {
                "message": self.message,
                "type": openai_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        # Round up: a client that waits exactly this long must fit.
        secs = int(-(-self.retry_after // 1)) if self.retry_after > 0 else 0
        ms = int(-(-self.retry_after * 1000 // 1)) if self.retry_after > 0 else 0
        # retry-after-ms carries the exact wait; both SDKs prefer it when present.
        return {"retry-after": str(max(secs, 1)), "retry-after-ms": str(ms)}


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
