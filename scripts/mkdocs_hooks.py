"""MkDocs hooks: pages that are generated from the code at build time, so they cannot drift.

``<!-- config-reference -->`` becomes the configuration reference (scripts/config_reference.py,
from the pydantic config model); ``<!-- cli-help -->`` becomes ``skillstate --help`` and each
command's ``--help``, as the installed CLI prints them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

_HERE = Path(__file__).parent
_COMMANDS = (
    [], ["serve"], ["demo"], ["cost"], ["keys"], ["keys", "create"], ["keys", "list"],
    ["migrate"], ["store", "copy"], ["replay"], ["bench"], ["bench", "conversation"],
    ["bench", "tools"], ["bench", "validity"], ["bench", "bfcl"], ["bench", "overhead"],
    ["bench", "replay"],
)  # fmt: skip


def _config_reference() -> str:
    spec = importlib.util.spec_from_file_location("config_reference", _HERE / "config_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.render())


# One interpreter prints every command's help (a process per command made the build 20 s
# slower): each --help ends in SystemExit, and a line of NUL separates them.
_HELP_ALL = """
import contextlib, json, sys
from skillstate.cli.main import main
for argv in json.loads(sys.argv[1]):
    with contextlib.suppress(SystemExit):
        main([*argv, "--help"])
    print("\\0", flush=True)
"""


def _cli_help() -> str:
    env = {**os.environ, "COLUMNS": "100"}
    texts = subprocess.run(
        [sys.executable, "-c", _HELP_ALL, json.dumps(_COMMANDS)],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.split("\0\n")  # fmt: skip
    out = []
    for argv, text in zip(_COMMANDS, texts[:-1], strict=True):
        title = " ".join(["skillstate", *argv])
        out += [f"### `{title} --help`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(out)


def on_page_markdown(markdown: str, **_: Any) -> str:
    if "<!-- config-reference -->" in markdown:
        markdown = markdown.replace("<!-- config-reference -->", _config_reference())
    if "<!-- cli-help -->" in markdown:
        markdown = markdown.replace("<!-- cli-help -->", _cli_help())
    return markdown
