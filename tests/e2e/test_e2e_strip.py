"""reply_envelope (issue 14 §3) end to end: the real proxy (in-process), the real openai and
anthropic SDKs (chat completions, Messages and the Responses API), the fake provider;
same-dialect and translated, JSON and streamed.

The fake streams text in 8-character pieces: replies whose prose before the envelope has
every length from 0 to 7 put every character of the envelope at every position of a piece,
so the envelope is split across chunks in every possible place.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pydantic
import pytest

from tests.conftest import InProcessProxy, launch_in_process
from tests.fakeprovider import CHUNK_CHARS, FakeProvider, Reply
from tests.helpers import SESSION_HEADER, ant, oai

ENVELOPE = "```json\n" + json.dumps({"state_patch": {"notes": "n"}, "action": "look"}) + "\n```"
# (client, model): the upstream for claude-* is Anthropic-kind, for resp-* Responses-kind, for
# anything else OpenAI-kind.
ROUTES = [
    ("openai", "gpt-x"),
    ("openai", "claude-x"),  # translated
    ("anthropic", "claude-x"),
    ("anthropic", "gpt-x"),  # translated
    ("responses", "resp-x"),
    ("responses", "gpt-x"),  # translated
    ("responses", "claude-x"),  # translated twice (Messages -> chat -> Responses)
]


def config(fp: FakeProvider, reply_envelope: str) -> dict[str, Any]:
    return {
        "schema": ["notes"],
        "reply_envelope": reply_envelope,
        "upstreams": [
            {"name": "a", "url": fp.url, "kind": "anthropic", "models": ["claude-*"]},
            {"name": "r", "url": fp.url + "/v1", "kind": "openai-responses", "models": ["resp-*"]},
            {"name": "o", "url": fp.url + "/v1", "kind": "openai"},
        ],
    }


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProvider]:
    fp = FakeProvider().start()
    yield fp
    fp.stop()


def launched(
    fake: FakeProvider, tmp_path_factory: pytest.TempPathFactory, reply_envelope: str
) -> Iterator[InProcessProxy]:
    """A proxy with ``reply_envelope`` for the module's tests, stopped after them."""
    p = launch_in_process(
        tmp_path_factory.mktemp(reply_envelope), config=config(fake, reply_envelope)
    )
    yield p
    p.stop()


@pytest.fixture(scope="module")
def stripping(
    fake: FakeProvider, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcessProxy]:
    yield from launched(fake, tmp_path_factory, "strip")


@pytest.fixture(scope="module")
def keeping(
    fake: FakeProvider, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcessProxy]:
    yield from launched(fake, tmp_path_factory, "keep")


def ask(
    p: InProcessProxy, client: str, model: str, session: str, stream: bool
) -> tuple[str, dict[str, str]]:
    """One turn through an SDK: (the text the client got, the response headers)."""
    headers = {SESSION_HEADER: session}
    messages = [{"role": "user", "content": "look around"}]
    if client == "responses":
        return ask_responses(p, model, headers, stream)
    if client == "openai":
        oc = oai(p, "k")
        if stream:
            with oc.chat.completions.with_streaming_response.create(
                model=model,
                messages=messages,
                stream=True,
                extra_headers=headers,  # type: ignore[arg-type]
            ) as raw:
                text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
                return text, dict(raw.headers)
        raw_reply = oc.chat.completions.with_raw_response.create(
            model=model,
            messages=messages,
            extra_headers=headers,  # type: ignore[arg-type]
        )
        return raw_reply.parse().choices[0].message.content or "", dict(raw_reply.headers)
    ac = ant(p, "k")
    if stream:
        with ac.messages.stream(
            model=model,
            max_tokens=500,
            messages=messages,
            extra_headers=headers,  # type: ignore[arg-type]
        ) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
            assert all(b.type != "text" or b.text for b in final.content)  # no empty block
            return text, dict(s.response.headers)
    raw_msg = ac.messages.with_raw_response.create(
        model=model,
        max_tokens=500,
        messages=messages,
        extra_headers=headers,  # type: ignore[arg-type]
    )
    msg = raw_msg.parse()
    assert all(b.type != "text" or b.text for b in msg.content)
    return "".join(b.text for b in msg.content if b.type == "text"), dict(raw_msg.headers)


