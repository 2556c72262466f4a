"""The benches' progress: phase messages become bars with an ETA on a terminal, plain lines
elsewhere."""

from __future__ import annotations

import io

from rich.console import Console

from skillstate.bench.console import phase_progress, progress_bar


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=100), out


def test_phases_are_bars_with_eta_on_a_terminal() -> None:
    console, out = _console(terminal=True)
    with phase_progress(console, enabled=True) as say:
        say("fast upstream: http://127.0.0.1:1 (pid 7)")
        say("sequential round 1/7")
        say("sequential round 2/7")
    text = out.getvalue()
    assert "fast upstream: http://127.0.0.1:1 (pid 7)" in text
    assert "sequential round" in text and "1/7" in text and "ETA" in text


def test_phases_are_lines_off_a_terminal() -> None:
    console, out = _console(terminal=False)
    with phase_progress(console, enabled=False) as say:
        say("sequential round 1/7")
        say("concurrency segment 2/4 (direct, 5 s)")
    assert out.getvalue() == "  sequential round 1/7\n  concurrency segment 2/4 (direct, 5 s)\n"


def test_arm_bars_show_elapsed_and_eta() -> None:
    console, out = _console(terminal=True)
    with progress_bar(console) as update:
        assert update is not None
        update("state", 3, 10)
    assert "3/10" in out.getvalue() and "ETA" in out.getvalue()
