"""A store that cannot be opened once uvicorn starts the app (after the CLI's pre-flight, or
in an in-process server, which has none) is one line, not uvicorn's start-up traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from skillstate.app import server
from skillstate.app.server import ProxyServer
from skillstate.cli import main as cli
from tests.conftest import proxy_env, settings_from_cli


@pytest.fixture
def corrupt_data(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    (data / "skillstate.db").write_bytes(b"this is not a database, not even close\n" * 4)
    return data


def _argv(data: Path) -> list[str]:
    return ["--port", "0", "--data-dir", str(data), "--upstream", "http://127.0.0.1:9/v1"]


def test_in_process_server_reports_a_store_it_cannot_open_in_one_line(
    corrupt_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    settings = settings_from_cli(_argv(corrupt_data), proxy_env(SKILLSTATE_API_KEY="k"), tmp_path)
    with pytest.raises(RuntimeError, match=r"cannot open store .*file is not a database"):
        ProxyServer(settings).start()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Application startup failed" not in err, err


def test_serve_reports_a_store_that_fails_after_the_preflight_in_one_line(
    corrupt_data: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # The database went bad between the pre-flight and the app's start-up.
    monkeypatch.setattr(server, "preflight_store", lambda settings: None)
    monkeypatch.setenv("SKILLSTATE_API_KEY", "k")
    assert cli.main(_argv(corrupt_data)) == 2
    err = capfd.readouterr().err
    assert err.splitlines() == [
        f"skillstate: cannot open store {corrupt_data / 'skillstate.db'}: file is not a database"
    ], err
