"""``skillstate replay``'s truth check on logs that lack their stable prefix (a Claude Code
log without ``api-request`` lines, a Codex rollout): a stand-in of the recorded size is sent
where the prefix sits; and the log's own bill at the model's own cache prices."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from skillstate.bench.replay.report import truth
from skillstate.bench.replay.run import Replayer, ReplayOptions, SessionRun
from skillstate.bench.replay.session import Call, Reply, Session
from skillstate.bench.replay.sources import iter_sessions
from skillstate.cli.main import main
from skillstate.cost.usage import Usage


def jsonl(path: Path, *records: Any) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def claude_log(path: Path, usage: dict[str, Any]) -> Path:
    """One Claude Code call, no api-request lines: its system prompt and tools not logged."""
    user = {
        "type": "user",
        "sessionId": "cc1",
        "uuid": "u1",
        "parentUuid": None,
        "timestamp": "2025-10-20T10:00:00.000Z",
        "message": {"role": "user", "content": "fix the failing test in parser.py please"},
    }
    reply = {
        "type": "assistant",
        "sessionId": "cc1",
        "uuid": "a1",
        "parentUuid": "u1",
        "timestamp": "2025-10-20T10:00:02.000Z",
        "requestId": "req1",
        "message": {
            "id": "msg1",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [{"type": "text", "text": "Done: the parser handles empty input now."}],
            "usage": usage,
        },
    }
    return jsonl(path, user, reply)


def codex_log(path: Path, usages: list[dict[str, int]]) -> Path:
    """A Codex rollout (gpt-5-codex) of ``len(usages)`` calls: tool definitions never logged."""
    at = "2025-10-20T11:00:0{}.000Z"
    lines: list[dict[str, Any]] = [
        {"timestamp": at.format(0), "type": "session_meta", "payload": {"id": "cx1"}},
        {"timestamp": at.format(0), "type": "turn_context", "payload": {"model": "gpt-5-codex"}},
    ]
    for k, usage in enumerate(usages, 1):
        said = f"step {k}: listing the files of the repository"
        lines += [
            {
                "timestamp": at.format(k),
                "type": "response_item",
                "payload": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": f"please go on with part {k}"}],
                },
            },
            {
                "timestamp": at.format(k),
                "type": "response_item",
                "payload": {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": said}],
                },
            },
            {
                "timestamp": at.format(k),
                "type": "event_msg",
                "payload": {"type": "token_count", "info": {"last_token_usage": usage}},
            },
        ]
    return jsonl(path, *lines)


def replayed(path: Path, **options: Any) -> tuple[SessionRun, Replayer]:
    (session,) = [s for _, s in iter_sessions([str(path)]) if isinstance(s, Session)]
    replayer = Replayer(ReplayOptions(arms=("passthrough",), **options), keep_requests=True)
    with replayer:
        run = replayer.replay_session(str(path), session, lambda n: None)
    return run, replayer


CLAUDE_USAGE = {
    "input_tokens": 4,
    "cache_creation_input_tokens": 3000,
    "cache_read_input_tokens": 12000,
    "output_tokens": 120,
}


def test_an_unlogged_claude_code_prefix_is_sent_as_a_stand_in_of_the_recorded_size(
    tmp_path: Path,
) -> None:
    run, _ = replayed(claude_log(tmp_path / "cc1.jsonl", CLAUDE_USAGE))
    check = truth(run)
    assert check is not None
    first = check["first_call_prompt_tokens"]
    assert first["recorded"] == 15004
    assert first["simulated"] == 15004, first  # fails before: 15004 rec / ~20 sim
    passthrough = run.arms["anthropic"]["passthrough"]
    (body,) = passthrough.requests[0]
    # Where the real ones sit: the tool definitions (the part the recorded call read from
    # the cache, which an earlier session wrote) and the system prompt, with its breakpoint.
    assert body["tools"] and body["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert passthrough.tokens["cache_read"] == 12000  # as recorded
    assert check["off"] is False and abs(check["difference"]) <= 0.05, check
    note = "system prompt and tools not logged: a stand-in of "
    assert [n for n in run.notes if n.startswith(note)] == run.notes, run.notes


def test_a_codex_rollout_gets_a_stand_in_for_its_tool_definitions(tmp_path: Path) -> None:
    usage = {"input_tokens": 8000, "cached_input_tokens": 0, "output_tokens": 150}
    run, _ = replayed(codex_log(tmp_path / "rollout.jsonl", [usage]))
    check = truth(run)
    assert check is not None
    assert check["first_call_prompt_tokens"]["simulated"] == 8000  # fails before: ~40
    (body,) = run.arms["openai"]["passthrough"].requests[0]
    assert body["messages"][0]["role"] == "system"  # the stand-in, as `instructions`
    assert check["off"] is False, check
    assert len(run.notes) == 1 and "a stand-in of" in run.notes[0], run.notes


def test_a_log_whose_gap_the_stand_in_explains_exits_0_and_says_so_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claude_log(tmp_path / "cc1.jsonl", CLAUDE_USAGE)
    usage = {"input_tokens": 8000, "cached_input_tokens": 0, "output_tokens": 150}
    codex_log(tmp_path / "rollout.jsonl", [usage])
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["replay", str(tmp_path), "--arms", "passthrough,state"])
    text = out.getvalue() + capsys.readouterr().out
    assert code == 0, text  # fails before: 1 (the truth check about 99% off)
    assert text.count("note: cc1: system prompt and tools not logged: a stand-in of") == 1
    assert text.count("note: cx1: system prompt and tools not logged: a stand-in of") == 1
    assert "no api-request lines" not in text  # the stand-in's note says it


def test_a_codex_log_s_own_bill_reads_its_cache_at_the_model_s_own_price(
    tmp_path: Path,
) -> None:
    usage = {"input_tokens": 10_000, "cached_input_tokens": 8_000, "output_tokens": 100}
    path = codex_log(tmp_path / "rollout.jsonl", [usage])
    # gpt-5-codex: input $1.25/M, cache read $0.125/M (the price book's; not 0.5x input).
    want = (2_000 * 1.25 + 8_000 * 0.125 + 100 * 10.0) / 1e6
    run, replayer = replayed(path)
    assert run.recorded_usd == pytest.approx(want, rel=1e-9)  # fails before: 0.5x input
    # The default regime (the log's provider's) bills every arm the same way ...
    assert replayer.prices("gpt-5-codex", "openai").cache_read_per_mtok == pytest.approx(0.125)
    # ... an explicit --cache-regime keeps its stated meaning, and the log's own bill is
    # still the model's (the simulated tokens priced the same way for the truth check).
    run, replayer = replayed(path, regimes=("openai",))
    assert replayer.prices("gpt-5-codex", "openai").cache_read_per_mtok == pytest.approx(0.625)
    assert run.recorded_usd == pytest.approx(want, rel=1e-9)
    tokens = run.arms["openai"]["passthrough"].tokens
    simulated = (
        tokens["input"] * 1.25
        + tokens["cache_read"] * 0.125
        + tokens["cache_write"] * 1.25
        + tokens["output"] * 10.0
    ) / 1e6
    check = truth(run)
    assert check is not None and check["simulated_usd"] == pytest.approx(simulated, rel=1e-9)
    run, replayer = replayed(path, regimes=("openai@0.1",))
    assert replayer.prices("gpt-5-codex", "openai@0.1").cache_read_per_mtok == pytest.approx(0.125)
    assert truth(run) is not None  # the provider's regime, at another read price


def test_one_hour_cache_writes_are_billed_at_their_own_rate_in_the_log_s_bill() -> None:
    session = Session("s", "transcript", "anthropic", "anthropic", "claude-sonnet-4-5")
    first = session.add({"role": "user", "content": "hello there"})
    usage = Usage(5_000, 100, 0, 4_000, cache_write_1h_tokens=3_000)
    session.calls.append(Call([first], Reply("hi", (), 100), usage, 0.0))
    with Replayer(ReplayOptions(arms=("passthrough",))) as replayer:
        run = replayer.replay_session("s", session, lambda n: None)
    # claude-sonnet-4-5: input $3/M, 5-minute writes $3.75/M, 1-hour writes $6/M, output $15/M.
    want = (1_000 * 3 + 1_000 * 3.75 + 3_000 * 6 + 100 * 15) / 1e6
    assert run.recorded_usd == pytest.approx(want, rel=1e-9)
