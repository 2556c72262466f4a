"""A turn's control header sent twice is a 400 in the client's dialect, before anything is
sent: which copy counts would otherwise depend on who reads it."""

from __future__ import annotations

import pytest

from tests.conftest import Proxy
from tests.fakeprovider import FakeProvider
from tests.helpers import SESSION_HEADER


@pytest.mark.parametrize(
    ("name", "values"),
    [
        (SESSION_HEADER, ("a", "b")),
        ("x-skillstate-mode", ("state", "passthrough")),
        ("x-skillstate-budget-usd", ("1", "2", "3")),
    ],
)
def test_a_control_header_sent_twice_is_a_400(
    fake: FakeProvider, proxy: Proxy, name: str, values: tuple[str, ...]
) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    headers = [(name, v) for v in values]
    r = proxy.http.post(proxy.v1 + "/chat/completions", json=body, headers=headers)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == f"{name} was sent {len(values)} times"
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    r = proxy.http.post(
        proxy.v1 + "/messages", json=body, headers=[*headers, ("anthropic-version", "2023-06-01")]
    )
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "error"
    assert not fake.requests