def ask_responses(
    p: InProcessProxy, model: str, headers: dict[str, str], stream: bool
) -> tuple[str, dict[str, str]]:
    """One Responses API turn through the openai SDK; a stream's events are checked to be a
    valid sequence whose closing events agree with its deltas."""
    oc = oai(p, "k")
    raw = oc.responses.with_raw_response.create(
        model=model, input="look around", stream=stream, extra_headers=headers
    )
    if not stream:
        return raw.parse().output_text, dict(raw.headers)
    events = [e.model_dump() for e in raw.parse()]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas: dict[tuple[str, int, int], str] = {}
    done: dict[tuple[str, int, int], str] = {}
    for e in events:
        key = (e.get("item_id"), e.get("output_index"), e.get("content_index"))
        if e["type"] == "response.output_text.delta":
            assert key not in done  # no delta after its part is done
            deltas[key] = deltas.get(key, "") + e["delta"]
        elif e["type"] == "response.output_text.done":
            done[key] = e["text"]
            assert e["text"] == deltas.get(key, "")
        elif e["type"] == "response.content_part.done":
            assert e["part"]["text"] == done[key]
        elif e["type"] == "response.output_item.done" and e["item"]["type"] == "message":
            item_key = (e["item"]["id"], e["output_index"], 0)
            assert e["item"]["content"][0]["text"] == done[item_key]
    final = events[-1]
    assert final["type"] == "response.completed"
    texts = [
        part["text"]
        for item in final["response"]["output"]
        if item["type"] == "message"
        for part in item["content"]
    ]
    assert texts == list(done.values())
    return "".join(texts), dict(raw.headers)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("client", "model"), ROUTES)
def test_strip_removes_the_envelope_wherever_the_chunks_split_it(
    fake: FakeProvider, stripping: InProcessProxy, client: str, model: str, stream: bool
) -> None:
    for n in range(CHUNK_CHARS):
        prose = "abcdefg"[:n] or ""
        said = f"{prose}\n{ENVELOPE}\nAfter." if n % 2 else f"{prose}\n{ENVELOPE}"
        fake.enqueue(Reply(text=said))
        session = f"strip-{client}-{model}-{stream}-{n}"
        text, headers = ask(stripping, client, model, session, stream)
        expected = (prose + "\nAfter.").lstrip("\n") if n % 2 else prose
        if not prose and not n % 2:
            expected = "look"  # nothing but the envelope: its action
        assert text == expected, (n, text)
        assert "state_patch" not in text
        # The verdict was made on the unstripped reply: the state moved.
        assert stripping.state(session)["state"] == {"notes": "n"}
        if not stream:
            assert headers["x-skillstate-transition"] == "valid"
            assert headers["x-skillstate-action"] == "look"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("client", "model"), ROUTES)
def test_keep_shows_the_reply_as_the_model_wrote_it(
    fake: FakeProvider, keeping: InProcessProxy, client: str, model: str, stream: bool
) -> None:
    said = f"Looking.\n{ENVELOPE}"
    fake.enqueue(Reply(text=said))
    session = f"keep-{client}-{model}-{stream}"
    text, headers = ask(keeping, client, model, session, stream)
    assert text == said
    assert keeping.state(session)["state"] == {"notes": "n"}
    if not stream:
        assert headers["x-skillstate-transition"] == "valid"


def test_passthrough_is_never_stripped(fake: FakeProvider, stripping: InProcessProxy) -> None:
    said = f"Looking.\n{ENVELOPE}"
    fake.enqueue(Reply(text=said))
    oc = oai(stripping, "k")
    got = oc.chat.completions.create(
        model="gpt-x",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-skillstate-mode": "passthrough", SESSION_HEADER: "pt"},
    )
    assert got.choices[0].message.content == said


# -- a reply that calls tools: the envelope's action is never shown as text -------------------

TOOL = {
    "type": "function",
    "function": {
        "name": "look_up",
        "description": "Look a user up.",
        "parameters": {"type": "object", "properties": {"who": {"type": "string"}}},
    },
}


def call_tools(p: InProcessProxy, client: str, model: str, session: str, stream: bool) -> Any:
    """One turn that offers a tool, through an SDK: the reply as the client's SDK parsed it."""
    headers = {SESSION_HEADER: session}
    question = [{"role": "user", "content": "who is ann?"}]
    if client == "openai":
        oc = oai(p, "k")
        if not stream:
            return (
                oc.chat.completions.create(
                    model=model, messages=question, tools=[TOOL], extra_headers=headers
                )
                .choices[0]
                .message
            )
        with oc.chat.completions.stream(
            model=model, messages=question, tools=[TOOL], extra_headers=headers
        ) as s:
            return s.get_final_completion().choices[0].message
    if client == "anthropic":
        ac = ant(p, "k")
        tool = {"name": "look_up", "input_schema": TOOL["function"]["parameters"]}
        kw: dict[str, Any] = dict(
            model=model, max_tokens=500, messages=question, tools=[tool], extra_headers=headers
        )
        if not stream:
            return ac.messages.create(**kw)
        with ac.messages.stream(**kw) as s:
            return s.get_final_message()
    oc = oai(p, "k")
    tool = {"type": "function", **TOOL["function"]}
    kw = dict(model=model, input="who is ann?", tools=[tool], extra_headers=headers)
    if not stream:
        return oc.responses.create(**kw)
    with oc.responses.stream(**kw) as s:
        return s.get_final_response()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("client", "model"), ROUTES)
