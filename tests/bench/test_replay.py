"""``skillstate replay``: real logs (Claude Code and Codex, written by the pinned agents;
the shared SWE-bench traces) through a real in-process proxy per arm, against the replay
upstream. Checks what the upstream received, the bills, reach and the truth check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from skillstate.bench.replay.cli import shared_traces
from skillstate.bench.replay.run import Replayer, ReplayOptions, SessionRun, available_arms
from skillstate.bench.replay.session import Session
from skillstate.bench.replay.sources import iter_sessions
from skillstate.dialects.responses.translate import input_to_messages

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "replay"
PRICE = "claude-sonnet-4-5"


def load(path: Path) -> list[Session]:
    return [s for _, s in iter_sessions([path]) if isinstance(s, Session)]


def replay_all(session: Session, **options: Any) -> tuple[SessionRun, Replayer]:
    replayer = Replayer(ReplayOptions(price_as=PRICE, **options), keep_requests=True)
    with replayer:
        run = replayer.replay_session("test", session, lambda n: None)
    return run, replayer


def _unmarked(value: Any) -> Any:
    """``value`` without breakpoints (a marked string content became its one text block)."""
    if isinstance(value, dict):
        out = {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
        if isinstance(out.get("content"), str):
            out["content"] = [{"type": "text", "text": out["content"]}]
        return out
    if isinstance(value, list):
        return [_unmarked(v) for v in value]
    return value


def assert_every_arm_ran(run: SessionRun, regime: str) -> None:
    arms = run.arms[regime]
    assert list(arms) == list(available_arms())
    for name, arm in arms.items():
        assert arm.calls == run.calls, name
        assert arm.errors == 0, (name, arm.first_error)
        assert arm.total_usd > 0, name
    assert arms["passthrough"].tokens["envelope"] == 0
    assert arms["state"].tokens["envelope"] > 0  # state turns ask for the envelope


def test_a_claude_code_log_replays_in_every_arm_as_sent() -> None:
    (session,) = load(FIXTURES / "claude-code.jsonl")
    run, _ = replay_all(session)
    assert_every_arm_ran(run, "anthropic")  # the log's own provider's regime by default
    sent = json.loads((FIXTURES / "claude-code.requests.json").read_text())
    received = run.arms["anthropic"]["passthrough"].requests
    assert [len(r) for r in received] == [1] * len(sent)
    for (body,), messages in zip(received, sent, strict=True):
        assert body["messages"] == messages  # breakpoints included, as Claude Code sent them


def test_a_codex_rollout_replays_in_every_arm_as_sent() -> None:
    (session,) = load(FIXTURES / "codex.jsonl")
    run, _ = replay_all(session)
    assert_every_arm_ran(run, "openai")
    sent = json.loads((FIXTURES / "codex.requests.json").read_text())
    received = run.arms["openai"]["passthrough"].requests
    for (body,), items in zip(received, sent, strict=True):
        # The proxy translates the Responses request for a chat-completions upstream.
        want = input_to_messages({"input": items})
        assert body["messages"][1:] == want[1:]
        assert body["messages"][0]["role"] == want[0]["role"]  # see test_replay_sources
    # The second and third reads name files the first one's output listed; the third
    # reaches back two exchanges: passthrough shows it verbatim, state mode does not.
    full, compact = (run.arms["openai"][arm].reach for arm in ("passthrough", "state"))
    assert [r.reachable > 0 for r in full] == [False, True, True, False]
    assert [r.verbatim_share for r in full if r.reachable] == [1.0, 1.0]
    assert compact[2].verbatim_share == 0.0


@pytest.fixture(scope="module")
def swe_sessions() -> list[Session]:
    path = shared_traces()
    if not path.exists():
        pytest.fail(f"{path} is missing: the shared data lives beside the repo")
    sessions = []
    for _, s in iter_sessions([path]):
        assert isinstance(s, Session)
        sessions.append(s)
        if len(sessions) == 2:
            break
    return sessions


@pytest.mark.parametrize("regime", ["openai", "anthropic"])
def test_the_shared_traces_replay_in_every_arm(swe_sessions: list[Session], regime: str) -> None:
    from skillstate.bench.replay.forms import as_anthropic

    session = swe_sessions[0]
    run, _ = replay_all(session, regimes=(regime,))
    assert_every_arm_ran(run, regime)
    arms = run.arms[regime]
    form = as_anthropic(session) if regime == "anthropic" else session
    for call, (body,) in zip(form.calls, arms["passthrough"].requests, strict=True):
        assert _unmarked(body["messages"]) == _unmarked([form.pool[i] for i in call.messages])
    # Reach: passthrough sees every message verbatim; state about its latest exchange.
    full = [r.verbatim_share for r in arms["passthrough"].reach if r.reachable]
    compact = [r.verbatim_share for r in arms["state"].reach if r.reachable]
    assert full and all(share == 1.0 for share in full)
    assert sum(compact) / len(compact) < 0.9
    assert arms["state"].invalid == 0


def test_the_truth_check_compares_the_recorded_bill(tmp_path: Path) -> None:
    from skillstate.bench.arm import regime_prices
    from skillstate.bench.replay.report import truth
    from skillstate.cost.tokens import estimate_tokens

    (session,) = load(FIXTURES / "claude-code.jsonl")
    # The recorded bill is the log's own usage at the model's prices (hand-summed here).
    prices = regime_prices(PRICE, "anthropic")
    assert prices is not None
    lines = [json.loads(line) for line in (FIXTURES / "claude-code.jsonl").open()]
    usage = {d["message"]["id"]: d["message"]["usage"] for d in lines if d["type"] == "assistant"}
    want = (
        sum(
            u["input_tokens"] * prices.input_per_mtok
            + u["cache_read_input_tokens"] * prices.cache_read_per_mtok
            + u["cache_creation_input_tokens"] * prices.cache_write_per_mtok
            + u["output_tokens"] * prices.output_per_mtok
            for u in usage.values()
        )
        / 1e6
    )
    run, _ = replay_all(session, arms=("passthrough",))
    check = truth(run)
    assert check is not None and check["recorded_usd"] == pytest.approx(want, rel=1e-9)
    # The fake provider that served Claude Code bills no tool definitions; the simulation
    # does. That is the whole first-call difference, and the check flags it.
    gap = check["first_call_prompt_tokens"]["simulated_minus_recorded"]
    assert gap == pytest.approx(estimate_tokens(session.tools), rel=0.05)
    assert check["off"] is True and check["difference"] > 0.05
    # Without the tool definitions the simulated passthrough bill is within 5% of the record.
    session.tools = None
    run, _ = replay_all(session, arms=("passthrough",))
    check = truth(run)
    assert check is not None and check["off"] is False, check
    assert abs(check["difference"]) <= 0.05


def test_the_replay_upstream_writes_an_envelope_only_when_asked() -> None:
    from skillstate.bench.simmodel import asks_for_envelope
    from skillstate.engine.context import CONTRACT_MARK, CORRECTION_MARK
    from skillstate.engine.window import CHECKPOINT_MARK

    state_contract = {"role": "system", "content": f"{CONTRACT_MARK}\nEnd every reply with..."}
    window_contract = {
        "role": "system",
        "content": f"{CONTRACT_MARK}\nEnd your reply with the envelope only when the last "
        "message asks for a checkpoint",
    }
    user = {"role": "user", "content": "ls"}
    checkpoint = {"role": "user", "content": f"{CHECKPOINT_MARK}: the older messages leave"}
    assert not asks_for_envelope([user])
    assert asks_for_envelope([state_contract, user])
    assert not asks_for_envelope([window_contract, user])
    assert asks_for_envelope([window_contract, user, checkpoint])
    # a re-ask: the reply and the proxy's correction after the request it repeats
    reply = {"role": "assistant", "content": "done"}
    correction = {"role": "user", "content": f"{CORRECTION_MARK}: your last reply had no..."}
    reasked = [window_contract, user, checkpoint, reply, correction]
    assert asks_for_envelope(reasked)
    assert asks_for_envelope([*reasked, reply, correction])  # the second re-ask
    assert asks_for_envelope([state_contract, user, reply, correction])
    assert not asks_for_envelope([window_contract, user, reply, correction])


def test_a_re_asked_checkpoint_is_answered_with_its_envelope_and_committed_valid(
    swe_sessions: list[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model that forgets the envelope (and its tool call) on its first checkpoint: the
    proxy re-asks, the replay upstream answers the re-ask as the checkpoint it repeats, and
    the turn commits valid (the re-ask's last message is the correction, not the checkpoint
    instruction)."""
    from skillstate.bench.replay import run as run_module
    from skillstate.bench.replay.upstream import ReplayUpstream
    from skillstate.bench.simmodel import SimReply, read_state

    forgot: list[int] = []

    class ForgetsOnce(ReplayUpstream):
        def reply(self, body: dict[str, Any]) -> SimReply:
            answer = super().reply(body)
            if self._cur.envelope and not forgot:
                assert self._cur.script is not None
                forgot.append(self._cur.script.step)
                self._cur.envelope = 0
                # no envelope and no tool call: invalid, so the proxy re-asks (with a tool
                # call the reply would stand as a tool-noop)
                return SimReply(self._cur.script.reply.text or "done")
            return answer

    monkeypatch.setattr(run_module, "ReplayUpstream", ForgetsOnce)
    run, _ = replay_all(swe_sessions[0], regimes=("openai",), arms=("window",))
    arm = run.arms["openai"]["window"]
    assert forgot, "no checkpoint was asked"
    assert arm.upstream_requests == arm.calls + 1  # the one re-ask
    assert arm.errors == 0 and arm.invalid == 0
    # the re-ask's envelope was committed: the next call's state is the checkpoint's patch
    (at,) = [k for k, sent in enumerate(arm.requests) if len(sent) == 2]
    assert at + 1 == forgot[0]  # scripts count calls from 1
    (after,) = arm.requests[at + 1]
    state = read_state(after["messages"])
    assert state is not None and state.get("step") == forgot[0]
