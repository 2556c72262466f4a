"""Idempotent turns (issue 26) end to end: the real proxy, the real SDKs (max_retries=0:
each call is one request), the fake provider counting upstream calls, the SQLite store
counting ledger rows and steps."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import InProcessProxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import ant, oai

KEY = "idempotency-key"


def envelope(patch: dict[str, Any], action: str = "next") -> str:
    return f"done\n```json\n{json.dumps({'state_patch': patch, 'action': action})}\n```"


def headers(key: str | None, session: str | None = "s1", **extra: str) -> dict[str, str]:
    h = dict(extra)
    if key is not None:
        h[KEY] = key
    if session is not None:
        h["x-skillstate-session"] = session
    return h


def db(tmp_path: Path) -> sqlite3.Connection:
    return sqlite3.connect(tmp_path / "data" / "skillstate.db")


def counts(tmp_path: Path) -> tuple[int, int]:
    """(ledger rows, transitions) in the store."""
    with db(tmp_path) as c:
        ledger = c.execute("SELECT count(*) FROM ledger").fetchone()[0]
        steps = c.execute("SELECT count(*) FROM transitions").fetchone()[0]
    return ledger, steps


def chat_raw(proxy: InProcessProxy, key: str | None, content: str = "hi", **kw: Any) -> Any:
    return oai(proxy).chat.completions.with_raw_response.create(
        model="m",
        messages=[{"role": "user", "content": content}],
        extra_headers=headers(key, **kw),
    )


def test_the_same_key_twice_is_one_call_one_row_one_step_and_the_same_bytes(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    proxy = start_proxy(fake.url + "/v1")
    fake.enqueue(Reply(text=envelope({"facts": ["a"]})), Reply(text=envelope({"notes": "b"})))
    first = chat_raw(proxy, "k-1")
    again = chat_raw(proxy, "k-1")
    assert len(fake.requests) == 1
    assert counts(tmp_path) == (1, 1)
    assert again.http_response.content == first.http_response.content
    assert again.headers["x-skillstate-replayed"] == "true"
    assert "x-skillstate-replayed" not in first.headers
    for h in ("x-skillstate-step", "x-skillstate-transition", "x-skillstate-pricing"):
        assert again.headers[h] == first.headers[h]
    assert again.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert proxy.state("s1")["step"] == 1
    # Another key is another turn; no key at all too (nothing changes without the header).
    chat_raw(proxy, "k-2")
    chat_raw(proxy, None)
    assert len(fake.requests) == 3 and proxy.state("s1")["step"] == 3


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_a_streamed_turn_is_replayed_as_the_same_stream(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path, dialect: str
) -> None:
    proxy = start_proxy(fake.url + "/v1")
    fake.enqueue(Reply(text=envelope({"facts": ["x"]})), Reply(text=envelope({})))

    def stream() -> tuple[bytes, dict[str, str]]:
        if dialect == "openai":
            cm: Any = oai(proxy).chat.completions.with_streaming_response.create(
                model="m",
                messages=[{"role": "user", "content": "go"}],
                stream=True,
                extra_headers=headers("stream-key"),
            )
        else:
            cm = ant(proxy).messages.with_streaming_response.create(
                model="m",
                max_tokens=100,
                messages=[{"role": "user", "content": "go"}],
                stream=True,
                extra_headers=headers("stream-key"),
            )
        with cm as r:
            return b"".join(r.iter_bytes()), dict(r.headers)

    first, h1 = stream()
    assert "x-skillstate-replayed" not in h1
    again, h2 = stream()
    assert len(fake.requests) == 1 and counts(tmp_path) == (1, 1)
    assert again == first and b"skillstate transition=valid step=1" in first
    assert h2["x-skillstate-replayed"] == "true" and h2["content-type"].startswith("text/event-")
    # The SDK reads the replayed stream like the first one.
    if dialect == "anthropic":
        with ant(proxy).messages.stream(
            model="m",
            max_tokens=100,
            messages=[{"role": "user", "content": "go"}],
            extra_headers=headers("stream-key"),
        ) as s:
            assert s.get_final_message().content[0].text == "done"  # type: ignore[union-attr]
    else:
        chunks = oai(proxy).chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "go"}],
            stream=True,
            extra_headers=headers("stream-key"),
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "done"
    assert len(fake.requests) == 1


def test_a_key_reused_with_another_body_is_a_422_in_the_dialect(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    proxy = start_proxy(fake.url + "/v1")
    fake.enqueue(Reply(text=envelope({})), Reply(text=envelope({})))
    chat_raw(proxy, "reused", "first question")
    with pytest.raises(openai.UnprocessableEntityError) as oe:
        chat_raw(proxy, "reused", "another question")
    assert oe.value.code == "idempotency_key_reused"
    # A streamed request is another request too.
    with pytest.raises(openai.UnprocessableEntityError):
        oai(proxy).chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "first question"}],
            stream=True,
            extra_headers=headers("reused"),
        )
    msg = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "x"}]}
    ant(proxy).messages.create(**msg, extra_headers=headers("a-key"))  # type: ignore[arg-type]
    with pytest.raises(anthropic.UnprocessableEntityError) as ae:
        ant(proxy).messages.create(
            **{**msg, "max_tokens": 101},  # type: ignore[arg-type]
            extra_headers=headers("a-key"),
        )
    assert ae.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "another request body" in ae.value.message
    assert len(fake.requests) == 2 and counts(tmp_path) == (2, 2)


@pytest.mark.parametrize("stream", [False, True])
def test_a_retry_of_the_same_json_in_another_member_order_gets_the_kept_reply(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path, stream: bool
) -> None:
    # JSON objects are unordered (RFC 8259): a retry that serialises the same request with
    # its members in another order is the same request. Arrays keep their order.
    proxy = start_proxy(fake.url + "/v1")
    fake.enqueue(Reply(text=envelope({"notes": "a"})), Reply(text=envelope({"notes": "b"})))
    sent: list[bytes] = []
    client = oai(
        proxy,
        http_client=openai.DefaultHttpxClient(
            event_hooks={"request": [lambda r: sent.append(r.read())]}
        ),
    ).chat.completions.with_raw_response

    def call(messages: list[Any]) -> Any:
        r = client.create(
            model="m", messages=messages, stream=stream, extra_headers=headers("order")
        )
        return r.http_response.read()

    system = {"role": "system", "content": "be brief"}
    user = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    first = call([system, user])
    resorted = [
        {"content": "be brief", "role": "system"},
        {"content": [{"text": "hi", "type": "text"}], "role": "user"},
    ]
    assert call(resorted) == first
    assert sent[1] != sent[0] and json.loads(sent[1]) == json.loads(sent[0])
    # The same members at the top level in another order, sent as bytes.
    body = json.loads(sent[0])
    raw = json.dumps(dict(reversed(list(body.items())))).encode()
    assert raw.index(b'"model"') > raw.index(b'"messages"') and raw != sent[0]
    again = proxy.http.post(
        proxy.v1 + "/chat/completions",
        content=raw,
        headers={"content-type": "application/json", **headers("order")},
    )
    assert again.status_code == 200 and again.headers["x-skillstate-replayed"] == "true"
    assert again.content == first
    assert len(fake.requests) == 1 and counts(tmp_path) == (1, 1)
    # The messages in another order are another request: the key is refused.
    with pytest.raises(openai.UnprocessableEntityError) as e:
        call([user, system])
    assert e.value.code == "idempotency_key_reused"
    assert len(fake.requests) == 1 and proxy.state("s1")["step"] == 1


@pytest.mark.parametrize("bad", ["", "x" * 256, "with space", "é"])
def test_a_malformed_key_is_a_400(fake: FakeProvider, start_proxy: StartProxy, bad: str) -> None:
    proxy = start_proxy(fake.url + "/v1")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(
        proxy.v1 + "/chat/completions",
        json=body,
        headers={KEY: bad.encode()},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == KEY
    assert not fake.requests


def test_the_same_key_concurrently_waits_for_the_first_and_gets_its_reply(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    proxy = start_proxy(fake.url + "/v1")
    gate = threading.Event()
    fake.enqueue(Reply(text=envelope({"facts": ["once"]}), hold=gate), Reply(text="never"))
    with ThreadPoolExecutor(4) as pool:
        calls = [pool.submit(chat_raw, proxy, "same") for _ in range(4)]
        fake.wait_for(lambda rs: len(rs) == 1)
        gate.set()
        replies = [c.result() for c in calls]
    bodies = {r.http_response.content for r in replies}
    assert len(bodies) == 1 and len(fake.requests) == 1 and counts(tmp_path) == (1, 1)
    assert sorted(r.headers.get("x-skillstate-replayed", "") for r in replies) == [
        "", "true", "true", "true"
    ]  # fmt: skip


def test_a_key_in_flight_past_lease_wait_is_a_409(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    proxy = start_proxy(fake.url + "/v1", config={"lease_wait": 0.2})
    gate = threading.Event()
    fake.enqueue(Reply(text=envelope({}), hold=gate))
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(chat_raw, proxy, "slow")
        fake.wait_for(lambda rs: len(rs) == 1)
        with pytest.raises(openai.ConflictError) as e:
            chat_raw(proxy, "slow")
        assert e.value.code == "idempotency_in_flight"
        assert e.value.response.headers["retry-after"] == "1"
        gate.set()
        assert first.result().headers["x-skillstate-step"] == "1"
    assert chat_raw(proxy, "slow").headers["x-skillstate-replayed"] == "true"
    assert len(fake.requests) == 1


def test_a_turn_that_was_not_committed_keeps_nothing_and_its_retry_runs(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    proxy = start_proxy(fake.url + "/v1", config={"retry_max_attempts": 1})
    fake.enqueue(Reply(status=400, error_body="bad"), Reply(text=envelope({"notes": "ok"})))
    with pytest.raises(openai.BadRequestError):
        chat_raw(proxy, "retry-me")
    ok = chat_raw(proxy, "retry-me")
    assert "x-skillstate-replayed" not in ok.headers and ok.headers["x-skillstate-step"] == "1"
    assert chat_raw(proxy, "retry-me").headers["x-skillstate-replayed"] == "true"
    assert len(fake.requests) == 2


def test_a_retry_without_a_session_header_gets_the_session_the_first_try_made(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    proxy = start_proxy(fake.url + "/v1")
    fake.enqueue(Reply(text=envelope({"facts": ["n"]})))
    first = chat_raw(proxy, "no-session", session=None)
    again = chat_raw(proxy, "no-session", session=None)
    made = first.headers["x-skillstate-session"]
    assert again.headers["x-skillstate-session"] == made
    assert again.http_response.content == first.http_response.content
    assert len(fake.requests) == 1 and proxy.state(made)["step"] == 1


@pytest.mark.parametrize("stream", [False, True])
def test_passthrough_turns_keep_their_reply_with_their_ledger_row(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path, stream: bool
) -> None:
    proxy = start_proxy(fake.url + "/v1", config={"mode": "passthrough"})
    fake.enqueue(Reply(text="plain answer"), Reply(text="never"))
    client = oai(proxy).chat.completions.with_raw_response

    def call() -> Any:
        return client.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            stream=stream,
            extra_headers=headers("pt"),
        )

    first, again = call(), call()
    assert again.http_response.read() == first.http_response.read()
    assert again.headers["x-skillstate-replayed"] == "true"
    assert len(fake.requests) == 1 and counts(tmp_path) == (1, 0)  # no step in passthrough


def test_responses_api_replays_with_its_chain(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    proxy = start_proxy(fake.url + "/v1")
    fake.enqueue(Reply(text=envelope({})), Reply(text=envelope({"notes": "2"})))
    client = oai(proxy)
    first = client.responses.create(model="m", input="one", extra_headers=headers(None))
    calls: list[Any] = []

    def second() -> Any:
        raw = client.responses.with_raw_response.create(
            model="m", input="two", previous_response_id=first.id, extra_headers=headers("r2")
        )
        calls.append(raw)
        return raw

    a, b = second(), second()
    assert b.http_response.content == a.http_response.content
    assert b.parse().previous_response_id == first.id
    assert b.headers["x-skillstate-replayed"] == "true"
    assert len(fake.requests) == 2 and counts(tmp_path) == (2, 2)
    # The kept reply's response is still there for the next link of the chain.
    fake.enqueue(Reply(text=envelope({})))
    third = client.responses.create(
        model="m", input="three", previous_response_id=a.parse().id, extra_headers=headers(None)
    )
    assert third.previous_response_id == a.parse().id


def test_kept_replies_expire_with_idempotency_ttl(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    proxy = start_proxy(fake.url + "/v1", config={"idempotency_ttl": 0.01, "purge_interval": 0.05})
    fake.enqueue(Reply(text=envelope({})), Reply(text=envelope({})))
    chat_raw(proxy, "short-lived")
    wait_until(lambda: _kept_rows(tmp_path) == 0)
    again = chat_raw(proxy, "short-lived")  # a new turn: the key was purged
    assert "x-skillstate-replayed" not in again.headers and len(fake.requests) == 2


def _kept_rows(tmp_path: Path) -> int:
    with db(tmp_path) as c:
        return int(c.execute("SELECT count(*) FROM idempotency_keys").fetchone()[0])


def wait_until(check: Callable[[], bool], limit: float = 30.0) -> None:
    """Poll until ``check`` (a guard against hanging, not a timing assertion)."""
    import time

    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.02)
