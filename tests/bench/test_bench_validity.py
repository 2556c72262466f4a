"""`skillstate bench validity`: both constraint settings in one run, counted from the proxy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skillstate.bench.arm import BenchConfig
from skillstate.bench.commands import main
from skillstate.bench.validity import run_validity
from tests.fakeprovider import FakeProvider, Reply


def fenced(patch: dict[str, object]) -> str:
    return "```json\n" + json.dumps({"state_patch": patch, "action": "go"}) + "\n```"


def test_counts_valid_first_attempt_and_reasks_per_setting(fake: FakeProvider) -> None:
    junk = Reply(text="I will keep that in mind.")
    fake.enqueue(
        # constrain off: turn 1 invalid after two re-asks, turn 2 valid, turn 3 valid on a re-ask
        junk, junk, junk,
        Reply(text=fenced({"step": 2})),
        junk, Reply(text=fenced({"step": 3})),
        # constrain json_schema: what a grammar-bound model sends, valid every time
        *(Reply(text=json.dumps({"state_patch": {"step": n}, "action": "go"})) for n in (1, 2, 3)),
    )  # fmt: skip
    cfg = BenchConfig(turns=3, upstream=fake.url + "/v1", model="m", api_key="k", max_tokens=64)
    report = run_validity(cfg)
    assert report["verdict"] == "valid run"
    off, on = report["arms"]["off"], report["arms"]["json_schema"]
    assert (off["valid"], off["valid_first_attempt"], off["reasks"]) == (2, 1, 3)
    assert [t["transition"] for t in off["per_turn"]] == ["invalid", "valid", "valid"]
    assert off["per_turn"][0]["why"]  # the proxy's x-skillstate-validation
    assert (on["valid"], on["valid_first_attempt"], on["reasks"], on["valid_pct"]) == (3, 3, 0, 100)
    assert on["final_state"]["step"] == 3
    # the first six requests (constrain off) carried no grammar; the last three did
    formats = [r.json.get("response_format") for r in fake.requests]
    assert formats[:6] == [None] * 6
    assert all(f and f["type"] == "json_schema" for f in formats[6:])
    # the ledger counts every attempt the upstream answered
    assert len(fake.requests) == 9
    assert off["prompt_tokens_all_attempts"] > on["prompt_tokens_all_attempts"]


def test_cli_offline_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "v.json"
    assert main(["validity", "--turns", "4", "--offline", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["arms"]) == {"off", "json_schema"}
    assert all(len(a["per_turn"]) == 4 for a in report["arms"].values())


def test_cli_usage_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validity", "--upstream", "http://127.0.0.1:9/v1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("skillstate bench:") and "\n" not in err