def test_a_tool_call_with_an_envelope_only_text_shows_no_text(
    fake: FakeProvider, stripping: InProcessProxy, client: str, model: str, stream: bool
) -> None:
    fake.enqueue(Reply(text=ENVELOPE, tool_calls=[("look_up", {"who": "ann"})]))
    session = f"calls-{client}-{model}-{stream}"
    got = call_tools(stripping, client, model, session, stream)
    if client == "openai":
        assert got.content is None  # not the action "look"
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in got.tool_calls]
    elif client == "anthropic":
        assert [b.type for b in got.content] == ["tool_use"]  # no text block
        calls = [(b.name, b.input) for b in got.content]
    else:
        assert [item.type for item in got.output] == ["function_call"]  # no message item
        assert got.output_text == ""
        calls = [(item.name, json.loads(item.arguments)) for item in got.output]
    assert calls == [("look_up", {"who": "ann"})]
    assert stripping.state(session)["state"] == {"notes": "n"}  # the envelope was committed


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("client", "model"), ROUTES)
def test_prose_beside_a_tool_call_stays_and_its_envelope_goes(
    fake: FakeProvider, stripping: InProcessProxy, client: str, model: str, stream: bool
) -> None:
    fake.enqueue(Reply(text=f"Checking.\n{ENVELOPE}", tool_calls=[("look_up", {"who": "ann"})]))
    session = f"prose-calls-{client}-{model}-{stream}"
    got = call_tools(stripping, client, model, session, stream)
    if client == "openai":
        assert got.content == "Checking."
        assert got.tool_calls[0].function.name == "look_up"
    elif client == "anthropic":
        assert [b.type for b in got.content] == ["text", "tool_use"]
        assert got.content[0].text == "Checking."
    else:
        assert [item.type for item in got.output] == ["message", "function_call"]
        assert got.output_text == "Checking."
    assert stripping.state(session)["state"] == {"notes": "n"}


# -- a turn that brought its own output format (format-noop): never stripped ------------------


class Verdict(pydantic.BaseModel):
    """A client's own output format that an envelope-shaped answer happens to satisfy."""

    state_patch: dict[str, Any]
    action: str


VERDICT_TEXT = json.dumps({"state_patch": {}, "action": "continue"})


@pytest.mark.parametrize(("client", "model"), ROUTES)
def test_a_format_noop_reply_reaches_the_sdk_parser_as_the_model_wrote_it(
    fake: FakeProvider, stripping: InProcessProxy, client: str, model: str
) -> None:
    fake.enqueue(Reply(text=VERDICT_TEXT))
    headers = {SESSION_HEADER: f"noop-{client}-{model}"}
    question = [{"role": "user", "content": "judge it"}]
    if client == "openai":
        oc = oai(stripping, "k")
        raw = oc.chat.completions.with_raw_response.parse(
            model=model, messages=question, response_format=Verdict, extra_headers=headers
        )
        message = raw.parse().choices[0].message
        text, parsed = message.content, message.parsed
    elif client == "anthropic":
        ac = ant(stripping, "k")
        # Messages' raw-response wrapper has no parse(); a stream commits after its headers.
        with ac.messages.stream(
            model=model,
            max_tokens=200,
            messages=question,
            output_format=Verdict,
            extra_headers=headers,
        ) as s:
            msg = s.get_final_message()
        text, parsed = msg.content[0].text, msg.parsed_output
        raw = None
    else:
        oc = oai(stripping, "k")
        raw = oc.responses.with_raw_response.parse(
            model=model, input="judge it", text_format=Verdict, extra_headers=headers
        )
        resp = raw.parse()
        text, parsed = resp.output_text, resp.output_parsed
    assert text == VERDICT_TEXT  # byte for byte what the model said
    assert parsed == Verdict(state_patch={}, action="continue")
    if raw is not None:
        assert raw.headers["x-skillstate-transition"] == "format-noop"


@pytest.mark.parametrize(("client", "model"), ROUTES)
def test_a_format_noop_stream_is_not_stripped(
    fake: FakeProvider, stripping: InProcessProxy, client: str, model: str
) -> None:
    fake.enqueue(Reply(text=VERDICT_TEXT))
    headers = {SESSION_HEADER: f"noop-stream-{client}-{model}"}
    question = [{"role": "user", "content": "judge it"}]
    schema = Verdict.model_json_schema()
    if client == "openai":
        oc = oai(stripping, "k")
        fmt = {"type": "json_schema", "json_schema": {"name": "Verdict", "schema": schema}}
        chunks = oc.chat.completions.create(
            model=model,
            messages=question,
            response_format=fmt,
            stream=True,  # type: ignore[arg-type]
            extra_headers=headers,
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    elif client == "anthropic":
        ac = ant(stripping, "k")
        with ac.messages.stream(
            model=model,
            max_tokens=200,
            messages=question,
            extra_headers=headers,
            output_config={"format": {"type": "json_schema", "schema": schema}},
        ) as s:
            text = "".join(s.text_stream)
    else:
        oc = oai(stripping, "k")
        fmt = {"format": {"type": "json_schema", "name": "Verdict", "schema": schema}}
        with oc.responses.stream(
            model=model,
            input="judge it",
            text=fmt,
            extra_headers=headers,  # type: ignore[arg-type]
        ) as s:
            text = s.get_final_response().output_text
    assert text == VERDICT_TEXT
