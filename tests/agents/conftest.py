"""The `agents` tier: the real agent programs people run, driven against the proxy in front of
the fake provider (tests/fakeprovider.py), scripted so that each run makes a tool call and
ends. Run it with `make test-agents`.

The programs are installed by the tier itself, at pinned versions, into a cache directory
(``$SKILLSTATE_AGENTS_CACHE``, default ``~/.cache/skillstate/agents``):

* ``@openai/codex`` and ``@anthropic-ai/claude-code`` with ``npm install --prefix`` (both
  packages ship a native binary; node only launches it);
* ``openai-agents`` from PyPI into its own venv there (it pins ``websockets<17``, which would
  downgrade the project's venv), driven as a subprocess by ``agents_sdk_driver.py``.

Only a missing ``node``/``npm`` skips the tier (with that reason); a failed install fails it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest

NPM_PACKAGES = {"@openai/codex": "0.171.0", "@anthropic-ai/claude-code": "2.1.332"}
PYPI_PACKAGES = {"openai-agents": "0.24.0"}
CACHE = Path(
    os.environ.get("SKILLSTATE_AGENTS_CACHE", Path.home() / ".cache" / "skillstate" / "agents")
)
INSTALL_TIMEOUT = 900  # a cold npm install fetches about 500 MB of native binaries


@dataclass(frozen=True)
class Agents:
    """Where the installed programs are."""

    claude: Path
    codex: Path


def _installed_version(package: str) -> str | None:
    manifest = CACHE / "node_modules" / package / "package.json"
    try:
        return str(json.loads(manifest.read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


def _npm_install() -> None:
    missing = [f"{p}@{v}" for p, v in NPM_PACKAGES.items() if _installed_version(p) != v]
    if missing:
        subprocess.run(
            ["npm", "install", "--prefix", str(CACHE), "--no-audit", "--no-fund", *missing],
            check=True,
            timeout=INSTALL_TIMEOUT,
        )


@pytest.fixture(scope="session")
def sdk_python() -> Path:
    """The python of a venv (in the cache) that has the pinned openai-agents."""
    root = CACHE / "agents-sdk-venv"
    python = root / "bin" / "python"
    pins = [f"{p}=={v}" for p, v in PYPI_PACKAGES.items()]
    stamp = root / ".installed"
    if stamp.exists() and stamp.read_text() == " ".join(pins):
        return python
    venv.create(root, with_pip=True, clear=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *pins],
        check=True,
        timeout=INSTALL_TIMEOUT,
    )
    stamp.write_text(" ".join(pins))
    return python


@pytest.fixture(scope="session")
def agents() -> Agents:
    """The pinned agent programs, installed into the cache on first use."""
    absent = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if absent:
        pytest.skip(f"{' and '.join(absent)} not on PATH: the agents tier needs Node.js and npm")
    CACHE.mkdir(parents=True, exist_ok=True)
    _npm_install()
    bin_dir = CACHE / "node_modules" / ".bin"
    return Agents(claude=bin_dir / "claude", codex=bin_dir / "codex")


def run_program(
    argv: list[str], *, env: dict[str, str], cwd: Path, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """Run one agent program to its end; its output is printed when a test fails."""
    base = {k: os.environ[k] for k in ("PATH", "LANG", "TERM") if k in os.environ}
    done = subprocess.run(
        argv, env={**base, **env}, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    sys.stdout.write(f"$ {' '.join(argv)}\nexit {done.returncode}\n{done.stdout}\n")
    sys.stderr.write(done.stderr)
    return done


@dataclass(frozen=True)
class CodexRun:
    """A finished ``codex exec``: the process, and the last message it wrote (``-o``)."""

    done: subprocess.CompletedProcess[str]
    last_message: str


def codex_home(
    root: Path,
    proxy_v1: str,
    session: str,
    *,
    model: str = "gpt-test",
    provider_name: str = "skillstate",
    settings: str = "",
) -> Path:
    """A CODEX_HOME whose config sends ``model`` to the proxy, in ``session``, with no
    retries and no approvals. ``provider_name``: Codex compacts remotely only for a provider
    named "OpenAI". ``settings``: more TOML, before the provider's table."""
    home = root / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        f"""model = "{model}"
model_provider = "skillstate"
approval_policy = "never"
sandbox_mode = "danger-full-access"
{settings}
[model_providers.skillstate]
name = "{provider_name}"
base_url = "{proxy_v1}"
env_key = "SKILLSTATE_TEST_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
http_headers = {{ "x-skillstate-session" = "{session}" }}
"""
    )
    return home


def run_codex(
    agents: Agents, root: Path, home: Path, prompt: str, *, timeout: float = 180
) -> CodexRun:
    """``codex exec`` on ``prompt`` in ``root``/work (the test fills it first), configured by
    ``home`` (:func:`codex_home`)."""
    last = root / "last.txt"
    done = run_program(
        [str(agents.codex), "exec", "--skip-git-repo-check", "-o", str(last), prompt],
        env={"CODEX_HOME": str(home), "HOME": str(root), "SKILLSTATE_TEST_KEY": "sk-dummy"},
        cwd=root / "work",
        timeout=timeout,
    )
    return CodexRun(done, last.read_text() if last.exists() else "")
