"""An Idempotency-Key on a request the proxy serves as a compaction (issues 25 and 26): a
compaction then the turn (Responses ``context_management`` past its threshold, Messages
``compact_20260112`` past its trigger) runs two turns under one key. The checkpoint's reply
was kept under the key, so the turn after it found the key kept and replayed the
checkpoint's answer: the client's turn never went upstream, and a stream got JSON.

Here: the first request sends both calls and the client gets the model's answer to its own
turn; a retry with the key sends nothing upstream and commits nothing more."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import InProcessProxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import ant, envelope, oai, session

JSON = dict[str, Any]
TRANSCRIPT = "Fix the failing test in calc.py. " * 40


def start(fake: FakeProvider, start_proxy: StartProxy, mode: str) -> InProcessProxy:
    up = {"name": "up", "url": fake.url + "/v1", "kind": "openai", "api_key": "sk-upstream"}
    return start_proxy(None, config={"upstreams": [up], "schema": ["notes"], "mode": mode})


def keyed(key: str) -> dict[str, str]:
    return {**session("c1"), "idempotency-key": key}


def calls(fake: FakeProvider) -> int:
    return sum(1 for r in fake.requests if r.method == "POST")


def responses_turn(p: InProcessProxy, stream: bool) -> tuple[list[str], str]:
    """A Responses turn past its compaction threshold: (output item types, output text)."""
    c = oai(p, default_headers=keyed("k-responses"))
    request: JSON = {
        "model": "m-1",
        "input": [{"role": "user", "content": TRANSCRIPT}],
        "context_management": [{"type": "compaction", "compact_threshold": 50}],
    }
    if stream:
        with c.responses.stream(**request) as events:
            final = events.get_final_response()
    else:
        final = c.responses.create(**request)
    return [o.type for o in final.output], final.output_text


def messages_turn(p: InProcessProxy, stream: bool) -> tuple[list[str], str]:
    """A Messages turn past its compact_20260112 trigger: (content block types, its text)."""
    c = ant(p, default_headers=keyed("k-messages"))
    request: JSON = {
        "model": "m-1",
        "max_tokens": 200,
        "messages": [{"role": "user", "content": TRANSCRIPT}],
        "extra_body": {
            "context_management": {
                "edits": [
                    {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50}}
                ]
            }
        },
    }
    if stream:
        with c.messages.stream(**request) as events:
            message = events.get_final_message()
    else:
        message = c.messages.create(**request)
    text = "".join(b.text for b in message.content if b.type == "text")
    return [b.type for b in message.content], text


TURNS = {"responses": responses_turn, "messages": messages_turn}


@pytest.mark.parametrize("mode", ["passthrough", "state"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", sorted(TURNS))
def test_a_keyed_compaction_then_turn_runs_the_turn_once(
    fake: FakeProvider, start_proxy: StartProxy, route: str, stream: bool, mode: str
) -> None:
    p = start(fake, start_proxy, mode)
    answer = "the answer to the turn" if mode == "passthrough" else envelope({}, prefix="answer")
    fake.enqueue(Reply(text=envelope({"notes": "compacted"}, prefix="folded")), Reply(text=answer))
    kinds, text = TURNS[route](p, stream)
    assert kinds[0] == "compaction" and "answer" in text and "folded" not in text
    assert calls(fake) == 2  # the checkpoint, then the turn itself
    state = p.state("c1")
    assert state["state"] == {"notes": "compacted"}
    kinds_again, text_again = TURNS[route](p, stream)
    assert (kinds_again, text_again) == (kinds, text)
    assert calls(fake) == 2 and p.state("c1")["step"] == state["step"]


@pytest.mark.parametrize("trigger", [False, True])
def test_a_keyed_compaction_retried_pins_the_same_step(
    fake: FakeProvider, start_proxy: StartProxy, trigger: bool
) -> None:
    """``/responses/compact`` and a trigger, retried with their key: no second checkpoint,
    and the retry's item restores the same state."""
    p = start(fake, start_proxy, "passthrough")
    fake.enqueue(Reply(text=envelope({"notes": "once"})))
    c = oai(p, default_headers=keyed("k-compact"))
    items: list[Any] = [{"role": "user", "content": TRANSCRIPT}]
    if trigger:
        first, again = (
            c.responses.create(model="m-1", input=[*items, {"type": "compaction_trigger"}])
            for _ in range(2)
        )
    else:
        first, again = (c.responses.compact(model="m-1", input=items) for _ in range(2))
    assert calls(fake) == 1 and p.state("c1")["step"] == 1
    # The retry's item is the first's: the same id and token, not a new item of the step.
    assert again.output[-1].model_dump() == first.output[-1].model_dump()
    for r in (first, again):
        item = r.output[-1].model_dump()
        assert item["type"] == "compaction"
        fake.enqueue(Reply(text="carry on"))
        later = httpx.post(
            p.v1 + "/responses",
            json={"model": "m-1", "input": [item, {"role": "user", "content": "go"}]},
            headers=session("c1"),
        )
        assert later.status_code == 200, later.text
        assert '\\"notes\\":\\"once\\"' in json.dumps(fake.requests[-1].json)


