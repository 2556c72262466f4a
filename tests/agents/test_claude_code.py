"""Claude Code (``claude -p``) through the proxy, in front of the fake provider speaking
Anthropic Messages: the fake model thinks (a signed thinking block and a redacted one), asks
for a ``Read`` of a file in a temp dir, then answers. One run per mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.agents.conftest import Agents, run_program
from tests.conftest import StartProxy
from tests.fakeprovider import FakeProvider, Reply, ToolCall

# What Claude Code 2.1.332 sends (pinned in conftest.NPM_PACKAGES).
BETA = (
    "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,"
    "per-turn-control-2026-07-01,mid-conversation-tool-changes-2026-07-01,"
    "thinking-token-count-2026-05-13,advanced-tool-use-2025-11-20,effort-2025-11-24"
)
# Awkward on purpose: a tab, quotes, a backslash, non-ASCII and an astral character.
THINKING = [
    {
        "type": "thinking",
        "thinking": 'I should read\tthe "notes" file \\ café 😀',
        "signature": "EqQBCkYIBxgCKkDsig+/nature==",
    },
    {"type": "redacted_thinking", "data": "RU5DUllQVEVEX1RISU5LSU5H"},
]
PROMPT = "What do the notes in notes.txt say?"
ANSWER = "The notes say the answer is 42."
ENVELOPE = '```json\n{"state_patch": {"notes": "answer 42"}, "action": "answer"}\n```'


def js_json(value: Any) -> bytes:
    """``JSON.stringify(value)``: compact, raw UTF-8, key order kept."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def claude_env(home: Path, proxy_url: str, session: str) -> dict[str, str]:
    return {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": proxy_url,
        "ANTHROPIC_API_KEY": "sk-ant-dummy",
        "ANTHROPIC_CUSTOM_HEADERS": f"x-skillstate-session: {session}",
        "CLAUDE_CODE_MAX_RETRIES": "0",
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }


def workspace(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(the working dir, Claude Code's HOME, notes.txt in the working dir holding the answer)."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    notes = work / "notes.txt"
    notes.write_text("the answer is 42\n")
    return work, home, notes


@pytest.mark.parametrize("mode", ["state", "passthrough"])
def test_claude_code_reads_a_file_and_answers(
    agents: Agents, fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path, mode: str
) -> None:
    work, home, notes = workspace(tmp_path)
    cfg = {
        "mode": mode,
        "schema": ["notes"],
        "upstreams": [
            # A configured default the client's own anthropic-version must win over.
            {"name": "up", "url": fake.url, "kind": "anthropic", "anthropic_version": "2023-01-01"}
        ],
    }
    proxy = start_proxy(None, config=cfg)
    read = ToolCall("Read", {"file_path": str(notes)}, id="toolu_01ReadNotes")
    fake.enqueue(Reply(thinking=THINKING, tool_calls=[read]), Reply(text=f"{ANSWER}\n{ENVELOPE}"))

    session = f"claude-{mode}"
    done = run_program(
        [str(agents.claude), "-p", PROMPT, "--output-format", "json", "--allowedTools", "Read"],
        env=claude_env(home, proxy.url, session),
        cwd=work,
    )

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["is_error"] is False and result["num_turns"] == 2
    # State mode strips its envelope from the reply; passthrough relays what the model said.
    assert result["result"] == ANSWER if mode == "state" else result["result"].startswith(ANSWER)
    turns = [r for r in fake.requests if r.path == "/v1/messages"]
    assert len(turns) == 2 and all(r.status == 200 for r in turns)
    for r in turns:
        assert r.headers["anthropic-beta"] == BETA
        assert r.headers["anthropic-version"] == "2023-06-01"
        assert r.json["stream"] is True
        # Fields the proxy does not model reach the upstream untouched.
        assert r.json["thinking"] == {"type": "adaptive", "display": "omitted"}
        assert r.json["context_management"] == {
            "edits": [{"type": "clear_thinking_20251015", "keep": "all"}]
        }
        assert r.json["output_config"] == {"effort": "medium"}
        assert "user_id" in r.json["metadata"]
        assert any(t.get("defer_loading") is True for t in r.json["tools"])
        # The environment system message inside `messages` is still there.
        assert [m for m in r.json["messages"] if m["role"] == "system"]

    # Turn 2: the thinking blocks exactly as Claude Code sent them back, in order, then the
    # tool_use, and the tool_result right after it.
    second = turns[1]
    want = b",".join(js_json(b) for b in THINKING) + b',{"type":"tool_use","id":"toolu_01ReadNotes"'
    assert want in second.body
    msgs = second.json["messages"]
    call = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    assert [b["type"] for b in msgs[call]["content"]] == [
        "thinking",
        "redacted_thinking",
        "tool_use",
    ]
    result_block = msgs[call + 1]["content"][0]
    assert result_block["type"] == "tool_result"
    assert result_block["tool_use_id"] == "toolu_01ReadNotes"
    assert "the answer is 42" in json.dumps(result_block["content"])
    assert "cache_control" in result_block  # the client's breakpoint is still sent

    cost = proxy.get("/cost", params={"session": session}).json()["totals"]
    assert cost["requests"] == 2, cost  # both turns metered, from their streams' usage
    assert cost["usage_unavailable_rows"] == 0 and cost["output_tokens"] > 0, cost
    if mode == "state":
        assert proxy.state(session)["state"] == {"notes": "answer 42"}
        # The prefix turn (task, contract, state), the system message, the call, the result.
        assert [m["role"] for m in msgs] == ["user", "system", "assistant", "user"]
    else:
        assert proxy.get("/state", params={"session": session}).status_code == 404
        assert second.json["messages"][0]["content"][-1]["text"].endswith("notes.txt say?")
