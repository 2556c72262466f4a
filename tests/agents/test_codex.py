"""Codex CLI (``codex exec``) through the proxy's ``/v1/responses``, in front of the fake
provider speaking the Responses API: the fake model asks for one shell command
(``exec_command``), Codex runs it and sends the output back, the model answers. One run per
mode, with Codex's default tools (it sends ``web_search`` and a ``namespace`` tool too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.agents.conftest import Agents, codex_home, run_codex
from tests.conftest import StartProxy
from tests.fakeprovider import FakeProvider, Reply, ToolCall

PROMPT = "What do the notes in notes.txt say?"
ANSWER = "The notes say the answer is 42."
ENVELOPE = '```json\n{"state_patch": {"notes": "answer 42"}, "action": "answer"}\n```'


def items(body: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [i for i in body["input"] if isinstance(i, dict) and i.get("type") == kind]


@pytest.mark.parametrize("mode", ["state", "passthrough"])
def test_codex_runs_a_command_and_answers(
    agents: Agents, fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path, mode: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("the answer is 42\n")
    up = {"name": "up", "url": fake.url + "/v1", "kind": "openai-responses"}
    proxy = start_proxy(None, config={"mode": mode, "schema": ["notes"], "upstreams": [up]})
    shell = ToolCall("exec_command", {"cmd": "cat notes.txt"}, id="call_cat_notes")
    fake.enqueue(Reply(tool_calls=[shell]), Reply(text=f"{ANSWER}\n{ENVELOPE}"))

    session = f"codex-{mode}"
    run = run_codex(agents, tmp_path, codex_home(tmp_path, proxy.v1, session), PROMPT)

    assert run.done.returncode == 0, run.done.stderr
    # State mode strips its envelope from the streamed reply; passthrough relays it as said.
    assert run.last_message.strip() == (ANSWER if mode == "state" else f"{ANSWER}\n{ENVELOPE}")
    turns = [r for r in fake.requests if r.path == "/v1/responses"]
    assert len(turns) == 2 and all(r.status == 200 for r in turns)
    for r in turns:
        assert r.json["stream"] is True
        assert r.headers["originator"] == "codex_exec"
        # Codex's default hosted tools reach a Responses-kind upstream too.
        assert {t["type"] for t in r.json["tools"]} >= {"function", "web_search", "namespace"}
    second = turns[1].json
    (call,) = items(second, "function_call")
    (output,) = items(second, "function_call_output")
    assert call["call_id"] == output["call_id"] == "call_cat_notes"
    assert json.loads(call["arguments"]) == {"cmd": "cat notes.txt"}
    assert "the answer is 42" in output["output"]  # the command really ran

    cost = proxy.get("/cost", params={"session": session}).json()["totals"]
    assert cost["requests"] == 2 and cost["usage_unavailable_rows"] == 0, cost
    if mode == "state":
        assert proxy.state(session)["state"] == {"notes": "answer 42"}
    else:
        assert proxy.get("/state", params={"session": session}).status_code == 404
