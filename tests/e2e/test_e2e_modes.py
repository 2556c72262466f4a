"""Modes (state / passthrough / auto), session expiry and URL handling."""

from __future__ import annotations

import json
import time

import httpx

from skillstate.upstream.client import base_url
from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER


def envelope(patch: dict) -> str:
    return "```json\n" + json.dumps({"state_patch": patch, "action": "a"}) + "\n```"


def post(p: Proxy, messages: list, **headers: str) -> httpx.Response:
    return p.http.post(
        p.v1 + "/chat/completions",
        json={"model": "m", "messages": messages},
        headers={k.replace("_", "-"): v for k, v in headers.items()},
        timeout=10,
    )


def long_transcript(turns: int) -> list[dict]:
    msgs: list[dict] = [{"role": "user", "content": "TASK"}]
    for i in range(turns):
        msgs += [
            {"role": "assistant", "content": f"reply {i} " + "r" * 200},
            {"role": "user", "content": f"obs {i} " + "o" * 200},
        ]
    return msgs


def test_passthrough_forwards_untouched_and_keeps_no_state(
    fake: FakeProvider, proxy: Proxy
) -> None:
    msgs = long_transcript(3)
    r = post(proxy, msgs, x_skillstate_mode="passthrough", x_skillstate_session="pt")
    assert r.status_code == 200
    assert r.headers[SESSION_HEADER] == "pt"
    assert "x-skillstate-transition" not in r.headers
    assert fake.last.json["messages"] == msgs
    assert proxy.get("/state", params={"session": "pt"}).status_code == 404
    # Still metered, and /cost counts the reply as soon as the client has it.
    cost = proxy.get("/cost", params={"session": "pt"}).json()
    assert cost["totals"]["requests"] == 1 and cost["totals"]["input_tokens"] > 0


def test_auto_mode_resumes_a_session_with_state_in_the_window(
    fake: FakeProvider, proxy: Proxy
) -> None:
    fake.responder = lambda _req: Reply(text=envelope({"notes": "n"}))
    r = post(proxy, [{"role": "user", "content": "hi"}], x_skillstate_session="au")
    assert r.headers["x-skillstate-context"] == "compact"  # state mode builds the state
    # auto on a session whose state exists: the window form, not passthrough (issue 23; the
    # choice for new sessions is tested in test_e2e_auto.py). Its window has no start yet,
    # so the first turn is a checkpoint over the transcript as the client sent it.
    r = post(proxy, long_transcript(20), x_skillstate_mode="auto", x_skillstate_session="au")
    assert r.headers["x-skillstate-context"] == "checkpoint"
    assert "reply 0 " in json.dumps(fake.last.json)
    assert proxy.state("au")["step"] == 2 and proxy.state("au")["state"] == {"notes": "n"}
    fake.responder = lambda _req: Reply(text="plain")
    more = [*long_transcript(20), {"role": "assistant", "content": "ok"}]
    more.append({"role": "user", "content": "and now?"})
    r = post(proxy, more, x_skillstate_mode="auto", x_skillstate_session="au")
    assert r.headers["x-skillstate-context"] == "window"
    assert r.headers["x-skillstate-transition"] == "window"
    assert "reply 0 " not in json.dumps(fake.last.json)  # the window kept the last exchanges


def test_bad_mode_header_is_400(proxy: Proxy) -> None:
    r = post(proxy, [{"role": "user", "content": "x"}], x_skillstate_mode="turbo")
    assert r.status_code == 400 and "x-skillstate-mode" in r.json()["error"]["message"]


def test_sessions_expire_after_ttl(fake: FakeProvider, start_proxy: StartProxy) -> None:
    p = start_proxy(fake.url, config={"session_ttl": 1, "purge_interval": 0.2})
    post(p, [{"role": "user", "content": "x"}], x_skillstate_session="old")
    assert p.get("/state", params={"session": "old"}).status_code == 200
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if p.get("/state", params={"session": "old"}).status_code == 404:
            break
        time.sleep(0.1)
    assert p.get("/state", params={"session": "old"}).status_code == 404


def test_base_url_is_never_doubled() -> None:
    assert base_url("http://h:1") == "http://h:1/v1"
    assert base_url("http://h:1/") == "http://h:1/v1"
    assert base_url("https://api.openai.com/v1") == "https://api.openai.com/v1"
    assert base_url("https://x/v1beta/openai") == "https://x/v1beta/openai"


def test_upstream_without_v1_gets_it(fake: FakeProvider, start_proxy: StartProxy) -> None:
    p = start_proxy(fake.url)  # no /v1 in the configured URL
    assert post(p, [{"role": "user", "content": "x"}]).status_code == 200
    assert fake.last.path == "/v1/chat/completions"
