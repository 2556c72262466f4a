"""Real agent logs for the replay (issue 24): the pinned Claude Code and Codex CLI, run
against the fake provider (no proxy between them), write their own session logs. The fake
model reads three files (the third named in the first one's text, two exchanges earlier)
and answers.

``python -m tests.agents.replay_logs DIR`` refreshes the committed fixtures
(tests/fixtures/replay/) with the agents installed by the agents tier; each log is written
with the messages of the requests the agent really sent (``*.requests.json``), the ground
truth the replay's passthrough arm is checked against.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.fakeprovider import FakeProvider, Reply, ToolCall

PROMPT = "What do the notes in notes.txt say?"
ANSWER = "load_config_file reads the file; helpers_module_version is 3."
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "replay"


def _workdir(root: Path) -> Path:
    work = root / "work"
    work.mkdir(parents=True)
    (work / "notes.txt").write_text(
        f"the answer is 42\nsee {work}/config_loader.py and {work}/helpers_module.py\n"
    )
    (work / "config_loader.py").write_text("def load_config_file(path):\n    return open(path)\n")
    (work / "helpers_module.py").write_text("helpers_module_version = 3\n")
    return work


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> None:
    base = {k: os.environ[k] for k in ("PATH", "LANG", "TERM") if k in os.environ}
    done = subprocess.run(
        argv, env={**base, **env}, cwd=cwd, capture_output=True, text=True, timeout=180
    )
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {done.returncode}: {done.stderr[-2000:]}")


def _requests(fake: FakeProvider, path: str, key: str) -> list[Any]:
    return [r.json[key] for r in fake.requests if r.path == path and r.status == 200]


def write_claude_code_log(claude: Path, root: Path) -> tuple[Path, list[Any]]:
    """Run ``claude -p`` (Anthropic cache billing in the fake); (its session log, the
    messages of each request it sent)."""
    work, home = _workdir(root), root / "home"
    home.mkdir()
    thinking = [{"type": "thinking", "thinking": "read the notes", "signature": "c2lnMQ=="}]
    with FakeProvider(cache="anthropic") as fake:
        fake.enqueue(
            Reply(
                thinking=thinking,
                tool_calls=[
                    ToolCall("Read", {"file_path": str(work / "notes.txt")}, id="toolu_01Notes")
                ],
            ),
            Reply(
                text="The notes name two files.",
                tool_calls=[
                    ToolCall(
                        "Read", {"file_path": str(work / "config_loader.py")}, id="toolu_01Loader"
                    )
                ],
            ),
            Reply(
                tool_calls=[
                    ToolCall(
                        "Read", {"file_path": str(work / "helpers_module.py")}, id="toolu_01Helpers"
                    )
                ]
            ),
            Reply(text=ANSWER),
        )
        env = {
            "HOME": str(home),
            "ANTHROPIC_BASE_URL": fake.url,
            "ANTHROPIC_API_KEY": "sk-ant-dummy",
            "CLAUDE_CODE_MAX_RETRIES": "0",
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
        }
        _run(
            [str(claude), "-p", PROMPT, "--output-format", "json", "--allowedTools", "Read"],
            env,
            work,
        )
        sent = _requests(fake, "/v1/messages", "messages")
    (log,) = (home / ".claude" / "projects").glob("*/*.jsonl")
    return log, sent


def write_codex_rollout(codex: Path, root: Path) -> tuple[Path, list[Any]]:
    """Run ``codex exec`` (Responses API); (its rollout, the input of each request)."""
    work, home = _workdir(root), root / "codex-home"
    home.mkdir()
    with FakeProvider(cache="openai") as fake:
        (home / "config.toml").write_text(
            f"""model = "gpt-5"
model_provider = "fake"
approval_policy = "never"
sandbox_mode = "danger-full-access"
web_search = "disabled"
[features]
multi_agent = false
[model_providers.fake]
name = "fake"
base_url = "{fake.url}/v1"
env_key = "FAKE_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
"""
        )
        fake.enqueue(
            Reply(tool_calls=[ToolCall("exec_command", {"cmd": "cat notes.txt"}, id="call_notes")]),
            Reply(
                text="The notes name two files.",
                tool_calls=[
                    ToolCall(
                        "exec_command", {"cmd": f"cat {work}/config_loader.py"}, id="call_loader"
                    )
                ],
            ),
            Reply(
                tool_calls=[
                    ToolCall(
                        "exec_command", {"cmd": f"cat {work}/helpers_module.py"}, id="call_helpers"
                    )
                ]
            ),
            Reply(text=ANSWER),
        )
        env = {"HOME": str(root), "CODEX_HOME": str(home), "FAKE_KEY": "sk-dummy"}
        _run([str(codex), "exec", "--skip-git-repo-check", PROMPT], env, work)
        sent = _requests(fake, "/v1/responses", "input")
    (log,) = (home / "sessions").glob("*/*/*/rollout-*.jsonl")
    return log, sent


def main(argv: list[str]) -> int:
    from tests.agents.conftest import CACHE

    bins = CACHE / "node_modules" / ".bin"
    scratch = Path(argv[0]) if argv else Path("/tmp/skillstate-replay-fixtures")
    shutil.rmtree(scratch, ignore_errors=True)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, write, agent in (
        ("claude-code", write_claude_code_log, bins / "claude"),
        ("codex", write_codex_rollout, bins / "codex"),
    ):
        log, sent = write(agent, scratch / name)
        shutil.copyfile(log, FIXTURES / f"{name}.jsonl")
        (FIXTURES / f"{name}.requests.json").write_text(json.dumps(sent) + "\n")
        print(f"{FIXTURES / name}.jsonl: {log.stat().st_size} bytes, {len(sent)} requests")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
