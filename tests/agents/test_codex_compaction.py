"""Codex CLI's remote compaction through the proxy, to upstreams that have none: a
chat-completions one and an Anthropic one (the fake provider). Codex compacts remotely only
for a provider it takes for OpenAI (``name = "OpenAI"``); with a small
``model_auto_compact_token_limit`` a six-command task compacts at least twice. Each time
Codex sends a ``compaction_trigger`` and needs exactly one ``compaction`` item back; the
proxy runs a checkpoint (the state folds the history in) and answers with a token, which
Codex sends back on every later request and the proxy replaces with the state.

Codex 0.169.0 and 0.171.0 have only this (v2) path: ``codex features list`` shows
``remote_compaction_v2`` as ``removed`` (always on) and the binary has no
``responses/compact`` route, so the v1 endpoint is tested with the openai SDK
(tests/e2e/test_compaction.py)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from skillstate.compaction.items import CHECKPOINT_MARK, RESTORED_MARK
from tests.agents.conftest import Agents, codex_home, run_codex
from tests.conftest import StartProxy
from tests.fakeprovider import FakeProvider, RecordedRequest, Reply, ToolCall

COMMANDS = 6  # shell commands the fake model asks for before it answers
ANSWER = "All six parts are printed."
LIMIT = 9000  # model_auto_compact_token_limit: about two commands above Codex's own prompt
UPSTREAM = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}


# Remote compaction every two commands or so, and nothing but the shell tool.
SETTINGS = f"""web_search = "disabled"
model_auto_compact_token_limit = {LIMIT}
model_context_window = 200000

[features]
multi_agent = false
"""


class Model:
    """The fake model: a checkpoint request gets an envelope that records what was done;
    any other request gets the next shell command, then the answer."""

    def __init__(self) -> None:
        self.commands = 0
        self.checkpoints = 0
        self.lock = threading.Lock()

    def __call__(self, rec: RecordedRequest) -> Reply:
        text = json.dumps(rec.json)
        with self.lock:
            if CHECKPOINT_MARK in text:
                self.checkpoints += 1
                patch = {
                    "notes": f"printed parts 1..{self.commands}",
                    "checkpoints": self.checkpoints,
                }
                env = json.dumps({"state_patch": patch, "action": "continue"})
                return Reply(text=f"```json\n{env}\n```")
            if self.commands < COMMANDS:
                self.commands += 1
                cmd = f"echo part{self.commands} " + "x" * 3000
                return Reply(tool_calls=[ToolCall("exec_command", {"cmd": cmd})])
            return Reply(text=ANSWER)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_codex_compacts_twice_through_the_proxy(
    agents: Agents, fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path, kind: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    url = fake.url if kind == "anthropic" else fake.url + "/v1"
    up = {"name": "up", "url": url, "kind": kind}
    proxy = start_proxy(
        None, config={"mode": "passthrough", "schema": ["notes", "checkpoints"], "upstreams": [up]}
    )
    model = Model()
    fake.responder = model
    session = f"codex-compact-{kind}"
    home = codex_home(tmp_path, proxy.v1, session, provider_name="OpenAI", settings=SETTINGS)
    run = run_codex(agents, tmp_path, home, "Print the six parts.", timeout=300)

    assert run.done.returncode == 0, run.done.stderr
    assert run.last_message.strip() == ANSWER
    assert model.commands == COMMANDS and model.checkpoints >= 2
    sent = [r for r in fake.requests if r.path == UPSTREAM[kind]]
    assert all(r.status == 200 for r in sent)
    checkpoints = [r for r in sent if CHECKPOINT_MARK in json.dumps(r.json)]
    assert len(checkpoints) == model.checkpoints
    assert not any("compaction_trigger" in json.dumps(r.json) for r in sent)
    # After the first compaction, every request carries the state in the item's place.
    after = sent[sent.index(checkpoints[0]) + 1 :]
    assert after and all(RESTORED_MARK in json.dumps(r.json) for r in after)
    assert not any("ssc1_" in json.dumps(r.json) for r in sent)  # the token never goes upstream
    state = proxy.state(session)
    assert state["state"]["checkpoints"] == model.checkpoints
    history = proxy.get("/state", params={"session": session, "history": "1"}).json()
    cost = proxy.get("/cost", params={"session": session}).json()["totals"]
    assert cost["requests"] == len(sent), (cost, history)
