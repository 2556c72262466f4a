"""Issue 16 end to end: client keys on a real proxy with the real SDKs (loopback only)."""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from skillstate.app.server import ProxyServer
from skillstate.cli.main import main
from tests.conftest import StartProxy, proxy_env, settings_from_cli
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, ant, envelope, oai

NO_CACHE = {"auth_cache_ttl": 0}


def make_key(data: Path, *args: str) -> str:
    """`skillstate keys ... ` in this process; its stdout (a new key, or a message)."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["keys", "--data-dir", str(data), *args]) == 0
    return out.getvalue().strip()


def chat(client: openai.OpenAI, session: str, text: str = "hi") -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": text}],
        extra_headers={SESSION_HEADER: session},
    )


def message(client: anthropic.Anthropic, session: str) -> anthropic.types.Message:
    return client.messages.create(
        model="m",
        max_tokens=50,
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={SESSION_HEADER: session},
    )


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return tmp_path / "data"


# -- start-up ----------------------------------------------------------------------------


def test_a_non_loopback_host_without_keys_fails_in_one_line(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "skillstate", "--upstream", "http://127.0.0.1:9/v1"]
    r = subprocess.run(
        [*argv, "--data-dir", str(tmp_path / "d"), "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=proxy_env(),
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("skillstate: host: listening on 0.0.0.0 needs client keys")


def test_insecure_no_auth_starts_warns_and_says_so_in_health(
    fake: FakeProvider, tmp_path: Path
) -> None:
    argv = [sys.executable, "-m", "skillstate", "--upstream", fake.url + "/v1"]
    argv += ["--data-dir", str(tmp_path / "d"), "--host", "0.0.0.0", "--port", "0"]
    proc = subprocess.Popen(
        [*argv, "--insecure-no-auth"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=proxy_env(),
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        port = re.search(r"http://0\.0\.0\.0:(\d+)", proc.stdout.readline())
        assert port, "no listening line"
        url = f"http://127.0.0.1:{port.group(1)}"  # only loopback traffic
        warning = proc.stderr.readline()
        assert "WARNING: --insecure-no-auth" in warning and "NO client keys" in warning
        health = httpx.get(url + "/health", timeout=10).json()
        assert health["auth"].startswith("OFF (--insecure-no-auth)")
    finally:
        proc.terminate()
        proc.wait(30)


# -- 401s ---------------------------------------------------------------------------------


def test_wrong_expired_revoked_and_rotated_keys_get_401_in_both_dialects(
    fake: FakeProvider, start_proxy: StartProxy, data: Path
) -> None:
    good = make_key(data, "create", "--name", "good")
    old = make_key(data, "create", "--name", "rotated")
    new = make_key(data, "rotate", "rotated")
    revoked = make_key(data, "create", "--name", "revoked")
    expired = make_key(data, "create", "--name", "expired", "--expires", "1d")
    db = sqlite3.connect(data / "skillstate.db")
    db.execute("UPDATE api_keys SET expires = ? WHERE name = 'expired'", (time.time() - 1,))
    db.commit()
    proxy = start_proxy(fake.url + "/v1", config=NO_CACHE)
    fake.enqueue(Reply(text=envelope({})), Reply(text=envelope({})))
    assert chat(oai(proxy, good), "s").choices[0].message.content
    assert message(ant(proxy, new), "s").content
    make_key(data, "revoke", "revoked")
    cases = {
        "sk-ss-wrong": "invalid API key",
        old: "invalid API key",
        revoked: "revoked",
        expired: "expired",
    }
    for key, why in cases.items():
        with pytest.raises(openai.AuthenticationError) as oe:
            chat(oai(proxy, key), "s")
        assert oe.value.status_code == 401 and why in oe.value.message
        assert oe.value.body["type"] == "invalid_request_error" or oe.value.body.get("code")
        with pytest.raises(anthropic.AuthenticationError) as ae:
            message(ant(proxy, key), "s")
        assert ae.value.status_code == 401 and why in ae.value.message
        assert ae.value.body["type"] == "error"
        assert ae.value.body["error"]["type"] == "authentication_error"
    # No key at all: a 401 too, on every data route.
    for path in ("/state", "/cost", "/v1/models"):
        r = proxy.get(path)
        assert r.status_code == 401 and "API key is required" in r.text
    # Liveness only without an admin key.
    assert set(proxy.get("/health").json()) == {"ok", "auth"}
    # The client's key never went upstream (the proxy's own key did).
    sent = [r.headers for r in fake.requests]
    assert sent and all(good not in json.dumps(h) and new not in json.dumps(h) for h in sent)
    assert all(h.get("authorization") == "Bearer sk-upstream" or h.get("x-api-key") for h in sent)


def test_auth_turns_on_when_the_first_key_is_created(
    fake: FakeProvider, start_proxy: StartProxy, data: Path
) -> None:
    proxy = start_proxy(fake.url + "/v1", config=NO_CACHE)
    assert proxy.get("/state").status_code == 200
    assert proxy.get("/health").json()["auth"] == "off"
    key = make_key(data, "create", "--name", "first", "--admin")
    assert proxy.get("/state").status_code == 401
    r = proxy.get("/health", headers={"authorization": f"Bearer {key}"})
    assert r.json()["auth"] == "on" and "upstreams" in r.json()


def test_metrics_takes_an_admin_key_or_its_token(
    fake: FakeProvider, start_proxy: StartProxy, data: Path
) -> None:
    admin = make_key(data, "create", "--name", "ops", "--admin")
    user = make_key(data, "create", "--name", "dev")
    token = "m" * 20
    proxy = start_proxy(fake.url + "/v1", config={"metrics_token": token})

    def status(bearer: str | None) -> int:
        headers = {"authorization": f"Bearer {bearer}"} if bearer else {}
        return proxy.get("/metrics", headers=headers).status_code

    assert [status(admin), status(token), status(user), status(None)] == [200, 200, 401, 401]


# -- tenancy ------------------------------------------------------------------------------


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def tenants(data: Path) -> tuple[str, str, str]:
    """Keys of two tenants, alice and bob, and of an admin (root), in that order."""
    alice = make_key(data, "create", "--name", "alice")
    bob = make_key(data, "create", "--name", "bob")
    return alice, bob, make_key(data, "create", "--name", "root", "--admin")


def test_two_keys_see_only_their_own_sessions_state_and_cost(
    fake: FakeProvider, start_proxy: StartProxy, data: Path
) -> None:
    a, b, root = tenants(data)
    proxy = start_proxy(fake.url + "/v1", "--schema", "facts", config=NO_CACHE)
    fake.enqueue(
        Reply(text=envelope({"facts": "alice's"})),
        Reply(text=envelope({"facts": "bob's"})),
    )
    r = oai(proxy, a).chat.completions.with_raw_response.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={SESSION_HEADER: "s1"},
    )
    assert r.headers[SESSION_HEADER] == "s1"  # the store's id is never shown
    message(ant(proxy, b), "s1")  # the same client id, another key: another session

    def state(caller: str, **params: str) -> httpx.Response:
        return proxy.get("/state", params=params, headers=bearer(caller))

    assert state(a, session="s1").json()["state"] == {"facts": "alice's"}
    assert state(b, session="s1").json()["state"] == {"facts": "bob's"}
    assert state(a, session="s1").json()["session"] == "s1"
    assert state(a).json()["sessions"] == [
        {**state(a).json()["sessions"][0], "session": "s1", "key": "alice"}
    ]
    assert [s["key"] for s in state(b).json()["sessions"]] == ["bob"]
    everyone = state(root).json()["sessions"]
    assert sorted((s["key"], s["session"]) for s in everyone) == [("alice", "s1"), ("bob", "s1")]
    assert [s["key"] for s in state(root, key="bob").json()["sessions"]] == ["bob"]
    assert state(root, key="alice", session="s1").json()["state"] == {"facts": "alice's"}

    def cost(caller: str, **params: str) -> dict:
        r = proxy.get("/cost", params=params, headers=bearer(caller))
        assert r.status_code == 200, r.text
        return r.json()

    def requests(caller: str, **params: str) -> int:
        n: int = cost(caller, **params)["totals"]["requests"]
        return n

    def groups(caller: str) -> list[str]:
        return sorted(g["key"] for g in cost(caller, group_by="session")["groups"])

    assert [requests(a), requests(b), requests(root), requests(root, key="bob")] == [1, 1, 2, 1]
    assert groups(a) == ["s1"] and groups(b) == ["s1"]
    assert groups(root) == ["alice:s1", "bob:s1"]

    def by_key(caller: str, **params: str) -> dict[str, int]:
        summary = cost(caller, group_by="key", **params)
        assert summary["group_by"] == "key"
        return {g["key"]: g["requests"] for g in summary["groups"]}

    assert by_key(root) == {"alice": 1, "bob": 1}
    assert by_key(root, key="bob") == {"bob": 1}
    assert by_key(a) == {"alice": 1} and by_key(b) == {"bob": 1}
    # The ledger rows record the key that spent them.
    db = sqlite3.connect(data / "skillstate.db")
    assert sorted(r[0] for r in db.execute("SELECT session FROM ledger")) == [
        "alice:s1",
        "bob:s1",
    ]


def test_cross_key_read_patch_and_delete_are_404(
    fake: FakeProvider, start_proxy: StartProxy, data: Path
) -> None:
    a, b, root = tenants(data)
    proxy = start_proxy(fake.url + "/v1", "--schema", "facts", config=NO_CACHE)
    fake.enqueue(Reply(text=envelope({"facts": "secret"})))
    chat(oai(proxy, a), "only-alice")
    http = proxy.http
    url = proxy.url + "/state"
    for params in ({"session": "only-alice"}, {"session": "only-alice", "key": "alice"}):
        assert http.get(url, params=params, headers=bearer(b)).status_code == 404
        r = http.patch(url, params=params, headers=bearer(b), json={"facts": "x"})
        assert r.status_code == 404
        assert http.delete(url, params=params, headers=bearer(b)).status_code == 404
    assert http.get(url, params={"key": "alice"}, headers=bearer(b)).status_code == 404
    assert proxy.get("/cost", params={"key": "alice"}, headers=bearer(b)).status_code == 404
    # Untouched, and an admin's patch is recorded with the admin's key name.
    params = {"session": "only-alice", "key": "alice"}
    r = http.patch(url, params=params, headers=bearer(root), json={"facts": "fixed"})
    assert r.status_code == 200 and r.json()["session"] == "only-alice"
    history = http.get(url, params={**params, "history": "1"}, headers=bearer(a)).json()
    assert history["state"] == {"facts": "fixed"}
    assert [t["action"] for t in history["history"]][-1] == "operator:root"
    assert http.delete(url, params=params, headers=bearer(root)).status_code == 204


def test_a_keys_session_with_a_budget_and_no_state_is_its_own_to_read_and_delete(
    fake: FakeProvider, start_proxy: StartProxy, data: Path
) -> None:
    a, b, root = tenants(data)
    prices = {"m": {"input_per_mtok": 0, "output_per_mtok": 1_000}}
    proxy = start_proxy(fake.url + "/v1", config={**NO_CACHE, "prices": prices})
    fake.enqueue(Reply(text="a plain answer", usage={"completion_tokens": 7}))
    oai(proxy, a).chat.completions.create(
        model="m",
        max_tokens=100,
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={
            SESSION_HEADER: "pt",
            "x-skillstate-mode": "passthrough",
            "x-skillstate-budget-usd": "5",
        },
    )
    http, url = proxy.http, proxy.url + "/state"
    own = http.get(url, params={"session": "pt"}, headers=bearer(a))
    assert own.status_code == 200, own.text
    assert own.json()["budget_usd"] == 5.0 and own.json()["state"] is None
    # Another key learns nothing of it, and changes nothing.
    for params in ({"session": "pt"}, {"session": "pt", "key": "alice"}):
        assert http.get(url, params=params, headers=bearer(b)).status_code == 404
        r = http.patch(url, params=params, headers=bearer(b), json={"facts": "x"})
        assert r.status_code == 404
        assert http.delete(url, params=params, headers=bearer(b)).status_code == 404
    assert http.get(url, params={"session": "pt"}, headers=bearer(a)).json()["budget_usd"] == 5
    # An admin reads and deletes it in alice's namespace.
    params = {"session": "pt", "key": "alice"}
    shown = http.get(url, params=params, headers=bearer(root)).json()
    assert shown["session"] == "pt" and shown["spent_usd"] == pytest.approx(0.007)
    assert http.delete(url, params=params, headers=bearer(root)).status_code == 204
    assert http.get(url, params={"session": "pt"}, headers=bearer(a)).status_code == 404


def test_sessions_made_before_the_first_key_are_an_admins_with_key_none(
    fake: FakeProvider, start_proxy: StartProxy, data: Path
) -> None:
    proxy = start_proxy(fake.url + "/v1", "--schema", "facts", config=NO_CACHE)
    fake.enqueue(Reply(text=envelope({"facts": "kept"})))
    chat(oai(proxy, "no-keys-yet"), "early")  # stored as "early": no namespace
    a, _, root = tenants(data)
    http, url = proxy.http, proxy.url + "/state"
    unkeyed = {"session": "early", "key": "(none)"}
    listed = http.get(url, headers=bearer(root)).json()["sessions"]
    assert [(s["session"], s["key"]) for s in listed] == [("early", None)]
    r = http.get(url, params=unkeyed, headers=bearer(root))
    assert r.status_code == 200 and r.json()["state"] == {"facts": "kept"}
    assert r.json()["session"] == "early"
    # A non-admin key never reaches it, named or not; an admin's own namespace has no "early".
    for caller, params in ((a, unkeyed), (a, {"session": "early"}), (root, {"session": "early"})):
        assert http.get(url, params=params, headers=bearer(caller)).status_code == 404
        r = http.patch(url, params=params, headers=bearer(caller), json={"facts": "x"})
        assert r.status_code == 404
        assert http.delete(url, params=params, headers=bearer(caller)).status_code == 404
    assert http.get(url, params={"key": "(none)"}, headers=bearer(a)).status_code == 404
    # Its ledger rows: the admin's /cost names them the same way; by key, their key is null.
    spent = proxy.get("/cost", params={**unkeyed, "since": "all"}, headers=bearer(root))
    assert spent.json()["totals"]["requests"] == 1
    assert proxy.get("/cost", params=unkeyed, headers=bearer(a)).status_code == 404
    by_key = proxy.get("/cost", params={"group_by": "key"}, headers=bearer(root)).json()
    assert [(g["key"], g["requests"]) for g in by_key["groups"]] == [(None, 1)]
    r = http.patch(url, params=unkeyed, headers=bearer(root), json={"facts": "fixed"})
    assert r.status_code == 200 and r.json()["state"] == {"facts": "fixed"}
    history = http.get(url, params={**unkeyed, "history": "1"}, headers=bearer(root)).json()
    assert history["history"][-1]["action"] == "operator:root"
    assert http.delete(url, params=unkeyed, headers=bearer(root)).status_code == 204
    assert http.get(url, params=unkeyed, headers=bearer(root)).status_code == 404
    assert http.get(url, headers=bearer(root)).json()["sessions"] == []


def test_key_none_lists_and_sums_only_the_sessions_made_before_the_first_key(
    fake: FakeProvider, start_proxy: StartProxy, data: Path
) -> None:
    proxy = start_proxy(fake.url + "/v1", config=NO_CACHE)
    for session in ("early1", "early2", "early3"):
        chat(oai(proxy, "no-keys-yet"), session)
    a, _, root = tenants(data)
    chat(oai(proxy, a), "early1")  # alice's own early1: alice:early1
    chat(oai(proxy, root), "mine")
    http, url, unkeyed = proxy.http, proxy.url + "/state", {"key": "(none)", "limit": "2"}
    listed, cursor = [], None
    while True:
        r = http.get(url, params={**unkeyed, **({"cursor": cursor} if cursor else {})},
                     headers=bearer(root))  # fmt: skip
        assert r.status_code == 200
        listed += [(s["session"], s["key"]) for s in r.json()["sessions"]]
        if (cursor := r.json()["next_cursor"]) is None:
            break
    assert sorted(listed) == [("early1", None), ("early2", None), ("early3", None)]
    cost = proxy.get("/cost", params={"key": "(none)", "group_by": "session"}, headers=bearer(root))
    groups = {g["key"]: g["requests"] for g in cost.json()["groups"]}
    assert groups == {"early1": 1, "early2": 1, "early3": 1}
    by_key = proxy.get("/cost", params={"group_by": "key"}, headers=bearer(root)).json()
    assert {g["key"]: g["requests"] for g in by_key["groups"]} == {None: 3, "alice": 1, "root": 1}
    for path in ("/state", "/cost"):  # a client key never reaches them
        assert proxy.get(path, params={"key": "(none)"}, headers=bearer(a)).status_code == 404


# -- per-key limits -----------------------------------------------------------------------


def test_per_key_rpm_is_exact_with_three_concurrent_clients(
    fake: FakeProvider, start_proxy: StartProxy, data: Path
) -> None:
    limited = make_key(data, "create", "--name", "limited", "--rpm", "5")
    other = make_key(data, "create", "--name", "other")
    proxy = start_proxy(fake.url + "/v1", config=NO_CACHE)
    fake.responder = lambda rec: envelope({})
    outcomes: list[int | str] = []

    def client(n: int) -> None:
        c = oai(proxy, limited)
        for i in range(3):
            try:
                chat(c, f"c{n}-{i}")
                outcomes.append(200)
            except openai.RateLimitError as e:
                assert e.response.headers["retry-after"]
                assert float(e.response.headers["retry-after-ms"]) > 0
                assert e.body["code"] == "key_rate_limit"
                outcomes.append(429)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes) == [200] * 5 + [429] * 4
    assert len(fake.requests) == 5  # the refused ones never reached the upstream
    chat(oai(proxy, other), "free")  # another key has its own window
    with pytest.raises(anthropic.RateLimitError) as e:  # in the Anthropic dialect too
        message(ant(proxy, limited), "late")
    assert e.value.body["error"]["type"] == "rate_limit_error"


def test_daily_budget_refuses_the_call_that_would_exceed_it_until_the_day_rolls_over(
    fake: FakeProvider, tmp_path: Path, data: Path
) -> None:
    # $0.01 per output token, input free: a call's estimate is max_tokens x $0.01.
    config = {**NO_CACHE, "prices": {"m": {"input_per_mtok": 0, "output_per_mtok": 10_000}}}
    cfg = tmp_path / "skillstate.json"
    cfg.write_text(json.dumps(config))
    argv = ["--port", "0", "--data-dir", str(data), "--upstream", fake.url + "/v1"]
    env = proxy_env(SKILLSTATE_API_KEY="sk-upstream")
    settings = settings_from_cli([*argv, "--config", str(cfg)], env, tmp_path)
    key = make_key(data, "create", "--name", "capped", "--budget-usd-per-day", "1")
    day = 86400.0
    now = [time.time()]  # the ledger's rows carry the real time; the budget's day is now[0]
    server = ProxyServer(settings, clock=lambda: now[0]).start()
    try:
        c = ant(server, key)

        def ask(max_tokens: int) -> httpx.Response:
            r = c.messages.with_raw_response.create(
                model="m", max_tokens=max_tokens, messages=[{"role": "user", "content": "hi"}]
            )
            return r.http_response

        fake.enqueue(Reply(text=envelope({}), usage={"completion_tokens": 60}))
        first = ask(50)  # estimated $0.50 of $1: let through; it costs $0.60
        assert first.headers["x-skillstate-cost-usd"] == "0.60000000"
        assert first.headers["x-skillstate-budget-spent-usd"] == "0.60000000"
        assert first.headers["x-skillstate-budget-remaining"] == "0.40000000"
        with pytest.raises(anthropic.RateLimitError) as refused:
            ask(50)  # $0.60 spent + $0.50 estimated > $1
        assert refused.value.response.headers["x-skillstate-budget-remaining"] == "0.40000000"
        assert refused.value.body["error"]["type"] == "rate_limit_error"
        assert "daily budget $1 reached" in refused.value.message
        assert len(fake.requests) == 1  # refused before the upstream
        with pytest.raises(openai.RateLimitError) as oe:  # the OpenAI dialect's 429
            openai.OpenAI(
                base_url=server.url + "/v1", api_key=key, max_retries=0
            ).chat.completions.create(
                model="m", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
            )
        assert oe.value.body["code"] == "budget_exceeded"
        now[0] += day  # the next UTC day: the same call passes
        fake.enqueue(Reply(text=envelope({}), usage={"completion_tokens": 10}))
        assert ask(50).headers["x-skillstate-budget-spent-usd"] == "0.10000000"
    finally:
        server.stop()


def test_responses_api_ids_and_sessions_are_namespaced_by_key(
    fake: FakeProvider, start_proxy: StartProxy, data: Path
) -> None:
    a = make_key(data, "create", "--name", "alice")
    b = make_key(data, "create", "--name", "bob")
    proxy = start_proxy(fake.url + "/v1", "--schema", "facts", config=NO_CACHE)
    fake.enqueue(Reply(text=envelope({"facts": "alice's"})))
    alice, bob = oai(proxy, a), oai(proxy, b)
    raw = alice.responses.with_raw_response.create(
        model="m", input="hi", extra_headers={SESSION_HEADER: "r1"}
    )
    assert raw.headers[SESSION_HEADER] == "r1"
    first = raw.parse()
    assert alice.responses.retrieve(first.id).id == first.id
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.input_items.list(first.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.create(model="m", input="more", previous_response_id=first.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(first.id)
    assert len(fake.requests) == 1  # nothing of bob's reached the upstream
    r = proxy.get("/state", params={"session": "r1"}, headers=bearer(a))
    assert r.json()["state"] == {"facts": "alice's"}
    assert proxy.get("/state", params={"session": "r1"}, headers=bearer(b)).status_code == 404


def test_responses_made_before_the_first_key_are_an_admins_to_read_and_delete_not_chain(
    fake: FakeProvider, start_proxy: StartProxy, data: Path
) -> None:
    proxy = start_proxy(fake.url + "/v1", "--schema", "facts", config=NO_CACHE)
    fake.enqueue(Reply(text=envelope({"facts": "early"})))
    early = oai(proxy).responses.create(model="m", input="hi")  # no key yet: no namespace
    a, _, root = tenants(data)
    alice, admin = oai(proxy, a), oai(proxy, root)
    assert admin.responses.retrieve(early.id).id == early.id
    items = admin.responses.input_items.list(early.id).data
    assert [i.type for i in items] == ["message"]
    for caller in (alice, admin):
        # A keyed client's turns are its own namespace's: no one chains on it, admin included.
        with pytest.raises(openai.NotFoundError):
            caller.responses.create(model="m", input="more", previous_response_id=early.id)
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(early.id)
    with pytest.raises(openai.NotFoundError):
        alice.responses.input_items.list(early.id)
    with pytest.raises(openai.NotFoundError):
        alice.responses.delete(early.id)
    assert len(fake.requests) == 1
    admin.responses.delete(early.id)
    with pytest.raises(openai.NotFoundError):
        admin.responses.retrieve(early.id)


def test_the_request_log_names_the_key_never_the_key_itself(
    fake: FakeProvider, start_proxy: StartProxy, data: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key = make_key(data, "create", "--name", "auditor")
    proxy = start_proxy(fake.url + "/v1", "--verbose", config=NO_CACHE)
    fake.enqueue(Reply(text=envelope({})))
    with caplog.at_level(logging.INFO, logger="skillstate"):
        chat(oai(proxy, key), "logged")
        proxy.get("/state", headers=bearer("sk-ss-not-a-key"))
    lines = [r.getMessage() for r in caplog.records if r.name == "skillstate"]
    turn = [line for line in lines if line.startswith("POST /v1/chat/completions")]
    assert turn and "key=auditor" in turn[0] and "session=logged" in turn[0]
    refused = [line for line in lines if line.startswith("GET /state")]
    assert refused and "key=- " in refused[0] and "status=401" in refused[0]
    assert not any(key in line or "sk-ss-not-a-key" in line for line in lines)


# -- wrong keys ---------------------------------------------------------------------------


def test_wrong_keys_from_one_address_get_429_before_hashing_in_bounded_memory(
    fake: FakeProvider, start_proxy: StartProxy, data: Path
) -> None:
    good = make_key(data, "create", "--name", "good")
    proxy = start_proxy(fake.url + "/v1", config={"wrong_key_limit": 10})
    keys = proxy._server._app.app.state.runtime.keys  # type: ignore[union-attr]
    hashed = []
    digest = keys.hasher.digest
    keys.hasher.digest = lambda key: hashed.append(key) or digest(key)  # counts the HMACs
    statuses = []
    with httpx.Client(base_url=proxy.url, timeout=30) as one_address:
        for i in range(1000):
            r = one_address.get("/state", headers=bearer(f"sk-ss-wrong-{i}"))
            statuses.append(r.status_code)
            if r.status_code == 429:
                assert r.json()["error"]["code"] == "too_many_wrong_keys"
                assert 1 <= int(r.headers["retry-after"]) <= 60
        # The right key from the limited address waits out the window too (the key is not
        # even hashed there).
        assert one_address.get("/state", headers=bearer(good)).status_code == 429
        # The Anthropic SDK's route answers in its own dialect.
        with pytest.raises(anthropic.RateLimitError) as ae:
            message(ant(proxy, "sk-ss-wrong"), "s")
        assert ae.value.body["error"]["type"] == "rate_limit_error"
    assert statuses == [401] * 10 + [429] * 990
    assert len(hashed) == 10  # the 990 refused were never hashed
    assert len(keys.wrong_keys) == 1 and len(keys) <= 10  # one address; 10 digests cached
    # A right key from another address (127.0.0.2 is loopback too) is unaffected.
    fake.enqueue(Reply(text=envelope({})))
    other = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(base_url=proxy.url, transport=other, timeout=30) as another_address:
        assert another_address.get("/state", headers=bearer(good)).status_code == 200
        client = openai.OpenAI(
            base_url=proxy.v1, api_key=good, max_retries=0, http_client=another_address
        )
        assert chat(client, "s").choices[0].message.content
        assert another_address.get("/state", headers=bearer("sk-ss-wrong")).status_code == 401


# -- /admin/keys ---------------------------------------------------------------------------


def test_admin_keys_create_list_rotate_revoke_over_http_with_audit_lines(
    fake: FakeProvider, start_proxy: StartProxy, data: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = make_key(data, "create", "--name", "root", "--admin")
    user = make_key(data, "create", "--name", "user")
    proxy = start_proxy(fake.url + "/v1", config={"auth_cache_ttl": 60})
    caplog.set_level(logging.INFO, logger="skillstate.audit")
    with httpx.Client(base_url=proxy.url, timeout=30, headers=bearer(root)) as admin:
        r = admin.post("/admin/keys", json={"name": "ci", "rpm": 5, "expires": "30d"})
        assert r.status_code == 201 and r.headers["cache-control"] == "no-store"
        made = r.json()
        assert made["name"] == "ci" and made["rpm"] == 5 and made["status"] == "active"
        ci = made["key"]
        assert ci.startswith("sk-ss-")
        # The new key works at once, and its secret is never shown again.
        fake.enqueue(Reply(text=envelope({})))
        assert chat(oai(proxy, ci), "s").choices[0].message.content
        listed = admin.get("/admin/keys").json()["data"]
        assert [k["name"] for k in listed] == ["ci", "root", "user"]
        assert ci not in json.dumps(listed) and all("digest" not in k for k in listed)
        # Rotate: a new secret; the old one is refused at once here (auth_cache_ttl is 60 s).
        r = admin.post("/admin/keys/ci/rotate")
        assert r.status_code == 200 and r.json()["key"] not in (ci, None)
        rotated = r.json()["key"]
        assert proxy.get("/state", headers=bearer(ci)).status_code == 401
        assert proxy.get("/state", headers=bearer(rotated)).status_code == 200
        # Revoke: refused at once too.
        r = admin.delete("/admin/keys/ci")
        assert r.status_code == 200 and r.json()["status"] == "revoked"
        assert proxy.get("/state", headers=bearer(rotated)).status_code == 401
        # Errors are one line in the OpenAI error shape.
        assert admin.post("/admin/keys/ci/rotate").status_code == 409
        assert admin.delete("/admin/keys/nobody").status_code == 404
        assert admin.post("/admin/keys", json={"name": "ci"}).status_code == 409
        assert admin.post("/admin/keys", json={"name": "a b"}).status_code == 400
        assert admin.post("/admin/keys", json={"name": "x", "rpm": "5"}).status_code == 400
        assert admin.post("/admin/keys", json={"name": "x", "secret": "y"}).status_code == 400
        # Past what the store's integers hold: a 400 naming the field (a 500 before).
        r = admin.post("/admin/keys", json={"name": "x", "tpm": 2**63})
        assert r.status_code == 400 and "tpm must be at most" in r.json()["error"]["message"]
    # Any other key: a 403, and nothing changed.
    with httpx.Client(base_url=proxy.url, timeout=30, headers=bearer(user)) as other:
        for r in (
            other.get("/admin/keys"),
            other.post("/admin/keys", json={"name": "mine", "admin": True}),
            other.post("/admin/keys/root/rotate"),
            other.delete("/admin/keys/root"),
        ):
            assert r.status_code == 403, r.text
            assert r.json()["error"]["code"] == "admin_key_required"
    assert proxy.get("/state", headers=bearer(root)).status_code == 200
    # The same audit lines as the CLI's, naming the admin key (never a secret).
    lines = [r.getMessage() for r in caplog.records if r.name == "skillstate.audit"]
    assert lines[:2] == [  # the keys made with the CLI above
        "audit: key created name=root admin=true by=cli",
        "audit: key created name=user admin=false by=cli",
    ]
    assert lines[2:] == [
        "audit: key created name=ci admin=false rpm=5 by=key:root from 127.0.0.1",
        "audit: key rotated name=ci by=key:root from 127.0.0.1",
        "audit: key revoked name=ci by=key:root from 127.0.0.1",
    ]
    assert not any(ci in line or rotated in line for line in lines)


def test_cli_key_changes_write_the_same_audit_lines(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "skillstate", "keys", "--data-dir", str(tmp_path)]
    env = proxy_env()
    create = [*argv, "create", "--name", "ci", "--rpm", "5"]
    r = subprocess.run(create, env=env, capture_output=True)
    assert r.returncode == 0 and r.stdout.decode().startswith("sk-ss-")
    assert r.stderr.decode() == "audit: key created name=ci admin=false rpm=5 by=cli\n"
    r = subprocess.run([*argv, "revoke", "ci"], env=env, capture_output=True)
    assert r.stderr.decode() == "audit: key revoked name=ci by=cli\n"


@pytest.mark.parametrize("expires", ["999999999999d", "99999999999999999999999w"])
def test_a_key_expiring_past_what_a_date_can_hold_is_a_400_and_the_listing_stands(
    fake: FakeProvider, start_proxy: StartProxy, data: Path, expires: str
) -> None:
    """``expires`` past year 9999 was kept (POST /admin/keys answered a 500 after saving it),
    and from then on every listing of the keys failed: GET /admin/keys a 500, ``skillstate
    keys list`` a traceback."""
    root = make_key(data, "create", "--name", "root", "--admin")
    proxy = start_proxy(fake.url + "/v1")
    with httpx.Client(base_url=proxy.url, timeout=30, headers=bearer(root)) as admin:
        r = admin.post("/admin/keys", json={"name": "far", "expires": expires})
        assert r.status_code == 400 and "at most 36500d" in r.json()["error"]["message"]
        r = admin.get("/admin/keys")
        assert r.status_code == 200 and [k["name"] for k in r.json()["data"]] == ["root"]
        r = admin.post("/admin/keys", json={"name": "century", "expires": "36500d"})
        assert r.status_code == 201 and r.json()["expires"].startswith("21")
        assert admin.get("/admin/keys").status_code == 200


def test_the_last_active_admin_key_cannot_be_revoked_over_http(
    fake: FakeProvider, start_proxy: StartProxy, data: Path
) -> None:
    """It could: the admin revoked its own key (200) and from then on no key could manage
    the keys over HTTP. The CLI on the host still may."""
    root = make_key(data, "create", "--name", "root", "--admin")
    make_key(data, "create", "--name", "old", "--admin")
    make_key(data, "revoke", "old")  # a revoked admin is no admin
    proxy = start_proxy(fake.url + "/v1", config={"auth_cache_ttl": 60})
    with httpx.Client(base_url=proxy.url, timeout=30, headers=bearer(root)) as admin:
        r = admin.delete("/admin/keys/root")
        assert r.status_code == 409, r.text
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "conflict", error
        assert "'root' is the last active admin key" in error["message"]
        assert "skillstate keys revoke root" in error["message"]
        assert admin.get("/admin/keys").status_code == 200  # still an admin
        # With a second admin, either may go (the caller's own key too).
        r = admin.post("/admin/keys", json={"name": "ops", "admin": True})
        ops = r.json()["key"]
        assert admin.delete("/admin/keys/root").status_code == 200
    with httpx.Client(base_url=proxy.url, timeout=30, headers=bearer(ops)) as admin:
        assert admin.delete("/admin/keys/ops").status_code == 409
        assert admin.post("/admin/keys/ops/rotate").status_code == 200  # the answer has it
    assert make_key(data, "revoke", "ops") == "revoked ops"  # on the host: allowed
