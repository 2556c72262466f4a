"""Where the numbers were measured: CPU, Python, packages, git revision, load."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any


def _git_revision() -> dict[str, Any]:
    here = Path(__file__).resolve().parent

    def git(*a: str) -> str | None:
        try:
            r = subprocess.run(
                ["git", "-C", str(here), *a], capture_output=True, text=True, timeout=5
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    rev = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"revision": rev or "unknown", "dirty": bool(dirty) if dirty is not None else None}


def machine_info() -> dict[str, Any]:
    from importlib import metadata

    cpu_model = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    versions: dict[str, str | None] = {}
    for pkg in (
        "skillstate-proxy",
        "uvicorn",
        "starlette",
        "aiohttp",
        "uvloop",
        "httptools",
        "orjson",
    ):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    affinity = None
    with contextlib.suppress(AttributeError, OSError):
        affinity = len(os.sched_getaffinity(0))
    load = None
    with contextlib.suppress(OSError, AttributeError):
        load = [round(x, 2) for x in os.getloadavg()]
    return {
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "cpu_model": cpu_model,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "git": _git_revision(),
        "packages": versions,
        "loadavg_start": load,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
