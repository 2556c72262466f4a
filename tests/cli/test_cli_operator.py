"""Operator commands run as a user runs them: what a mistake gets (one line, a non-zero
exit, nothing left behind) before anything is written or run."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import skillstate.cli.main as cli_main
from tests.conftest import proxy_env
from tests.fakeprovider import FakeProvider


def skillstate(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "skillstate", *args],
        capture_output=True, text=True, timeout=120, env=proxy_env(**env), cwd=cwd,
    )  # fmt: skip


def refused(*args: str, cwd: Path, **env: str) -> str:
    """The one line a command that must not start prints (a proxy that starts instead would
    run until the timeout: a failure saying so, in seconds, not two minutes)."""
    try:
        r = subprocess.run(
            [sys.executable, "-m", "skillstate", *args],
            capture_output=True, text=True, timeout=20, env=proxy_env(**env), cwd=cwd,
        )  # fmt: skip
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"started instead of refusing: {e.stdout!r}") from None
    assert r.stdout == "", r
    return one_line(r)


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


@pytest.mark.parametrize("command", [["cost"], ["cost", "--json"], ["keys", "list"]])
@pytest.mark.parametrize("content", [b"", "header"], ids=["zero bytes", "a header, no table"])
def test_a_store_file_with_no_tables_is_no_store_to_read_and_stays_as_it_was(
    tmp_path: Path, command: list[str], content: bytes | str
) -> None:
    """`cost` and `keys list` on an empty skillstate.db (a `touch`, or a database nothing
    wrote to) wrote a whole new store into it and answered 'no spend' / 'no keys'."""
    data = tmp_path / "d"
    data.mkdir()
    db = data / "skillstate.db"
    if isinstance(content, bytes):
        db.write_bytes(content)
    else:
        with sqlite3.connect(db) as made:
            made.execute("PRAGMA user_version = 7")  # a header page, no table
        made.close()
    before = db.read_bytes()
    r = skillstate(command[0], "--data-dir", str(data), *command[1:], cwd=tmp_path)
    assert one_line(r) == f"skillstate: data_dir: no store at {db}"
    assert r.stdout == "" and db.read_bytes() == before
    assert sorted(p.name for p in data.iterdir()) == ["skillstate.db"]


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


def test_a_config_file_value_a_flag_overrides_is_still_refused_in_one_line(
    tmp_path: Path,
) -> None:
    """``"mode": "bogus"`` in the file with ``--mode state`` started: the broken file showed
    only on the day the flag was dropped."""
    cfg = tmp_path / "bad.json"
    cfg.write_text(json.dumps({"mode": "bogus"}))
    base = ["--config", str(cfg), "--upstream", "http://127.0.0.1:1/v1", "--port", "0",
            "--data-dir", str(tmp_path / "d")]  # fmt: skip
    alone = refused(*base, cwd=tmp_path)
    assert alone.startswith("skillstate: mode: Input should be 'state'"), alone
    assert refused(*base, "--mode", "state", cwd=tmp_path) == alone
    assert refused(*base, cwd=tmp_path, SKILLSTATE_MODE="state") == alone
    assert not (tmp_path / "d").exists()


def test_two_spellings_of_one_setting_in_a_config_file_are_refused_in_one_line(
    tmp_path: Path,
) -> None:
    """``{"listenPort": 18858, "port": 18859}`` started on 18859 without a word."""
    cfg = tmp_path / "two.json"
    cfg.write_text('{"listenPort": 18798, "port": 0}')
    line = refused("--config", str(cfg), "--upstream", "http://127.0.0.1:1/v1",
                   "--data-dir", str(tmp_path / "d"), cwd=tmp_path)  # fmt: skip
    assert line == (
        "skillstate: config: 'listenPort' and 'port' are the same setting (port); keep one"
    )


# Runs the command as an entry point does, after a line on stdout that says the interpreter
# is up and about to import the CLI (argparse and the choices, which the CLI's module
# imports at its top, already loaded: what follows is what main() guards).
_EARLY_SIGINT_CHILD = """
import argparse, runpy, sys
import skillstate.choices
entry, sys.argv = sys.argv[1], ["skillstate", *sys.argv[2:]]
print("importing", flush=True)
if entry == "-m":
    runpy.run_module("skillstate", run_name="__main__", alter_sys=True)
