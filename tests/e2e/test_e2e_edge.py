"""Hostile clients at the HTTP edge, through the real app under the CLI's uvicorn config: JSON
nested too deep, bodies not declared as JSON (what a web page can send without CORS), foreign
Host and Origin headers (DNS rebinding, cross-site requests), and headers that pick what the
operator's key bills. Every refusal is an error object in the client's own dialect."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from skillstate.jsondepth import MAX_JSON_DEPTH
from tests.conftest import InProcessProxy, Proxy, StartProxy, proxy_env
from tests.fakeprovider import FakeProvider

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
TURN_PATHS = [CHAT, MESSAGES]


def turn_body(path: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if path == MESSAGES:
        body["max_tokens"] = 16
    return {**body, **extra}


def post(proxy: Proxy, path: str, body: bytes | dict[str, Any], **headers: str) -> httpx.Response:
    # The stdlib encoder: orjson refuses to write more than 255 levels.
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = {"content-type": "application/json"}
    hdrs.update({k.replace("_", "-"): v for k, v in headers.items()})
    return proxy.http.post(proxy.url + path, content=raw, headers=hdrs, timeout=30)


def assert_dialect_error(r: httpx.Response, path: str, status: int, words: str) -> None:
    """The refusal is ``status`` with the error object of ``path``'s dialect, naming ``words``."""
    assert r.status_code == status, r.text
    body = r.json()
    if path.endswith("/messages"):
        assert body["type"] == "error" and isinstance(body["error"]["type"], str), body
    else:
        assert set(body["error"]) >= {"message", "type", "param", "code"}, body
    assert words in body["error"]["message"], body


