"""Offline benchmarks through the real in-process proxy: report structure and invariants.

No timing assertions: only token counts, recall and verdicts, which are deterministic.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from skillstate.bench import report as rep
from skillstate.bench.arm import Arm, BenchConfig, BenchError
from skillstate.bench.chart import nice_ticks, render_svg, write_chart
from skillstate.bench.commands import add_bench_parsers, main
from skillstate.bench.options import config_from_args
from skillstate.bench.runner import run_benchmark
from skillstate.bench.simmodel import SIM_MODEL_ID, SimModel, sim_reply
from skillstate.bench.workloads import ConversationWorkload, ToolsWorkload
from skillstate.dialects.openai import OPENAI
from skillstate.engine.context import build_compact


def _prompts(report: dict[str, Any], arm: str) -> list[int]:
    return [row[arm]["prompt_tokens"] for row in report["per_turn"]]


def _flat(values: list[int]) -> bool:
    return max(values) <= 2 * min(values)


@pytest.fixture(scope="module")
def conversation() -> dict[str, Any]:
    run = run_benchmark(BenchConfig(workload="conversation", turns=12, distractor_bytes=1200))
    return rep.build_report(run)


@pytest.fixture(scope="module")
def tools() -> dict[str, Any]:
    return rep.build_report(run_benchmark(BenchConfig(workload="tools", steps=6)))


# -- report structure ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["conversation", "tools"])
def test_report_has_exactly_the_documented_keys(name: str, request: pytest.FixtureRequest) -> None:
    report = request.getfixturevalue(name)
    assert tuple(report) == rep.REPORT_KEYS
    assert report["workload"] == name
    assert report["simulated"] is True
    assert report["model"] == SIM_MODEL_ID
    assert isinstance(report["version"], str)
    assert report["revision"] is None or len(report["revision"]) == 40
    assert set(report["savings"]) == {
        "prompt_tokens_pct",
        "per_call_pct",
        "break_even_turn",
        "cost_pct",
        "by_arm",
    }
    for arm in ("baseline", "state"):
        a = report["arms"][arm]
        for key in (
            "prompt_tokens",
            "completion_tokens",
            "calls",
            "failures",
            "prompt_tokens_per_call",
            "cost_usd",
            "quality",
        ):
            assert key in a, (arm, key)
        assert a["failures"] == 0
        assert a["prompt_tokens"] == sum(_prompts(report, arm))
    assert report["arms"]["baseline"]["calls"] == report["arms"]["state"]["calls"]
    assert report["verdict"].startswith("VALID")
    json.dumps(report)  # serialisable as is


# -- invariants ------------------------------------------------------------------------------


def test_conversation_baseline_grows_and_state_stays_flat(conversation: dict[str, Any]) -> None:
    base = _prompts(conversation, "baseline")
    state = _prompts(conversation, "state")
    assert all(b2 > b1 for b1, b2 in itertools.pairwise(base)), base
    assert _flat(state[2:]), state  # turns >= 3
    assert conversation["savings"]["prompt_tokens_pct"] > 50
    assert conversation["savings"]["break_even_turn"] <= 5
    # every state-arm call went through the proxy in compact form, with the contract
    assert conversation["arms"]["state"]["contexts"] == {"compact": 12}
    assert all(row["state"]["injected_tokens"] > 0 for row in conversation["per_turn"])


def test_conversation_recall_recorded_kept_asides_lost(conversation: dict[str, Any]) -> None:
    q_state = conversation["arms"]["state"]["quality"]
    q_base = conversation["arms"]["baseline"]["quality"]
    assert q_state["recall_pct"] == 100.0
    assert q_base["recall_pct"] == 100.0 and q_base["aside_recall_pct"] == 100.0
    lost = q_state["facts_lost"]
    assert lost and all(f["kind"] == "aside" for f in lost)
    assert all(f["answered"] == "UNKNOWN" for f in lost)
    assert q_state["aside_recall_pct"] == 0.0
    # the final state holds exactly the recorded facts
    recorded = {f["key"]: f["expected"] for f in q_state["facts_kept"]}
    final = conversation["arms"]["state"]["final_state"]
    assert final["facts"] == recorded
    assert final["step"] == 12
    assert "aside" in conversation["verdict"]


def test_tools_end_state_matches_and_state_stays_flat(tools: dict[str, Any]) -> None:
    for arm in ("baseline", "state"):
        q = tools["arms"][arm]["quality"]
        assert q["end_state_match"] is True, q["mismatches"]
        assert q["finished"] is True
    base = _prompts(tools, "baseline")
    state = _prompts(tools, "state")
    assert all(b2 > b1 for b1, b2 in itertools.pairwise(base[:-1])), base
    assert _flat(state[2:-1]), state  # the final DONE call carries no tool results
    assert tools["savings"]["prompt_tokens_pct"] > 0
    final = tools["arms"]["state"]["final_state"]
    assert final["queue"] == [] and len(final["done"]) == ToolsWorkload(steps=6).n_open


def test_the_window_arm_finishes_the_tools_workload_under_the_anthropic_cache() -> None:
    # The window shows the model only its recent calls; its tool call ids must still be
    # unique in the client's transcript, or the Messages API (and the proxy's request
    # checks) refuse the next request: the arm stopped at its third call.
    cfg = BenchConfig(
        workload="tools", steps=6, cache_regime="anthropic", arms=("baseline", "window")
    )
    report = rep.build_report(run_benchmark(cfg))
    window = report["arms"]["window"]
    assert window["failures"] == 0, window["failed_calls"]
    assert window["quality"]["end_state_match"] is True and window["quality"]["finished"]
    assert window["calls"] == report["arms"]["baseline"]["calls"]


def test_injected_failure_makes_the_run_invalid() -> None:
    cfg = BenchConfig(workload="conversation", turns=4, inject_failure=("state", 2))
    report = rep.build_report(run_benchmark(cfg))
    assert report["verdict"].startswith("INVALID RUN")
    assert report["arms"]["state"]["failures"] == 1
    assert report["arms"]["state"]["failed_calls"][0]["turn"] == 2
    assert report["per_turn"][1]["state"]["status"] == "error"
    assert report["per_turn"][1]["state"]["prompt_tokens"] is None  # never a silent 0
    assert report["savings"] == {
        "prompt_tokens_pct": None,
        "per_call_pct": None,
        "break_even_turn": None,
        "cost_pct": None,
        "by_arm": None,
    }


def test_auto_mode_costs_at_most_the_instruction_overhead() -> None:
    report = rep.build_report(run_benchmark(BenchConfig(turns=3, mode="auto")))
    assert report["verdict"].startswith("VALID")
    for row in report["per_turn"]:
        extra = row["state"]["prompt_tokens"] - row["baseline"]["prompt_tokens"]
        assert extra <= row["state"]["injected_tokens"], row


def test_streaming_arms() -> None:
    report = rep.build_report(run_benchmark(BenchConfig(turns=4, stream=True)))
    assert report["verdict"].startswith("VALID")
    assert report["arms"]["state"]["quality"]["recall_pct"] == 100.0
    assert all(p > 0 for p in _prompts(report, "state"))


def test_missing_usage_fails_the_step() -> None:
    with SimModel(usage=False) as sim:
        arm = Arm("baseline", BenchConfig(), sim.base_url, "k", SIM_MODEL_ID, {}, sim)
        try:
            msg, rec = arm.call(1, [{"role": "user", "content": "hi"}], None)
        finally:
            arm.close()
    assert msg is not None
    assert rec.status == "error" and "refusing silent 0" in (rec.error or "")
    assert rec.prompt_tokens is None


# -- the simulated model, without any server -------------------------------------------------


def test_sim_answers_only_from_its_context() -> None:
    w = ConversationWorkload(turns=6)
    rec = next(f for f in w.facts if f.kind == "recorded")
    aside = next(f for f in w.facts if f.kind == "aside")
    probe = {"role": "user", "content": f"RECALL {rec.key}?\nRECALL {aside.key}?"}
    empty = sim_reply({"messages": [{"role": "user", "content": w.task}, probe]})
    assert f"ANSWER {rec.key}=UNKNOWN" in empty.content
    full = [
        {"role": "user", "content": w.task},
        *({"role": "user", "content": w.user_text(t)} for t in range(2, 6)),
        probe,
    ]
    answered = sim_reply({"messages": full})
    assert f"ANSWER {rec.key}={rec.value}" in answered.content
    assert f"ANSWER {aside.key}={aside.value}" in answered.content
    assert answered.patch is None and "```json" not in answered.content  # no contract


def test_sim_records_instructions_but_never_asides() -> None:
    w = ConversationWorkload(turns=3)  # turn 2 carries one RECORD and one aside
    body = build_compact(
        OPENAI.context,
        {
            "messages": [
                {"role": "user", "content": w.task},
                {"role": "user", "content": w.user_text(2)},
            ]
        },
        list(w.schema_keys),
        {"step": 1, "facts": {}},
    )
    reply = sim_reply(body)
    rec = next(f for f in w.facts if f.kind == "recorded")
    assert reply.patch == {"step": 2, "facts": {rec.key: rec.value}}
    assert reply.content.rstrip().endswith("```")


def test_sim_answers_a_re_asked_checkpoint_as_the_checkpoint_it_repeats() -> None:
    from skillstate.engine.context import add_correction
    from skillstate.engine.window import build_window, checkpoint_text, plan_window

    w = ConversationWorkload(turns=3)  # turn 2 carries one RECORD and one aside
    rec = next(f for f in w.facts if f.kind == "recorded")
    transcript = {
        "messages": [
            {"role": "user", "content": w.task},
            {"role": "user", "content": w.user_text(2)},
        ]
    }
    ctx = OPENAI.context
    plan = plan_window(transcript["messages"], ctx, None)
    window = build_window(ctx, transcript, plan, list(w.schema_keys), {"step": 1})
    asked = ctx.instruct(window, checkpoint_text())
    first = sim_reply(asked)
    assert first.patch is not None and first.patch["facts"] == {rec.key: rec.value}
    # The proxy re-asks (the reply and a correction appended), twice: each is the checkpoint
    # again, with the same envelope, and the same answer to the observation.
    again = add_correction(ctx, asked, "Noted.", ["no ```json block"])
    twice = add_correction(ctx, again, "Noted.", ["no ```json block"])
    for body in (again, twice):
        reply = sim_reply(body)
        assert reply.patch == first.patch and reply.content == first.content
    # The same window turn with no checkpoint asked: no envelope, re-asked or not.
    plain = sim_reply(window)
    assert plain.patch is None and "```json" not in plain.content


def test_sim_tools_parallel_calls() -> None:
    w = ToolsWorkload(steps=4)
    env = w.tracker()
    messages: list[dict[str, Any]] = [{"role": "user", "content": w.task}]
    first = sim_reply({"messages": messages, "tools": w.tools})
    assert [c["function"]["name"] for c in first.tool_calls] == ["list_issues"]
    messages.append({"role": "assistant", "content": first.content, "tool_calls": first.tool_calls})
    for c in first.tool_calls:
        out = env.call(c["function"]["name"], c["function"]["arguments"])
        messages.append({"role": "tool", "tool_call_id": c["id"], "content": out})
    second = sim_reply({"messages": messages, "tools": w.tools})
    names = [c["function"]["name"] for c in second.tool_calls]
    assert names.count("get_issue") == w.batch  # parallel fetches
    assert len({c["id"] for c in second.tool_calls}) == len(second.tool_calls)


# -- report helpers, chart, CLI --------------------------------------------------------------


def test_break_even_turn_is_the_last_crossing() -> None:
    def row(t: int, cb: int, cs: int) -> dict[str, Any]:
        return {"turn": t, "baseline": {}, "state": {}, "cum_baseline": cb, "cum_state": cs}

    rows = [row(1, 10, 20), row(2, 30, 25), row(3, 40, 45), row(4, 60, 50), row(5, 90, 55)]
    assert rep.break_even_turn(rows) == 4
    assert rep.break_even_turn(rows[:3]) is None


def test_condensed_rows() -> None:
    assert rep.condensed_rows(10) == list(range(10))
    shown = rep.condensed_rows(100)
    assert shown[:5] == [0, 1, 2, 3, 4] and shown[-5:] == [95, 96, 97, 98, 99]
    assert len(shown) <= 24 and shown == sorted(set(shown))


def test_nice_ticks_cover_the_range() -> None:
    ticks = nice_ticks(0, 43711)
    assert ticks[0] == 0 and ticks[-1] >= 43711 and len(ticks) <= 8


def test_chart_svg_and_html(conversation: dict[str, Any], tmp_path: Path) -> None:
    svg = render_svg(conversation)
    assert svg.startswith("<svg") and svg.count("<polyline") == 4  # 2 panels x 2 arms
    assert "SIMULATED" in svg
    write_chart(conversation, tmp_path / "c.html")
    assert "<svg" in (tmp_path / "c.html").read_text()
    with pytest.raises(RuntimeError):
        write_chart(conversation, tmp_path / "c.pdf")


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is not None, reason="has matplotlib")
def test_png_without_matplotlib_is_a_clear_error(
    conversation: dict[str, Any], tmp_path: Path
) -> None:
    with pytest.raises(RuntimeError, match="matplotlib"):
        write_chart(conversation, tmp_path / "c.png")


def test_cli_writes_report_and_chart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, chart = tmp_path / "r.json", tmp_path / "c.svg"
    code = main(["tools", "--steps", "4", "--offline", "--out", str(out), "--chart", str(chart)])
    assert code == 0
    report = json.loads(out.read_text())
    assert tuple(report) == rep.REPORT_KEYS and report["params"]["steps"] == 4
    assert chart.read_text().startswith("<svg")
    assert "VALID" in capsys.readouterr().out


def test_cli_invalid_run_exit_code(tmp_path: Path) -> None:
    code = main(["conversation", "--turns", "3", "--inject-failure", "baseline:1"])
    assert code == 1


def test_cli_arguments() -> None:
    parser = argparse.ArgumentParser()
    add_bench_parsers(parser.add_subparsers(dest="bench"))
    args = parser.parse_args(["conversation"])
    cfg = config_from_args(args)
    assert (cfg.workload, cfg.turns, cfg.offline, cfg.mode) == ("conversation", 50, True, "state")
    args = parser.parse_args(["tools", "--mode", "auto", "--seed", "3", "--distractor-bytes", "10"])
    cfg = config_from_args(args)
    assert (cfg.workload, cfg.steps, cfg.mode, cfg.seed, cfg.distractor_bytes) == (
        "tools",
        20,
        "auto",
        3,
        10,
    )
    with pytest.raises(BenchError):
        config_from_args(parser.parse_args(["tools", "--offline", "--upstream", "http://x"]))
    with pytest.raises(BenchError):
        config_from_args(parser.parse_args(["tools", "--inject-failure", "nope"]))
    # "²".isdigit() is true and int("²") raises: an error line, not a traceback
    for turn in ("\u00b2", "\uff12"):
        with pytest.raises(BenchError, match="expected ARM:N"):
            config_from_args(parser.parse_args(["tools", "--inject-failure", f"state:{turn}"]))


def test_the_proxies_run_with_the_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"no_such_setting": 1}')
    assert main(["conversation", "--turns", "3", "--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "skillstate bench: --config: no_such_setting: unknown setting"
    # mask_keep from the file: with 100 nothing is masked, so the mask arm sends what the
    # baseline sends; at the default (3) it masks from the sixth observation on.
    keep = tmp_path / "keep.json"
    keep.write_text('{"mask_keep": 100}')
    reports = {}
    for name, extra in (("file", ["--config", str(keep)]), ("default", [])):
        out = tmp_path / f"{name}.json"
        args = ["conversation", "--turns", "8", "--arms", "mask", "--cache-regime", "none"]
        assert main([*args, *extra, "--out", str(out)]) == 0
        reports[name] = json.loads(out.read_text())
    assert reports["file"]["params"]["config"] == str(keep)
    assert _prompts(reports["file"], "mask") == _prompts(reports["file"], "baseline")
    assert sum(_prompts(reports["default"], "mask")) < sum(_prompts(reports["default"], "baseline"))


def test_live_mode_needs_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SKILLSTATE_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(BenchError, match="key"):
        run_benchmark(BenchConfig(upstream="http://127.0.0.1:9", model="m"))


def test_demo_writes_report_and_chart(tmp_path: Path) -> None:
    from skillstate.cli.demo import run_demo

    code = run_demo(argparse.Namespace(turns=4, out_dir=str(tmp_path)))
    assert code == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["simulated"] is True and report["params"]["turns"] == 4
    chart = (tmp_path / "chart.html").read_text()
    assert chart.startswith("<!doctype html>")
    # Dollars as well as tokens: a named model, the anthropic regime, every arm this proxy
    # has, cumulative dollars per arm in the report and the chart, marked hypothetical.
    params = report["params"]
    assert (params["price_as"], params["cache_regime"]) == ("claude-sonnet-4-5", "anthropic")
    assert {"baseline", "state", "auto"} <= set(report["arms"])
    last = report["per_turn"][-1]
    for arm, summary in report["arms"].items():
        assert summary["cost_usd"] > 0
        assert last[f"cum_cost_{arm}"] == pytest.approx(summary["cost_usd"])
    assert "Cumulative billed dollars (claude-sonnet-4-5, anthropic cache, hypothetical)" in chart


# -- what needs the bench extra --------------------------------------------------------------


def test_demo_runs_without_the_openai_sdk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from skillstate.cli.demo import run_demo

    monkeypatch.setitem(sys.modules, "openai", None)  # as if not installed (plain pip install)
    assert run_demo(argparse.Namespace(turns=3, out_dir=str(tmp_path))) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["arms"]["state"]["quality"]["recall_pct"] == 100.0
    assert all(p > 0 for p in _prompts(report, "state"))


@pytest.mark.parametrize("bench", ["conversation", "tools", "validity", "bfcl"])
def test_a_bench_without_the_extra_says_in_one_line_how_to_install_it(
    bench: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from skillstate.cli.main import main as cli_main

    monkeypatch.setitem(sys.modules, "openai", None)
    assert cli_main(["bench", bench, "--offline"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert "pip install 'skillstate-proxy[bench]'" in captured.err


def test_the_proxy_imports_no_benchmark_code() -> None:
    code = (
        "import sys; import skillstate.cli.main, skillstate.app.server, skillstate.app; "
        "print(sorted(m for m in sys.modules if m.startswith("
        "('skillstate.bench', 'skillstate.cli.demo', 'openai', 'httpx', 'pydantic_settings'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
