"""The command lines: ``skillstate replay`` on good and bad files (one line per bad file,
no traceback), and ``skillstate bench replay`` on a few of the shared traces."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from skillstate.bench.replay.cli import shared_traces
from skillstate.cli.main import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "replay"


def test_replay_reports_each_bad_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = (FIXTURES / "codex.jsonl").read_bytes().splitlines(keepends=True)
    (tmp_path / "malformed.jsonl").write_bytes(b"".join([*lines[:3], b"{\n", *lines[3:]]))
    (tmp_path / "truncated.jsonl").write_bytes((FIXTURES / "claude-code.jsonl").read_bytes()[:900])
    (tmp_path / "empty.json").write_bytes(b"")
    (tmp_path / "photo.json").write_bytes(b"GIF89a")
    (tmp_path / "nothing").mkdir()
    out = tmp_path / "report.json"
    code = main(
        [
            "replay",
            str(tmp_path),
            str(tmp_path / "nothing"),
            str(FIXTURES / "claude-code.jsonl"),
            "--arms",
            "passthrough,state",
            "--price-as",
            "claude-sonnet-4-5",
            "--json",
            str(out),
            "--html",
            str(tmp_path / "report.html"),
        ]
    )
    captured = capsys.readouterr()
    assert code == 1  # files were not (wholly) replayed
    assert "Traceback" not in captured.err + captured.out
    problems = [line for line in captured.err.splitlines() if line.startswith("skillstate replay:")]
    assert len(problems) == 5, captured.err
    named = {Path(line.split(": ", 2)[1]).name for line in problems}
    assert named == {"malformed.jsonl", "truncated.jsonl", "empty.json", "photo.json", "nothing"}
    report = json.loads(out.read_text())
    # The good log and the malformed rollout's other lines replayed.
    assert sorted(s["source"] for s in report["sessions"]) == ["claude-code", "codex"]
    assert {p["path"].rsplit("/", 1)[-1] for p in report["problems"]} == named
    # No message text without --include-text.
    assert "helpers_module" not in out.read_text()
    assert "replies" not in report["sessions"][0]


def test_include_text_puts_the_replies_in_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    code = main(
        [
            "replay",
            str(FIXTURES / "codex.jsonl"),
            "--arms",
            "passthrough",
            "--price-as",
            "gpt-5",
            "--include-text",
            "--json",
            str(out),
        ]
    )
    assert code in (0, 1)  # 1 only when the truth check is off (see the truth-check test)
    (session,) = json.loads(out.read_text())["sessions"]
    assert "helpers_module_version is 3" in session["replies"][-1]


def test_an_unknown_arm_or_price_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    log = str(FIXTURES / "codex.jsonl")
    assert main(["replay", log, "--arms", "passthrough,bogus"]) == 2
    assert main(["replay", log, "--price-as", "no-such-model-anywhere"]) == 2
    # Refused before any log is read (not once per session, nor never when none replays).
    assert main(["replay", "no-such-log.jsonl", "--price-as", "no-such-model-anywhere"]) == 2
    # Refused before any log is read (a missing one here: the check does not wait for it).
    assert main(["replay", "no-such-log.jsonl", "--envelope-tokens", str(10**20)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("skillstate replay: --arms: this proxy has no mode bogus")
    assert err[1] == (
        "skillstate replay: no bundled price for model 'no-such-model-anywhere': "
        "price it as a known model with --price-as MODEL"
    )
    assert err[2] == err[1]
    assert err[3] == "skillstate replay: --envelope-tokens must be 0 to 128,000"


def test_bench_replay_runs_every_arm_under_both_regimes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = shared_traces()
    if not path.exists():
        pytest.fail(f"{path} is missing: the shared data lives beside the repo")
    two = json.loads(path.read_bytes())[:2]  # read from ../shared, written only to tmp
    traces = tmp_path / "traces.json"
    traces.write_text(json.dumps(two))
    out, page = tmp_path / "bench.json", tmp_path / "bench.html"
    code = main(
        ["bench", "replay", "--traces", str(traces), "--json", str(out), "--html", str(page)]
    )
    assert code == 0, capsys.readouterr().err
    report = json.loads(out.read_text())
    assert list(report["totals"]) == ["openai", "anthropic"]
    assert report["options"]["price_as"] == "claude-sonnet-4-5"
    for arms in report["totals"].values():
        assert arms["passthrough"]["ratio"] == 1.0 and arms["passthrough"]["reach"] == 1.0
        assert arms["state"]["usd"] > 0 and arms["state"]["reach"] < 1.0
    calls = sum(1 for t in two for m in t["messages"][1:] if m["role"] == "assistant")
    for arms in report["totals"].values():
        assert all(a["calls"] == calls and a["errors"] == 0 for a in arms.values())
    text = page.read_text()
    assert (
        "<svg" in text
        and "<script" not in text
        and "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    )
    assert "https://" not in text


def test_the_proxies_run_with_the_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = str(FIXTURES / "codex.jsonl")
    bad = tmp_path / "bad.json"
    bad.write_text('{"no_such_setting": 1}')
    assert main(["replay", log, "--config", str(bad), "--price-as", "gpt-5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "skillstate replay: --config: no_such_setting: unknown setting"
    good = tmp_path / "good.json"
    good.write_text('{"schema": ["notes"], "constrain": "off"}')
    out = tmp_path / "r.json"
    main(
        [
            "replay",
            log,
            "--config",
            str(good),
            "--arms",
            "passthrough,state",
            "--price-as",
            "gpt-5",
            "--json",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    assert report["options"]["config"] == str(good)
    state = report["totals"]["openai"]["state"]
    # The simulated model writes only the keys the contract allows: no invalid turn.
    assert state["calls"] == 4 and state["errors"] == 0 and state["invalid"] == 0
    assert state["upstream_requests"] == 4  # no re-ask


def _transcript(tid: str, model: str = "gpt-4o", **extra: Any) -> dict[str, Any]:
    messages = [
        {"role": "user", "content": "fix the bug", **extra},
        {"role": "assistant", "content": "done"},
    ]
    return {"id": tid, "model": model, "messages": messages}


def _deep(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


def test_a_session_that_cannot_be_priced_or_sent_is_one_line_and_the_rest_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "unpriced.json").write_text(json.dumps(_transcript("unpriced", "no-such-model")))
    # orjson reads 1,024 levels and writes 255: read, it cannot be sent.
    (tmp_path / "deep.json").write_text(json.dumps(_transcript("deep", meta=_deep(300))))
    (tmp_path / "good.json").write_text(json.dumps(_transcript("good")))
    out = tmp_path / "r.json"
    code = main(["replay", str(tmp_path), "--arms", "passthrough", "--json", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 2, err
    assert lines[0].endswith(
        "deep.json: session deep: a message cannot be sent as JSON (Recursion limit reached)"
    )
    assert lines[1].endswith(
        "unpriced.json: session unpriced: no bundled price for model 'no-such-model': "
        "price it as a known model with --price-as MODEL"
    )
    report = json.loads(out.read_text())
    assert [s["id"] for s in report["sessions"]] == ["good"]
    assert len(report["problems"]) == 2


def test_a_transcript_the_anthropic_translation_refuses_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    odd = _transcript("odd")
    # The second call sends a reply that is neither a string nor content parts.
    odd["messages"][1]["content"] = 5
    odd["messages"] += [{"role": "user", "content": "and?"}, {"role": "assistant", "content": "."}]
    (tmp_path / "odd.json").write_text(json.dumps([odd, _transcript("good")]))
    out = tmp_path / "r.json"
    args = ["replay", str(tmp_path), "--arms", "passthrough", "--json", str(out)]
    code = main([*args, "--cache-regime", "anthropic"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert err.strip().endswith(
        "odd.json: session odd: the Anthropic translation refuses it "
        "(messages[1].content: must be a string or an array of content parts)"
    )
    assert [s["id"] for s in json.loads(out.read_text())["sessions"]] == ["good"]


def test_session_ids_are_printed_as_they_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = ["[/red]", "[bold]x[/bold]"]
    (tmp_path / "t.json").write_text(json.dumps([_transcript(i) for i in ids]))
    out = tmp_path / "r.json"
    code = main(["replay", str(tmp_path), "--arms", "passthrough", "--json", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert all(i in captured.out for i in ids)  # not read as rich markup
    assert [s["id"] for s in json.loads(out.read_text())["sessions"]] == ids


def test_escape_sequences_in_session_ids_are_written_out_in_the_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A session id from a log went to the terminal as it was in the per-session and truth
    tables (markup was escaped, control characters were not): a log could retitle the
    window, clear the screen or colour the rest of the report."""
    ids = ["a\x1b]0;PWNED\x07", "b\x1b[2J\x1b[31m"]
    (tmp_path / "t.json").write_text(json.dumps([_transcript(i) for i in ids]))
    code = main(["replay", str(tmp_path), "--arms", "passthrough"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "\x1b" not in captured.out and "\x07" not in captured.out
    assert "a\\x1b]0;PWNED\\x07" in captured.out
    assert "b\\x1b[2J\\x1b[31m" in captured.out


def test_a_report_that_cannot_be_written_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "t.json").write_text(json.dumps(_transcript("t")))
    args = ["replay", str(tmp_path / "t.json"), "--arms", "passthrough"]
    assert main([*args, "--json", "/dev/full", "--html", "/dev/full"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "skillstate replay: --json /dev/full: No space left on device",
        "skillstate replay: --html /dev/full: No space left on device",
    ]
    with open("/dev/full", "wb") as full:
        done = subprocess.run(
            [sys.executable, "-m", "skillstate", *args],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    assert done.returncode == 1
    assert done.stderr == "skillstate replay: cannot print the report: No space left on device\n"


def test_json_dash_writes_the_report_to_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "t.json").write_text(json.dumps(_transcript("t")))
    args = ["replay", str(tmp_path / "t.json"), "--arms", "passthrough"]
    assert main([*args, "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["sessions"][0]["id"] == "t"  # stdout is the report alone
    assert "passthrough" in captured.err  # the tables went to stderr


def test_the_console_says_each_regime_s_sessions_first_errors_and_shared_notes_once() -> None:
    from rich.console import Console

    from skillstate.bench.replay.report import build_report, render_console
    from skillstate.bench.replay.run import ArmRun, ReplayOptions, SessionRun

    failed = SessionRun("a.json", "a", "transcript", "gpt-4o", 1)
    failed.arms = {
        "openai": {"passthrough": ArmRun(calls=1, errors=1, first_error="HTTP 400: [b]")}
    }
    runs = [failed]
    for sid in ("b", "c", "d"):
        run = SessionRun(f"{sid}.jsonl", sid, "claude-code", "claude-sonnet-4-5", 1)
        run.arms = {"anthropic": {"passthrough": ArmRun(calls=1)}}
        run.notes = ["no api-request lines: system prompt and tools not logged"]
        runs.append(run)
    report = build_report(runs, [], ReplayOptions(), ("passthrough",), 0.0)
    console = Console(file=io.StringIO(), width=300)
    render_console(report, console)
    text = console.file.getvalue()
    assert "1 session(s), openai cache regime" in text
    assert "3 session(s), anthropic cache regime" in text
    assert "passthrough: 1 call(s) failed, the first with HTTP 400: [b]" in text
    assert text.count("no api-request lines") == 1
    assert "note (3x): no api-request lines: system prompt and tools not logged (b, c, d)" in text


def test_a_log_tree_with_bookkeeping_and_empty_sessions_replays_with_exit_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = tmp_path / "-home-u-proj"
    (project / "s1" / "subagents").mkdir(parents=True)
    (project / "s1" / "tool-results").mkdir()
    (project / "t.json").write_text(json.dumps(_transcript("t")))
    (project / "sessions-index.json").write_text('{"version": 1, "entries": []}')
    (project / "s1" / "subagents" / "agent-a1.meta.json").write_text('{"agentType": "x"}')
    (project / "s1" / "tool-results" / "toolu_1.json").write_text('{"stdout": "x"}')
    summary = {"type": "summary", "summary": "Fixed the bug", "leafUuid": "u9"}
    snapshot = {"type": "file-history-snapshot", "messageId": "m", "snapshot": {}}
    meta = {"timestamp": "2025-10-20T11:00:00Z", "type": "session_meta", "payload": {"id": "c"}}
    for name, record in [("summary", summary), ("snapshot", snapshot), ("codex", meta)]:
        (project / f"{name}-only.jsonl").write_text(json.dumps(record) + "\n")
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    code = main(["replay", str(project), "--arms", "passthrough", "--json", str(out),
                 "--html", str(page)])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    notes = [line for line in captured.err.splitlines() if line.startswith("skillstate replay:")]
    assert len(notes) == 3 and all(": note: " in line for line in notes), captured.err
    assert all("empty session" in line for line in notes)
    # The reports say so too: a reader of the JSON or the page sees what was left out.
    report = json.loads(out.read_text())
    assert report["problems"] == []
    skipped = sorted((Path(s["path"]).name, s["reason"]) for s in report["skipped"])
    assert [name for name, _ in skipped] == [
        f"{n}-only.jsonl" for n in ("codex", "snapshot", "summary")
    ]
    assert all("empty session" in reason for _, reason in skipped)
    html_page = page.read_text()
    assert "<h2>nothing to replay</h2>" in html_page and "summary-only.jsonl" in html_page


def test_control_characters_from_a_log_are_escaped_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sid = "\x1b]0;PWNED\x07\x1b[2J"
    lines = [
        {"type": "user", "sessionId": sid, "uuid": "u1", "parentUuid": None}
        | {"message": {"role": "user", "content": "hi"}},
        {"type": "assistant", "sessionId": sid, "uuid": "a1", "parentUuid": "u1"}
        | {"message": {"id": "m1", "role": "assistant", "model": "claude-x-0", "content": []}},
    ]
    lines[1]["message"]["content"] = [{"type": "text", "text": "yo"}]
    name = tmp_path / "log\x1b[31m.jsonl"
    name.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code = main(["replay", str(name), "--arms", "passthrough"])
    captured = capsys.readouterr()
    assert code == 1
    assert "\x1b" not in captured.err and "\x07" not in captured.err
    assert "session \\x1b]0;PWNED\\x07\\x1b[2J: no bundled price" in captured.err
    assert "log\\x1b[31m.jsonl" in captured.err
