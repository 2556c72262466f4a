"""Drop-in compatibility across a translation, with the real SDKs through one real proxy
against the fake provider: an error an upstream reports mid-stream reaches a client of
another format as that format says it (a Responses client: ``response.failed`` with the
code Codex and the SDK act on, not a generic ``stream_error``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.conftest import InProcessProxy, StartProxy, launch_in_process
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, ant, oai

# model name prefix -> the upstream kind it is routed to
KINDS = {"chat": "openai", "claude": "anthropic"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeProvider, Any]]:
    """One fake provider and one passthrough proxy for the module: ``chat-*``, ``gpt-*``
    and ``o*`` models go to its chat-completions face, ``claude-*`` to its Messages face,
    ``responses/*`` to its Responses face."""
    fake = FakeProvider().start()
    upstreams = [
        {"name": "resp", "url": fake.url + "/v1", "kind": "openai-responses",
         "models": ["responses/*"]},
        {"name": "chat", "url": fake.url + "/v1", "kind": "openai",
         "models": ["chat-*", "gpt-*", "o*"]},
        {"name": "claude", "url": fake.url, "kind": "anthropic", "models": ["claude-*"]},
    ]  # fmt: skip
    for up in upstreams:
        up["api_key"] = "sk-upstream"
    tmp = tmp_path_factory.mktemp("translated-compat")
    # Tests of unusable replies count against the shared upstreams' breakers: never opened.
    config = {"upstreams": upstreams, "failure_threshold": 1000}
    proxy = launch_in_process(tmp, None, "--mode", "passthrough", config=config)
    try:
        yield fake, proxy
    finally:
        proxy.stop()
        fake.stop()


@pytest.fixture
def fake(served: tuple[FakeProvider, InProcessProxy]) -> FakeProvider:
    served[0].reset()
    return served[0]


@pytest.fixture
def proxy(served: tuple[FakeProvider, InProcessProxy]) -> InProcessProxy:
    return served[1]


def chat_sse(events: list[dict[str, Any]]) -> Reply:
    """A chat-completions stream of ``events`` as the upstream's reply, ``[DONE]`` last."""
    data = [json.dumps(e) for e in events] + ["[DONE]"]
    return Reply(raw_body=b"".join(f"data: {d}\n\n".encode() for d in data))


def chat_stream(error: dict[str, Any], said: str = "hi") -> bytes:
    """A chat-completions stream that says ``said``, then reports ``error``."""
    delta = {"role": "assistant", "content": said}
    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "chat-m",
             "choices": [{"index": 0, "delta": delta}]}  # fmt: skip
    return b"".join(f"data: {json.dumps(d)}\n\n".encode() for d in (chunk, {"error": error}))


def messages_stream(error: dict[str, Any]) -> bytes:
    """A Messages stream that starts, then reports ``error`` in an ``error`` event."""
    usage = {"input_tokens": 3, "output_tokens": 0}
    start = {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-m",
        "content": [], "stop_reason": None, "usage": usage}}  # fmt: skip
    events = [("message_start", start), ("error", {"type": "error", "error": error})]
    return b"".join(f"event: {n}\ndata: {json.dumps(d)}\n\n".encode() for n, d in events)


def upstream_error(model: str, type_: str, message: str, code: str | None = None) -> Reply:
    """A 200 stream from the upstream ``model`` routes to, ending with the error it reports
    (chat's error object has a code, Anthropic's only a type)."""
    if model.startswith("chat"):
        error = {"message": message, "type": type_, "param": None, "code": code}
        return Reply(raw_body=chat_stream(error))
    return Reply(raw_body=messages_stream({"type": type_, "message": message}))


TOO_LONG_CHAT = "This model's maximum context length is 128000 tokens."
TOO_LONG_CLAUDE = "prompt is too long: 210000 tokens > 200000 maximum"


@pytest.mark.parametrize(
    ("model", "type_", "code", "message", "failure_code"),
    [
        ("chat-m", "invalid_request_error", "context_length_exceeded", TOO_LONG_CHAT,
         "context_length_exceeded"),
        ("chat-m", "tokens", "rate_limit_exceeded", "Try again in 2s.", "rate_limit_exceeded"),
        ("chat-m", "server_error", None, "The server had an error.", "server_error"),
        ("claude-m", "invalid_request_error", None, TOO_LONG_CLAUDE, "context_length_exceeded"),
        ("claude-m", "overloaded_error", None, "Overloaded", "server_is_overloaded"),
        ("claude-m", "rate_limit_error", None, "Slow down.", "rate_limit_exceeded"),
        ("claude-m", "api_error", None, "Internal server error", "server_error"),
    ],
)  # fmt: skip
def test_an_upstream_stream_error_fails_a_responses_stream_with_its_code(
    fake: FakeProvider,
    proxy: InProcessProxy,
    model: str,
    type_: str,
    code: str | None,
    message: str,
    failure_code: str,
) -> None:
    """Codex reads only ``response.failed``, by its ``error.code``: context_length_exceeded
    starts its context-window handling, server_is_overloaded says the model is at capacity,
    rate_limit_exceeded and server_error are retried."""
    fake.enqueue(upstream_error(model, type_, message, code))
    events = list(oai(proxy).responses.create(model=model, input="Hi", stream=True))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    failed = events[-1]
    assert failed.type == "response.failed"
    assert failed.response.status == "failed"
    assert failed.response.error is not None
    assert (failed.response.error.code, failed.response.error.message) == (failure_code, message)
    assert failed.response.output == []
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_a_failed_response_shows_no_envelope_and_commits_nothing(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """In ``state``, the envelope the model had begun when the upstream failed reaches the
    client nowhere: not in the deltas (held back), not in the failed response (no output)."""
    up = {"name": "chat", "url": fake.url + "/v1", "kind": "openai", "api_key": "sk-upstream"}
    p = start_proxy(None, "--mode", "state", config={"upstreams": [up]})
    said = 'Done.\n```json\n{"state_patch": {"notes": "secret"'
    error = {"message": "Overloaded", "type": "server_error", "code": "server_is_overloaded"}
    fake.enqueue(Reply(raw_body=chat_stream(error, said)))
    sdk = oai(p, default_headers={SESSION_HEADER: "s1"})
    events = list(sdk.responses.create(model="chat-m", input="Hi", stream=True))
    assert events[-1].type == "response.failed"
    assert events[-1].response.error.code == "server_is_overloaded"
    assert not any("secret" in e.model_dump_json() for e in events)
    assert p.get("/state", params={"session": "s1"}).status_code == 404


@pytest.mark.parametrize(
    ("model", "type_", "code", "seen"),
    [
        ("claude-m", "overloaded_error", None, ("overloaded_error", "overloaded")),
        ("claude-m", "rate_limit_error", None, ("rate_limit_error", "rate_limit")),
    ],
)
def test_an_anthropic_stream_error_reaches_a_chat_client_with_its_type(
    fake: FakeProvider,
    proxy: InProcessProxy,
    model: str,
    type_: str,
    code: str | None,
    seen: tuple[str, str],
) -> None:
    """Not a generic ``api_error``: the type says what the client can do about it."""
    fake.enqueue(upstream_error(model, type_, "busy", code))
    stream = oai(proxy).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], stream=True
    )
    with pytest.raises(openai.APIError) as e:
        list(stream)
    assert isinstance(e.value.body, dict)
    assert (e.value.body["type"], e.value.body["code"], e.value.message) == (*seen, "busy")


@pytest.mark.parametrize(
    ("code", "type_", "seen"),
    [
        ("rate_limit_exceeded", "tokens", "rate_limit_error"),
        ("server_is_overloaded", "server_error", "overloaded_error"),
        (None, "server_error", "api_error"),
    ],
)
def test_a_chat_stream_error_reaches_a_messages_client_with_its_type(
    fake: FakeProvider, proxy: InProcessProxy, code: str | None, type_: str, seen: str
) -> None:
    """Claude Code waits and retries a rate_limit_error or overloaded_error."""
    fake.enqueue(upstream_error("chat-m", type_, "busy", code))
    request = {"model": "chat-m", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}
    with pytest.raises(anthropic.APIStatusError) as e, ant(proxy).messages.stream(**request) as s:
        list(s)
    assert e.value.body == {"type": "error", "error": {"type": seen, "message": "busy"}}


# A 200 from each upstream that is no reply: chat's choices null, Messages' content null.
NO_REPLY = {
    "chat-m": {"id": "c1", "object": "chat.completion", "model": "chat-m", "choices": None},
    "claude-m": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-m",
                 "content": None, "stop_reason": "end_turn",
                 "usage": {"input_tokens": 3, "output_tokens": 1}},
}  # fmt: skip


# Each client format on an upstream of another format (a passthrough of the client's own
# format relays the upstream's bytes unread).
TRANSLATED = [("chat", "claude-m"), ("messages", "chat-m"), ("responses", "chat-m"),
              ("responses", "claude-m")]  # fmt: skip


@pytest.mark.parametrize(("client", "model"), TRANSLATED)
def test_a_reply_that_is_no_reply_is_a_502_the_sdks_do_not_send_again(
    fake: FakeProvider, proxy: InProcessProxy, client: str, model: str
) -> None:
    """The upstream answered (and may bill the call): the SDKs' two retries of a 502 would
    bill it twice more for the same unusable reply, so the 502 says ``x-should-retry:
    false``, which both SDKs obey before their own rule."""
    fake.responder = lambda request: Reply(raw_body=json.dumps(NO_REPLY[model]).encode())
    with pytest.raises((anthropic.InternalServerError, openai.InternalServerError)) as e:
        ask(proxy, client, model, max_retries=2)
    assert e.value.status_code == 502
    assert e.value.response.headers["x-should-retry"] == "false"
    assert len(fake.requests) == 1


@pytest.mark.parametrize(("client", "model"), [("chat", "claude-m"), ("messages", "chat-m")])
def test_a_stream_that_never_started_is_a_502_the_sdks_do_not_send_again(
    fake: FakeProvider, start_proxy: StartProxy, client: str, model: str
) -> None:
    """The same unusable 2xx to a streamed request fails each of the proxy's attempts before
    the first byte: its 502 says ``x-should-retry: false`` as the unstreamed one does, so the
    SDKs do not send (and the proxy bill) all its attempts twice more (before: the SDKs'
    third try found the upstream's circuit open). Its own proxy: the failures count
    against the upstream's breaker."""
    kind = KINDS[model.split("-")[0]]
    url = fake.url if kind == "anthropic" else fake.url + "/v1"
    up = {"name": "u", "url": url, "kind": kind, "api_key": "sk-upstream"}
    proxy = start_proxy(None, "--mode", "passthrough", config={"upstreams": [up]})
    fake.responder = lambda request: Reply(raw_body=json.dumps(NO_REPLY[model]).encode())
    with pytest.raises((anthropic.InternalServerError, openai.InternalServerError)) as e:
        ask(proxy, client, model, max_retries=2, stream=True)
    assert e.value.status_code == 502
    assert e.value.response.headers["x-should-retry"] == "false"
    assert len(fake.requests) == 3  # the proxy's own attempts (retry_max_attempts)


def test_an_upstream_503_is_still_the_sdks_to_retry(
    fake: FakeProvider, proxy: InProcessProxy
) -> None:
    """An overloaded upstream may serve the next call: the error says nothing against it."""
    fake.responder = lambda request: Reply(status=503, error_body="busy")
    with pytest.raises(openai.InternalServerError) as e:
        ask(proxy, "responses", "claude-m", max_retries=0)
    assert "x-should-retry" not in e.value.response.headers


def ask(
    proxy: InProcessProxy, client: str, model: str, *, max_retries: int, stream: bool = False
) -> Any:
    """One turn by the ``client`` SDK (chat, messages, responses), read whole."""
    base, key = proxy.url, "sk-client"
    hi = [{"role": "user", "content": "Hi"}]
    if client == "messages":
        return anthropic.Anthropic(
            base_url=base, api_key=key, max_retries=max_retries
        ).messages.create(model=model, max_tokens=16, messages=hi, stream=stream)
    sdk = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=max_retries)
    if client == "chat":
        return sdk.chat.completions.create(model=model, messages=hi, stream=stream)
    return sdk.responses.create(model=model, input="Hi", stream=stream)


def token(text: str, logprob: float, *alternatives: tuple[str, float]) -> dict[str, Any]:
    """A token's log-probability entry, the same in chat's ``logprobs.content`` and in a
    Responses output_text part's ``logprobs``."""
    tops = [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in alternatives]
    return {"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": tops}


TOKENS = [token("Hi", -0.1, ("Hi", -0.1), ("Hey", -2.5)), token("!", -0.3, ("!", -0.3))]
LOGPROBS = ["message.output_text.logprobs"]


def chat_reply_with_logprobs(streamed: bool) -> Reply:
    """A chat reply "Hi!" with its tokens' log probabilities: one choice, or a chunk a token."""
    base = {"id": "c1", "created": 1, "model": "chat-m"}
    if not streamed:
        message = {"role": "assistant", "content": "Hi!"}
        choice = {"index": 0, "message": message, "finish_reason": "stop",
                  "logprobs": {"content": TOKENS, "refusal": None}}  # fmt: skip
        reply = {**base, "object": "chat.completion", "choices": [choice]}
        return Reply(raw_body=json.dumps(reply).encode())
    chunks = [
        {"index": 0, "delta": {"role": "assistant", "content": t["token"]},
         "logprobs": {"content": [t], "refusal": None}, "finish_reason": None}
        for t in TOKENS
    ] + [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]  # fmt: skip
    events = [{**base, "object": "chat.completion.chunk", "choices": [c]} for c in chunks]
    return chat_sse(events)


@pytest.mark.parametrize("streamed", [False, True])
def test_a_responses_clients_logprobs_cross_a_chat_upstream(
    fake: FakeProvider, proxy: InProcessProxy, streamed: bool
) -> None:
    """``include: ["message.output_text.logprobs"]`` and ``top_logprobs`` are chat's
    ``logprobs`` and ``top_logprobs``; the tokens' entries come back in the output_text
    part, and streamed in each text delta and the done events."""
    fake.enqueue(chat_reply_with_logprobs(streamed))
    sdk = oai(proxy)
    if not streamed:
        response = sdk.responses.create(
            model="chat-m", input="Hi", include=LOGPROBS, top_logprobs=2
        )
    else:
        stream = sdk.responses.create(
            model="chat-m", input="Hi", include=LOGPROBS, top_logprobs=2, stream=True
        )
        events = list(stream)
        deltas = [e for e in events if e.type == "response.output_text.delta"]
        assert [[t.model_dump() for t in e.logprobs] for e in deltas] == [[t] for t in TOKENS]
        done = next(e for e in events if e.type == "response.output_text.done")
        assert [t.model_dump() for t in done.logprobs] == TOKENS
        assert events[-1].type == "response.completed"
        response = events[-1].response
    sent = fake.last.json
    assert (sent["logprobs"], sent["top_logprobs"]) == (True, 2)
    part = response.output[0].content[0]
    assert part.type == "output_text" and part.text == "Hi!"
    assert [t.model_dump() for t in part.logprobs] == TOKENS


def test_logprobs_are_a_400_for_an_anthropic_upstream(
    fake: FakeProvider, proxy: InProcessProxy
) -> None:
    """Claude models give no log probabilities: a reply whose ``logprobs`` were silently
    empty would pass for one that had none to give."""
    with pytest.raises(openai.BadRequestError) as e:
        oai(proxy).responses.create(model="claude-m", input="Hi", include=LOGPROBS)
    assert e.value.param == "include"
    assert "message.output_text.logprobs cannot be sent to an Anthropic upstream" in e.value.message
    assert fake.requests == []


def test_top_logprobs_without_include_asks_a_chat_upstream_for_none(
    fake: FakeProvider, proxy: InProcessProxy
) -> None:
    """The Responses API returns log probabilities only when ``include`` asks for them;
    chat would refuse ``top_logprobs`` without ``logprobs``."""
    fake.enqueue(Reply(text="ok"))
    oai(proxy).responses.create(model="chat-m", input="Hi", top_logprobs=2)
    assert "logprobs" not in fake.last.json and "top_logprobs" not in fake.last.json


# Claude Code's beta of a mid-conversation system message's output_config.
EFFORT_BETA = ["mid-conversation-output-config-2026-07-01"]
ASKED = {"role": "user", "content": "Plan it."}
ANSWERED = {"role": "assistant", "content": "Planned."}
USE = {"role": "assistant", "content": [
    {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}]}  # fmt: skip
RESULT = {"role": "user", "content": [
    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "found"}]}  # fmt: skip


def effort(level: str) -> dict[str, Any]:
    """Claude Code's effort-only system message."""
    return {"role": "system", "content": [], "output_config": {"effort": level}}


@pytest.mark.parametrize(
    ("model", "messages", "sent"),
    [
        ("gpt-5.1", [ASKED], "medium"),  # the request's own (Claude Code's)
        # Right after a user turn with new input: that turn's reply is asked at that level.
        ("gpt-5.1", [ASKED, effort("low")], "low"),
        ("responses/gpt-5.1-codex", [ASKED, effort("high")], "high"),
        ("o3", [ASKED, effort("high")], "high"),
        ("gpt-5.1", [ASKED, effort("max")], "xhigh"),  # Anthropic's most, OpenAI's xhigh
        # Elsewhere: from the next user turn with new input on, and until another changes it.
        ("gpt-5.1", [ASKED, ANSWERED, effort("low"), ASKED], "low"),
        ("gpt-5.1", [ASKED, effort("low"), ANSWERED, ASKED], "low"),
        # Tool results alone are no new input: the turn keeps the level it started with.
        ("gpt-5.1", [ASKED, USE, effort("low"), RESULT], "medium"),
        ("responses/gpt-5.1", [ASKED, USE, effort("low"), RESULT, ANSWERED, ASKED], "low"),
        # A model that takes no reasoning effort refuses one: none is sent.
        ("gpt-4.1", [ASKED, effort("low")], None),
        ("responses/gpt-4.1", [ASKED], None),
    ],
)
def test_claude_codes_effort_is_openais_reasoning_effort(
    fake: FakeProvider,
    proxy: InProcessProxy,
    model: str,
    messages: list[dict[str, Any]],
    sent: str | None,
) -> None:
    """``output_config.effort``, top-level or a mid-conversation system message's (beta
    mid-conversation-output-config), is chat's ``reasoning_effort`` / the Responses
    API's ``reasoning.effort`` for the reply, where the model takes one."""
    fake.enqueue(Reply(text="ok"))
    ant(proxy).beta.messages.create(
        model=model,
        max_tokens=64,
        messages=messages,  # type: ignore[arg-type]
        tools=[{"name": "lookup", "input_schema": {"type": "object"}}],
        output_config={"effort": "medium"},
        betas=EFFORT_BETA,
    )
    body = fake.last.json
    if model.startswith("responses/"):
        assert body.get("reasoning", {}).get("effort") == sent
    else:
        assert body.get("reasoning_effort") == sent


BREAKPOINT = {"mode": "explicit", "ttl": "12h"}


def test_a_responses_clients_cache_options_and_breakpoints_reach_a_chat_upstream(
    fake: FakeProvider, proxy: InProcessProxy
) -> None:
    """``prompt_cache_options`` and a part's ``prompt_cache_breakpoint`` (the same objects in
    both APIs): the mode and a 30-minute ttl cross, the diagnostics' response id (one chat
    does not know) does not; a part with a breakpoint stays a part (it marks the part's
    end), so the user message keeps its list."""
    fake.enqueue(Reply(text="ok"))
    oai(proxy).responses.create(
        model="gpt-5.1",
        input=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "input_text",
                        "text": "The long, stable prefix.",
                        "prompt_cache_breakpoint": BREAKPOINT,
                    },
                    {"type": "input_text", "text": "The question."},
                ],
            }
        ],
        prompt_cache_options={"mode": "explicit", "ttl": "30m", "comparison_response_id": "r1"},
    )
    body = fake.last.json
    assert body["prompt_cache_options"] == {"mode": "explicit", "ttl": "30m"}
    assert body["messages"][-1]["content"] == [
        {"type": "text", "text": "The long, stable prefix.", "prompt_cache_breakpoint": BREAKPOINT},
        {"type": "text", "text": "The question."},
    ]


def test_a_12h_cache_ttl_is_chats_30_minutes_and_prewarming_is_a_400(
    fake: FakeProvider, proxy: InProcessProxy
) -> None:
    """Chat's request ttl is 30m only (the 12h minimum is the cache's, not the answer's);
    ``prewarm`` asks for no answer, which chat has no request for."""
    fake.enqueue(Reply(text="ok"))
    sdk = oai(proxy)
    sdk.responses.create(model="gpt-5.1", input="Hi", prompt_cache_options={"ttl": "12h"})
    assert "prompt_cache_options" not in fake.last.json
    with pytest.raises(openai.BadRequestError) as e:
        sdk.responses.create(model="gpt-5.1", input="Hi", prompt_cache_options={"prewarm": True})
    assert e.value.param == "prompt_cache_options.prewarm"
    assert len(fake.requests) == 1


def test_a_chat_clients_cache_options_and_breakpoints_reach_a_responses_upstream(
    fake: FakeProvider, proxy: InProcessProxy
) -> None:
    fake.enqueue(Reply(text="ok"))
    image = "https://example.com/cat.png"
    oai(proxy).chat.completions.create(
        model="responses/gpt-5.1",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Stable.", "prompt_cache_breakpoint": BREAKPOINT},
                    {
                        "type": "image_url",
                        "image_url": {"url": image},
                        "prompt_cache_breakpoint": {"mode": "explicit"},
                    },
                ],
            }
        ],
        prompt_cache_options={"mode": "explicit", "ttl": "30m"},
    )
    body = fake.last.json
    assert body["prompt_cache_options"] == {"mode": "explicit", "ttl": "30m"}
    assert body["input"][0]["content"] == [
        {"type": "input_text", "text": "Stable.", "prompt_cache_breakpoint": BREAKPOINT},
        {"type": "input_image", "image_url": image, "detail": "auto",
         "prompt_cache_breakpoint": {"mode": "explicit"}},
    ]  # fmt: skip


# Each client format on an upstream of its own format and of another.
CUT = [("chat", "chat-m"), ("chat", "claude-m"), ("responses", "responses/m"),
       ("responses", "chat-m"), ("responses", "claude-m"), ("messages", "claude-m"),
       ("messages", "chat-m")]  # fmt: skip


@pytest.mark.parametrize(("client", "model"), CUT)
def test_a_stream_the_upstream_cuts_ends_in_the_clients_own_error_shape(
    fake: FakeProvider, proxy: InProcessProxy, client: str, model: str
) -> None:
    """The upstream closes the stream mid-answer (the proxy's own stream failure, not an
    error the upstream reported). A Responses client gets ``response.failed`` with
    ``server_error``, as the API fails a response (the openai SDK only yields an ``error``
    event, and Codex ignores one: before, ``type: error`` with code ``stream_error``); a
    chat client the error chunk the openai SDK raises, the proxy's own 500 error object (was
    code ``stream_error``); a Messages client Anthropic's ``error`` event with
    ``api_error``."""
    fake.enqueue(Reply(text="one two three four five six", drop_after=3))
    hi = [{"role": "user", "content": "Hi"}]
    if client == "messages":
        request = {"model": model, "max_tokens": 16, "messages": hi}
        with (
            pytest.raises(anthropic.APIStatusError) as cut,
            ant(proxy).messages.stream(**request) as s,
        ):
            list(s)
        assert cut.value.body["error"]["type"] == "api_error"
        return
    sdk = openai.OpenAI(base_url=proxy.v1, api_key="sk-client", max_retries=0)
    if client == "chat":
        with pytest.raises(openai.APIError) as failed:
            list(sdk.chat.completions.create(model=model, messages=hi, stream=True))
        assert failed.value.body == {
            "message": failed.value.message, "type": "api_error", "param": None,
            "code": "api_error",
        }  # fmt: skip
        return
    events = list(sdk.responses.create(model=model, input="Hi", stream=True))
    last = events[-1]
    assert last.type == "response.failed", [e.type for e in events]
    assert last.response.status == "failed" and last.response.error is not None
    assert last.response.error.code == "server_error"
    assert "mid-stream" in last.response.error.message
    assert last.sequence_number == events[-2].sequence_number + 1


@pytest.mark.parametrize("helper", ["create", "stream"])
def test_a_responses_stream_cut_before_it_began_is_a_response_created_then_failed(
    fake: FakeProvider, proxy: InProcessProxy, helper: str
) -> None:
    """A Responses upstream answers 200, sends only a keep-alive comment and closes: the
    stream failed before any response existed. The client gets ``response.created`` then
    ``response.failed`` with ``server_error``, the one pair all Responses clients read:
    Codex reads only ``response.failed``, and the openai SDK's ``responses.stream`` raises
    on any first event but ``response.created``. Before: a lone ``error`` event with code
    ``api_error`` (a RuntimeError in ``responses.stream``; ignored by Codex)."""
    fake.enqueue(Reply(raw_body=b": processing\n\n"))
    sdk = openai.OpenAI(base_url=proxy.v1, api_key="sk-client", max_retries=0)
    if helper == "create":
        events = list(sdk.responses.create(model="responses/m", input="Hi", stream=True))
    else:
        with sdk.responses.stream(model="responses/m", input="Hi") as s:
            events = list(s)
    assert [e.type for e in events] == ["response.created", "response.failed"]
    created, failed = events
    assert [created.sequence_number, failed.sequence_number] == [0, 1]
    assert created.response.status == "in_progress"
    assert failed.response.id == created.response.id
    assert failed.response.model == "responses/m"
    assert failed.response.status == "failed" and failed.response.error is not None
    assert failed.response.error.code == "server_error"
    assert "closed the stream" in failed.response.error.message


@pytest.mark.parametrize("client", ["chat", "responses"])
def test_a_streamed_request_without_a_limit_may_write_the_claude_models_whole_output(
    fake: FakeProvider, proxy: InProcessProxy, client: str
) -> None:
    """A chat or Responses client that sets no output limit means the model's own maximum;
    the Messages API requires a number. Streamed, a Claude model the proxy knows gets its
    maximum output (Sonnet 4.5: 64,000), so an agent writing a long file is not cut at
    4,096 tokens; read whole at the end, a request keeps 4,096 (a long non-streamed answer
    outlives idle connections)."""
    for stream, sent in ((True, 64_000), (False, 4096)):
        fake.enqueue(Reply(text="done"))
        answer = ask(proxy, client, "claude-sonnet-4-5-20250929", max_retries=0, stream=stream)
        if stream:
            assert list(answer)  # read to its end
        assert fake.requests[-1].json["max_tokens"] == sent


# -- translation fidelity: a call left unanswered, a reply cut off, a refusal -------------

UNANSWERED = [
    {"role": "user", "content": "What is in /etc/hosts?"},
    {"type": "function_call", "call_id": "call_1", "name": "read", "arguments": "{}"},
]


@pytest.mark.parametrize("model", ["claude-m", "chat-m"])
def test_a_call_without_its_output_is_the_responses_apis_400_before_anything_is_sent(
    fake: FakeProvider, proxy: InProcessProxy, model: str
) -> None:
    """The Responses API refuses an input whose function call no output answers, in these
    words; translated, the call would go as a trailing ``tool_use`` that Messages refuses
    (or a tool call chat completions refuses, in its own words): the client gets the API's
    400, and the upstream nothing."""
    with pytest.raises(openai.BadRequestError) as e:
        oai(proxy).responses.create(model=model, input=UNANSWERED)  # type: ignore[arg-type]
    assert isinstance(e.value.body, dict)
    assert (e.value.body["param"], e.value.body["type"]) == ("input", "invalid_request_error")
    assert e.value.body["message"] == "No tool output found for function call call_1."
    assert fake.requests == []
    answered = [*UNANSWERED, {"type": "function_call_output", "call_id": "call_1",
                              "output": "127.0.0.1 localhost"}]  # fmt: skip
    fake.enqueue(Reply(text="It maps localhost."))
    reply = oai(proxy).responses.create(model=model, input=answered)  # type: ignore[arg-type]
    assert reply.output_text == "It maps localhost."


@pytest.mark.parametrize("model", ["claude-m", "chat-m"])
def test_a_message_between_a_call_and_its_output_reaches_the_upstream_after_the_output(
    fake: FakeProvider, proxy: InProcessProxy, model: str
) -> None:
    """The Responses API takes a user message between a call and its output (typed while
    the tool ran); Messages takes a tool_result only at the start of the user turn right
    after its call, chat a tool message only right after its call: the message goes after
    the output (before: in between, and the upstream refused the request)."""
    typed = {"role": "user", "content": "Also check /etc/resolv.conf."}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "127.0.0.1"}
    fake.enqueue(Reply(text="Checked both."))
    items = [*UNANSWERED, typed, output]
    reply = oai(proxy).responses.create(model=model, input=items)  # type: ignore[arg-type]
    assert reply.output_text == "Checked both."
    sent = fake.last.json["messages"]
    if model == "claude-m":
        assert [b["type"] for b in sent[-1]["content"]] == ["tool_result", "text"]
    else:
        assert [m["role"] for m in sent[-3:]] == ["assistant", "tool", "user"]


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("model", ["claude-m", "chat-m"])
def test_a_reply_cut_at_its_output_limit_is_an_incomplete_response_and_item(
    fake: FakeProvider, proxy: InProcessProxy, model: str, streamed: bool
) -> None:
    """``finish_reason: length`` / ``stop_reason: max_tokens`` is, as the Responses API
    says it, a response ``incomplete`` for ``max_output_tokens`` whose message item is
    ``incomplete`` (before: the item said ``completed``), streamed or not."""
    fake.enqueue(Reply(text="one two three four five six seven eight nine ten " * 20))
    sdk = oai(proxy)
    if not streamed:
        response = sdk.responses.create(model=model, input="Count.", max_output_tokens=16)
    else:
        stream = sdk.responses.create(
            model=model, input="Count.", max_output_tokens=16, stream=True
        )
        events = list(stream)
        (done,) = [e for e in events if e.type == "response.output_item.done"]
        assert done.item.status == "incomplete"
        assert events[-1].type == "response.incomplete"
        response = events[-1].response
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    (item,) = response.output
    assert item.type == "message" and item.status == "incomplete"
    assert response.output_text  # the text it wrote before the limit


REFUSAL = "I can't help with that."


def chat_refusal(streamed: bool) -> Reply:
    """A chat upstream's refusal (structured outputs' safety refusal): ``content`` null,
    the ``refusal`` member, ``finish_reason`` ``stop``; or its chunks."""
    base = {"id": "c1", "created": 1, "model": "chat-m"}
    if not streamed:
        message = {"role": "assistant", "content": None, "refusal": REFUSAL}
        choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
        return Reply(raw_body=json.dumps({**base, "object": "chat.completion",
                                          "choices": [choice]}).encode())  # fmt: skip
    deltas = [({"role": "assistant", "content": None, "refusal": ""}, None),
              ({"refusal": "I can't "}, None), ({"refusal": "help with that."}, None),
              ({}, "stop")]  # fmt: skip
    events = [{**base, "object": "chat.completion.chunk",
               "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": f}]}
              for d, f in deltas]  # fmt: skip
    return chat_sse(events)


@pytest.mark.parametrize("streamed", [False, True])
def test_a_chat_refusal_is_a_messages_refusal(
    fake: FakeProvider, proxy: InProcessProxy, streamed: bool
) -> None:
    """Messages says the model declined for safety with ``stop_reason: "refusal"`` (as its
    structured outputs do), which the anthropic SDK and Claude Code read as a refusal, not
    an answer (before: ``end_turn``); the text the model said stays."""
    fake.enqueue(chat_refusal(streamed))
    request = {"model": "chat-m", "max_tokens": 64, "messages": [{"role": "user", "content": "x"}]}
    if streamed:
        with ant(proxy).messages.stream(**request) as s:  # type: ignore[arg-type]
            message = s.get_final_message()
    else:
        message = ant(proxy).messages.create(**request)  # type: ignore[arg-type]
    assert message.stop_reason == "refusal"
    assert [(b.type, getattr(b, "text", None)) for b in message.content] == [("text", REFUSAL)]


@pytest.mark.parametrize("streamed", [False, True])
def test_a_chat_refusal_is_a_responses_refusal_part(
    fake: FakeProvider, proxy: InProcessProxy, streamed: bool
) -> None:
    """The Responses API gives a model's refusal as a ``refusal`` part of its message item
    (streamed: ``response.refusal.delta`` / ``.done``); before, the refusal was left out and
    the response had no output at all."""
    fake.enqueue(chat_refusal(streamed))
    sdk = oai(proxy)
    if streamed:
        events = list(sdk.responses.create(model="chat-m", input="x", stream=True))
        deltas = [e.delta for e in events if e.type == "response.refusal.delta"]
        assert "".join(deltas) == REFUSAL
        assert events[-1].type == "response.completed"
        response = events[-1].response
    else:
        response = sdk.responses.create(model="chat-m", input="x")
    assert response.status == "completed"
    (item,) = response.output
    assert item.type == "message"
    assert [(p.type, getattr(p, "refusal", None)) for p in item.content] == [("refusal", REFUSAL)]
