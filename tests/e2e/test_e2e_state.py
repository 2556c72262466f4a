"""The state engine end to end: flat context over long conversations and tool loops, invalid
transitions rejected byte for byte, rollback and re-ask, merge semantics, concurrent sessions,
durability across kill -9 (a real process) and the /state endpoint."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest

from tests.conftest import Proxy, StartProxy, StartProxyProcess
from tests.fakeprovider import FakeProvider, RecordedRequest, Reply
from tests.helpers import SESSION_HEADER, envelope, session


def oai(proxy: Proxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.v1, api_key="k", max_retries=0)


def sent_text(req: RecordedRequest) -> str:
    return json.dumps(req.json["messages"])


def test_100_turn_conversation_stays_flat(fake: FakeProvider, proxy: Proxy) -> None:
    c = oai(proxy)
    hdr = {SESSION_HEADER: "long"}
    transcript = [
        {"role": "system", "content": "You are a planner."},
        {"role": "user", "content": "TASK: plan the warehouse migration."},
    ]
    sizes = []
    client_sizes = []
    for turn in range(1, 101):
        if turn == 2:
            fake.enqueue(Reply(text=envelope({"facts": {"dock": "D-17"}}, "noted dock")))
        else:
            fake.enqueue(Reply(text=envelope({"step": turn}, f"turn {turn}")))
        if turn > 1:
            obs = f"Observation {turn}: " + "log line " * 30
            if turn == 3:
                obs += " (aside: the courier's name is Zanzibar)"
            transcript.append({"role": "user", "content": obs})
        r = c.chat.completions.create(model="m", messages=transcript, extra_headers=hdr)
        transcript.append({"role": "assistant", "content": r.choices[0].message.content})
        sizes.append(len(fake.last.body))
        client_sizes.append(len(json.dumps(transcript)))
    flat = sizes[9:]
    assert max(flat) <= 2 * min(flat), (min(flat), max(flat))
    assert client_sizes[-1] > 10 * client_sizes[9]
    last = sent_text(fake.last)
    assert "D-17" in last  # written to state at turn 2
    assert "Zanzibar" not in last  # only mentioned in passing at turn 3: lossy by design
    assert "TASK: plan the warehouse migration." in last  # the pinned task
    assert proxy.state("long")["step"] == 100


def test_tool_loop_60_cycles_keeps_native_pairs(fake: FakeProvider, proxy: Proxy) -> None:
    c = oai(proxy)
    hdr = {SESSION_HEADER: "tools"}
    tools = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]
    msgs: list[dict] = [{"role": "user", "content": "List everything."}]
    for cycle in range(60):
        n = 3 if cycle % 10 == 0 else 1  # parallel calls now and then
        fake.enqueue(Reply(tool_calls=[("ls", {"dir": f"d{cycle}_{i}"}) for i in range(n)]))
        r = c.chat.completions.create(model="m", messages=msgs, tools=tools, extra_headers=hdr)
        m = r.choices[0].message
        assert m.tool_calls and len(m.tool_calls) == n
        msgs.append(m.model_dump(exclude_none=True))
        for tc in m.tool_calls:
            msgs.append({"role": "tool", "tool_call_id": tc.id, "content": f"files of {tc.id}"})
        fake.enqueue(Reply(text=envelope({"notes": f"cycle {cycle}"})))
        c.chat.completions.create(model="m", messages=msgs, tools=tools, extra_headers=hdr)
        sent = fake.last.json["messages"]
        # The observation: the assistant tool_calls message followed by all its results.
        call_ids = [tc.id for tc in m.tool_calls]
        idx = next(i for i, x in enumerate(sent) if x.get("tool_calls"))
        assert [tc["id"] for tc in sent[idx]["tool_calls"]] == call_ids
        assert [x["tool_call_id"] for x in sent[idx + 1 : idx + 1 + n]] == call_ids
        assert sum(1 for x in sent if x.get("tool_calls")) == 1  # earlier cycles not resent
        msgs.append({"role": "assistant", "content": "ok"})
        msgs.append({"role": "user", "content": "continue"})
    assert proxy.state("tools")["state"]["notes"] == "cycle 59"


def _try(proxy: Proxy, fake: FakeProvider, text: str, session: str) -> httpx.Response:
    fake.responder = lambda _req: Reply(text=text)
    return proxy.http.post(
        proxy.v1 + "/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        headers={SESSION_HEADER: session},
        timeout=10,
    )


def test_invalid_transitions_leave_state_byte_identical(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start_proxy(
        fake.url,
        env={"SKILLSTATE_INITIAL_STATE": '{"facts": {}, "notes": "", "step": 0}'},
        config={"max_patch_bytes": 200},
    )
    ok = _try(p, fake, envelope({"notes": "first"}), "inv")
    assert ok.headers["x-skillstate-transition"] == "valid"
    before = p.get("/state", params={"session": "inv"}).json()["state"]
    bad = {
        "invalid json": '```json\n{"state_patch": {"notes": }\n```',
        "out of schema": envelope({"secret": 1}),
        "wrong type": envelope({"step": "seven"}),
        "oversize": envelope({"notes": "x" * 500}),
    }
    for name, text in bad.items():
        r = _try(p, fake, text, "inv")
        assert r.headers["x-skillstate-transition"] == "invalid", name
        assert r.headers["x-skillstate-retries"] == "2", name
        assert r.headers.get("x-skillstate-validation"), name
        assert p.get("/state", params={"session": "inv"}).json()["state"] == before, name
    # The rollback-retry told the model what was wrong.
    assert "[skillstate] CORRECTION" in json.dumps(fake.last.json["messages"])


def test_rollback_retry_recovers(fake: FakeProvider, proxy: Proxy) -> None:
    fake.enqueue(Reply(text="no envelope here"), Reply(text=envelope({"notes": "fixed"})))
    r = proxy.http.post(
        proxy.v1 + "/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        headers={SESSION_HEADER: "rr"},
    )
    assert r.headers["x-skillstate-transition"] == "valid"
    assert r.headers["x-skillstate-retries"] == "1"
    assert r.json()["choices"][0]["message"]["content"] == "ok"  # the re-asked answer, stripped
    assert proxy.state("rr")["state"]["notes"] == "fixed"
    assert proxy.state("rr")["state"] == {"notes": "fixed"}


def test_merge_semantics(fake: FakeProvider, proxy: Proxy) -> None:
    c = oai(proxy)
    hdr = {SESSION_HEADER: "merge"}
    for patch in (
        {"facts": {"a": 1, "b": {"c": 2}, "list": [1, 2, 3]}, "notes": "n"},
        {"facts": {"b": {"d": 3}, "list": [9]}, "notes": None},
    ):
        fake.enqueue(Reply(text=envelope(patch)))
        c.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], extra_headers=hdr
        )
    assert proxy.state("merge")["state"] == {"facts": {"a": 1, "b": {"c": 2, "d": 3}, "list": [9]}}


def test_concurrent_sessions_no_cross_talk(fake: FakeProvider, proxy: Proxy) -> None:
    def responder(req: RecordedRequest) -> Reply:
        text = json.dumps(req.json["messages"])
        sid = text.split("SESSION-")[1].split("-END")[0]
        return Reply(text=envelope({"facts": {sid: text.count("turn")}, "notes": sid}))

    fake.responder = responder
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            c = oai(proxy)
            for t in range(5):
                r = c.chat.completions.with_raw_response.create(
                    model="m",
                    messages=[{"role": "user", "content": f"SESSION-s{i}-END turn"}],
                    extra_headers={SESSION_HEADER: f"s{i}"},
                )
                assert r.headers["x-skillstate-step"] == str(t + 1)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    for i in range(16):
        st = proxy.state(f"s{i}")
        assert st["step"] == 5
        assert st["state"]["notes"] == f"s{i}"
        assert list(st["state"]["facts"]) == [f"s{i}"]
        hist = proxy.get("/state", params={"session": f"s{i}", "history": 1}).json()["history"]
        assert [h["step"] for h in hist] == [1, 2, 3, 4, 5]


def test_state_survives_kill9(fake: FakeProvider, start_proxy_process: StartProxyProcess) -> None:
    p = start_proxy_process(fake.url, "--schema", "facts")
    fake.enqueue(Reply(text=envelope({"facts": {"k": "durable"}})))
    oai(p).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "x"}],
        extra_headers={SESSION_HEADER: "dur"},
    )
    p.kill9()
    p.start()
    assert p.state("dur")["state"] == {"facts": {"k": "durable"}}


def test_state_endpoint_crud(fake: FakeProvider, proxy: Proxy) -> None:
    fake.enqueue(Reply(text=envelope({"notes": "n1"})))
    oai(proxy).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "x"}],
        extra_headers={SESSION_HEADER: "crud"},
    )
    listed = proxy.get("/state").json()["sessions"]
    assert [s["session"] for s in listed] == ["crud"] and listed[0]["step"] == 1
    got = proxy.state("crud")
    assert set(got) >= {"session", "step", "schema", "state", "created", "updated"}
    assert got["schema"] == ["facts", "notes", "step"]
    r = proxy.http.patch(
        proxy.url + "/state", params={"session": "crud"}, json={"facts": {"op": True}}
    )
    assert r.status_code == 200, r.text
    assert proxy.state("crud")["state"] == {"notes": "n1", "facts": {"op": True}}
    bad = proxy.http.patch(proxy.url + "/state", params={"session": "crud"}, json={"nope": 1})
    assert bad.status_code == 400
    hist = proxy.get("/state", params={"session": "crud", "history": "1"}).json()["history"]
    assert [h["status"] for h in hist] == ["valid", "operator"]
    assert proxy.get("/state", params={"session": "missing"}).status_code == 404
    assert proxy.http.delete(proxy.url + "/state", params={"session": "crud"}).status_code == 204
    assert proxy.get("/state", params={"session": "crud"}).status_code == 404


def test_an_operator_patch_and_budget_in_one_request_are_both_applied_or_neither(
    fake: FakeProvider, proxy: Proxy
) -> None:
    fake.enqueue(Reply(text=envelope({"notes": "n1"})))
    oai(proxy).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "x"}],
        extra_headers={SESSION_HEADER: "both"},
    )

    def patch(body: dict[str, object], budget: str) -> httpx.Response:
        # The body read once: reading it again waited for ASGI messages that never came.
        return proxy.http.patch(
            proxy.url + "/state",
            params={"session": "both"},
            json=body,
            headers={"x-skillstate-budget-usd": budget},
        )

    done = patch({"facts": {"op": True}}, "2.50")
    assert done.status_code == 200, done.text
    assert done.json()["budget_usd"] == 2.5 and done.json()["step"] == 2
    got = proxy.state("both")
    assert got["state"] == {"notes": "n1", "facts": {"op": True}} and got["budget_usd"] == 2.5
    refused = patch({"nope": 1}, "none")  # a patch the schema refuses: no budget change
    assert refused.status_code == 400 and "nope" in refused.json()["error"]["message"]
    assert proxy.state("both")["budget_usd"] == 2.5
    unknown = proxy.http.patch(
        proxy.url + "/state",
        params={"session": "nobody"},
        json={"notes": "x"},
        headers={"x-skillstate-budget-usd": "1"},
    )
    assert unknown.status_code == 404
    assert proxy.get("/state", params={"session": "nobody"}).status_code == 404


BUDGET = "x-skillstate-budget-usd"
PASSTHROUGH = {"x-skillstate-mode": "passthrough"}
# $0.001 per output token, input free: a session's spend says which calls it made.
PRICED = {"prices": {"m": {"input_per_mtok": 0, "output_per_mtok": 1_000}}}


def turn(proxy: Proxy, sid: str, **headers: str) -> None:
    oai(proxy).chat.completions.create(
        model="m",
        max_tokens=100,  # its worst case, $0.10, fits the budgets
        messages=[{"role": "user", "content": "x"}],
        extra_headers={**session(sid), **headers},
    )


def test_a_session_with_a_budget_and_no_state_reads_back_its_budget_and_spend(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start_proxy(fake.url + "/v1", "--schema", "facts,notes,step", config=PRICED)
    fake.enqueue(
        Reply(text="a plain answer", usage={"completion_tokens": 7}),
        Reply(text=envelope({"notes": "n"}), usage={"completion_tokens": 3}),
        Reply(text="another plain answer", usage={"completion_tokens": 2}),
        Reply(text=envelope({"notes": "later"}), usage={"completion_tokens": 1}),
    )
    turn(p, "pt", **PASSTHROUGH, **{BUDGET: "5"})
    turn(p, "st", **{BUDGET: "2"})
    stateful, stateless = p.state("st"), p.state("pt")
    assert set(stateless) == set(stateful)  # one shape: what it lacks is null
    assert stateless == {
        "session": "pt",
        "step": None,
        "schema": None,
        "state": None,
        "created": None,
        "updated": None,
        "budget_usd": 5.0,
        "spent_usd": pytest.approx(0.007),
    }
    assert stateful["state"] == {"notes": "n"} and stateful["spent_usd"] == pytest.approx(0.003)
    history = p.get("/state", params={"session": "pt", "history": "1"})
    assert history.status_code == 200
    assert history.json()["history"] == [] and history.json()["next_cursor"] is None
    # Ledger rows alone make no session known (they outlive it): a passthrough session
    # without a budget is a 404, as one never seen is; /cost has its spend.
    turn(p, "pt-free", **PASSTHROUGH)
    assert p.get("/state", params={"session": "pt-free"}).status_code == 404
    assert p.get("/cost", params={"session": "pt-free"}).json()["totals"]["requests"] == 1
    assert p.get("/state", params={"session": "never"}).status_code == 404
    # A budget set before a session's first turn reads back at once; then its state does.
    r = p.http.patch(p.url + "/state", params={"session": "early"}, headers={BUDGET: "1"})
    assert r.status_code == 200 and r.json() == {"session": "early", "budget_usd": 1.0}
    assert p.state("early")["budget_usd"] == 1.0 and p.state("early")["state"] is None
    turn(p, "early")
    got = p.state("early")
    assert got["state"] == {"notes": "later"} and got["step"] == 1 and got["budget_usd"] == 1.0


def test_patch_and_delete_of_a_session_with_a_budget_and_no_state(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start_proxy(fake.url + "/v1", "--schema", "facts,notes,step", config=PRICED)
    fake.enqueue(Reply(text="a plain answer", usage={"completion_tokens": 7}))
    turn(p, "pt", **PASSTHROUGH, **{BUDGET: "5"})
    url, params = p.url + "/state", {"session": "pt"}
    # It has no state to patch: a 409 (not the 404 of a session never seen), and the budget
    # sent with the refused patch is not set.
    r = p.http.patch(url, params=params, json={"notes": "x"}, headers={BUDGET: "9"})
    assert r.status_code == 409, r.text
    assert "no state to patch" in r.json()["error"]["message"]
    assert p.state("pt")["budget_usd"] == 5.0
    nobody = p.http.patch(url, params={"session": "nobody"}, json={"notes": "x"})
    assert nobody.status_code == 404
    # Its budget is changed as any session's.
    r = p.http.patch(url, params=params, headers={BUDGET: "7.5"})
    assert r.status_code == 200 and r.json()["budget_usd"] == 7.5
    assert p.state("pt")["budget_usd"] == 7.5
    # DELETE forgets it with its budget: a 204, then it is a session never seen. Its ledger
    # rows stay (/cost).
    assert p.http.delete(url, params=params).status_code == 204
    assert p.get("/state", params=params).status_code == 404
    assert p.http.delete(url, params=params).status_code == 404
    assert p.get("/cost", params=params).json()["totals"]["requests"] == 1


def test_failed_rollback_retry_still_answers_with_the_last_reply(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start_proxy(fake.url, config={"retry_max_attempts": 1})
    fake.enqueue(Reply(text="no envelope at all"), Reply(status=500, error_body="down"))
    r = p.http.post(
        p.v1 + "/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        headers={SESSION_HEADER: "rf"},
        timeout=10,
    )
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == "no envelope at all"
    assert r.headers["x-skillstate-transition"] == "invalid"
    assert p.state("rf")["step"] == 1 and p.state("rf")["state"] == {}
    # the reply that reached the client is the turn's generation, not a discarded re-ask
    attempts = p.get("/cost", params={"session": "rf"}).json()["totals"]["attempts"]
    assert (attempts["generation"], attempts["rollback-retry"]) == (1, 0), attempts


VISIBLE_ASCII = {chr(c) for c in range(0x20, 0x7F)}


def test_control_characters_from_the_model_reach_the_client_as_visible_ascii_headers(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    # uvicorn refuses such a header: the client got 0 bytes while the step was saved (and an
    # SDK retrying the connection error applied and billed the turn twice).
    p = start_proxy(fake.url, "--schema", "facts,notes,step", config={"max_retries": 0})
    r = _try(p, fake, envelope({"notes": "n"}, action="run\u0000x\r\nX-Evil: 1 é"), "ctl1")
    assert r.status_code == 200 and r.headers["x-skillstate-transition"] == "valid"
    action = r.headers["x-skillstate-action"]
    assert set(action) <= VISIBLE_ASCII and action.startswith("run%00x")
    assert "x-evil" not in r.headers
    r = _try(p, fake, envelope({"a\u0001b": 1, "c\u00e9": 2}), "ctl2")
    assert r.status_code == 200 and r.headers["x-skillstate-transition"] == "invalid"
    why = r.headers["x-skillstate-validation"]
    assert set(why) <= VISIBLE_ASCII and "a%01b" in why
    assert p.state("ctl2")["step"] == 1


def test_a_huge_action_is_capped_in_the_header_and_in_the_store(
    fake: FakeProvider, proxy: Proxy
) -> None:
    r = _try(proxy, fake, envelope({"notes": "n"}, action="go " * 35_000), "big")
    assert r.status_code == 200 and r.headers["x-skillstate-transition"] == "valid"
    assert len(r.headers["x-skillstate-action"]) <= 256
    hist = proxy.get("/state", params={"session": "big", "history": "1"}).json()["history"]
    assert hist[0]["action"].startswith("go go") and len(hist[0]["action"]) <= 1024


def test_state_listings_are_paginated_with_limit_and_an_opaque_cursor(
    fake: FakeProvider, proxy: Proxy
) -> None:
    for i in range(5):
        assert _try(proxy, fake, envelope({"notes": f"n{i}"}), f"pg{i}").status_code == 200
    for i in range(4):
        assert _try(proxy, fake, envelope({"notes": f"m{i}"}), "pg0").status_code == 200

    seen: list[str] = []
    params: dict[str, str] = {"limit": "2"}
    for _ in range(10):
        page = proxy.get("/state", params=params).json()
        assert len(page["sessions"]) <= 2
        seen += [s["session"] for s in page["sessions"]]
        if page["next_cursor"] is None:
            break
        params["cursor"] = page["next_cursor"]
    assert seen == ["pg0", "pg4", "pg3", "pg2", "pg1"]  # most recently updated first
    assert proxy.get("/state").json()["next_cursor"] is None

    steps: list[int] = []
    params = {"session": "pg0", "history": "1", "limit": "2"}
    for _ in range(10):
        doc = proxy.get("/state", params=params).json()
        assert doc["step"] == 5 and len(doc["history"]) <= 2
        steps += [t["step"] for t in doc["history"]]
        if doc["next_cursor"] is None:
            break
        params["cursor"] = doc["next_cursor"]
    assert steps == [1, 2, 3, 4, 5]

    sessions_cursor = proxy.get("/state", params={"limit": "1"}).json()["next_cursor"]
    history_cursor = proxy.get(
        "/state", params={"session": "pg0", "history": "1", "limit": "1"}
    ).json()["next_cursor"]
    bad = [
        {"limit": "0"},
        {"limit": "1001"},
        {"limit": "-1"},
        {"limit": "two"},
        {"cursor": "%%%"},
        {"cursor": "bm90IGpzb24"},
        {"cursor": history_cursor},
        {"session": "pg0", "history": "1", "cursor": sessions_cursor},
        {"session": "pg1", "history": "1", "cursor": history_cursor},
        {"session": "pg0", "history": "1", "limit": "x"},
    ]
    for params in bad:
        r = proxy.get("/state", params=params)
        assert r.status_code == 400, (params, r.text)
        assert r.json()["error"]["param"] in ("limit", "cursor"), params


def test_operator_route_refusals_follow_the_anthropic_version_header(proxy: Proxy) -> None:
    """docs/endpoints.md (*What every route refuses*): Anthropic's error shape for a request
    with ``anthropic-version``. A 401 was; a 415 on PATCH /state, a 400 on /state or /cost
    and a 403 on /admin/keys answered OpenAI's."""
    ant = {"anthropic-version": "2023-06-01"}
    cases = [
        ("PATCH", "/state?session=s", {"content-type": "text/plain"}, 415),
        ("GET", "/state?limit=0", {}, 400),
        ("GET", "/cost?since=yesterday", {}, 400),
        ("GET", "/admin/keys", {}, 403),  # client keys off: no admin key
    ]
    for method, path, headers, status in cases:
        r = proxy.http.request(method, proxy.url + path, headers={**headers, **ant}, content=b"{}")
        assert r.status_code == status, (path, r.text)
        body = r.json()
        assert body["type"] == "error" and "message" in body["error"], (path, body)
        plain = proxy.http.request(method, proxy.url + path, headers=headers, content=b"{}")
        assert plain.status_code == status and "type" not in plain.json(), (path, plain.text)
