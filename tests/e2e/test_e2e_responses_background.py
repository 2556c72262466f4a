"""``background: true`` on ``/v1/responses`` through the real proxy, driven by the openai SDK,
against the fake provider serving the Responses API as an ``openai-responses`` upstream
(which answers a background request ``queued``, with no output, as the API does) and as a
chat-completions one.

The proxy runs a background request in the foreground: it never sends ``background``
upstream, answers the finished response with ``background: true``, and serves what the SDK
does with a background response afterwards: ``retrieve`` (also ``stream=True`` with
``starting_after``, and ``responses.stream(response_id=...)``) and ``cancel``."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import envelope, oai, session

KINDS = ["openai-responses", "openai"]


def start(fake: FakeProvider, start_proxy: StartProxy, kind: str, mode: str) -> Proxy:
    up = {"name": "up", "url": fake.url + "/v1", "kind": kind, "api_key": "sk-upstream"}
    return start_proxy(None, "--schema", "facts", "--mode", mode, config={"upstreams": [up]})


def sent_upstream(fake: FakeProvider) -> dict[str, Any]:
    body = fake.last.json
    assert isinstance(body, dict)
    return body


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["passthrough", "state", "window"])
def test_a_background_request_is_answered_finished(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, mode: str
) -> None:
    p = start(fake, start_proxy, kind, mode)
    c = oai(p)
    fake.enqueue(Reply(text=envelope({"facts": ["found it"]}, prefix="The answer.")))
    r = c.responses.create(
        model="m",
        input="think long",
        background=True,
        background_options={"completion_window": "soonest", "continuation_id": "job-7"},
        extra_headers=session("bg1"),
    )
    assert r.status == "completed" and r.background is True
    assert "The answer." in r.output_text
    body = sent_upstream(fake)
    assert "background" not in body and "background_options" not in body
    got = c.responses.retrieve(r.id)
    assert got.status == "completed" and got.background is True
    assert got.output_text == r.output_text
    if mode == "state":  # (the window commits its state at checkpoints only)
        assert p.state("bg1")["state"] == {"facts": ["found it"]}


@pytest.mark.parametrize("kind", KINDS)
def test_a_streamed_background_request_is_stored_as_background(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    p = start(fake, start_proxy, kind, "state")
    c = oai(p)
    fake.enqueue(Reply(text=envelope({"facts": ["streamed"]}, prefix="Streamed.")))
    with c.responses.stream(model="m", input="go", background=True) as s:
        final = s.get_final_response()
    assert "Streamed." in final.output_text
    assert "background" not in sent_upstream(fake)
    got = c.responses.retrieve(final.id)
    assert got.background is True and got.output_text == final.output_text


def test_a_background_response_streams_again_from_where_the_client_was(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai-responses", "passthrough")
    c = oai(p)
    fake.enqueue(Reply(text="Line one. Line two."))
    r = c.responses.create(model="m", input="x", background=True)
    events = list(c.responses.retrieve(r.id, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Line one. Line two."
    assert events[-1].response.id == r.id  # type: ignore[union-attr]
    later = list(c.responses.retrieve(r.id, stream=True, starting_after=2))
    assert [e.sequence_number for e in later] == list(range(3, len(events)))
    assert [e.type for e in later] == kinds[3:]
    # The SDK's accumulator over the same stream, by the response's id.
    with c.responses.stream(response_id=r.id) as s:
        assert s.get_final_response().output_text == "Line one. Line two."


def test_only_a_background_response_streams_again_or_is_cancelled(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai-responses", "passthrough")
    c = oai(p)
    fake.enqueue(Reply(text="Foreground."), Reply(text="Background."))
    fg = c.responses.create(model="m", input="x")
    bg = c.responses.create(model="m", input="y", background=True)
    assert fg.background is not True
    with pytest.raises(openai.BadRequestError) as e:
        list(c.responses.retrieve(fg.id, stream=True))
    assert e.value.body["param"] == "stream"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.cancel(fg.id)
    assert "background" in e.value.message
    # A background response is finished by the time its id is known: cancel leaves it so.
    cancelled = c.responses.cancel(bg.id)
    assert cancelled.id == bg.id and cancelled.status == "completed"
    assert c.responses.retrieve(bg.id).output_text == "Background."
    with pytest.raises(openai.NotFoundError):
        c.responses.cancel("resp_unknown")


@pytest.mark.parametrize(
    ("query", "param"),
    [("stream=yes", "stream"), ("stream=true&starting_after=-1", "starting_after"),
     ("stream=true&starting_after=%C2%B2", "starting_after")],
)  # fmt: skip
def test_a_malformed_stream_query_is_a_400(
    fake: FakeProvider, start_proxy: StartProxy, query: str, param: str
) -> None:
    p = start(fake, start_proxy, "openai-responses", "passthrough")
    c = oai(p)
    fake.enqueue(Reply(text="x"))
    r = c.responses.create(model="m", input="x", background=True)
    answer = httpx.get(f"{p.url}/v1/responses/{r.id}?{query}")
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == param


def test_what_a_background_request_cannot_be_is_a_400_before_anything_is_sent(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai-responses", "state")
    c = oai(p)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"background": True, "store": False}, "store"),
        ({"background": True, "background_options": {"completion_window": "2h"}},
         "background_options.completion_window"),
        ({"background": True, "background_options": {"completion_window": "week"}},
         "background_options.completion_window"),
        ({"background": True, "background_options": "soon"}, "background_options"),
    ]  # fmt: skip
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.create(model="m", input="x", **extra)
        assert e.value.body["param"] == param, extra  # type: ignore[index]
    assert fake.requests == []
