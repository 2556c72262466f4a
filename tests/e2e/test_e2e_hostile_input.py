"""Hostile input a real client can send, through a real proxy against the fake provider:
each one a 400 in the client's dialect (never a 500 or a dropped connection), nothing sent
upstream for what the proxy refuses, and what it accepts served as a turn.

Every case here was a crash (500, the connection reset for a stream) before its fix."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import zlib
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import zstandard

from skillstate.cli.main import main
from tests.conftest import InProcessProxy, StartProxy
from tests.fakeprovider import FakeProvider, RecordedRequest, Reply
from tests.helpers import envelope, oai, session

JSON = dict[str, Any]
KINDS = ["openai", "anthropic"]
MODES = ["passthrough", "state", "window"]


def start(fake: FakeProvider, start_proxy: StartProxy, kind: str, **cfg: Any) -> InProcessProxy:
    url = fake.url if kind == "anthropic" else fake.url + "/v1"
    up = {"name": "up", "url": url, "kind": kind, "api_key": "sk-upstream"}
    return start_proxy(None, config={"upstreams": [up], "schema": ["facts", "notes"], **cfg})


def turns_sent(fake: FakeProvider) -> list[RecordedRequest]:
    return [r for r in fake.requests if r.method == "POST"]


def headers(mode: str, sid: str = "h1") -> dict[str, str]:
    return {**session(sid), "x-skillstate-mode": mode}


CALL = {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": "{}"}

# Responses input whose text-bearing members are not strings: the translation to a chat or
# Anthropic upstream joined them as text (TypeError, a 500 on every mode).
WRONG_TEXT: dict[str, list[Any]] = {
    "input_text": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}],
    "output_text": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "output_text", "text": ["x"]}]},
        {"role": "user", "content": "go on"},
    ],
    "refusal": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": 5}]},
        {"role": "user", "content": "go on"},
    ],
    "output part": [
        {"role": "user", "content": "hi"},
        CALL,
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text"}]},
    ],
    "output not a part": [
        {"role": "user", "content": "hi"},
        CALL,
        {"type": "function_call_output", "call_id": "c1", "output": [7]},
    ],
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(WRONG_TEXT))
def test_responses_text_that_is_not_a_string_is_a_400(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, mode: str, case: str
) -> None:
    p = start(fake, start_proxy, kind)
    c = oai(p, default_headers=headers(mode))
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.create(model="m-1", input=WRONG_TEXT[case], stream=stream)
        assert e.value.status_code == 400 and "input[" in str(e.value)
    assert turns_sent(fake) == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_the_compact_endpoint_takes_a_string_input(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, mode: str
) -> None:
    """``input`` may be a string on every Responses route (it is one user message); the
    compact endpoint read it as a list of characters in passthrough (AttributeError)."""
    p = start(fake, start_proxy, kind)
    fake.enqueue(Reply(text=envelope({"notes": "compacted"})))
    r = oai(p, default_headers=headers(mode)).responses.compact(
        model="m-1", input="Fix the failing test in calc.py"
    )
    *users, item = r.output
    assert item.type == "compaction" and [u.role for u in users] == ["user"]
    assert "Fix the failing test in calc.py" in str(turns_sent(fake)[-1].json)
    assert p.state("h1")["state"] == {"notes": "compacted"}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stream", [False, True])
def test_a_string_input_past_its_compaction_threshold_compacts(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, stream: bool
) -> None:
    """``context_management`` compaction on a string ``input`` in passthrough mode (the
    compaction read the string as a list of characters: AttributeError)."""
    p = start(fake, start_proxy, kind)
    fake.enqueue(Reply(text=envelope({"notes": "long task"})), Reply(text="answer"))
    request: JSON = {
        "model": "m-1",
        "input": "Fix the failing test. " * 200,
        "context_management": [{"type": "compaction", "compact_threshold": 100}],
    }
    c = oai(p, default_headers=headers("passthrough"))
    if stream:
        with c.responses.stream(**request) as events:
            final = events.get_final_response()
    else:
        final = c.responses.create(**request)
    assert final.output[0].type == "compaction"
    assert final.output_text == "answer"
    assert p.state("h1")["state"] == {"notes": "long task"}


def test_errors_under_the_responses_routes_answer_in_openais_shape(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """An error outside the turn handler on /v1/responses/... is the Responses API's (OpenAI's)
    shape, whatever the client's other headers say (it followed ``anthropic-version``)."""
    p = start(fake, start_proxy, "openai")
    for path in ("/v1/responses/compact", "/responses/compact", "/v1/responses/resp_1"):
        r = httpx.put(p.url + path, headers={"anthropic-version": "2023-06-01"})
        assert r.status_code == 405
        assert list(r.json()) == ["error"], r.text  # not Anthropic's {"type": "error", ...}
        assert r.json()["error"]["type"] == "invalid_request_error"


