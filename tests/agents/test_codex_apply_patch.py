"""Codex CLI (``codex exec``) editing a file through the proxy's ``/v1/responses`` in front of
a chat-completions upstream (``kind: openai``): for gpt-5.5 (a model its bundled metadata
gives the freeform apply_patch) Codex offers ``apply_patch`` as a custom tool under a Lark
grammar; the fake model calls it with a patch, streamed as chat completions streams a custom
call; Codex applies the patch and sends the custom tool call's output back, and the upstream
gets the pair as an assistant custom tool call and the tool message answering it. Before
custom tools were translated, Codex got a function_call without a name ("unsupported call")
and its next request was a 400."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agents.conftest import Agents, codex_home, run_codex
from tests.conftest import StartProxy
from tests.fakeprovider import FakeProvider, Reply, ToolCall

PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hello from the patch\n*** End Patch\n"
ANSWER = "Created hello.txt."
ENVELOPE = '```json\n{"state_patch": {"notes": "hello.txt created"}, "action": "answer"}\n```'


@pytest.mark.parametrize("mode", ["state", "passthrough"])
def test_codex_applies_a_freeform_patch_through_a_chat_upstream(
    agents: Agents, fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path, mode: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    up = {"name": "up", "url": fake.url + "/v1", "kind": "openai"}
    proxy = start_proxy(None, config={"mode": mode, "schema": ["notes"], "upstreams": [up]})
    patch = ToolCall("apply_patch", PATCH, id="call_patch_1", custom=True)
    fake.enqueue(Reply(tool_calls=[patch]), Reply(text=f"{ANSWER}\n{ENVELOPE}"))
    home = codex_home(tmp_path, proxy.v1, f"patch-{mode}", model="gpt-5.5")
    run = run_codex(agents, tmp_path, home, "Create hello.txt")

    assert run.done.returncode == 0, run.done.stderr
    assert (work / "hello.txt").read_text() == "hello from the patch\n"  # the patch applied
    turns = [r for r in fake.requests if r.path == "/v1/chat/completions"]
    assert len(turns) == 2 and all(r.status == 200 for r in turns)
    offered = [t for t in turns[0].json["tools"] if t["type"] == "custom"]
    assert [t["custom"]["name"] for t in offered] == ["apply_patch"]
    assert offered[0]["custom"]["format"]["grammar"]["syntax"] == "lark"
    msgs = turns[1].json["messages"]
    asked = next(m for m in msgs if m.get("tool_calls"))
    assert asked["tool_calls"] == [
        {"id": "call_patch_1", "type": "custom", "custom": {"name": "apply_patch", "input": PATCH}}
    ]
    answer = msgs[msgs.index(asked) + 1]
    assert answer["role"] == "tool" and answer["tool_call_id"] == "call_patch_1"
    assert "hello.txt" in answer["content"]
