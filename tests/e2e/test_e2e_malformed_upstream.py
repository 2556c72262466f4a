"""An upstream's 2xx that is no reply, through the real proxy to the real SDKs: where the
proxy reads the reply (to translate it for a client of another format, or to judge and
commit it in state, window and auto), a body of a shape no provider sends is a 502 in the
client's dialect naming what was wrong, metered as the upstream's call (it may be billed),
and nothing is committed; what a provider does send (chat's ``content: null`` beside tool
calls, Messages' empty ``content`` at ``max_tokens``) is a reply. A same-format
passthrough turn relays the provider's bytes as they came. A Responses reply whose status
is ``failed`` reaches a client of another format (or a turn that commits) as the error it
reports, its code kept, streamed or not."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply, ToolCall
from tests.helpers import SESSION_HEADER, ant, oai

CLIENT_OF = {"openai": "chat", "anthropic": "messages", "openai-responses": "responses"}
USAGE = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
ANT_USAGE = {"input_tokens": 3, "output_tokens": 1}


def _chat(**message: Any) -> dict[str, Any]:
    choice = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", **message}}
    return {"id": "c1", "object": "chat.completion", "model": "m", "choices": [choice],
            "usage": USAGE}  # fmt: skip


def _message(content: Any) -> dict[str, Any]:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
            "content": content, "stop_reason": "end_turn", "usage": ANT_USAGE}  # fmt: skip


def _response(output: Any) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "status": "completed", "model": "m",
            "output": output, "usage": {"input_tokens": 3, "output_tokens": 1,
                                        "total_tokens": 4}}  # fmt: skip


# kind -> case -> (body, what the client is told the upstream returned)
MALFORMED: dict[str, dict[str, tuple[dict[str, Any], str]]] = {
    "openai": {
        "choices-null": ({**_chat(content="x"), "choices": None},
                         "a chat completion whose choices is null"),
        "no-choices": ({**_chat(content="x"), "choices": []}, "a chat completion with no choices"),
        "no-message": ({**_chat(content="x"), "choices": [{"index": 0, "finish_reason": "stop"}]},
                       "a chat completion whose choices[0].message is null, not a message"),
        "content-object": (_chat(content={"text": "hi"}),
                           "choices[0].message.content is an object, not a string"),
        "content-number": (_chat(content=5), "choices[0].message.content is a number"),
        "tool-calls-object": (_chat(content=None, tool_calls={"id": "t"}),
                              "choices[0].message.tool_calls is an object, not a list"),
        "error-under-200": ({"error": {"message": "quota exceeded", "type": "insufficient_quota"}},
                            "an error under status 200 (quota exceeded)"),
    },
    "anthropic": {
        "content-null": (_message(None), "a message whose content is null, not a list of blocks"),
        "content-string": (_message("hi"), "a message whose content is a string"),
        "block-without-type": (_message([{"text": "hi"}]),
                               "a message whose content[0] has no type"),
    },
    "openai-responses": {
        "output-null": (_response(None), "a response whose output is null, not a list of items"),
        "output-object": (_response({"type": "message"}), "a response whose output is an object"),
        "item-without-type": (_response([{"id": "m1"}]), "a response whose output[0] has no type"),
        "message-content-null": (
            _response([{"type": "message", "id": "m1", "role": "assistant", "content": None}]),
            "a response whose output[0] (a message) has content null, not a list of parts",
        ),
    },
}  # fmt: skip

# What a provider does send, at the edge of each shape: the session goes on with it.
EDGE_REPLIES = {
    "openai": Reply(tool_calls=[ToolCall("f", "{}")]),  # content: null beside the call
    "anthropic": Reply(raw_body=json.dumps({**_message([]), "stop_reason": "max_tokens"}).encode()),
    "openai-responses": Reply(text="long answer", finish_reason="length"),  # incomplete
}


def start(fake: FakeProvider, start_proxy: StartProxy, kind: str, mode: str) -> Proxy:
    up = {"name": "up", "url": fake.url + "/v1", "kind": kind, "api_key": "k"}
    return start_proxy(None, "--mode", mode, config={"upstreams": [up]})


def ask(p: Proxy, client: str, session: str, **kw: Any) -> Any:
    """One turn through the client's SDK (which does not retry)."""
    headers = {SESSION_HEADER: session}
    if client == "messages":
        kw.setdefault("max_tokens", 100)
        msgs: Any = [{"role": "user", "content": "hi"}]
        return ant(p).messages.create(model="m", messages=msgs, extra_headers=headers, **kw)
    if client == "responses":
        return oai(p).responses.create(model="m", input="hi", extra_headers=headers, **kw)
    msgs = [{"role": "user", "content": "hi"}]
    return oai(p).chat.completions.create(model="m", messages=msgs, extra_headers=headers, **kw)