TURN_BODIES: dict[str, JSON] = {
    "/v1/chat/completions": {"model": "m-1", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/messages": {
        "model": "m-1",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "hi"}],
    },
    "/v1/messages/count_tokens": {"model": "m-1", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": {"model": "m-1", "input": "hi"},
}


def dialect_error(path: str, r: httpx.Response) -> JSON:
    """The error object of the route's dialect (Anthropic's on /v1/messages...)."""
    body = r.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error", r.text
    else:
        assert list(body) == ["error"], r.text
    error: JSON = body["error"]
    return error


@pytest.mark.parametrize("path", sorted(TURN_BODIES))
def test_a_compressed_body_is_decoded_and_sent_upstream_plain(
    fake: FakeProvider, start_proxy: StartProxy, path: str
) -> None:
    """Codex CLI zstd-compresses its requests for OpenAI's provider, and HTTP clients may gzip
    a big body: the proxy decodes gzip, deflate and zstd before its one parse and sends its own
    JSON upstream uncompressed (the client's ``content-encoding`` was once forwarded with a
    re-encoded body, and the upstream could not decode it: a 500 relayed to the client)."""
    p = start(fake, start_proxy, "openai")
    raw = json.dumps(TURN_BODIES[path]).encode()
    encoded = {
        "gzip": gzip.compress(raw),
        "deflate": zlib.compress(raw),
        "zstd": zstandard.ZstdCompressor().compress(raw),
        "identity": raw,
    }
    for coding, body in encoded.items():
        r = httpx.post(
            p.url + path,
            content=body,
            headers={"content-type": "application/json", "content-encoding": coding},
        )
        assert r.status_code == 200, (coding, r.text)
    sent = turns_sent(fake)
    if path.endswith("count_tokens"):
        assert sent == []  # counted by the proxy itself
        return
    assert len(sent) == len(encoded)
    assert all("content-encoding" not in s.headers for s in sent)
    assert all(json.loads(s.body)["model"] == "m-1" for s in sent)


@pytest.mark.parametrize("path", sorted(TURN_BODIES))
def test_a_body_that_is_not_what_its_coding_says_is_refused_before_upstream(
    fake: FakeProvider, start_proxy: StartProxy, path: str
) -> None:
    """Plain JSON labelled gzip and a truncated zstd frame are 400s, an unknown coding a 415,
    and a small body that inflates past ``max_body_bytes`` a 413: each in the route's dialect,
    and nothing goes upstream."""
    p = start(fake, start_proxy, "openai", max_body_bytes=64 * 1024)
    raw = json.dumps(TURN_BODIES[path]).encode()
    bomb = json.dumps({**TURN_BODIES[path], "metadata": {"pad": "x" * 200_000}}).encode()
    cases = [
        ("gzip", raw, 400, "not valid gzip"),
        ("zstd", zstandard.ZstdCompressor().compress(raw)[:-6], 400, "not valid zstd"),
        ("br", raw, 415, "content-encoding 'br' is not supported"),
        ("gzip", gzip.compress(bomb), 413, "max_body_bytes"),
        ("zstd", zstandard.ZstdCompressor().compress(bomb), 413, "max_body_bytes"),
    ]
    for coding, body, status, says in cases:
        assert len(body) < 64 * 1024
        r = httpx.post(
            p.url + path,
            content=body,
            headers={"content-type": "application/json", "content-encoding": coding},
        )
        assert r.status_code == status, (coding, r.text)
        assert says in dialect_error(path, r)["message"], (coding, r.text)
    assert turns_sent(fake) == []


def test_an_empty_body_labelled_compressed_is_an_empty_body(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """Zero bytes have nothing to decode: a client that labels every request gzip can set a
    session's budget with an empty ``PATCH /state`` (it was a 400, "not valid gzip data"),
    and a turn with no body is told that its body is empty, not that it is bad gzip."""
    p = start(fake, start_proxy, "openai")
    for coding in ("gzip", "deflate", "zstd"):
        budget = {"x-skillstate-budget-usd": "1.5", "content-encoding": coding}
        r = p.http.patch(p.url + "/state", params={"session": f"e-{coding}"}, headers=budget)
        assert r.status_code == 200, (coding, r.text)
        assert r.json() == {"session": f"e-{coding}", "budget_usd": 1.5}  # as stored
        turn = httpx.post(
            p.url + "/v1/chat/completions",
            content=b"",
            headers={"content-type": "application/json", "content-encoding": coding},
        )
        assert turn.status_code == 400, (coding, turn.text)
        assert "request body is empty" in turn.json()["error"]["message"], turn.text
    assert turns_sent(fake) == []


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stream", [False, True])
def test_huge_integers_in_a_chat_clients_tool_arguments_reach_an_anthropic_upstream(
    fake: FakeProvider, start_proxy: StartProxy, mode: str, stream: bool
) -> None:
    """A chat client's tool-call arguments are JSON text the proxy parses into Anthropic's
    ``input`` object: an integer past the float range (400 digits) or past Python's
    4,300-digit int conversion limit (5,000) was a 500 (OverflowError, ValueError), the
    connection reset for a stream. Now read as orjson reads such a number: null."""
    p = start(fake, start_proxy, "anthropic")
    big = "9" * 400
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "sh", "arguments": f'{{"a": {big}, "b": -{"9" * 5000}, "c": 7}}'},
    }
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    r = httpx.post(
        p.url + "/v1/chat/completions",
        json={"model": "m-1", "messages": messages, "stream": stream},
        headers=headers(mode),
        timeout=30,
    )
    assert r.status_code == 200, r.text
    if mode == "passthrough":  # state and window send the state, not the transcript
        (sent,) = turns_sent(fake)
        blocks = [
            b for m in sent.json["messages"] if isinstance(m["content"], list) for b in m["content"]
        ]
        (use,) = [b for b in blocks if b["type"] == "tool_use"]
        assert use["input"] == {"a": None, "b": None, "c": 7}


