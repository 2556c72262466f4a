"""Compaction served from the session's state, through a real proxy, driven by the openai
SDK (``responses.compact``, a ``compaction_trigger`` as JSON and as a stream, the item sent
back later) against the fake provider as a chat-completions and an Anthropic upstream; the
native pass-through to a Responses upstream; and every bad compaction item refused with a
400 before anything goes upstream."""

from __future__ import annotations

import contextlib
import io
import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from skillstate.cli.main import main as cli_main
from skillstate.compaction.items import CHECKPOINT_MARK, RESTORED_MARK
from skillstate.engine.context import STATE_MARK
from tests.conftest import InProcessProxy, StartProxy
from tests.fakeprovider import FakeProvider, RecordedRequest, Reply
from tests.helpers import SESSION_HEADER, ant

JSON = dict[str, Any]
KINDS = ["openai", "anthropic"]
TRIGGER = {"type": "compaction_trigger"}


def envelope(patch: JSON, action: str = "continue") -> str:
    return f"```json\n{json.dumps({'state_patch': patch, 'action': action})}\n```"


def start(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, *args: str, **cfg: Any
) -> InProcessProxy:
    url = fake.url if kind == "anthropic" else fake.url + "/v1"
    up = {"name": "up", "url": url, "kind": kind, "api_key": "sk-upstream"}
    return start_proxy(None, *args, config={"upstreams": [up], **cfg})


def client(
    proxy: InProcessProxy, session: str | None = "s1", key: str = "sk-client"
) -> openai.OpenAI:
    headers = {SESSION_HEADER: session} if session else {}
    return openai.OpenAI(base_url=proxy.v1, api_key=key, max_retries=0, default_headers=headers)


def history(n: int = 3) -> list[Any]:
    items: list[Any] = [{"role": "user", "content": "Fix the failing test in calc.py"}]
    for k in range(n):
        items += [
            {
                "type": "function_call",
                "call_id": f"call_{k}",
                "name": "sh",
                "arguments": json.dumps({"cmd": f"cat part{k}.py"}),
            },
            {"type": "function_call_output", "call_id": f"call_{k}", "output": f"def f{k}(): ..."},
        ]
    return items


TOOLS = [{"type": "function", "name": "sh", "parameters": {"type": "object", "properties": {}}}]


def upstream_text(rec: RecordedRequest) -> str:
    return json.dumps(rec.json)


def sent_turns(fake: FakeProvider) -> list[RecordedRequest]:
    return [r for r in fake.requests if r.path in ("/v1/chat/completions", "/v1/messages")]