def refused(p: Proxy, client: str, session: str, **kw: Any) -> tuple[int, dict[str, Any]]:
    """The status and the error object (OpenAI's ``error``; Anthropic's, checked to be in
    its envelope) of a turn the client's SDK raises on."""
    try:
        ask(p, client, session, **kw)
    except openai.APIStatusError as e:
        assert client != "messages"
        assert isinstance(e.body, dict) and {"message", "type", "code"} <= set(e.body), e.body
        return e.status_code, e.body
    except anthropic.APIStatusError as e:
        assert client == "messages"
        assert isinstance(e.body, dict) and e.body["type"] == "error", e.body
        return e.status_code, e.body["error"]
    raise AssertionError("the turn was answered")


def calls_metered(p: Proxy, session: str) -> dict[str, Any]:
    return p.get("/cost", params={"session": session, "since": "all"}).json()["totals"]


CASES = [(kind, case) for kind, cases in MALFORMED.items() for case in cases]


@pytest.mark.parametrize(("kind", "case"), CASES)
def test_a_malformed_reply_translated_for_another_client_is_a_502_in_its_dialect(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, case: str
) -> None:
    body, what = MALFORMED[kind][case]
    raw = json.dumps(body).encode()
    p = start(fake, start_proxy, kind, "passthrough")
    for n, client in enumerate(c for k, c in CLIENT_OF.items() if k != kind):
        fake.enqueue(Reply(raw_body=raw))
        status, error = refused(p, client, f"t{n}")
        assert status == 502
        assert error["message"].startswith("upstream up returned ") and what in error["message"]
        assert error["type"] == "api_error"
        totals = calls_metered(p, f"t{n}")  # the upstream answered: its call may be billed
        assert totals["requests"] == 1 and totals["attempts"]["generation"] == 1
    # The same format in passthrough: the provider's bytes, as they came.
    fake.enqueue(Reply(raw_body=raw))
    path = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}.get(kind)
    request = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    if path is None:
        path, request = "/v1/responses", {"model": "m", "input": "hi"}
    r = p.http.post(p.url + path, json=request, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 200 and r.content == raw


@pytest.mark.parametrize("mode", ["state", "window", "auto"])
@pytest.mark.parametrize(("kind", "case"), CASES)
def test_a_malformed_reply_to_a_turn_that_commits_is_a_502_and_commits_nothing(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, case: str, mode: str
) -> None:
    body, what = MALFORMED[kind][case]
    p = start(fake, start_proxy, kind, mode)
    client = CLIENT_OF[kind]
    fake.enqueue(Reply(raw_body=json.dumps(body).encode()))
    status, error = refused(p, client, "s1")
    assert status == 502 and error["message"].startswith("upstream up returned ")
    assert what in error["message"]
    assert len(fake.requests) == 1  # not re-asked: there was no answer to correct
    assert p.get("/state", params={"session": "s1"}).status_code == 404
    totals = calls_metered(p, "s1")
    assert totals["requests"] == 1 and totals["attempts"]["generation"] == 1
    # What a provider does send at the edge of the shape is a reply, and the turn commits.
    fake.enqueue(*[EDGE_REPLIES[kind]] * 3)
    ask(p, client, "s1")
    if mode != "auto":  # (auto's first turns go as the client sent them: nothing stored)
        assert p.state("s1")["step"] == 1


FAILURES = [
    ("rate_limit_exceeded", 429, "rate_limit_error"),
    ("server_error", 500, "api_error"),
    ("invalid_prompt", 400, "invalid_request_error"),
]


@pytest.mark.parametrize(("code", "status", "anthropic_type"), FAILURES)
def test_a_failed_response_is_the_error_it_reports_in_each_clients_dialect(
    fake: FakeProvider, start_proxy: StartProxy, code: str, status: int, anthropic_type: str
) -> None:
    """A Responses reply with status ``failed``: a chat or Messages client gets the error it
    reports (its message; its code, or for Anthropic the type that code means) with the
    status it means, as does a Responses client whose turn would commit; a Responses client
    in passthrough gets the failed response, as the API sent it."""
    fail = Reply(fail="The model could not finish.", fail_code=code)
    passthrough = start(fake, start_proxy, "openai-responses", "passthrough")
    for client in ("chat", "messages"):
        fake.enqueue(fail)
        got, error = refused(passthrough, client, f"p-{client}")
        assert got == status and error["message"] == "The model could not finish."
        assert error["type"] == anthropic_type if client == "messages" else error["code"] == code
    fake.enqueue(fail)
    response = ask(passthrough, "responses", "p-responses")
    assert response.status == "failed" and response.error.code == code
    state = start(fake, start_proxy, "openai-responses", "state")
    fake.enqueue(fail)
    got, error = refused(state, "responses", "s1")
    assert got == status and error["code"] == code
    assert state.get("/state", params={"session": "s1"}).status_code == 404


@pytest.mark.parametrize("mode", ["passthrough", "state"])
def test_a_streamed_failed_response_keeps_its_code(
    fake: FakeProvider, start_proxy: StartProxy, mode: str
) -> None:
    """``response.failed`` mid-stream: a chat client's stream ends with the upstream's
    error, its code kept (not a generic ``stream_error``); a Messages client's with the
    Anthropic type that code means."""
    p = start(fake, start_proxy, "openai-responses", mode)
    fake.enqueue(Reply(fail="Slow down.", fail_code="rate_limit_exceeded"))
    with pytest.raises(openai.APIError) as chat_error:
        for _ in ask(p, "chat", "c1", stream=True):
            pass
    assert chat_error.value.code == "rate_limit_exceeded"
    assert chat_error.value.message == "Slow down."
    fake.enqueue(Reply(fail="Slow down.", fail_code="rate_limit_exceeded"))
    with pytest.raises(anthropic.APIStatusError) as messages_error:
        for _ in ask(p, "messages", "m1", stream=True):
            pass
    body = messages_error.value.body
    assert isinstance(body, dict)
    assert body["error"] == {"type": "rate_limit_error", "message": "Slow down."}
    for session in ("c1", "m1"):
        assert p.get("/state", params={"session": session}).status_code == 404


def _chat_sse(*data: str) -> bytes:
    return b"".join(f"data: {d}\n\n".encode() for d in data)


CHUNK = '{"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
HI = CHUNK + '"delta":{"role":"assistant","content":"hi"}}]}'
STOP = CHUNK + '"delta":{},"finish_reason":"stop"}]}'
START = ('{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant",'
         '"model":"m","content":[],"usage":{"input_tokens":1,"output_tokens":0}}}')  # fmt: skip
NOT_JSON_STREAMS = {
    "openai": _chat_sse(HI, "{not json", STOP, "[DONE]"),
    "anthropic": b"".join(
        f"event: {name}\ndata: {data}\n\n".encode()
        for name, data in [
            ("message_start", START),
            ("content_block_start", '{"type":"content_block_start","index":0,'
                                    '"content_block":{"type":"text","text":""}}'),
            ("content_block_delta", "{not json"),
            ("content_block_stop", '{"type":"content_block_stop","index":0}'),
            ("message_delta", '{"type":"message_delta","delta":{"stop_reason":"end_turn"},'
                              '"usage":{"output_tokens":1}}'),
            ("message_stop", '{"type":"message_stop"}'),
        ]
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "client", "mode"),
    [
        ("openai", "messages", "passthrough"),
        ("openai", "responses", "passthrough"),
        ("anthropic", "chat", "passthrough"),
        ("openai", "chat", "state"),
        ("anthropic", "messages", "state"),
    ],
)
def test_a_stream_event_that_is_not_json_ends_the_stream_with_an_error(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, client: str, mode: str
) -> None:
    """Data that is not JSON in a stream the proxy translates or commits: the client's
    stream ends with an error event naming it, a Responses client's ``response.failed``
    (before: it was left out, and the stream ended as if whole, the turn committed), and
    nothing is committed."""
    p = start(fake, start_proxy, kind, mode)
    fake.enqueue(Reply(raw_body=NOT_JSON_STREAMS[kind]))
    said = "upstream up sent a stream event whose data is not JSON"
    if client == "responses":  # the response fails, as the API fails one
        last = list(ask(p, client, "s1", stream=True))[-1]
        assert last.type == "response.failed" and last.response.error.message == said
    else:
        with pytest.raises((openai.APIError, anthropic.APIStatusError)) as raised:
            for _ in ask(p, client, "s1", stream=True):
                pass
        assert said in str(raised.value)
    assert p.get("/state", params={"session": "s1"}).status_code == 404


@pytest.mark.parametrize("client", ["chat", "messages"])
@pytest.mark.parametrize("stream", [False, True])
def test_an_output_limit_under_the_responses_apis_minimum_is_sent_as_the_minimum(
    fake: FakeProvider, start_proxy: StartProxy, client: str, stream: bool
) -> None:
    """``max_tokens: 5`` from a chat or Messages client to a Responses upstream: the API
    refuses ``max_output_tokens`` under 16 with a 400, so the proxy sends 16 and the turn
    is answered (a ``max_tokens: 1`` probe of the model included)."""
    p = start(fake, start_proxy, "openai-responses", "passthrough")
    fake.enqueue(Reply(text="ok"))
    answer = ask(p, client, "s1", max_tokens=5, stream=stream)
    if stream:
        answer = list(answer)
        assert answer
    else:
        text = answer.content[0].text if client == "messages" else answer.choices[0].message.content
        assert text == "ok"
    assert fake.requests[-1].json["max_output_tokens"] == 16


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_a_malformed_json_answer_to_a_streamed_request_is_a_502(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    """An upstream that answers a streamed request with JSON is read as that reply, made the
    stream its kind sends: JSON of a shape no provider sends is no reply, and fails the
    attempt (before: its stream said nothing, ended as if whole, and the turn committed)."""
    body, what = next(iter(MALFORMED[kind].values()))  # (its first case)
    p = start(fake, start_proxy, kind, "state")
    fake.enqueue(*[Reply(raw_body=json.dumps(body).encode())] * 5)
    status, error = refused(p, CLIENT_OF[kind], "s1", stream=True)
    assert status == 502 and "JSON that is no reply" in error["message"], error
    assert what in error["message"]
    assert p.get("/state", params={"session": "s1"}).status_code == 404
