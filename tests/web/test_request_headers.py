"""A request's headers read once per turn (skillstate.web.turns.RequestHeaders): what the
turn's headers and its control headers were read as before, from Starlette's ``Headers``."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from skillstate.errors import ProxyError
from skillstate.web.turns import request_headers, single_header

RAW = [
    (b"content-type", b"application/json"),
    (b"anthropic-beta", b"one"),
    (b"X-Mixed", b"v"),
    (b"anthropic-beta", b"two"),
    (b"x-skillstate-session", b"s1"),
    (b"x-skillstate-mode", b"state"),
    (b"x-skillstate-mode", b"passthrough"),
    (b"x-skillstate-mode", b"auto"),
    (b"x-latin", "caf\u00e9".encode("latin-1")),
]


def _request() -> Request:
    return Request({"type": "http", "method": "POST", "path": "/", "headers": RAW})


def test_values_are_the_pairs_as_a_dict_with_lower_case_names() -> None:
    request = _request()
    plain = {k.lower(): v for k, v in request.headers.items()}  # what a turn kept before
    assert request_headers(request).values == plain
    assert request_headers(request) is request_headers(_request_sharing(request))  # read once


def _request_sharing(request: Request) -> Request:
    return Request(request.scope)


def test_single_header_is_the_one_value_and_a_repeated_one_a_400() -> None:
    request = _request()
    assert single_header(request, "x-skillstate-session") == "s1"
    assert single_header(request, "x-latin") == "caf\u00e9"
    assert single_header(request, "idempotency-key") is None
    with pytest.raises(ProxyError, match="x-skillstate-mode was sent 3 times"):
        single_header(request, "x-skillstate-mode")
    with pytest.raises(ProxyError, match="anthropic-beta was sent 2 times"):
        single_header(request, "anthropic-beta")
