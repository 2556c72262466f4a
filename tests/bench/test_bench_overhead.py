"""Smoke tests for `skillstate bench overhead`: tiny counts, report structure only.

Timings are never asserted (the machine is shared and noisy); only that the harness runs
end to end and reports every number it promises.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest

from skillstate.bench import overhead
from skillstate.bench.fastupstream import FastUpstream, start_fast_upstream
from skillstate.bench.overhead.arguments import validate
from skillstate.bench.overhead.run import FLOOR_NAMES
from skillstate.bench.overhead.transcripts import exchange

TINY = [
    "--warmup", "1",
    "--rounds", "2",
    "--requests", "2",
    "--duration", "0.2",
    "--concurrency", "2",
    "--sessions", "3",
    "--quiet",
]  # fmt: skip


@pytest.fixture(scope="module")
def target() -> Any:
    """A second fast upstream, standing in for a gateway under test."""
    with start_fast_upstream() as up:
        yield up


def _post(url: str, path: str, body: dict[str, Any]) -> tuple[int, bytes, str]:
    u = urlsplit(url)
    c = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=10)
    c.request("POST", path, orjson.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data, r.getheader("content-type") or ""


def _envelope(content: str) -> dict[str, Any]:
    m = re.search(r"```json\s*(\{.*\})\s*```", content, re.S)
    assert m, content
    env = json.loads(m.group(1))
    assert isinstance(env["state_patch"], dict) and env["state_patch"]
    assert isinstance(env["action"], str) and env["action"]
    return env


def test_fast_upstream_chat_models_and_stream(target: FastUpstream) -> None:
    status, data, ctype = _post(
        target.url, "/v1/chat/completions", {"model": "m1", "messages": [{"role": "user"}]}
    )
    assert status == 200 and ctype.startswith("application/json")
    obj = json.loads(data)
    assert obj["object"] == "chat.completion" and obj["model"] == "m1"
    assert obj["usage"]["total_tokens"] > 0
    _envelope(obj["choices"][0]["message"]["content"])

    status, data, ctype = _post(target.url, "/v1/chat/completions", {"model": "m", "stream": True})
    assert status == 200 and ctype.startswith("text/event-stream")
    events = [e[len("data: ") :] for e in data.decode().split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["usage"]["total_tokens"] > 0
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    _envelope(text)

    u = urlsplit(target.url)
    c = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=10)
    c.request("GET", "/v1/models")
    r = c.getresponse()
    assert r.status == 200 and json.loads(r.read())["data"][0]["id"]
    c.close()


def _run(tmp_path: Path, *argv: str) -> dict[str, Any]:
    out = tmp_path / "report.json"
    args = overhead.build_parser().parse_args([*argv, "--json", str(out)])
    assert overhead.run_overhead(args) == 0
    rep: dict[str, Any] = json.loads(out.read_text())
    return rep


def _check_stats(s: dict[str, Any]) -> None:
    for key in ("n", "p50_ms", "p99_ms", "mean_ms", "min_ms", "max_ms"):
        assert key in s, key
    assert s["n"] > 0
    assert isinstance(s["p50_ms"], float) and isinstance(s["p99_ms"], float)


def _check_common(rep: dict[str, Any]) -> None:
    m = rep["machine"]
    assert m["cpu_count"] >= 1 and m["python"] and "revision" in m["git"]
    seq = rep["sequential"]
    _check_stats(seq["direct"])
    _check_stats(seq["proxied"])
    assert seq["direct"]["n"] == seq["proxied"]["n"] == 4
    for key in ("p50_ms", "p99_ms", "mean_ms", "p50_ms_median_of_rounds"):
        assert isinstance(seq["added"][key], float)
    assert len(seq["added"]["p50_ms_per_round"]) == 2
    conc = rep["concurrency"]
    assert conc["connections"] == 2
    for path in ("direct", "proxied"):
        _check_stats(conc[path])
        assert conc[path]["rps"] > 0 and conc[path]["errors"] == 0
    assert "rps_ratio" in conc["added"] and "p50_ms" in conc["added"]
    assert "added_p50_ms" in rep["targets"]


def test_forward_against_target(tmp_path: Path, target: FastUpstream) -> None:
    rep = _run(tmp_path, "--target", target.url, *TINY)
    _check_common(rep)
    assert rep["config"]["mode"] == "forward" and rep["config"]["mode_header"] == "passthrough"


def test_stream_state_and_turn_profile_against_target(tmp_path: Path, target: FastUpstream) -> None:
    rep = _run(
        tmp_path,
        "--target", target.url,
        "--target-pid", str(target.pid),
        "--mode", "state",
        "--stream",
        "--turn-profile", "--turns", "8", "--turn-batch", "2",
        *TINY,
    )  # fmt: skip
    _check_common(rep)
    assert rep["config"]["stream"] is True
    assert "proxied_rps" in rep["targets"]
    tp = rep["turn_profile"]
    assert tp["turns"] == 8 and tp["cpu_clock"] in ("schedstat", "psutil", "proc-stat")
    assert len(tp["windows"]) >= 2
    for w in tp["windows"]:
        assert w["proxy_cpu_ms_per_turn"] is not None and w["wall_p50_ms"] is not None
    assert "cpu_ratio_last_vs_first" in tp
    assert rep["sequential"]["proxy_cpu_ms_per_request"] is not None  # --target-pid given
    assert rep["concurrency"]["proxy_cpu_ms_per_request"] is not None


def test_helpers() -> None:
    assert overhead.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert overhead.percentile([5.0], 99) == 5.0
    for kib in (2, 4, 8):
        n = len(orjson.dumps(overhead.initial_state(kib)))
        assert kib * 1024 <= n < kib * 1024 + 400
    ep = overhead.Endpoint.from_base
    assert ep("http://127.0.0.1:9/v1").path == "/v1/chat/completions"
    assert ep("http://127.0.0.1:9").path == "/v1/chat/completions"
    assert ep("http://h:9/x/chat/completions/").path == "/x/chat/completions"
    assert overhead.proc_cpu_seconds(__import__("os").getpid())[0] > 0

    top = argparse.ArgumentParser()
    sub = top.add_subparsers(dest="cmd")
    overhead.add_overhead_parser(sub)
    a = top.parse_args(["overhead", "--mode", "state", "--stream"])
    assert a.func is overhead.run_overhead and a.mode == "state" and a.stream


_HAS_PROXY = all(
    importlib.util.find_spec(m) is not None for m in ("skillstate.__main__", "skillstate.app")
)


@pytest.mark.skipif(not _HAS_PROXY, reason="the skillstate proxy is not there")
@pytest.mark.parametrize("mode", ["forward", "state"])
def test_against_real_proxy(tmp_path: Path, mode: str) -> None:
    rep = _run(tmp_path, "--mode", mode, *TINY)
    _check_common(rep)
    assert rep["config"]["proxy"] == "skillstate"
    if mode == "state":
        seeded = rep["state_check"]["seeded"]
        assert seeded["step"] >= 1, seeded  # the envelope committed
        assert seeded["state_bytes"] >= 2048


@pytest.mark.skipif(not _HAS_PROXY, reason="the skillstate proxy is not there")
@pytest.mark.parametrize("server", ["aiohttp", "uvicorn"])
def test_floor_arm_is_measured_in_the_same_run(tmp_path: Path, server: str) -> None:
    rep = _run(tmp_path, "--floor", "--floor-server", server, *TINY)
    _check_common(rep)
    assert rep["config"]["floor"] == FLOOR_NAMES[server] and server in rep["config"]["floor"]
    seq, conc = rep["sequential"], rep["concurrency"]
    _check_stats(seq["floor"])
    assert seq["floor"]["n"] == seq["proxied"]["n"] == 4
    assert len(seq["floor_added"]["p50_ms_per_round"]) == 2
    assert seq["floor_cpu_ms_per_request"] > 0 and seq["proxy_cpu_ms_per_request"] > 0
    assert seq["vs_floor"]["cpu_ratio"] == round(
        seq["proxy_cpu_ms_per_request"] / seq["floor_cpu_ms_per_request"], 3
    )
    _check_stats(conc["floor"])
    assert conc["floor"]["rps"] > 0 and conc["floor"]["errors"] == 0
    assert conc["vs_floor"]["rps_ratio"] == round(conc["proxied"]["rps"] / conc["floor"]["rps"], 3)
    for key in ("cpu_vs_floor", "rps_vs_floor"):
        assert rep["targets"][key]["value"] is not None
    # both CPU ratios are judged, each against its own figure
    assert rep["targets"]["concurrent_cpu_vs_floor"]["value"] == conc["vs_floor"]["cpu_ratio"]
    assert rep["targets"]["cpu_vs_floor"]["value"] == seq["vs_floor"]["cpu_ratio"]
    # the floor relays the upstream's answer: a chat completion with the envelope text
    sample = orjson.loads(rep["samples"]["floor"])
    assert sample["object"] == "chat.completion" and "state_patch" in str(sample["choices"])


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--replicas", "2"], "--replicas > 1 needs --store postgresql"),
        (["--replicas", "2", "--store", "sqlite:///x.db", "--coordination", "redis://h"], "needs"),
        (["--replicas", "2", "--store", "postgresql://h/db"], "needs"),
        (["--replicas", "0"], "--replicas must be >= 1"),
        (["--floor-server", "uvicorn"], "--floor-server only makes sense with --floor"),
        (["--target", "http://127.0.0.1:9", "--store", "postgresql://h/db"], "not a --target"),
    ],
)
def test_replica_flags_are_checked(argv: list[str], problem: str) -> None:
    assert problem in (validate(overhead.build_parser().parse_args(argv)) or "")
    assert overhead.run_overhead(overhead.build_parser().parse_args(argv)) == 2


@pytest.mark.skipif(not _HAS_PROXY, reason="the skillstate proxy is not there")
def test_transcript_phase_grows_each_session_by_one_exchange(tmp_path: Path) -> None:
    rep = _run(tmp_path, "--transcript-kb", "6,20", "--transcript-turns", "3", "--floor", "--quiet")
    tr = rep["transcripts"]
    rows = {(r["kb"], r["path"]): r for r in tr["rows"]}
    assert set(rows) == {(kb, p) for kb in (6.0, 20.0) for p in ("passthrough", "state", "floor")}
    step = len(orjson.dumps(exchange(0)))
    for (kb, _), r in rows.items():
        assert r["calls"] == 3
        # two more exchanges between the first and the last measured call, and the measured
        # transcripts average about the size asked for
        assert 2 * step - 200 <= r["body_bytes_last"] - r["body_bytes_first"] <= 2 * step + 200
        middle = (r["body_bytes_first"] + r["body_bytes_last"]) / 2
        assert abs(middle - kb * 1024) < 2 * step
        assert r["cpu_ms_per_call_median"] > 0 and r["wall_ms_p50"] > 0
    small, large = rows[(6.0, "state")], rows[(20.0, "state")]
    ratio = round(large["cpu_ms_per_call_median"] / small["cpu_ms_per_call_median"], 3)
    assert tr["state_largest_vs_smallest_cpu"] == ratio
    assert rep["targets"]["transcript_growth"]["value"] == ratio
    assert "sequential" not in rep and "concurrency" not in rep  # this phase only


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--transcript-kb", "10,x"], "could not convert"),
        (["--transcript-kb", ""], "give 1 to"),
        (["--transcript-kb", "1"], "between 4 and 8192"),
        (["--transcript-kb", "10", "--transcript-turns", "2"], "--transcript-turns >= 3"),
    ],
)
def test_transcript_flags_are_checked(argv: list[str], problem: str) -> None:
    assert problem in (validate(overhead.build_parser().parse_args(argv)) or "")
