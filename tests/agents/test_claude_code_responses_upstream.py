"""Claude Code (``claude -p``) through the proxy in front of an upstream of kind
``openai-responses`` (a Responses-only model): its Messages requests are translated to the
Responses API and the Responses stream back into Messages events (8cd25ac). The fake model
asks for a ``Read`` of a file in a temp dir, then answers from the tool's output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.agents.conftest import Agents, run_program
from tests.agents.test_claude_code import ANSWER, ENVELOPE, PROMPT, claude_env, workspace
from tests.conftest import StartProxy
from tests.fakeprovider import FakeProvider, Reply, ToolCall


@pytest.mark.parametrize("mode", ["passthrough", "state"])
def test_claude_code_reads_a_file_through_a_responses_only_upstream(
    agents: Agents, fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path, mode: str
) -> None:
    work, home, notes = workspace(tmp_path)
    cfg = {
        "mode": mode,
        "schema": ["notes"],
        "upstreams": [{"name": "up", "url": fake.url + "/v1", "kind": "openai-responses"}],
    }
    proxy = start_proxy(None, config=cfg)
    read = ToolCall("Read", {"file_path": str(notes)}, id="call_ReadNotes")
    fake.enqueue(Reply(tool_calls=[read]), Reply(text=f"{ANSWER}\n{ENVELOPE}"))

    session = f"claude-responses-{mode}"
    done = run_program(
        [str(agents.claude), "-p", PROMPT, "--output-format", "json", "--allowedTools", "Read"],
        env=claude_env(home, proxy.url, session),
        cwd=work,
    )

    assert done.returncode == 0, done.stderr + done.stdout
    result = json.loads(done.stdout)
    assert result["is_error"] is False and result["num_turns"] == 2, result
    assert result["result"].startswith(ANSWER), result["result"]
    turns = [r for r in fake.requests if r.path == "/v1/responses"]
    assert len(turns) == 2 and all(r.status == 200 for r in turns), [r.status for r in turns]
    assert not [r for r in fake.requests if r.path == "/v1/messages"]
    for r in turns:
        sent = r.json
        assert sent["stream"] is True and sent["store"] is False
        # Anthropic's own members never reach the Responses API.
        assert not {"thinking", "metadata", "context_management", "system"} & set(sent)
        assert "cache_control" not in r.body.decode()
        assert "anthropic-beta" not in r.headers
    # Turn 2: Claude Code's tool_use and tool_result, as a function call and its output.
    items = turns[1].json["input"]
    call = next(i for i in items if i.get("type") == "function_call")
    assert call["name"] == "Read" and json.loads(call["arguments"]) == {"file_path": str(notes)}
    output = next(i for i in items if i.get("type") == "function_call_output")
    assert output["call_id"] == call["call_id"]
    assert "the answer is 42" in json.dumps(output["output"])

    cost = proxy.get("/cost", params={"session": session}).json()["totals"]
    assert cost["requests"] == 2 and cost["output_tokens"] > 0, cost
    if mode == "state":
        assert proxy.state(session)["state"] == {"notes": "answer 42"}
