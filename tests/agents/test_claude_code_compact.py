"""Claude Code's own ``/compact`` through the proxy: with the pinned 2.1.332 it runs
non-interactively as ``claude -p /compact --resume <session>`` (an ordinary summarisation
request: "Respond with TEXT ONLY..."), and the next ``-p ... --resume`` run sends the summary
in place of the history. Each mode keeps working: the runs exit 0, the request after the
compaction holds the summary and the new prompt once each, and no message twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.agents.conftest import Agents, run_program
from tests.agents.test_claude_code import claude_env
from tests.conftest import StartProxy
from tests.fakeprovider import FakeProvider, RecordedRequest, Reply

SUMMARY_MARK = "This session is being continued from a previous conversation"
COMPACT_ASK = "Respond with TEXT ONLY"


def envelope(patch: dict[str, Any]) -> str:
    return f"```json\n{json.dumps({'state_patch': patch, 'action': 'answer'})}\n```"


def texts(rec: RecordedRequest) -> list[str]:
    """Every text of the request's messages (string contents and text blocks)."""
    out = []
    for m in rec.json["messages"]:
        content = m["content"]
        if isinstance(content, str):
            out.append(content)
        else:
            out += [b["text"] for b in content if b.get("type") == "text"]
    return out


@pytest.mark.parametrize("mode", ["auto", "state", "passthrough"])
def test_claude_code_compact_keeps_the_session_going(
    agents: Agents, fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path, mode: str
) -> None:
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    up = {"name": "up", "url": fake.url, "kind": "anthropic"}
    proxy = start_proxy(None, config={"mode": mode, "schema": ["said"], "upstreams": [up]})
    env = claude_env(home, proxy.url, f"claude-compact-{mode}")

    def claude(*argv: str) -> dict[str, Any]:
        done = run_program(
            [str(agents.claude), *argv, "--output-format", "json"], env=env, cwd=work
        )
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    fake.enqueue(Reply(text="Hello! " + envelope({"said": "hi"})))
    first = claude("-p", "say hi")
    sid = first["session_id"]
    fake.enqueue(Reply(text="<summary>The user said hi.</summary>\n" + envelope({"said": "hi"})))
    claude("-p", "/compact", "--resume", sid)
    fake.enqueue(Reply(text="You said hi. " + envelope({"said": "hi, then asked"})))
    third = claude("-p", "what did I say?", "--resume", sid)

    assert third["result"].startswith("You said hi.")
    sent = [r for r in fake.requests if r.path == "/v1/messages"]
    assert len(sent) == 3 and all(r.status == 200 for r in sent)
    assert any(COMPACT_ASK in t for t in texts(sent[1]))  # the summarisation request
    after = texts(sent[2])
    assert sum("what did I say?" in t for t in after) == 1  # the new prompt, once
    if mode != "state":  # (state mode sends the compact context, not the transcript)
        assert sum(SUMMARY_MARK in t for t in after) == 1
    assert len(after) == len(set(after)), "a message went upstream twice"
    if mode == "state":  # (auto stays in passthrough this short: it keeps no state yet)
        assert proxy.state(f"claude-compact-{mode}")["state"]["said"] == "hi, then asked"