def test_the_clients_idempotency_key_is_not_forwarded_upstream(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """The key names the client's request to the proxy; the proxy's calls for it differ (a
    re-ask here, checkpoints elsewhere). Forwarded, an upstream that keeps keys (another
    skillstate proxy in front of the provider) refused the re-ask with a 422."""
    p = start(fake, start_proxy, "state")
    fake.enqueue(Reply(text="no envelope"), Reply(text=envelope({"notes": "re-asked"})))
    r = oai(p, default_headers=keyed("k-forward")).chat.completions.create(
        model="m-1", messages=[{"role": "user", "content": "hi"}]
    )
    assert r.choices[0].message.content == "ok"
    sent = [q for q in fake.requests if q.method == "POST"]
    assert len(sent) == 2 and all("idempotency-key" not in q.headers for q in sent)
    assert p.state("c1")["state"] == {"notes": "re-asked"}


NOT_AN_ENVELOPE = Reply(text="I would rather keep working.")
ENDPOINT_INPUT: list[Any] = [{"role": "user", "content": TRANSCRIPT}]


def compact_with_sdk_retries(p: InProcessProxy, headers: dict[str, str]) -> Any:
    """``responses.compact`` through the SDK with its own retries on (its default, 2)."""
    c = openai.OpenAI(base_url=p.v1, api_key="sk-client", default_headers=headers)
    return c.responses.compact(model="m-1", input=ENDPOINT_INPUT)


@pytest.mark.parametrize("keyed_request", [False, True])
def test_a_checkpoint_that_folds_nothing_is_not_retried_by_the_sdk(
    fake: FakeProvider, start_proxy: StartProxy, keyed_request: bool
) -> None:
    """The proxy already re-asked ``max_retries`` times; an SDK that retried on its own would
    bill the whole checkpoint again, twice (the SDKs retry 408, 409, 429 and 5xx unless told
    ``x-should-retry: false``; Codex retries 5xx). The failure is a 422 they do not retry."""
    p = start(fake, start_proxy, "state")
    fake.responder = lambda _req: NOT_AN_ENVELOPE
    headers = keyed("k-fail") if keyed_request else session("c1")
    with pytest.raises(openai.UnprocessableEntityError) as e:
        compact_with_sdk_retries(p, headers)
    assert e.value.status_code == 422 and e.value.response.headers["x-should-retry"] == "false"
    body = e.value.body
    assert isinstance(body, dict) and body["code"] == "invalid_checkpoint"
    assert calls(fake) == 3  # the checkpoint and its two re-asks, once


def test_a_failed_keyed_compaction_is_not_kept_its_retry_runs(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """A compaction that folded nothing keeps nothing under its Idempotency-Key: retried with
    the same key it runs again (nothing was compacted), and then the key keeps its answer."""
    p = start(fake, start_proxy, "passthrough")
    fake.enqueue(NOT_AN_ENVELOPE, NOT_AN_ENVELOPE, NOT_AN_ENVELOPE)
    c = oai(p, default_headers=keyed("k-retry"))
    with pytest.raises(openai.UnprocessableEntityError):
        c.responses.compact(model="m-1", input=ENDPOINT_INPUT)
    assert calls(fake) == 3
    fake.enqueue(Reply(text=envelope({"notes": "second try"})))
    first = c.responses.compact(model="m-1", input=ENDPOINT_INPUT)
    assert calls(fake) == 4 and p.state("c1")["state"] == {"notes": "second try"}
    again = c.responses.compact(model="m-1", input=ENDPOINT_INPUT)
    assert calls(fake) == 4
    assert again.output[-1].model_dump() == first.output[-1].model_dump()


@pytest.mark.parametrize("trigger", [False, True])
def test_a_keyed_compaction_retried_gets_the_same_reply(
    fake: FakeProvider, start_proxy: StartProxy, trigger: bool
) -> None:
    """A retry with the key is answered with the first reply, whole: its response id and
    ``created_at`` too, not only its compaction item (a client that stored the first id
    chains on it)."""
    p = start(fake, start_proxy, "passthrough")
    fake.enqueue(Reply(text=envelope({"notes": "once"})))
    c = oai(p, default_headers=keyed("k-same"))
    items: list[Any] = [{"role": "user", "content": TRANSCRIPT}]
    if trigger:
        replies = [
            c.responses.with_raw_response.create(
                model="m-1", input=[*items, {"type": "compaction_trigger"}]
            )
            for _ in range(2)
        ]
    else:
        replies = [
            c.responses.with_raw_response.compact(model="m-1", input=items) for _ in range(2)
        ]
    first, again = replies
    assert calls(fake) == 1
    assert again.headers.get("x-skillstate-replayed") == "true"
    assert json.loads(again.content) == json.loads(first.content)


@pytest.mark.parametrize("route", sorted(TURNS))
def test_a_keyed_compaction_then_turn_retried_gets_the_same_reply(
    fake: FakeProvider, start_proxy: StartProxy, route: str
) -> None:
    """The reply a compaction then the turn made, retried with the key: the same bytes (its
    ids and times too), nothing sent upstream again."""
    p = start(fake, start_proxy, "passthrough")
    fake.enqueue(Reply(text=envelope({"notes": "compacted"})), Reply(text="the answer"))
    bodies = []
    for _ in range(2):
        if route == "responses":
            raw = httpx.post(
                p.v1 + "/responses",
                json={
                    "model": "m-1",
                    "input": [{"role": "user", "content": TRANSCRIPT}],
                    "context_management": [{"type": "compaction", "compact_threshold": 50}],
                },
                headers=keyed("k-whole"),
            )
        else:
            raw = httpx.post(
                p.url + "/v1/messages",
                json={
                    "model": "m-1",
                    "max_tokens": 200,
                    "messages": [{"role": "user", "content": TRANSCRIPT}],
                    "context_management": {
                        "edits": [
                            {
                                "type": "compact_20260112",
                                "trigger": {"type": "input_tokens", "value": 50},
                            }
                        ]
                    },
                },
                headers=keyed("k-whole"),
            )
        assert raw.status_code == 200, raw.text
        bodies.append(raw.json())
    assert calls(fake) == 2
    assert bodies[1] == bodies[0]


@pytest.mark.parametrize("trigger", [False, True])
def test_a_compaction_served_again_is_the_same_answer_byte_for_byte(
    fake: FakeProvider, start_proxy: StartProxy, trigger: bool
) -> None:
    """``/responses/compact`` and a paused ``compact_20260112``, retried with their key: the
    same bytes (ids included), not a new message id for the same checkpoint."""
    p = start(fake, start_proxy, "passthrough")
    fake.enqueue(Reply(text=envelope({"notes": "once"})))
    if trigger:
        edit = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50}}
        body: JSON = {
            "model": "m-1",
            "max_tokens": 100,
            "messages": [{"role": "user", "content": TRANSCRIPT}],
            "context_management": {"edits": [{**edit, "pause_after_compaction": True}]},
        }
        path, headers = "/v1/messages", {"anthropic-version": "2023-06-01"}
    else:
        body = {"model": "m-1", "input": [{"role": "user", "content": TRANSCRIPT}]}
        path, headers = "/v1/responses/compact", {}
    first, again = (
        p.http.post(p.url + path, json=body, headers={**keyed("k-again"), **headers})
        for _ in range(2)
    )
    assert first.status_code == 200, first.text
    assert calls(fake) == 1 and again.content == first.content
