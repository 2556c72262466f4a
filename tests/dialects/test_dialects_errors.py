"""An upstream's error answer as a client of either dialect sees it (registry.error_reply)."""

from __future__ import annotations

import orjson
import pytest

from skillstate.dialects.base import MAX_ERROR_MESSAGE_CHARS
from skillstate.dialects.registry import error_reply


def _message(body: bytes, client: str) -> str:
    doc = orjson.loads(body)
    return str(doc["error"]["message"])


@pytest.mark.parametrize(("upstream", "client"), [("openai", "anthropic"), ("anthropic", "openai")])
def test_an_upstream_message_of_any_size_reaches_the_client_cut_and_saying_so(
    upstream: str, client: str
) -> None:
    huge = "why " * 500_000  # 2 MB of explanation
    raw = orjson.dumps({"error": {"message": huge, "type": "invalid_request_error"}})
    status, body = error_reply(raw, 400, upstream, client)
    assert status == 400
    message = _message(body, client)
    assert message.startswith("why why")
    assert message.endswith(
        f"({len(huge) - MAX_ERROR_MESSAGE_CHARS} more characters cut by the proxy)"
    )
    assert len(body) < MAX_ERROR_MESSAGE_CHARS + 500


@pytest.mark.parametrize("client", ["openai", "anthropic"])
def test_a_short_message_and_a_text_page_are_kept_as_they_are(client: str) -> None:
    raw = orjson.dumps({"error": {"message": "model not found", "type": "not_found_error"}})
    upstream = "anthropic" if client == "openai" else "openai"
    assert _message(error_reply(raw, 404, upstream, client)[1], client) == "model not found"
    page = b"<html>502 Bad Gateway</html>" + b" " * 5_000_000
    message = _message(error_reply(page, 502, upstream, client)[1], client)
    assert message.startswith("<html>502 Bad Gateway</html>")
    assert len(message) <= 500
