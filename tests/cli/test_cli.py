"""The `skillstate` executables as a user runs them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import StartProxyProcess, proxy_env
from tests.fakeprovider import FakeProvider
from tests.helpers import SESSION_HEADER

BIN = Path(sys.executable).parent


def run(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args), capture_output=True, text=True, timeout=60, env=env or proxy_env(), cwd=cwd
    )


def test_version_agrees_across_entry_points() -> None:
    outs = {
        run(str(BIN / "skillstate"), "--version").stdout.strip(),
        run(str(BIN / "skillstate-proxy"), "--version").stdout.strip(),
        run(sys.executable, "-m", "skillstate", "--version").stdout.strip(),
    }
    assert len(outs) == 1 and outs.pop().startswith("skillstate-proxy ")


def test_help_lists_flags_env_endpoints_and_session_header() -> None:
    out = run(str(BIN / "skillstate"), "--help").stdout
    for flag in (
        "--config",
        "--upstream",
        "--port",
        "--host",
        "--schema",
        "--data-dir",
        "--verbose",
    ):
        assert flag in out
    for var in (
        "SKILLSTATE_UPSTREAM", "SKILLSTATE_API_KEY", "SKILLSTATE_PORT", "SKILLSTATE_HOST",
        "SKILLSTATE_SCHEMA", "SKILLSTATE_INITIAL_STATE", "SKILLSTATE_CONFIG",
        "SKILLSTATE_DATA_DIR", "SKILLSTATE_VERBOSE",
    ):  # fmt: skip
        assert var in out
    for path in (
        "/v1/chat/completions",
        "/v1/messages",
        "/v1/models",
        "/health",
        "/state",
        "/cost",
    ):
        assert path in out
    assert SESSION_HEADER in out


def _mounted() -> set[tuple[str, str]]:
    """(method, path) of every route the app mounts, ``{param}`` as ``{}``; a path served
    with and without /v1 once, with it; HEAD (Starlette's, with GET) and post_only (the
    405 of a POST-only path) left out."""
    from starlette.routing import Mount, Route

    from skillstate.web.failures import post_only
    from skillstate.web.routes import ROUTES

    paths = {getattr(r, "path", "") for r in ROUTES}
    out = set()
    for r in ROUTES:
        assert isinstance(r, (Route, Mount)), r
        if r.path.startswith("/") and "/v1" + r.path in paths:
            continue
        if isinstance(r, Mount):
            out.add(("GET", r.path))
            continue
        if r.endpoint is post_only:
            continue
        path = re.sub(r"\{[^}]*\}", "{}", r.path)
        out |= {(m, path) for m in (r.methods or ()) if m != "HEAD"}
    return out


def _in_help(text: str) -> set[tuple[str, str]]:
    """(method, path) of each endpoint line of --help: ``METHOD[|METHOD] PATH ...``, the
    query (``?...``, ``[?...]``) dropped, an optional ``[/segment]`` as both paths."""
    out = set()
    for methods, path in re.findall(r"^  ([A-Z]+(?:\|[A-Z]+)*) +(/\S*)", text, re.M):
        path = re.sub(r"\{[^}]*\}", "{}", re.split(r"\[?\?", path)[0])
        optional = re.fullmatch(r"(.*)\[(/[^\]]*)\]", path)
        paths = [optional[1], optional[1] + optional[2]] if optional else [path]
        out |= {(m, p) for m in methods.split("|") for p in paths}
    return out


def test_help_lists_every_route_the_app_mounts_and_no_other() -> None:
    from skillstate.cli.main import ENDPOINTS

    mounted, listed = _mounted(), _in_help(ENDPOINTS)
    assert ("GET", "/v1/responses/{}/input_items") in mounted  # the walk sees every kind
    assert mounted - listed == set(), "routes --help leaves out"
    assert listed - mounted == set(), "--help lists routes the app does not mount"


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--port", "99999"], {}, "--port"),
        # int() would read these as 8080 and 1: digits 0-9 only
        (["--port", "8_080"], {}, "--port: must be a whole number from 0 to 65535, got '8_080'"),
        (["--port", "\uff11"], {}, "--port: must be a whole number from 0 to 65535"),
        (["--upstream", "ftp://nope"], {}, "url"),
        (["--config", "/nonexistent.json", "--upstream", "http://x"], {}, "not found"),
        (["--upstream", "http://x"], {"SKILLSTATE_INITIAL_STATE": "[]"}, "initial_state"),
        ([], {}, "upstreams"),
    ],
)
def test_bad_config_one_line_nonzero_no_traceback(
    tmp_path: Path, args: list[str], env: dict[str, str], needle: str
) -> None:
    r = run(
        str(BIN / "skillstate"), "--data-dir", str(tmp_path), *args,
        env=proxy_env(**env), cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert lines and needle in lines[-1], r.stderr
    assert "Traceback" not in r.stderr
    assert len([ln for ln in lines if not ln.startswith("usage:")]) == 1, r.stderr


def test_port_in_use_is_one_line(tmp_path: Path, fake: FakeProvider) -> None:
    port = fake.url.rsplit(":", 1)[1]
    r = run(
        str(BIN / "skillstate"), "--port", port, "--upstream", fake.url,
        "--data-dir", str(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "port" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_second_proxy_on_the_same_data_dir_is_one_line(
    tmp_path: Path, fake: FakeProvider, start_proxy_process: StartProxyProcess
) -> None:
    first = start_proxy_process(fake.url + "/v1")
    data = tmp_path / "data"  # start_proxy_process's data dir
    r = run(
        str(BIN / "skillstate"), "--port", "0", "--upstream", fake.url, "--data-dir", str(data),
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "in use by another skillstate proxy" in r.stderr
    assert f"pid {first.proc.pid}" in r.stderr
    first.stop()
    assert start_proxy_process(fake.url + "/v1").get("/health").status_code == 200  # free again


@pytest.mark.parametrize(
    "args",
    [["demo", "--turns", "0"], ["bench", "conversation", "--turns", "0"],
     ["bench", "tools", "--steps", "0"]],
)  # fmt: skip
def test_zero_turns_is_an_error_not_the_default(tmp_path: Path, args: list[str]) -> None:
    r = run(str(BIN / "skillstate"), *args, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert r.stderr.strip().endswith(("at least 3 turns", "at least 3 steps"))
    assert len(r.stderr.strip().splitlines()) == 1


def test_sigterm_finishes_in_flight_then_exits(
    fake: FakeProvider, start_proxy_process: StartProxyProcess
) -> None:
    from tests.fakeprovider import Reply

    p = start_proxy_process(fake.url)
    fake.enqueue(Reply(text='```json\n{"state_patch": {}, "action": "a"}\n```', delay=1.0))
    with httpx.Client(timeout=30) as c:
        import threading

        result: dict[str, int] = {}

        def call() -> None:
            r = c.post(
                p.v1 + "/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
            )
            result["status"] = r.status_code

        t = threading.Thread(target=call)
        t.start()
        fake.wait_for(lambda reqs: len(reqs) == 1)
        err = p.stop()
        t.join()
    assert result.get("status") == 200, err
    # uvicorn re-raises the signal after its graceful shutdown, as a service should.
    assert p.proc is not None and p.proc.returncode in (0, -15)
    assert "Traceback" not in err


def test_verbose_logs_one_line_per_request_without_secrets(
    fake: FakeProvider, start_proxy_process: StartProxyProcess
) -> None:
    p = start_proxy_process(fake.url, "--verbose")
    httpx.post(
        p.v1 + "/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "TOPSECRET-BODY"}]},
        headers={"authorization": "Bearer sk-client-secret", SESSION_HEADER: "logme"},
        timeout=10,
    )
    err = p.stop()
    lines = [ln for ln in err.splitlines() if "/v1/chat/completions" in ln]
    assert len(lines) == 1, err
    line = lines[0]
    for part in ("POST", "session=logme", "status=200", "upstream=default", "ms="):
        assert part in line
    assert "TOPSECRET" not in err and "sk-client-secret" not in err and "sk-upstream" not in err


def test_data_dir_permissions(
    fake: FakeProvider, start_proxy_process: StartProxyProcess, tmp_path: Path
) -> None:
    p = start_proxy_process(fake.url)
    httpx.post(
        p.v1 + "/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        timeout=10,
    )
    data = tmp_path / "data"
    assert oct(os.stat(data).st_mode & 0o777) == "0o700"
    assert oct(os.stat(data / "skillstate.db").st_mode & 0o777) == "0o600"


def test_executables_exist() -> None:
    assert shutil.which("skillstate", path=str(BIN)) and shutil.which(
        "skillstate-proxy", path=str(BIN)
    )


def test_the_listening_lines_say_where_the_dashboard_is(fake: FakeProvider, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "skillstate", "--upstream", fake.url + "/v1", "--port", "0"]
    argv += ["--data-dir", str(tmp_path / "d"), "--host", "0.0.0.0", "--insecure-no-auth"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=proxy_env()
    )
    try:
        assert proc.stdout is not None
        assert "listening on http://0.0.0.0:" in proc.stdout.readline()
        line = proc.stdout.readline()
        assert line.startswith("dashboard: http://127.0.0.1:") and "allowed_hosts" in line
        url = line.split()[1]
        page = httpx.get(url, timeout=10)
        assert page.status_code == 200 and "<html" in page.text.lower()
    finally:
        proc.terminate()
        proc.wait(30)


REPLAY_FIXTURE = Path(__file__).parents[1] / "fixtures" / "replay" / "codex.jsonl"


@pytest.mark.parametrize(
    "args",
    [["replay", "--json", "{out}", str(REPLAY_FIXTURE)],
     ["replay", "--html", "{out}", str(REPLAY_FIXTURE)],
     ["bench", "conversation", "--turns", "3", "--out", "{out}"],
     ["bench", "tools", "--steps", "3", "--chart", "{out}"]],
)  # fmt: skip
def test_a_report_path_that_cannot_be_written_is_one_line_before_the_run(
    tmp_path: Path, args: list[str]
) -> None:
    """The report is written at the end of the run: a path that cannot take it failed only
    then, with a traceback (``replay --json`` under a file, after the whole replay)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = str(blocker / "report.json")  # under a file: no directory can be made there
    r = run(str(BIN / "skillstate"), *(a.replace("{out}", out) for a in args), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("usage:")]
    assert len(lines) == 1 and f"cannot write {out}" in lines[0], r.stderr
    assert r.stdout == ""  # nothing ran


def test_a_report_in_a_new_directory_is_written(tmp_path: Path) -> None:
    out = tmp_path / "new" / "report.json"
    r = run(str(BIN / "skillstate"), "replay", "--json", str(out), str(REPLAY_FIXTURE))
    assert "Traceback" not in r.stderr and out.exists(), r.stderr
    assert json.loads(out.read_text())["sessions"]
