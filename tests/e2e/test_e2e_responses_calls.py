"""The Responses API's other call items end to end: Codex's ``apply_patch`` freeform tool
(``custom_tool_call`` / ``custom_tool_call_output``), the native ``shell_call`` and
``apply_patch_call``, ``local_shell_call``, ``computer_call``, an MCP approval request, and
hosted calls (``web_search_call``). The real proxy (in-process), the real openai SDK, the fake
provider as a Responses upstream, JSON and streams. A call the client runs is a tool call
everywhere the proxy asks: its reply is no re-ask, its message item left empty by the
envelope goes, state mode keeps it paired with its output, the window counts its exchanges;
the item reaches the client as the model sent it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response

from skillstate.engine.context import CORRECTION_MARK, STATE_MARK
from skillstate.engine.window import CHECKPOINT_MARK
from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, RecordedRequest, Reply
from tests.helpers import oai

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
    {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch."},
]
PATCH = "*** Begin Patch\n*** Update File: calc.py\n@@\n-return a\n+return a * b\n*** End Patch\n"
RESULT = "Success. Updated the following files:\nM calc.py\n" + "ok\n" * 40

# One call item of each kind the client runs, as the API sends it (the openai SDK's types),
# and the output item the client answers it with.
CLIENT_CALLS: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {
    "custom_tool_call": (
        {"type": "custom_tool_call", "call_id": "call_p1", "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "call_p1", "output": RESULT},
    ),
    "shell_call": (
        {"type": "shell_call", "call_id": "call_s1", "action": {"commands": ["ls -la", "pwd"]}},
        {
            "type": "shell_call_output",
            "call_id": "call_s1",
            "output": [
                {"stdout": "a.py\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}
            ],
        },
    ),
    "apply_patch_call": (
        {
            "type": "apply_patch_call",
            "call_id": "call_a1",
            "operation": {"type": "update_file", "path": "calc.py", "diff": "@@\n-a\n+b\n"},
        },
        {"type": "apply_patch_call_output", "call_id": "call_a1", "status": "completed"},
    ),
    "local_shell_call": (
        {
            "type": "local_shell_call",
            "call_id": "call_l1",
            "action": {"type": "exec", "command": ["ls"], "env": {}},
        },
        None,
    ),
    "computer_call": (
        {
            "type": "computer_call",
            "call_id": "call_c1",
            "action": {"type": "click", "button": "left", "x": 10, "y": 20},
            "pending_safety_checks": [],
        },
        None,
    ),
    "mcp_approval_request": (
        {
            "type": "mcp_approval_request",
            "server_label": "deepwiki",
            "name": "ask_question",
            "arguments": '{"question": "what is it?"}',
        },
        None,
    ),
}
WEB_SEARCH = {"type": "web_search_call", "action": {"type": "search", "query": "weather oslo"}}


def envelope(patch: dict[str, Any], action: str = "continue") -> str:
    return "```json\n" + json.dumps({"state_patch": patch, "action": action}) + "\n```"


def start(start_proxy: StartProxy, fake: FakeProvider, mode: str, **config: Any) -> Proxy:
    up = {"name": "up", "url": fake.url + "/v1", "kind": "openai-responses", "api_key": "k"}
    cfg = {"upstreams": [up], "mode": mode, "schema": ["notes", "step"], **config}
    return start_proxy(config=cfg)


def respond(p: Proxy, session: str, items: list[Any], stream: bool) -> tuple[Any, bytes, dict]:
    """One turn through the openai SDK: (the parsed response, its raw body or the stream's
    bytes, the reply's headers)."""
    c = oai(p, "k")
    kw: dict[str, Any] = {
        "model": "gpt-test",
        "input": items,
        "tools": TOOLS,
        "extra_headers": {"x-skillstate-session": session},
    }
    if stream:
        with c.responses.with_streaming_response.create(**kw, stream=True) as raw:
            body = raw.read()
            headers = dict(raw.headers)
        final = [
            json.loads(line[6:])
            for line in body.decode().splitlines()
            if line.startswith("data: ") and '"response.completed"' in line
        ]
        return Response.model_validate(final[-1]["response"]), body, headers
    raw = c.responses.with_raw_response.create(**kw)
    return raw.parse(), raw.http_response.content, dict(raw.headers)


def history(p: Proxy, session: str) -> list[dict[str, Any]]:
    r = p.get("/state", params={"session": session, "history": "1"})
    return [] if r.status_code == 404 else list(r.json()["history"])


def sent_items(req: RecordedRequest) -> list[dict[str, Any]]:
    return list(req.json["input"])


def upstream_item(req: RecordedRequest, kind: str) -> dict[str, Any]:
    """The item of ``kind`` in the fake provider's reply to ``req``."""
    body = req.response_body.decode()
    if req.stream:
        done = [
            json.loads(line[6:])
            for line in body.splitlines()
            if line.startswith("data: ") and '"response.output_item.done"' in line
        ]
        return next(e["item"] for e in done if e["item"]["type"] == kind)
    return next(i for i in json.loads(body)["output"] if i["type"] == kind)


# -- a reply that calls a client tool is a tool call ----------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("kind", sorted(CLIENT_CALLS))
def test_a_client_call_without_an_envelope_is_a_tool_turn_not_a_reask(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, stream: bool
) -> None:
    """State mode: the model answers with only a call the client runs (no envelope, as a
    function call may): one upstream call, the item untouched, the turn ``tool-noop``."""
    p = start(start_proxy, fake, "state")
    call, _ = CLIENT_CALLS[kind]
    fake.enqueue(Reply(items=[call]), Reply(text=envelope({"step": 1})))
    session = f"noop-{kind}-{stream}"
    task = [{"role": "user", "content": "TASK: fix calc.py"}]
    resp, _, headers = respond(p, session, task, stream)
    assert len(fake.requests) == 1  # no re-ask
    assert stream or headers["x-skillstate-transition"] == "tool-noop"
    (item,) = [i.model_dump(exclude_unset=True) for i in resp.output]
    assert item == upstream_item(fake.requests[0], kind)  # as the model sent it
    assert [h["status"] for h in history(p, session)] == ["tool-noop"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("kind", sorted(CLIENT_CALLS))
def test_an_envelope_beside_a_client_call_leaves_no_message_item(
    fake: FakeProvider, start_proxy: StartProxy, kind: str, stream: bool
) -> None:
    """The model's text was only the envelope and it called a client tool: the client gets
    the call alone (no message item saying the action), the state is committed."""
    p = start(start_proxy, fake, "state")
    call, _ = CLIENT_CALLS[kind]
    fake.enqueue(Reply(text=envelope({"step": 7}, "patch the file"), items=[call]))
    session = f"env-{kind}-{stream}"
    resp, body, _ = respond(p, session, [{"role": "user", "content": "TASK"}], stream)
    assert [h["status"] for h in history(p, session)] == ["valid"]
    assert [i.type for i in resp.output] == [kind]
    assert resp.output[0].model_dump(exclude_unset=True) == upstream_item(fake.last, kind)
    assert "patch the file" not in body.decode() and "state_patch" not in body.decode()
    assert p.state(session)["state"]["step"] == 7


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_hosted_call_is_the_models_own_turn_its_envelope_only_text_shows_the_action(
    fake: FakeProvider, start_proxy: StartProxy, stream: bool
) -> None:
    """A web search the API ran within the response is no call the client answers: the reply
    is final, so a text that was only the envelope shows its action (as a reply without
    calls does), and a reply with no envelope is re-asked like a text reply."""
    p = start(start_proxy, fake, "state")
    fake.enqueue(Reply(text=envelope({"step": 2}, "It is sunny."), items=[WEB_SEARCH]))
    resp, _, _ = respond(p, f"ws-{stream}", [{"role": "user", "content": "Weather?"}], stream)
    assert [h["status"] for h in history(p, f"ws-{stream}")] == ["valid"]
    assert [i.type for i in resp.output] == ["web_search_call", "message"]
    assert resp.output_text == "It is sunny."
    if stream:
        return  # a stream is not re-asked: what went out is the reply
    fake.enqueue(Reply(text="It is sunny.", items=[WEB_SEARCH]), Reply(text=envelope({})))
    respond(p, "ws-reask", [{"role": "user", "content": "Weather?"}], False)
    assert len(fake.requests) == 3 and CORRECTION_MARK in json.dumps(fake.last.json["input"])


# -- state mode keeps a client call paired with its output, and only the last round ----------


def codex_loop(
    p: Proxy, fake: FakeProvider, session: str, kinds: list[str], model: Any
) -> list[dict[str, Any]]:
    """A Codex-like agent: each turn sends its whole transcript, appends the reply's items
    (as the SDK dumps them) and an output for each call it ran."""
    fake.responder = model
    transcript: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": "You are Codex."},
        {"type": "message", "role": "user", "content": "TASK: fix calc.py"},
    ]
    for t, _ in enumerate(kinds):
        resp, _, _ = respond(p, session, transcript, stream=t % 2 == 1)
        for item in resp.output:
            transcript.append(item.model_dump(exclude_none=True))
            out = _output_for(item.model_dump(exclude_none=True))
            if out is not None:
                transcript.append(out)
    return transcript


def _output_for(item: dict[str, Any]) -> dict[str, Any] | None:
    if item["type"] == "function_call":
        return {"type": "function_call_output", "call_id": item["call_id"], "output": RESULT}
    for call, output in CLIENT_CALLS.values():
        if output is not None and call["type"] == item["type"]:
            return {**output, "call_id": item["call_id"]}
    return None


class Agent:
    """A fake model: each turn one call of the scripted kind, ``text`` beside it (the envelope
    when the request asks for one: state mode always, the window at checkpoints)."""

    def __init__(self, kinds: list[str], always_envelope: bool) -> None:
        self.kinds = kinds
        self.always = always_envelope
        self.turn = 0

    def __call__(self, req: RecordedRequest) -> Reply:
        kind = self.kinds[self.turn % len(self.kinds)]
        self.turn += 1
        last = json.dumps(req.json["input"][-1])
        asked = self.always or CHECKPOINT_MARK in last or CORRECTION_MARK in last
        text = envelope({"step": self.turn}) if asked else f"Step {self.turn}."
        if kind == "function_call":
            return Reply(text=text, tool_calls=[("exec_command", {"cmd": f"ls {self.turn}"})])
        call, _ = CLIENT_CALLS[kind]
        return Reply(text=text, items=[{**call, "call_id": f"call_{kind}_{self.turn}"}])


ROUND_KINDS = ["custom_tool_call", "shell_call", "apply_patch_call", "function_call"]


def test_state_mode_sends_the_last_round_of_any_client_call_paired_with_its_output(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """The latest observation of a transcript whose last round was a custom tool call (or a
    shell or apply_patch call) is that call and its output: not the whole transcript since
    the task, and never an output without its call (the API's 400)."""
    p = start(start_proxy, fake, "state")
    kinds = ROUND_KINDS * 2
    codex_loop(p, fake, "rounds", kinds, Agent(kinds, always_envelope=True))
    assert [r.status for r in fake.requests] == [200] * len(kinds)  # every pair intact
    for t, req in enumerate(fake.requests[1:], 1):
        items = sent_items(req)
        at = next(k for k, i in enumerate(items) if STATE_MARK in json.dumps(i))
        after = [i["type"] for i in items[at + 1 :]]
        previous = kinds[t - 1]
        assert after == [previous, previous.replace("_call", "_call_output")] or after == [
            "message",
            previous,
            previous.replace("_call", "_call_output"),
        ], (t, after)
    assert [h["status"] for h in history(p, "rounds")] == ["valid"] * len(kinds)


# -- the window counts a client call's exchange ------------------------------------------------


@pytest.mark.parametrize("kinds", [["custom_tool_call"], ROUND_KINDS], ids=["patch", "mixed"])
def test_the_window_restarts_at_the_kept_exchanges_of_client_calls(
    fake: FakeProvider, start_proxy: StartProxy, kinds: list[str]
) -> None:
    """A window of custom tool calls (Codex's apply_patch) and other client calls: each call
    with its output is an exchange, so a checkpoint restarts the window at the last
    ``window_keep`` of them, and between checkpoints each request extends the previous one."""
    p = start(start_proxy, fake, "window", window_keep=2, window_max_tokens=1200)
    turns = 20
    codex_loop(p, fake, "win", [kinds[0]] * turns, Agent(kinds, always_envelope=False))
    reqs = fake.requests
    assert [r.status for r in reqs] == [200] * turns
    asked = [CHECKPOINT_MARK in json.dumps(r.json["input"][-1]) for r in reqs]
    steps = history(p, "win")
    assert 2 <= sum(asked) <= turns // 3, asked  # checkpoints, not one on every turn
    assert max(h["estimate"]["window"]["start"] for h in steps) > 10  # the window moved on
    assert max(h["estimate"]["exchanges"] for h in steps) >= 3
    for k in range(turns - 1):
        if asked[k]:
            # after a checkpoint: the state, then the kept exchanges (2 calls and their
            # outputs, with the message beside each call) and the new round
            items = sent_items(reqs[k + 1])
            at = next(j for j, i in enumerate(items) if STATE_MARK in json.dumps(i))
            calls = [i for i in items[at + 1 :] if i["type"].endswith("_call")]
            assert len(calls) == 3, [i["type"] for i in items[at + 1 :]]
            continue
        a = json.dumps(reqs[k].json["input"])[:-1]
        assert json.dumps(reqs[k + 1].json["input"]).startswith(a), k