else:
    from skillstate.cli.main import main
    sys.exit(main())
"""


@pytest.mark.parametrize("entry", ["-m", "script"])
@pytest.mark.parametrize("delay", [0.05, 0.15])
def test_ctrl_c_while_serve_imports_is_quiet(
    tmp_path: Path, refused_url: str, entry: str, delay: float
) -> None:
    """A Ctrl-C in the first third of a second (pydantic and the rest importing) printed a
    30-line KeyboardInterrupt traceback."""
    argv = [sys.executable, "-c", _EARLY_SIGINT_CHILD, entry, "serve", "--port", "0",
            "--upstream", refused_url + "/v1", "--data-dir", str(tmp_path / "d")]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=proxy_env(), cwd=tmp_path)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "importing\n"
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 1, err
    assert proc.returncode == 130, err


_SWALLOWED_SIGINT_CHILD = """
import sys
import skillstate.app.factory as factory
from skillstate.cli.main import main
real = factory.create_app
class Lost:
    def __del__(self):
        raise KeyboardInterrupt  # a Ctrl-C landing where Python cannot raise it
def create_app(*args, **kwargs):
    Lost()
    return real(*args, **kwargs)
factory.create_app = create_app
sys.exit(main(sys.argv[1:]))
"""


def test_a_ctrl_c_python_could_not_raise_during_start_up_still_stops_serve(
    tmp_path: Path, refused_url: str
) -> None:
    """A Ctrl-C whose KeyboardInterrupt landed in a callback (the import lock's weakref
    callback, seen in CI) printed 'Exception ignored ... Traceback' and was lost: the proxy
    went on to listen. Now it is raised before the proxy listens: exit 130, quiet."""
    argv = [sys.executable, "-c", _SWALLOWED_SIGINT_CHILD, "serve", "--port", "0",
            "--upstream", refused_url + "/v1", "--data-dir", str(tmp_path / "d")]  # fmt: skip
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=proxy_env(),
                           cwd=tmp_path)  # fmt: skip
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"served after the Ctrl-C: {e.stdout!r}") from None
    assert r.returncode == 130, r
    assert "listening" not in r.stdout and r.stderr == "", r


def test_a_ctrl_c_python_could_not_raise_during_a_command_is_exit_130(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The command ran to its end (the interrupt was lost where it landed): exit 130, and
    the unraisable hook of the caller is back in place afterwards."""

    class Lost:
        def __del__(self) -> None:
            raise KeyboardInterrupt

    def run(argv: list[str]) -> int:
        Lost()
        return 0

    before = sys.unraisablehook
    monkeypatch.setattr(cli_main, "_run", run)
    assert cli_main.main(["cost"]) == 130
    assert sys.unraisablehook is before
    monkeypatch.setattr(cli_main, "_run", lambda argv: 0)
    assert cli_main.main(["cost"]) == 0  # none kept from the run before


def test_the_cli_module_imports_no_config_before_main_runs() -> None:
    """The console script imports it before main() (and its Ctrl-C guard) runs: the config
    (pydantic, jsonschema) is imported inside main()."""
    code = "import sys, skillstate.cli.main; print(sorted(m for m in sys.modules if m in"
    code += " ('pydantic', 'skillstate.config', 'jsonschema')))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "[]", r


@pytest.mark.parametrize("bench", [["conversation", "--turns", "3"], ["validity"]])
def test_a_top_level_upstream_before_bench_is_checked_in_one_line(
    tmp_path: Path, bench: list[str]
) -> None:
    """``skillstate --upstream BAD bench …`` printed pydantic's four-line error."""
    r = skillstate("--upstream", "ftp://usr9:pw9@x", "bench", *bench, "--model", "m",
                   cwd=tmp_path, SKILLSTATE_API_KEY="x")  # fmt: skip
    assert one_line(r) == (
        "skillstate: argument --upstream: must be an http(s) URL, got 'ftp://***@x' (see --help)"
    )
    assert "pw9" not in r.stderr and r.stdout == ""


