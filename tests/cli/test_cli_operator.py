"""Operator commands run as a user runs them: what a mistake gets (one line, a non-zero
exit, nothing left behind) before anything is written or run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import proxy_env
from tests.fakeprovider import FakeProvider


def skillstate(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "skillstate", *args],
        capture_output=True, text=True, timeout=120, env=proxy_env(**env), cwd=cwd,
    )  # fmt: skip


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2 and "Traceback" not in r.stderr, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.mark.parametrize("action", [["list"], ["list", "--json"], ["revoke", "a"], ["rotate", "a"]])
def test_keys_on_a_mistyped_data_dir_say_no_store_and_make_none(
    tmp_path: Path, action: list[str]
) -> None:
    """They made an empty store and auth.secret there and answered 'no keys (auth is
    off…)': an operator checking a deployment's keys with a wrong path was told auth is off."""
    typo = tmp_path / "typo"
    r = skillstate("keys", "--data-dir", str(typo), *action, cwd=tmp_path)
    assert one_line(r) == f"skillstate: data_dir: no store at {typo / 'skillstate.db'}"
    assert r.stdout == "" and not typo.exists()


def test_keys_create_still_makes_the_store_the_others_then_use(tmp_path: Path) -> None:
    data = tmp_path / "new"
    r = skillstate("keys", "--data-dir", str(data), "create", "--name", "a", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("sk-ss-"), r
    r = skillstate("keys", "--data-dir", str(data), "list", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("a  active"), r


@pytest.mark.parametrize(
    "url",
    ["http://usr9:pw9@127.0.0.1:1/v1", "http://127.0.0.1:1/v1?api_key=SECRET9",
     "http://127.0.0.1:1/v1\x1b[31m"],
)  # fmt: skip
def test_an_upstream_url_with_credentials_or_a_query_does_not_start_and_is_not_shown(
    tmp_path: Path, url: str
) -> None:
    r = skillstate("--upstream", url, "--port", "0", "--data-dir", str(tmp_path / "d"),
                   cwd=tmp_path)  # fmt: skip
    line = one_line(r)
    assert line.startswith("skillstate: upstreams.0.url: upstream 'default': "), line
    for secret in ("usr9", "pw9", "SECRET9", "\x1b"):
        assert secret not in r.stderr and secret not in r.stdout
    assert r.stdout == ""  # no start-up line


@pytest.mark.parametrize("bench", [["conversation", "--turns", "3"], ["tools", "--steps", "3"],
                                   ["validity"]])  # fmt: skip
def test_a_bench_upstream_url_is_checked_as_the_proxys_in_one_line(
    tmp_path: Path, bench: list[str]
) -> None:
    """It was pydantic's four-line error (``1 validation error for Upstream`` …)."""
    r = skillstate("bench", *bench, "--upstream", "ftp://usr9:pw9@x", "--model", "m",
                   cwd=tmp_path, SKILLSTATE_API_KEY="x")  # fmt: skip
    line = one_line(r)
    assert line.endswith(
        "argument --upstream: must be an http(s) URL, got 'ftp://***@x' (see --help)"
    )
    assert "pw9" not in r.stderr and r.stdout == ""


def test_demo_refuses_an_unpriced_model_before_the_run(tmp_path: Path) -> None:
    """It ran, every cost "—", and exited 0; ``replay --price-as`` refuses the same."""
    r = skillstate("demo", "--turns", "3", "--price-as", "nosuchmodel", "--out-dir",
                   str(tmp_path / "out"), cwd=tmp_path)  # fmt: skip
    assert one_line(r) == (
        "skillstate demo: no bundled price for model 'nosuchmodel': price it as a known model"
        " with --price-as MODEL"
    )
    assert r.stdout == "" and not (tmp_path / "out").exists()


def test_demo_checks_its_out_dir_before_the_run(tmp_path: Path) -> None:
    """The whole demo ran and printed its tables, then failed on where the report goes."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    r = skillstate("demo", "--turns", "3", "--out-dir", str(blocker), cwd=tmp_path)
    assert one_line(r) == f"skillstate demo: cannot write {blocker / 'report.json'}: File exists"
    assert r.stdout == ""  # nothing ran
    r = skillstate("demo", "--turns", "3", "--out-dir", str(tmp_path / "new" / "dir"),
                   cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert {p.name for p in (tmp_path / "new" / "dir").iterdir()} == {"report.json", "chart.html"}


def test_serve_takes_the_proxys_options_after_it_too(fake: FakeProvider, tmp_path: Path) -> None:
    """README: ``skillstate`` (or ``skillstate serve``) runs the proxy; ``serve --port N``
    was refused ("unrecognized arguments")."""
    argv = [sys.executable, "-m", "skillstate", "--mode", "mask", "serve", "--port", "0",
            "--upstream", fake.url + "/v1", "--data-dir", str(tmp_path / "d")]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=proxy_env()
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line and "mode=mask" in line, line
        assert f"default={fake.url}/v1" in line
        assert (tmp_path / "d" / "skillstate.db").exists()
    finally:
        proc.terminate()
        proc.wait(30)
    r = skillstate("serve", "--port", "70000", cwd=tmp_path)
    assert one_line(r).startswith("skillstate serve: argument --port: must be a whole number")
