"""An integer beyond 64 bits on its way into a session's state, end to end: orjson reads it as
the nearest float, so the state silently held another number. A model's patch with one is
invalid and re-asked like any other, the correction naming where it is; a streamed one is
recorded invalid; an operator's ``PATCH /state`` with one is a 400. The state is untouched
each time, and a float written as one, however large, is kept."""

from __future__ import annotations

import json

import httpx

from tests.conftest import Proxy
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import envelope, oai, session

BIG = 123456789012345678901234567890
WHY = (
    "state_patch has an integer beyond 64 bits at 'facts.id', which would be kept as the float"
    " 1.2345678901234568e+29: send it as a string"
)


def test_a_model_patch_with_an_integer_beyond_64_bits_is_re_asked_not_kept(
    fake: FakeProvider, proxy: Proxy
) -> None:
    fake.enqueue(
        Reply(text=envelope({"facts": {"id": BIG}}, "saved the id")),
        Reply(text=envelope({"facts": {"id": str(BIG)}}, "saved the id")),
    )
    raw = oai(proxy).chat.completions.with_raw_response.create(
        model="m",
        messages=[{"role": "user", "content": "Remember order 123456789012345678901234567890."}],
        extra_headers=session("wide"),
    )
    assert raw.headers["x-skillstate-transition"] == "valid"
    assert raw.headers["x-skillstate-retries"] == "1"
    assert raw.parse().choices[0].message.content == "ok"
    # The re-ask told the model what was wrong and where.
    reask = json.dumps(fake.last.json["messages"])
    assert "[skillstate] CORRECTION" in reask and json.dumps(WHY)[1:-1] in reask
    got = proxy.state("wide")
    assert got["state"] == {"facts": {"id": str(BIG)}} and got["step"] == 1


def test_a_model_that_keeps_sending_it_leaves_the_state_as_it_was(
    fake: FakeProvider, proxy: Proxy
) -> None:
    c = oai(proxy)
    fake.enqueue(Reply(text=envelope({"facts": {"id": 1e30}, "step": 1})))  # a float: kept
    r = c.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "x"}], extra_headers=session("keep")
    )
    assert r.headers["x-skillstate-transition"] == "valid"
    before = proxy.state("keep")["state"]
    assert before == {"facts": {"id": 1e30}, "step": 1}

    fake.responder = lambda _req: Reply(text=envelope({"facts": {"id": BIG}, "step": 2}))
    r = c.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "y"}], extra_headers=session("keep")
    )
    assert r.headers["x-skillstate-transition"] == "invalid"
    assert r.headers["x-skillstate-retries"] == "2"
    assert "integer beyond 64 bits at 'facts.id'" in r.headers["x-skillstate-validation"]
    assert proxy.state("keep")["state"] == before

    # Streamed, the reply is judged once: recorded invalid, with why.
    stream = c.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "z"}],
        stream=True,
        extra_headers=session("keep"),
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == "ok"
    doc = proxy.get("/state", params={"session": "keep", "history": "1"}).json()
    assert doc["state"] == before
    assert [t["status"] for t in doc["history"]] == ["valid", "invalid", "invalid"]
    assert doc["history"][-1]["errors"] == [WHY]


def test_an_operator_patch_with_an_integer_beyond_64_bits_is_a_400(
    fake: FakeProvider, proxy: Proxy
) -> None:
    fake.enqueue(Reply(text=envelope({"notes": "n1"})))
    oai(proxy).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], extra_headers=session("op")
    )
    before = proxy.state("op")

    def patch(body: bytes, **headers: str) -> httpx.Response:
        return proxy.http.patch(
            proxy.url + "/state",
            params={"session": "op"},
            content=body,
            headers={"content-type": "application/json", **headers},
        )

    body = b'{"facts": {"id": 123456789012345678901234567890}}'
    for r in (patch(body), patch(body, **{"x-skillstate-budget-usd": "3"})):
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["message"] == WHY and error["type"] == "invalid_request_error"
    after = proxy.state("op")
    assert after["state"] == before["state"] and after["step"] == before["step"]
    assert after["budget_usd"] is None  # the refused request changed neither

    ok = patch(b'{"facts": {"id": 123456789012345678901234567890.0, "n": 18446744073709551615}}')
    assert ok.status_code == 200, ok.text
    assert proxy.state("op")["state"]["facts"] == {"id": float(BIG), "n": 2**64 - 1}
