"""CPU time of another process (the proxy under test)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def proc_cpu_seconds(pid: int) -> tuple[float, str]:
    """CPU time (user+system) of a process, and which clock gave it.

    Prefers the scheduler's nanosecond counters summed over the process's threads
    (``/proc/PID/task/*/schedstat``), then psutil, then ``/proc/PID/stat`` utime+stime
    (clock ticks, usually 10 ms)."""
    task_dir = Path(f"/proc/{pid}/task")
    try:
        total = 0
        for t in task_dir.iterdir():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                total += int((t / "schedstat").read_text().split()[0])
        if total:
            return total / 1e9, "schedstat"
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil  # type: ignore[import-untyped,unused-ignore]

        ct = psutil.Process(pid).cpu_times()
        return float(ct.user + ct.system), "psutil"
    except Exception:
        pass
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks, "proc-stat"