def nested_lists(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


def deep_schema(levels: int) -> dict[str, Any]:
    """A JSON schema whose containers nest exactly ``levels`` deep."""
    if levels <= 2:
        return {"type": "string", "enum": ["a"]} if levels == 2 else {"type": "string"}
    return {"type": "object", "properties": {"x": deep_schema(levels - 2)}}


def with_deep_tool(path: str, total_depth: int) -> dict[str, Any]:
    """A turn body whose deepest point, ``total_depth`` levels down, is in a tool's schema."""
    above = depth(turn_body(path, tools=[tool(path, {})]))  # levels down to the schema itself
    body = turn_body(path, tools=[tool(path, deep_schema(total_depth - above + 1))])
    assert depth(body) == total_depth
    return body


def tool(path: str, schema: dict[str, Any]) -> dict[str, Any]:
    if path == MESSAGES:
        return {"name": "f", "description": "d", "input_schema": schema}
    return {"type": "function", "function": {"name": "f", "parameters": schema}}


# ---- item 4: one nesting limit, enforced at parse time -------------------------------------


@pytest.mark.parametrize("path", TURN_PATHS)
@pytest.mark.parametrize("mode", ["state", "passthrough"])
def test_json_nested_past_the_limit_is_a_400_in_the_dialect(
    fake: FakeProvider, proxy: Proxy, path: str, mode: str
) -> None:
    # 300 nested arrays used to be a 500 with a traceback (orjson serialises only 255 levels).
    content = [{"type": "text", "text": "x", "extra": nested_lists(300)}]
    deep_content = turn_body(path, messages=[{"role": "user", "content": content}])
    # Deep in the tools' schemas; exactly what a passing body may reach still works.
    deep_tool = with_deep_tool(path, MAX_JSON_DEPTH + 1)
    within = with_deep_tool(path, MAX_JSON_DEPTH)

    for body in (deep_content, deep_tool):
        r = post(proxy, path, body, x_skillstate_mode=mode)
        assert_dialect_error(r, path, 400, f"more than {MAX_JSON_DEPTH} levels deep")
    assert fake.requests == []
    r = post(proxy, path, within, x_skillstate_mode=mode)
    assert r.status_code == 200, r.text
    assert proxy.get("/health").json()["ok"] is True


def test_operator_patch_nested_past_the_limit_is_a_400(fake: FakeProvider, proxy: Proxy) -> None:
    r = post(proxy, CHAT, turn_body(CHAT), x_skillstate_session="s")
    assert r.status_code == 200, r.text
    before = proxy.state("s")
    r = proxy.http.patch(
        proxy.url + "/state",
        params={"session": "s"},
        content=json.dumps({"facts": nested_lists(400)}).encode(),
        headers={"content-type": "application/json"},
    )
    assert_dialect_error(r, CHAT, 400, "levels deep")
    assert proxy.state("s") == before


# ---- item 7: bodies must be declared as JSON ------------------------------------------------


@pytest.mark.parametrize("path", TURN_PATHS)
def test_a_body_not_declared_as_json_is_a_415(fake: FakeProvider, proxy: Proxy, path: str) -> None:
    raw = orjson.dumps(turn_body(path))
    # What a web page may send cross-site without a CORS preflight, and no type at all.
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data", ""):
        r = proxy.http.post(proxy.url + path, content=raw, headers={"content-type": ctype})
        assert_dialect_error(r, path, 415, "application/json")
    assert fake.requests == []
    for ctype in ("application/json; charset=utf-8", "Application/JSON", "application/x+json"):
        r = proxy.http.post(proxy.url + path, content=raw, headers={"content-type": ctype})
        assert r.status_code == 200, (ctype, r.text)


def test_a_state_patch_not_declared_as_json_is_a_415(fake: FakeProvider, proxy: Proxy) -> None:
    assert post(proxy, CHAT, turn_body(CHAT), x_skillstate_session="s").status_code == 200
    before = proxy.state("s")
    r = proxy.http.patch(
        proxy.url + "/state",
        params={"session": "s"},
        content=b'{"facts": "from a web page"}',
        headers={"content-type": "text/plain"},
    )
    assert_dialect_error(r, CHAT, 415, "application/json")
    assert proxy.state("s") == before


# ---- item 7: Host and Origin ----------------------------------------------------------------


def test_a_foreign_host_is_refused_on_every_route(fake: FakeProvider, proxy: Proxy) -> None:
    # DNS rebinding: evil.example resolves to 127.0.0.1, the browser sends its own name.
    assert post(proxy, CHAT, turn_body(CHAT), x_skillstate_session="s").status_code == 200
    fake.reset()
    for path in TURN_PATHS:
        r = post(proxy, path, turn_body(path), host="evil.example")
        assert_dialect_error(r, path, 403, "allowed_hosts")
    for path in ("/state?session=s", "/state", "/cost", "/health", "/v1/models"):
        r = httpx.get(proxy.url + path, headers={"host": "evil.example:8789"})
        assert_dialect_error(r, CHAT, 403, "allowed_hosts")
    assert fake.requests == []
    port = proxy.url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", "LOCALHOST.", "[::1]"):
        assert httpx.get(proxy.url + "/health", headers={"host": host}).status_code == 200, host


def test_allowed_hosts_adds_names(fake: FakeProvider, start_proxy: StartProxy) -> None:
    proxy = start_proxy(fake.url + "/v1", config={"allowed_hosts": ["proxy.internal"]})
    assert httpx.get(proxy.url + "/health", headers={"host": "proxy.internal:1"}).status_code == 200
    assert httpx.get(proxy.url + "/health", headers={"host": "127.0.0.1"}).status_code == 200
    r = httpx.get(proxy.url + "/health", headers={"host": "other.internal"})
    assert_dialect_error(r, CHAT, 403, "allowed_hosts")


def test_a_cross_origin_request_is_refused_on_every_route(fake: FakeProvider, proxy: Proxy) -> None:
    for path in TURN_PATHS:
        for origin in ("https://evil.example", "null", "http://localhost:1"):
            r = post(proxy, path, turn_body(path), origin=origin)
            assert_dialect_error(r, path, 403, "allowed_origins")
    r = httpx.delete(
        proxy.url + "/state", params={"session": "s"}, headers={"origin": "https://evil.example"}
    )
    assert_dialect_error(r, CHAT, 403, "allowed_origins")
    r = httpx.get(proxy.url + "/v1/models", headers={"origin": "https://evil.example"})
    assert_dialect_error(r, CHAT, 403, "allowed_origins")
    assert fake.requests == []
    # The proxy's own pages (same origin) may call it.
    r = post(proxy, CHAT, turn_body(CHAT), origin=proxy.url)
    assert r.status_code == 200, r.text


def test_allowed_origins_lets_a_named_site_in(fake: FakeProvider, start_proxy: StartProxy) -> None:
    proxy = start_proxy(fake.url + "/v1", config={"allowed_origins": ["https://app.example"]})
    r = post(proxy, MESSAGES, turn_body(MESSAGES), origin="https://app.example")
    assert r.status_code == 200, r.text
    r = post(proxy, MESSAGES, turn_body(MESSAGES), origin="https://app.example.evil")
    assert_dialect_error(r, MESSAGES, 403, "allowed_origins")


# ---- item 8: client headers that pick what the operator's key bills -------------------------

SCOPING = {
    "openai-organization": "org-client",
    "openai-project": "proj-client",
    "api-key": "azure-client-key",
    "x-goog-api-key": "google-client-key",
    "x-goog-user-project": "client-project",
    "anthropic-organization-id": "client-org",
    "ocp-apim-subscription-key": "apim-client-key",
}


@pytest.mark.parametrize("path", TURN_PATHS)
def test_scoping_headers_are_dropped_when_the_proxy_has_its_own_key(
    fake: FakeProvider, proxy: Proxy, path: str
) -> None:
    r = post(proxy, path, turn_body(path), authorization="Bearer client-key", **SCOPING)
    assert r.status_code == 200, r.text
    sent = fake.last.headers
    assert not set(SCOPING) & set(sent), sent
    assert "client-key" not in str(sent)
    assert sent.get("authorization") == "Bearer sk-upstream" or sent.get("x-api-key")


def test_scoping_headers_on_the_allowlist_are_forwarded(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(
        fake.url + "/v1", config={"forward_scoping_headers": ["OpenAI-Organization"]}
    )
    r = post(proxy, CHAT, turn_body(CHAT), **SCOPING)
    assert r.status_code == 200, r.text
    sent = fake.last.headers
    assert sent["openai-organization"] == "org-client"
    assert not (set(SCOPING) - {"openai-organization"}) & set(sent), sent


def test_without_a_proxy_key_the_clients_own_scoping_headers_go_with_its_key(
    fake: FakeProvider, tmp_path: Path
) -> None:
    argv = ["--port", "0", "--data-dir", str(tmp_path), "--upstream", fake.url + "/v1"]
    proxy = InProcessProxy(argv, proxy_env(), tmp_path)  # no SKILLSTATE_API_KEY
    try:
        r = post(proxy, CHAT, turn_body(CHAT), authorization="Bearer client-key", **SCOPING)
    finally:
        proxy.stop()
    assert r.status_code == 200, r.text
    sent = fake.last.headers
    assert sent["authorization"] == "Bearer client-key"
    # (anthropic-* headers never go to an OpenAI-kind upstream, with or without a key)
    assert {k: sent.get(k) for k in SCOPING} == {
        k: None if k.startswith("anthropic-") else v for k, v in SCOPING.items()
    }