@pytest.mark.parametrize("kind", KINDS)
def test_the_compact_endpoint_checkpoints_into_the_state(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    p = start(fake, start_proxy, kind, "--mode", "passthrough")
    fake.enqueue(Reply(text="Noted.\n" + envelope({"facts": ["calc.py: f2 is wrong"]})))
    r = client(p).responses.compact(model="m-1", input=history(), instructions="You fix bugs.")
    assert r.object == "response.compaction"
    *users, item = r.output
    assert [u.role for u in users] == ["user"] and item.type == "compaction"
    assert item.encrypted_content.startswith("ssc1_") and r.usage.input_tokens > 0
    (sent,) = sent_turns(fake)
    text = upstream_text(sent)
    assert "STATE CONTRACT" in text and CHECKPOINT_MARK in text and "cat part2.py" in text
    assert "is being compacted" in text  # no state yet: a full turn with the contract
    state = p.state("s1")
    assert state["state"] == {"facts": ["calc.py: f2 is wrong"]} and state["step"] == 1
    assert p.get("/cost", params={"session": "s1"}).json()["totals"]["requests"] == 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stream", [False, True])
def test_a_trigger_gets_exactly_one_compaction_item(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, stream: bool
) -> None:
    p = start(fake, start_proxy, kind, "--mode", "passthrough")
    fake.enqueue(Reply(text=envelope({"notes": "read part0..2"})))
    c = client(p)
    request = {"model": "m-1", "input": [*history(), TRIGGER], "tools": TOOLS}
    if stream:
        with c.responses.stream(**request) as events:
            types = [e.type for e in events]
            final = events.get_final_response()
        assert types[0] == "response.created" and types[-1] == "response.completed"
        assert types.count("response.output_item.done") == 1
    else:
        final = c.responses.create(**request)
    (item,) = final.output
    assert item.type == "compaction" and item.encrypted_content.startswith("ssc1_")
    assert p.state("s1")["state"] == {"notes": "read part0..2"}
    (sent,) = sent_turns(fake)
    assert "compaction_trigger" not in upstream_text(sent) and sent.json.get("stream") is not True


def compact_once(p: InProcessProxy, fake: FakeProvider, patch: JSON, session: str = "s1") -> JSON:
    fake.enqueue(Reply(text=envelope(patch)))
    r = client(p, session).responses.create(model="m-1", input=[*history(), TRIGGER])
    return r.output[0].model_dump()


@pytest.mark.parametrize("kind", KINDS)
def test_a_later_request_gets_the_pinned_state_in_the_items_place(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    p = start(fake, start_proxy, kind, "--mode", "passthrough")
    first = compact_once(p, fake, {"facts": ["one"]})
    compact_once(p, fake, {"facts": ["one", "two"]})  # the session moves on (step 2)
    fake.enqueue(Reply(text="carrying on"))
    later = [{"role": "user", "content": "Fix it"}, first, {"role": "user", "content": "next?"}]
    r = client(p).responses.create(model="m-1", input=later)
    assert r.output_text == "carrying on"
    text = upstream_text(sent_turns(fake)[-1])
    assert RESTORED_MARK in text and '\\"facts\\":[\\"one\\"]' in text and "two" not in text
    assert "ssc1_" not in text and "compaction" not in text.replace(RESTORED_MARK, "")


def test_the_item_works_after_a_restart(fake: FakeProvider, start_proxy: StartProxy) -> None:
    p = start(fake, start_proxy, "openai", "--mode", "passthrough")
    item = compact_once(p, fake, {"facts": ["kept"]})
    p.stop()
    again = start(fake, start_proxy, "openai", "--mode", "passthrough")
    fake.enqueue(Reply(text="ok"))
    client(again).responses.create(model="m-1", input=[item, {"role": "user", "content": "go"}])
    assert '\\"facts\\":[\\"kept\\"]' in upstream_text(sent_turns(fake)[-1])


def test_state_mode_compacts_and_continues(fake: FakeProvider, start_proxy: StartProxy) -> None:
    p = start(fake, start_proxy, "openai", "--mode", "state")
    fake.enqueue(Reply(text="Looking.\n" + envelope({"notes": "started"})))
    c = client(p)
    c.responses.create(model="m-1", input=history(1))
    item = compact_once(p, fake, {"notes": "folded", "facts": ["f0 fine"]})
    # A session with state and no window: the whole transcript, the contract, the state,
    # then the window form's checkpoint instruction.
    text = upstream_text(sent_turns(fake)[-1])
    assert "cat part0.py" in text and "cat part2.py" in text and "started" in text
    assert "leave your context after this reply" in text and "is being compacted" not in text
    fake.enqueue(Reply(text="Done.\n" + envelope({"notes": "done"})))
    r = c.responses.create(model="m-1", input=[item, {"role": "user", "content": "finish"}])
    assert r.output_text == "Done."
    state = p.state("s1")
    assert state["state"] == {"notes": "done", "facts": ["f0 fine"]} and state["step"] == 3


def test_native_compaction_passes_through_to_a_responses_upstream(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai-responses", "--mode", "state")
    fake.enqueue(Reply(text="whatever the upstream compacts"))
    client(p).responses.create(model="m-1", input=[*history(), TRIGGER])
    (sent,) = [r for r in fake.requests if r.path == "/v1/responses"]
    assert sent.json["input"][-1] == TRIGGER and "STATE CONTRACT" not in upstream_text(sent)
    foreign = {"type": "compaction", "id": "cmp_x", "encrypted_content": "gAAAA-openai-own"}
    fake.enqueue(Reply(text="fine"))
    client(p).responses.create(
        model="m-1",
        input=[foreign, {"role": "user", "content": "go"}],
        extra_headers={"x-skillstate-mode": "passthrough"},
    )
    assert foreign in fake.requests[-1].json["input"]  # the upstream's own: it reads it


BIG = "line of build output 0123456789\n" * 12  # ~100 tokens per tool output


def checkpointing_model(rec: RecordedRequest) -> Reply:
    """A model that writes the envelope only when the last message asks for a checkpoint
    (the window form's turns between checkpoints ask for none)."""
    asked = CHECKPOINT_MARK in json.dumps((rec.json.get("messages") or [{}])[-1])
    n = len(rec.json.get("messages") or ())
    return Reply(text=envelope({"notes": f"folded at {n}"})) if asked else Reply(text="next")


def build_steps(c: openai.OpenAI, items: list[Any], first: int, last: int) -> None:
    """The agent's loop: each step's output and the model's answer join the transcript."""
    for k in range(first, last):
        items.append({"role": "user", "content": f"output {k}\n{BIG}"})
        r = c.responses.create(model="m-1", input=items)
        items.append({"role": "assistant", "content": r.output_text})


def checkpoints(fake: FakeProvider) -> list[RecordedRequest]:
    return [r for r in sent_turns(fake) if CHECKPOINT_MARK in json.dumps(r.json["messages"][-1])]


@pytest.mark.parametrize("rewritten", [False, True])
def test_a_window_session_compacts_with_the_windows_checkpoint(
    fake: FakeProvider, start_proxy: StartProxy, rewritten: bool
) -> None:
    """A session in the window form compacts with the window's checkpoint turn: the stable
    prefix, the state, the messages since the window's start and the checkpoint instruction
    (the messages an earlier checkpoint folded are not sent again). A transcript the window
    does not continue (the client rewrote it) is sent whole, so nothing unfolded is lost."""
    p = start(fake, start_proxy, "openai", "--mode", "window", window_max_tokens=1000)
    fake.responder = checkpointing_model
    c = client(p)
    items: list[Any] = [{"role": "user", "content": "TASK: build the project"}]
    build_steps(c, items, 0, 12)
    assert checkpoints(fake), "the window never checkpointed"
    build_steps(c, items, 12, 14)
    if rewritten:
        items = [items[0], {"role": "user", "content": "output 0 again"}, *items[-4:]]
    before = p.state("s1")
    fake.requests.clear()
    r = c.responses.create(model="m-1", input=[*items, TRIGGER])
    (item,) = r.output
    assert item.type == "compaction" and item.encrypted_content.startswith("ssc1_")
    (sent,) = sent_turns(fake)
    text = upstream_text(sent)
    assert STATE_MARK in text and before["state"]["notes"] in text  # the state it starts from
    assert "Older messages are not shown" in text  # the window's contract
    assert "leave your context after this reply" in text  # the window's checkpoint instruction
    assert "output 13" in text and "is being compacted" not in text
    assert ("output 0 again" in text) is rewritten  # rewritten: the whole transcript
    if not rewritten:  # (output 0, sent with the task before any reply, is the task's)
        assert "output 1\\n" not in text  # folded by an earlier checkpoint: not sent again
    after = p.get("/state", params={"session": "s1", "history": "1"}).json()
    assert after["step"] == before["step"] + 1
    assert after["history"][-1]["context"] == "checkpoint"
    assert after["history"][-1]["status"] == "valid"


@pytest.mark.parametrize("mode", ["state", "window", "passthrough"])
def test_the_compact_endpoint_passes_through_to_a_responses_upstream(
    fake: FakeProvider, start_proxy: StartProxy, mode: str
) -> None:
    """``compaction: native`` (the default): ``POST /responses/compact`` goes to the
    upstream's own ``/responses/compact`` as it came, its answer comes back as it is, the
    call is metered, and the session's state is not touched."""
    p = start(fake, start_proxy, "openai-responses", "--mode", mode)
    c = client(p)
    if mode != "passthrough":
        fake.enqueue(Reply(text="Looking.\n" + envelope({"notes": "started"})))
        c.responses.create(model="gpt-4o", input=history(1))
    before = p.state("s1") if mode != "passthrough" else {}
    fake.enqueue(Reply(text="the upstream's summary", usage={"prompt_tokens": 900}))
    raw = c.responses.with_raw_response.compact(
        model="gpt-4o", input=history(), instructions="You fix bugs."
    )
    r = raw.parse()
    assert r.object == "response.compaction" and r.usage.input_tokens == 900
    *users, item = r.output
    assert [u.role for u in users] == ["user"] and item.type == "compaction"
    assert item.encrypted_content.startswith("gAAAAA")  # the upstream's own, not a token
    sent = fake.requests[-1]
    assert sent.path == "/v1/responses/compact"
    assert {k: v for k, v in sent.json.items() if k != "prompt_cache_key"} == {
        "model": "gpt-4o",
        "input": history(),
        "instructions": "You fix bugs.",
    }
    if before:  # no checkpoint (the upstream compacted); the call is in the session's spend
        after = p.state("s1")
        assert (after["state"], after["step"]) == (before["state"], before["step"])
        assert after["spent_usd"] > before["spent_usd"]
    rows = p.get("/cost", params={"session": "s1"}).json()["totals"]
    assert rows["requests"] == (1 if mode == "passthrough" else 2)
    assert rows["input_tokens"] >= 900 and rows["cost_usd"] > 0
    fake.enqueue(Reply(text="carrying on"))
    compacted = raw.http_response.json()["output"]  # as the upstream wrote it
    later = c.responses.create(model="gpt-4o", input=[*compacted, TRIGGER])
    assert later.output_text == "carrying on"
    assert fake.requests[-1].json["input"] == [*compacted, TRIGGER]  # the upstream's to read


def test_native_compact_errors_reach_the_client_in_its_dialect(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai-responses", "--mode", "state")
    c = client(p)
    with pytest.raises(openai.BadRequestError) as e:  # the API's own refusal, relayed
        c.responses.compact(model="gpt-4o", input=history(), extra_body={"stream": True})
    assert e.value.body["code"] == "unknown_parameter" and e.value.body["param"] == "stream"
    fake.enqueue(Reply(status=400, error_body="context too long to compact"))
    with pytest.raises(openai.BadRequestError, match="context too long to compact") as e:
        c.responses.compact(model="gpt-4o", input=history())
    assert e.value.body["type"] == "invalid_request_error"
    assert [r.path for r in fake.requests] == ["/v1/responses/compact"] * 2
    rows = p.get("/cost", params={"session": "s1"}).json()["totals"]
    assert rows["requests"] == 2  # the failed calls are in the ledger too


def test_native_compact_is_for_responses_upstreams_only(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """A failover target of another kind never gets the native endpoint's request: with the
    Responses upstream down, the client gets the failure, nothing went to the chat one."""
    ups = [
        {"name": "r", "url": fake.url + "/v1", "kind": "openai-responses", "api_key": "k"},
        {"name": "c", "url": fake.url + "/v1", "kind": "openai", "api_key": "k", "priority": 1},
    ]
    p = start_proxy(None, "--mode", "state", config={"upstreams": ups, "retry_max_attempts": 1})
    fake.enqueue(Reply(status=503, error_body="down"))
    with pytest.raises(openai.InternalServerError):
        client(p).responses.compact(model="gpt-4o", input=history())
    assert [r.path for r in fake.requests] == ["/v1/responses/compact"]


def test_compaction_proxy_serves_a_responses_upstream_too(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(fake, start_proxy, "openai-responses", "--mode", "passthrough", compaction="proxy")
    item = compact_once(p, fake, {"notes": "from the proxy"})
    assert item["encrypted_content"].startswith("ssc1_")
    assert CHECKPOINT_MARK in upstream_text(fake.requests[-1])
    fake.enqueue(Reply(text=envelope({"notes": "the endpoint, from the proxy"})))
    r = client(p).responses.compact(model="m-1", input=history())
    assert r.output[-1].encrypted_content.startswith("ssc1_")
    assert fake.requests[-1].path == "/v1/responses"
    assert p.state("s1")["state"] == {"notes": "the endpoint, from the proxy"}


NOT_AN_ENVELOPE = Reply(text="I would rather keep working.")


@pytest.mark.parametrize("how", ["trigger", "endpoint", "threshold", "tool calls"])
def test_a_checkpoint_that_folds_nothing_is_a_422_and_no_token(
    fake: FakeProvider, start_proxy: StartProxy, how: str
) -> None:
    """A checkpoint still invalid after the re-asks (or answered with tool calls instead of
    the envelope) does not pin the unchanged state as if it folded the history: a 422 (that
    no SDK retries on its own) in the client's dialect, no compaction item, nothing run after
    it; the turn stays in the history as judged, and is billed."""
    p = start(fake, start_proxy, "openai", "--mode", "state")
    fake.enqueue(Reply(text="Looking.\n" + envelope({"notes": "started"})))
    c = client(p)
    c.responses.create(model="m-1", input=history(1))
    if how == "tool calls":
        fake.enqueue(Reply(tool_calls=[("sh", {"cmd": "ls"})]))
    else:
        fake.enqueue(NOT_AN_ENVELOPE, NOT_AN_ENVELOPE, NOT_AN_ENVELOPE)  # max_retries: 2
    before = len(fake.requests)
    with pytest.raises(openai.UnprocessableEntityError) as e:
        if how == "endpoint":
            c.responses.compact(model="m-1", input=history())
        elif how == "threshold":
            cm = [{"type": "compaction", "compact_threshold": 50}]
            c.responses.create(model="m-1", input=history(), context_management=cm)  # type: ignore[arg-type]
        else:
            c.responses.create(model="m-1", input=[*history(), TRIGGER], tools=TOOLS)  # type: ignore[list-item]
    assert e.value.status_code == 422 and e.value.response.headers["x-should-retry"] == "false"
    err = e.value.body
    assert isinstance(err, dict) and err["code"] == "invalid_checkpoint"
    assert (
        "did not produce a valid checkpoint" in err["message"]
        and "ssc1_" not in e.value.response.text
    )
    assert e.value.response.headers["x-skillstate-transition"] != "valid"
    sent = len(fake.requests) - before
    assert sent == (1 if how == "tool calls" else 3)  # the checkpoint and its re-asks, no more
    state = p.get("/state", params={"session": "s1", "history": "1"}).json()
    assert state["state"] == {"notes": "started"} and state["step"] == 2
    assert state["history"][-1]["status"] in ("invalid", "tool-noop")
    totals = p.get("/cost", params={"session": "s1"}).json()["totals"]
    assert totals["requests"] == 2 and sum(totals["attempts"].values()) == 1 + sent  # billed


def test_an_anthropic_client_gets_the_422_in_its_dialect(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    import anthropic

    p = start(fake, start_proxy, "openai", "--mode", "passthrough")
    fake.enqueue(NOT_AN_ENVELOPE, NOT_AN_ENVELOPE, NOT_AN_ENVELOPE)
    c = ant(p, "sk-client")
    edit = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50}}
    messages = [{"role": "user", "content": "read it all " * 100}]
    with pytest.raises(anthropic.UnprocessableEntityError) as e:
        c.beta.messages.create(
            model="m-1",
            max_tokens=50,
            messages=messages,  # type: ignore[arg-type]
            context_management={"edits": [edit]},  # type: ignore[arg-type]
            extra_headers={SESSION_HEADER: "a1"},
        )
    body = e.value.body
    assert e.value.status_code == 422 and isinstance(body, dict)
    assert body["type"] == "error" and body["error"]["type"] == "api_error"
    assert "did not produce a valid checkpoint" in body["error"]["message"]
    assert "ssc1_" not in e.value.response.text  # no compaction block, no token
    assert len(fake.requests) == 3


def make_key(data: Path, name: str) -> str:
    """A new client key ``name`` (``skillstate keys add``, in this process)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["keys", "--data-dir", str(data), "create", "--name", name]) == 0
    return out.getvalue().strip()


def bad_request(
    p: InProcessProxy, items: list[Any], session: str | None = "s1", key: str = "sk-client"
) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"}
    if session:
        headers[SESSION_HEADER] = session
    return p.http.post(p.v1 + "/responses", json={"model": "m-1", "input": items}, headers=headers)


def assert_refused(r: httpx.Response, fake: FakeProvider, before: int, says: str) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (
        err["type"] == "invalid_request_error"
        and err["param"] == "input"
        and says in err["message"]
    )
    assert len(fake.requests) == before  # nothing went upstream


def test_bad_compaction_items_are_refused(fake: FakeProvider, start_proxy: StartProxy) -> None:
    p = start(fake, start_proxy, "openai", "--mode", "passthrough")
    item = compact_once(p, fake, {"notes": "x"})
    before = len(fake.requests)
    token = item["encrypted_content"]
    tampered = {
        **item,
        "encrypted_content": token[:-6] + ("AAAAAA" if token[-6:] != "AAAAAA" else "BBBBBB"),
    }
    refused = bad_request(p, [tampered])
    assert_refused(refused, fake, before, "does not verify")
    assert refused.headers[SESSION_HEADER] == "s1"  # as on every answer
    forged = {**item, "encrypted_content": "TOKEN-V2-1"}
    assert_refused(bad_request(p, [forged]), fake, before, "not a compaction token")
    assert_refused(bad_request(p, [item], session="s2"), fake, before, "another session")
    assert p.http.delete(p.url + "/state", params={"session": "s1"}).status_code in (200, 204)
    assert_refused(bad_request(p, [item]), fake, before, "no longer exists")


def test_a_trigger_not_last_is_refused(fake: FakeProvider, start_proxy: StartProxy) -> None:
    p = start(fake, start_proxy, "openai", "--mode", "passthrough")
    r = bad_request(p, [TRIGGER, {"role": "user", "content": "hi"}])
    assert_refused(r, fake, 0, "compaction_trigger")


def test_an_item_from_another_key_is_refused(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    alice, bob = make_key(tmp_path / "data", "alice"), make_key(tmp_path / "data", "bob")
    p = start(fake, start_proxy, "openai", "--mode", "passthrough")
    fake.enqueue(Reply(text=envelope({"notes": "alice's"})))
    r = client(p, key=alice).responses.create(model="m-1", input=[*history(), TRIGGER])
    item = r.output[0].model_dump()
    before = len(fake.requests)
    assert_refused(bad_request(p, [item], key=bob), fake, before, "another client key")
    assert_refused(
        bad_request(p, [item], session=None, key=bob), fake, before, "another client key"
    )


@pytest.mark.parametrize("stream", [False, True])
def test_context_management_compacts_past_its_threshold(
    fake: FakeProvider, start_proxy: StartProxy, stream: bool
) -> None:
    p = start(fake, start_proxy, "openai", "--mode", "passthrough")
    fake.enqueue(Reply(text=envelope({"notes": "parts 0..2 read"})), Reply(text="All read."))
    cm = [{"type": "compaction", "compact_threshold": 50}]
    request: Any = {"model": "m-1", "input": history(), "context_management": cm}
    c = client(p)
    if stream:
        with c.responses.stream(**request) as events:
            final = events.get_final_response()
    else:
        final = c.responses.create(**request)
    first, answer = final.output
    assert first.type == "compaction" and first.encrypted_content.startswith("ssc1_")
    assert answer.type == "message" and final.output_text == "All read."
    checkpoint, call = sent_turns(fake)
    assert CHECKPOINT_MARK in upstream_text(checkpoint)
    text = upstream_text(call)
    assert RESTORED_MARK in text and "parts 0..2 read" in text and "cat part0.py" not in text
    assert "cat part2.py" in text  # the latest observation stays whole
    fake.enqueue(Reply(text="Below the threshold."))
    big = [{"type": "compaction", "compact_threshold": 10**6}]
    r = c.responses.create(model="m-1", input=history(), context_management=big)  # type: ignore[arg-type]
    assert [i.type for i in r.output] == ["message"] and len(sent_turns(fake)) == 3
    assert "context_management" not in sent_turns(fake)[-1].json


def test_models_carry_the_upstreams_context_window(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """Agents set their compaction threshold from the model's window: an Anthropic
    upstream's ``max_input_tokens`` reaches an OpenAI client as ``context_window``."""
    from tests.fakeprovider import ANTHROPIC_CONTEXT_WINDOW

    p = start(fake, start_proxy, "anthropic")
    c = client(p)
    listed = c.models.list().data
    assert listed and all(
        m.model_extra["context_window"] == ANTHROPIC_CONTEXT_WINDOW for m in listed
    )
    one = c.models.retrieve(fake.models[0])
    assert (
        one.model_extra is not None
        and one.model_extra["context_window"] == ANTHROPIC_CONTEXT_WINDOW
    )


@pytest.mark.parametrize("mode", ["state", "passthrough", "window"])
def test_a_compactions_checkpoint_is_recorded_under_the_sessions_mode(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path, mode: str
) -> None:
    """The checkpoint runs as a window (or full) turn on the session's behalf; the ledger
    and the reply's ``x-skillstate-mode`` name the mode the session is in."""
    p = start(fake, start_proxy, "openai", "--mode", mode)
    c = client(p)
    fake.enqueue(Reply(text="Looking.\n" + envelope({"notes": "started"})))
    c.responses.create(model="m-1", input=history(1))
    for k in range(2):  # the second: the session has state (a window checkpoint)
        fake.enqueue(Reply(text=envelope({"notes": f"folded {k}"})))
        r = c.responses.with_raw_response.compact(model="m-1", input=history())
        assert r.headers["x-skillstate-mode"] == mode
        assert r.headers["x-skillstate-context"] in ("checkpoint", "full")
    # A passthrough turn's row is written after its reply; /cost waits for the writes.
    assert p.get("/cost", params={"session": "s1"}).status_code == 200
    db = sqlite3.connect(tmp_path / "data" / "skillstate.db")
    modes = [m for (m,) in db.execute("SELECT mode FROM ledger WHERE session = 's1' ORDER BY ts")]
    db.close()
    assert modes == [mode] * 3


@pytest.mark.parametrize("mode", ["state", "passthrough"])
def test_a_streamed_native_compact_answered_in_json_is_relayed_as_json(
    fake: FakeProvider, start_proxy: StartProxy, mode: str
) -> None:
    """``stream: true`` on ``/responses/compact`` goes to the upstream as it came; one that
    takes the field and answers 200 with JSON (the endpoint does not stream) gets its answer
    to the client as it is, JSON, and metered, not misread as an event stream."""
    fake.compact_ignores_stream = True
    p = start(fake, start_proxy, "openai-responses", "--mode", mode)
    fake.enqueue(Reply(text="the upstream's summary", usage={"prompt_tokens": 900}))
    r = httpx.post(
        p.v1 + "/responses/compact",
        json={"model": "gpt-4o", "input": history(), "stream": True},
        headers={SESSION_HEADER: "s1", "authorization": "Bearer sk-client"},
    )
    assert fake.requests[-1].json["stream"] is True  # as it came
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["object"] == "response.compaction" and body["output"][-1]["type"] == "compaction"
    assert body["usage"]["input_tokens"] == 900
    rows = p.get("/cost", params={"session": "s1"}).json()["totals"]
    assert rows["requests"] == 1 and rows["input_tokens"] == 900


def test_the_compact_endpoint_answers_the_user_messages_as_output_items(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """The answer's user messages as the API's output items (type, id, status, parts), not
    as the request's easy input messages: the SDK types them by ``type``."""
    p = start(fake, start_proxy, "openai")
    fake.enqueue(Reply(text=envelope({"notes": "n"})))
    items = [{"role": "user", "content": "hello task"}, *history(1)[1:]]
    r = client(p).responses.compact(model="m-1", input=items)  # type: ignore[arg-type]
    user, item = r.output
    assert (user.type, user.role, user.status) == ("message", "user", "completed")
    assert user.id and user.id.startswith("msg_")
    assert [(c.type, c.text) for c in user.content] == [("input_text", "hello task")]  # type: ignore[union-attr]
    assert item.type == "compaction"


@pytest.mark.parametrize("chained", [False, True])
def test_a_threshold_compacts_once_for_a_client_that_appends_its_output(
    fake: FakeProvider, start_proxy: StartProxy, chained: bool
) -> None:
    """The Agents SDK's way: the output items (the compaction item among them) appended to the
    input, or chained with ``previous_response_id``. The API reads an input from its latest
    compaction item on: the threshold is passed once, not on every turn after."""
    p = start(fake, start_proxy, "openai", "--mode", "passthrough")
    c = client(p, "agents")
    big = [{"role": "user", "content": "task " + "lorem ipsum " * 300}]
    cm = [{"type": "compaction", "compact_threshold": 500}]
    fake.enqueue(Reply(text=envelope({"notes": "task read"})), Reply(text="answer 0"))
    r = c.responses.create(model="m-1", input=big, context_management=cm, store=chained)  # type: ignore[arg-type]
    assert [o.type for o in r.output] == ["compaction", "message"]
    items: list[Any] = [*big, *(o.model_dump(exclude_none=True) for o in r.output)]
    for turn in range(1, 4):
        fake.enqueue(Reply(text=f"answer {turn}"))
        said = [{"role": "user", "content": f"step {turn}"}]
        if chained:
            r = c.responses.create(
                model="m-1",
                input=said,
                previous_response_id=r.id,
                context_management=cm,  # type: ignore[arg-type]
            )
        else:
            items += said
            r = c.responses.create(model="m-1", input=items, context_management=cm)  # type: ignore[arg-type]
            items += [o.model_dump(exclude_none=True) for o in r.output]
        assert [o.type for o in r.output] == ["message"], turn
        sent = upstream_text(sent_turns(fake)[-1])
        assert "lorem ipsum" not in sent and RESTORED_MARK in sent  # the state stands for it
    assert len(sent_turns(fake)) == 5  # one checkpoint, then one call a turn


def test_a_chain_through_a_triggered_compaction_continues(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """``previous_response_id`` naming the response to a compaction trigger: the rebuilt
    chain does not carry the trigger again (a 400 naming an item the client never sent)."""
    p = start(fake, start_proxy, "openai", "--mode", "passthrough")
    c = client(p, "chain")
    fake.enqueue(Reply(text=envelope({"notes": "folded"})), Reply(text="carrying on"))
    r = c.responses.create(model="m-1", input=[*history(), TRIGGER], store=True)  # type: ignore[arg-type]
    assert [o.type for o in r.output] == ["compaction"]
    nxt = c.responses.create(model="m-1", input="continue please", previous_response_id=r.id)
    assert nxt.output_text == "carrying on"
    assert "folded" in upstream_text(sent_turns(fake)[-1])
