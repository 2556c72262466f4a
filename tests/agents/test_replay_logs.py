"""``skillstate replay`` on logs the pinned agents write now (fresh, not the committed
fixtures): Claude Code and Codex CLI run against the fake provider, then their logs replay
in every arm, and the passthrough arm's upstream gets the requests the agent sent."""

from __future__ import annotations

from pathlib import Path

from skillstate.bench.replay.forms import STANDIN_FILLER
from skillstate.dialects.responses.translate import input_to_messages
from tests.agents.conftest import Agents
from tests.agents.replay_logs import write_claude_code_log, write_codex_rollout
from tests.bench.test_replay import assert_every_arm_ran, load, replay_all


def test_a_fresh_claude_code_log_replays_as_sent(agents: Agents, tmp_path: Path) -> None:
    log, sent = write_claude_code_log(agents.claude, tmp_path)
    (session,) = load(log)
    assert session.notes == [] and len(session.calls) == len(sent) == 4
    run, _ = replay_all(session)
    assert_every_arm_ran(run, "anthropic")
    received = run.arms["anthropic"]["passthrough"].requests
    assert [body["messages"] for (body,) in received] == sent


def test_a_fresh_codex_rollout_replays_as_sent(agents: Agents, tmp_path: Path) -> None:
    log, sent = write_codex_rollout(agents.codex, tmp_path)
    (session,) = load(log)
    assert len(session.calls) == len(sent) == 4
    run, _ = replay_all(session)
    assert_every_arm_ran(run, "openai")
    received = run.arms["openai"]["passthrough"].requests
    for (body,), items in zip(received, sent, strict=True):
        want = input_to_messages({"input": items})
        # Codex logs no tool definitions: a stand-in of their size goes as `instructions`
        # (the proxy's leading system message), then what Codex sent.
        standin, *messages = body["messages"]
        assert STANDIN_FILLER in standin["content"]
        assert messages[1:] == want[1:]  # the first: see test_replay_sources