@pytest.mark.parametrize("action", [["list"], ["list", "--json"], ["revoke", "b"], ["rotate", "c"]])
def test_keys_actions_take_the_store_flags_after_them(tmp_path: Path, action: list[str]) -> None:
    """``keys list --data-dir X`` was refused ("unrecognized arguments"), though
    ``keys --data-dir X list`` and ``cost --data-dir X`` work."""
    data, cfg = tmp_path / "d", tmp_path / "c.json"
    cfg.write_text("{}")
    for name in ("a", "b", "c"):
        r = skillstate("keys", "create", "--name", name, "--data-dir", str(data),
                       "--config", str(cfg), cwd=tmp_path)  # fmt: skip
        assert r.returncode == 0 and r.stdout.startswith("sk-ss-"), r
    after = skillstate("keys", *action, "--data-dir", str(data), "--config", str(cfg),
                       cwd=tmp_path)  # fmt: skip
    assert after.returncode == 0, after
    if action[0] == "list":
        before = skillstate("keys", "--data-dir", str(data), *action, cwd=tmp_path)
        assert after.stdout == before.stdout and "a" in after.stdout
    # The one after the action wins over the one before it, as for cost.
    r = skillstate("keys", "--data-dir", str(tmp_path / "typo"), "list", "--data-dir",
                   str(data), cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0 and r.stdout.startswith("a  active"), r


def _postgres_url(refused_url: str) -> str:
    port = refused_url.rsplit(":", 1)[1]
    return (
        f"postgresql://usr9@127.0.0.1:{port}/db?password=SECRET9&sslpassword=SECRET8"
        "&passfile=/etc/pf9"
    )


@pytest.mark.parametrize(
    "command",
    [["cost"], ["keys", "list"], ["migrate"], ["serve", "--upstream", "http://127.0.0.1:1/v1"],
     ["store", "copy", "--from", "URL", "--to", "sqlite:///{tmp}/x.db"],
     ["store", "copy", "--from", "sqlite:///{tmp}/s/skillstate.db", "--to", "URL"]],
)  # fmt: skip
def test_a_postgres_store_urls_query_password_is_masked_in_every_message(
    tmp_path: Path, refused_url: str, command: list[str]
) -> None:
    """``?password=`` (and ``sslpassword``) were printed in clear wherever the URL was
    shown, though the user part's password was masked; ``passfile`` is a path, shown."""
    pytest.importorskip("asyncpg")
    url = _postgres_url(refused_url)
    if command[0] == "store":
        r = skillstate("keys", "--data-dir", str(tmp_path / "s"), "create", "--name", "a",
                       cwd=tmp_path)  # fmt: skip
        assert r.returncode == 0, r
        argv = [url if a == "URL" else a.format(tmp=tmp_path) for a in command]
        r = skillstate(*argv, cwd=tmp_path)
    else:
        r = skillstate(*command, "--data-dir", str(tmp_path / "d"), cwd=tmp_path,
                       SKILLSTATE_STORE=url)  # fmt: skip
    line = one_line(r)
    assert "SECRET" not in r.stderr + r.stdout, r
    if "postgresql://" in line:  # the lines that name the store show it masked
        assert "/db?password=***&sslpassword=***&passfile=/etc/pf9" in line, line


def test_the_start_up_line_names_a_postgres_store_masked() -> None:
    """What ``serve``'s start-up line and every store error names (``describe_store``)."""
    pytest.importorskip("asyncpg")
    from skillstate.config import Settings
    from skillstate.store.factory import describe_store

    settings = Settings(store="postgresql://u@h/db?password=SECRET9&sslpassword=SECRET8")
    assert describe_store(settings) == "postgresql://u@h/db?password=***&sslpassword=***"
