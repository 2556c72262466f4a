"""A corpus of hostile and malformed requests against one real proxy process.

Every case must get a 4xx with an error object in the dialect of the route it hit (OpenAI's
``{"error": {...}}`` or Anthropic's ``{"type": "error", "error": {...}}``), and once the whole
corpus has run the proxy is healthy and a session committed before it is byte-identical.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ProxyProcess, proxy_env
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER

OAI = "/v1/chat/completions"
ANT = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
INPUT_TOKENS = "/v1/responses/input_tokens"
JSON_CT = {"content-type": "application/json"}
OK_MSGS = [{"role": "user", "content": "hi"}]


def nested(depth: int) -> str:
    """A placeholder that `j` replaces with `depth` nested arrays (too deep for json.dumps)."""
    return f"@DEEP{depth}@"


@dataclass
class Case:
    name: str
    method: str
    path: str
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    status: int | None = None  # exact status when it is part of the contract

    @property
    def anthropic(self) -> bool:
        return self.path.startswith(("/v1/messages", "/messages"))


def j(obj: Any) -> bytes:
    text = json.dumps(obj)
    for depth in (300, 2000):
        text = text.replace(f'"@DEEP{depth}@"', "[" * depth + '"x"' + "]" * depth)
    return text.encode()


def oai(name: str, body: Any, status: int | None = 400, **headers: str) -> Case:
    raw = body if isinstance(body, bytes) else j(body)
    return Case(name, "POST", OAI, raw, {**JSON_CT, **headers}, status)


def ant(name: str, body: Any, status: int | None = 400, path: str = ANT, **headers: str) -> Case:
    raw = body if isinstance(body, bytes) else j(body)
    return Case(name, "POST", path, raw, {**JSON_CT, "x-api-key": "k", **headers}, status)


def _openai_cases() -> list[Case]:
    m = {"model": "m", "messages": OK_MSGS}
    return [
        oai("oai-not-json", b"{nope"),
        oai("oai-array-body", [1, 2]),
        oai("oai-string-body", "hello"),
        oai("oai-empty-body", b""),
        oai(
            "oai-invalid-utf8", b'{"model": "m", "messages": [{"role": "user", "content": "\xff"}]}'
        ),
        oai("oai-nan-literal", b'{"model": "m", "messages": [], "temperature": NaN}'),
        oai("oai-no-messages", {"model": "m"}),
        oai("oai-messages-not-list", {"model": "m", "messages": "hi"}),
        oai("oai-message-not-object", {"model": "m", "messages": ["hi"]}),
        oai("oai-role-not-string", {"model": "m", "messages": [{"role": 1, "content": "x"}]}),
        oai("oai-content-number", {"model": "m", "messages": [{"role": "user", "content": 5}]}),
        oai("oai-model-number", {"model": 5, "messages": OK_MSGS}),
        oai("oai-tools-string", {**m, "tools": "abc"}),
        oai("oai-tools-numbers", {**m, "tools": [1]}),
        oai("oai-tool-no-function", {**m, "tools": [{"type": "function"}]}),
        oai("oai-tool-choice-number", {**m, "tool_choice": 5}),
        oai("oai-response-format-string", {**m, "response_format": "json"}),
        oai("oai-response-format-bad-type", {**m, "response_format": {"type": "nope"}}),
        oai("oai-stream-options-string", {**m, "stream": True, "stream_options": "x"}),
        oai(
            "oai-deep-content",
            {"model": "m", "messages": [{"role": "user", "content": nested(300)}]},
        ),
        oai("oai-deep-elsewhere", {**m, "metadata": nested(2000)}),
        oai("oai-text-plain", m, 415, **{"content-type": "text/plain"}),
        oai("oai-form", m, 415, **{"content-type": "application/x-www-form-urlencoded"}),
        oai("oai-no-content-type", m, 415, **{"content-type": ""}),
        oai("oai-bad-session", m, 400, **{SESSION_HEADER: "bad id!"}),
        oai("oai-long-session", m, 400, **{SESSION_HEADER: "s" * 500}),
        oai("oai-bad-mode", m, 400, **{"x-skillstate-mode": "bogus"}),
        oai("oai-bad-constrain", m, 400, **{"x-skillstate-constrain": "bogus"}),
        oai("oai-too-large", {**m, "pad": "x" * (17 * 1024 * 1024)}, 413),
        oai("oai-foreign-host", m, None, host="evil.example"),
        oai("oai-foreign-origin", m, None, origin="https://evil.example"),
        Case("oai-get", "GET", OAI, None, {}, 405),
        *_input_tokens_cases(),
    ]


def _input_tokens_cases() -> list[Case]:
    def count(name: str, body: Any, status: int | None = 400, **headers: str) -> Case:
        raw = body if isinstance(body, bytes) else j(body)
        return Case(name, "POST", INPUT_TOKENS, raw, {**JSON_CT, **headers}, status)

    return [
        count("itok-not-json", b"{nope"),
        count("itok-empty-model", {"model": "", "input": "hi"}),  # optional, a string if given
        count("itok-no-input", {"model": "m"}),
        count("itok-item-bad-role", {"model": "m", "input": [{"role": "x", "content": "y"}]}),
        count("itok-deep", {"model": "m", "input": nested(300)}),
        count("itok-unknown-previous", {"model": "m", "previous_response_id": "resp_x"}, 404),
        count("itok-bad-session", {"model": "m", "input": "hi"}, 400, **{SESSION_HEADER: "a b"}),
        count("itok-text-plain", {"model": "m", "input": "hi"}, 415, **{"content-type": "x/y"}),
        Case("itok-get", "GET", INPUT_TOKENS, None, {}, 405),
    ]


def _anthropic_cases() -> list[Case]:
    m = {"model": "m", "max_tokens": 16, "messages": OK_MSGS}
    return [
        ant("ant-not-json", b"{nope"),
        ant("ant-array-body", [1]),
        ant("ant-empty-body", b""),
        ant("ant-invalid-utf8", b'{"model": "m", "max_tokens": 1, "messages": "\xfe"}'),
        ant("ant-no-messages", {"model": "m", "max_tokens": 16}),
        ant("ant-no-max-tokens", {"model": "m", "messages": OK_MSGS}),
        ant("ant-max-tokens-string", {**m, "max_tokens": "ten"}),
        ant("ant-messages-not-list", {**m, "messages": {"role": "user"}}),
        ant("ant-content-number", {**m, "messages": [{"role": "user", "content": 7}]}),
        ant("ant-block-not-object", {**m, "messages": [{"role": "user", "content": [3]}]}),
        ant("ant-system-number", {**m, "system": 9}),
        ant("ant-tools-string", {**m, "tools": "abc"}),
        ant("ant-tool-no-name", {**m, "tools": [{"input_schema": {"type": "object"}}]}),
        ant("ant-tool-choice-bogus", {**m, "tool_choice": {"type": "bogus"}}),
        ant("ant-stream-string", {**m, "stream": "yes"}),
        ant("ant-deep-content", {**m, "messages": [{"role": "user", "content": nested(300)}]}),
        ant("ant-text-plain", m, 415, **{"content-type": "text/plain"}),
        ant("ant-bad-session", m, 400, **{SESSION_HEADER: "ba d"}),
        ant("ant-bad-mode", m, 400, **{"x-skillstate-mode": "nope"}),
        ant("ant-foreign-origin", m, None, origin="https://evil.example"),
        ant("count-not-json", b"[", path=COUNT),
        ant("count-no-messages", {"model": "m"}, path=COUNT),
        ant("count-deep", {"model": "m", "messages": nested(300)}, path=COUNT),
        ant(
            "count-text-plain",
            {"model": "m", "messages": OK_MSGS},
            415,
            path=COUNT,
            **{"content-type": "text/plain"},
        ),
    ]


def _state_and_cost_cases() -> list[Case]:
    def patch(name: str, query: str, body: Any, status: int | None = 400, **h: str) -> Case:
        raw = body if isinstance(body, bytes) else j(body)
        return Case(name, "PATCH", "/state" + query, raw, {**JSON_CT, **h}, status)

    def get(name: str, path: str, status: int | None = 400) -> Case:
        return Case(name, "GET", path, None, {}, status)

    return [
        patch("state-patch-not-json", "?session=seed", b"{"),
        patch("state-patch-array", "?session=seed", [1]),
        patch("state-patch-unknown-key", "?session=seed", {"nope": 1}),
        patch("state-patch-bad-type", "?session=seed", {"facts": "not an object"}),
        patch("state-patch-deep", "?session=seed", {"facts": {"d": nested(300)}}),
        patch("state-patch-huge", "?session=seed", {"notes": "x" * (2 * 1024 * 1024)}, None),
        patch("state-patch-no-session", "", {"notes": "x"}),
        patch("state-patch-bad-session", "?session=bad%20id", {"notes": "x"}),
        patch(
            "state-patch-text-plain",
            "?session=seed",
            {"notes": "x"},
            415,
            **{"content-type": "text/plain"},
        ),
        patch("state-patch-missing-session", "?session=nobody-here", {"notes": "x"}, 404),
        get("state-get-bad-session", "/state?session=bad%20id"),
        get("state-get-missing", "/state?session=nobody-here", 404),
        get("state-list-bad-limit", "/state?limit=-1"),
        get("state-list-limit-word", "/state?limit=ten"),
        # "²".isdigit() is true and int("²") raised: a 500 before
        get("state-list-limit-superscript", "/state?limit=%C2%B2"),
        get("state-list-limit-fullwidth", "/state?limit=%EF%BC%91"),
        get("state-history-limit-superscript", "/state?session=seed&history=1&limit=%C2%B2"),
        get("cost-since-fullwidth-digits", "/cost?since=%EF%BC%91h"),
        get("cost-window-backwards", "/cost?since=1h&until=2h"),
        get("state-list-bad-cursor", "/state?cursor=%00garbage"),
        get("state-history-bad-limit", "/state?session=seed&history=1&limit=0"),
        Case("state-delete-bad-session", "DELETE", "/state?session=bad%20id", None, {}, 400),
        Case("state-post", "POST", "/state", b"{}", JSON_CT, 405),
        get("cost-bad-since", "/cost?since=yesterday-ish"),
        get("cost-bad-group", "/cost?group_by=planet"),
        get("cost-bad-session", "/cost?session=bad%20id"),
        get("unknown-route", "/v2/everything", 404),
    ]


CASES = _openai_cases() + _anthropic_cases() + _state_and_cost_cases()


def test_the_corpus_is_large_and_names_are_unique() -> None:
    assert len(CASES) >= 60
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.fixture(scope="module")
def corpus_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProxyProcess, Any]]:
    tmp: Path = tmp_path_factory.mktemp("corpus")
    fake = FakeProvider().start()
    cfg = tmp / "skillstate.json"
    cfg.write_text(
        json.dumps({"schema": ["facts", "notes", "step"], "initial_state": {"facts": {}}})
    )
    argv = ["--port", "0", "--data-dir", str(tmp / "data"), "--upstream", fake.url + "/v1"]
    p = ProxyProcess([*argv, "--config", str(cfg)], proxy_env(SKILLSTATE_API_KEY="sk-up"), tmp)
    fake.enqueue(
        Reply(text='ok\n```json\n{"state_patch": {"notes": "seeded"}, "action": "a"}\n```')
    )
    r = httpx.post(
        p.url + OAI,
        json={"model": "m", "messages": OK_MSGS},
        headers={SESSION_HEADER: "seed", "authorization": "Bearer k"},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    before = httpx.get(p.url + "/state", params={"session": "seed", "history": 1}).content
    try:
        yield p, (fake, before)
    finally:
        p.stop()
        fake.stop()


def _check_dialect(case: Case, r: httpx.Response) -> None:
    body = r.json()
    if case.anthropic:
        assert body.get("type") == "error", body
        err = body["error"]
        assert isinstance(err.get("type"), str) and isinstance(err.get("message"), str), body
    else:
        err = body.get("error")
        assert isinstance(err, dict) and isinstance(err.get("message"), str), body
        assert err["message"], body


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_bad_input_gets_a_4xx_in_the_dialect(
    case: Case, corpus_proxy: tuple[ProxyProcess, Any]
) -> None:
    p, (fake, _) = corpus_proxy
    sent_before = len(fake.requests)
    headers = {k: v for k, v in case.headers.items() if v}
    if case.headers.get("content-type") == "":
        headers.pop("content-type", None)
    r = httpx.request(
        case.method, p.url + case.path, content=case.body, headers=headers, timeout=30
    )
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:500])
    if case.status is not None:
        assert r.status_code == case.status, (r.status_code, r.text[:500])
    _check_dialect(case, r)
    if case.method == "POST":
        assert len(fake.requests) == sent_before  # refused before anything went upstream


def test_after_the_corpus_the_proxy_is_healthy_and_state_unchanged(
    corpus_proxy: tuple[ProxyProcess, Any],
) -> None:
    p, (_, before) = corpus_proxy
    assert httpx.get(p.url + "/health", timeout=10).status_code == 200
    after = httpx.get(p.url + "/state", params={"session": "seed", "history": 1}).content
    assert after == before
    assert p.proc is not None and p.proc.poll() is None