def test_head_on_the_state_route_answers_as_get_without_a_body(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """Starlette routes a GET route's HEAD to its handler: ``HEAD /state?session=ID`` was a
    500 (KeyError: no HEAD among the route's methods) and a listing's HEAD a 400 saying
    ``?session=ID`` is required. Each now answers what GET would, without the body, and
    changes nothing."""
    p = start(fake, start_proxy, "openai")
    fake.enqueue(Reply(text=envelope({"notes": "kept"})))
    first = TURN_BODIES["/v1/chat/completions"]
    assert httpx.post(
        p.url + "/v1/chat/completions", json=first, headers=headers("state")
    ).is_success
    for query in ("?session=h1", "?session=h1&history=1", "", "?session=nosuch", "?session=a/b"):
        got = httpx.get(p.url + "/state" + query)
        head = httpx.head(p.url + "/state" + query)
        assert (head.status_code, head.content) == (got.status_code, b""), (query, head)
    assert p.state("h1")["state"] == {"notes": "kept"}


def test_head_on_the_admin_keys_route_lists_instead_of_creating(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    """``HEAD /admin/keys`` went down the create (POST) path: a 415 asking for a JSON body.
    It now answers as the listing does."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert (
            main(
                [
                    "keys",
                    "--data-dir",
                    str(tmp_path / "data"),
                    "create",
                    "--name",
                    "root",
                    "--admin",
                ]
            )
            == 0
        )
    admin = {"authorization": "Bearer " + out.getvalue().strip()}
    p = start(fake, start_proxy, "openai")
    head = httpx.head(p.url + "/admin/keys", headers=admin)
    assert (head.status_code, head.content) == (200, b""), head
    listed = httpx.get(p.url + "/admin/keys", headers=admin).json()["data"]
    assert [k["name"] for k in listed] == ["root"]


@pytest.mark.parametrize("path", sorted(TURN_BODIES))
def test_a_gzip_body_of_several_members_and_a_zstd_body_of_several_frames_are_read_whole(
    fake: FakeProvider, start_proxy: StartProxy, path: str
) -> None:
    """A gzip body is a series of members, a zstd body a series of frames (RFC 1952 2.2,
    RFC 8878 3; ``gzip -d`` and ``zstd -d`` read them whole): such a body was a 400 ("not
    valid gzip data: truncated or trailing data"). Split over members or frames, a body past
    ``max_body_bytes`` is still a 413 and junk after the last member still a 400."""
    p = start(fake, start_proxy, "openai", max_body_bytes=64 * 1024)
    raw = json.dumps(TURN_BODIES[path]).encode()
    head, tail = raw[: len(raw) // 2], raw[len(raw) // 2 :]
    zstd = zstandard.ZstdCompressor()
    pad = b" " * (40 * 1024)  # whitespace: two of these pass max_body_bytes decoded
    cases = [
        ("gzip", gzip.compress(head) + gzip.compress(tail), 200),
        ("zstd", zstd.compress(head) + zstd.compress(tail), 200),
        ("gzip", gzip.compress(pad + head) + gzip.compress(pad + tail), 413),
        ("zstd", zstd.compress(pad + head) + zstd.compress(pad + tail), 413),
        ("gzip", gzip.compress(raw) + b"junk", 400),
        ("zstd", zstd.compress(raw) + b"junk", 400),
    ]
    for coding, body, status in cases:
        r = httpx.post(
            p.url + path,
            content=body,
            headers={"content-type": "application/json", "content-encoding": coding},
        )
        assert r.status_code == status, (coding, status, r.text)
        if status != 200:
            dialect_error(path, r)
    expected = 0 if path.endswith("count_tokens") else 2  # counted by the proxy itself
    assert [json.loads(s.body)["model"] for s in turns_sent(fake)] == ["m-1"] * expected
