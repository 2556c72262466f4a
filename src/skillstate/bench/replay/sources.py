"""Which logs to replay: files and directories on the command line, each file's format, and
its sessions, one at a time. A file that cannot be replayed becomes one ``Problem`` line
and the rest goes on.

Formats (detected from the content, not the name): Claude Code JSONL, Codex CLI rollout
JSONL, a JSON list of ``{id, tools, messages}`` transcripts, one such transcript.
A directory is searched recursively for ``*.jsonl`` and ``*.json`` files.
"""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import orjson

from . import claudecode, codex, transcripts
from .jsonstream import LogError
from .session import Session

__all__ = ["FORMATS", "Problem", "detect", "iter_sessions", "log_files"]

FORMATS = ("claude-code", "codex", "transcripts", "transcript")
# Lines after the first looked at for one that names the format (each read whole).
SNIFF_LINES = 200
BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class Problem:
    """A file (or part of one) that was not replayed, and the one line that says why."""

    path: str
    reason: str

    def line(self) -> str:
        return f"{self.path}: {self.reason}"


def log_files(paths: Iterable[str | Path]) -> Iterator[Path | Problem]:
    """The files named, and the ``*.jsonl`` / ``*.json`` files under the directories named
    (sorted); a missing or unreadable path, a directory with none, or one under a directory
    named that cannot be searched is a Problem."""
    for raw in paths:
        path = Path(raw).expanduser()
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:
            yield Problem(str(path), "no such file or directory")
            continue
        except OSError as e:  # e.g. under a directory this user may not search
            yield Problem(str(path), e.strerror or str(e))
            continue
        if stat.S_ISDIR(mode):
            yield from _logs_under(path)
        elif stat.S_ISREG(mode):
            yield path
        else:
            yield Problem(str(path), "not a regular file")


def _logs_under(top: Path) -> Iterator[Path | Problem]:
    unsearched: list[Problem] = []

    def unreadable(e: OSError) -> None:
        where = str(e.filename) if e.filename else str(top)
        unsearched.append(Problem(where, f"{e.strerror or e}; its logs were not searched"))

    found = sorted(
        Path(root, name)
        for root, _, names in os.walk(top, onerror=unreadable)
        for name in names
        if name.endswith((".jsonl", ".json")) and Path(root, name).is_file()
    )
    yield from unsearched
    if not found and not unsearched:
        yield Problem(str(top), "a directory with no .jsonl or .json logs")
    yield from found


def detect(f: IO[bytes]) -> str:
    """The format of a file from its first lines (read from where ``f`` is, and put back
    there); LogError when it is none of ours."""
    start = f.tell()
    try:
        return _detect(f)
    finally:
        f.seek(start)


def _detect(f: IO[bytes]) -> str:
    lines = (line for line in f if line.strip())
    first = next(lines, b"").lstrip()
    if not first:
        raise LogError("empty file")
    if first[:1] == b"[":
        return "transcripts"
    if first[:1] != b"{":
        raise LogError("unknown format (not JSON lines or a JSON transcript)")
    first_is_json, scanned = True, 0
    # A log may start with lines of types this replay does not know (Claude Code writes
    # ``permission-mode`` or ``file-history-snapshot`` lines first), or a corrupt one: the
    # first line that names a format decides.
    for scanned, line in enumerate(itertools.chain([first], itertools.islice(lines, SNIFF_LINES))):
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            first_is_json = first_is_json and scanned > 0
            continue
        if claudecode.is_claude_code_line(obj):
            return "claude-code"
        if codex.is_codex_line(obj):
            return "codex"
        if scanned == 0 and transcripts.is_transcript(obj):
            return "transcript"
    if not first_is_json:
        if scanned > 0 or b'"messages"' in first:
            return "transcript"  # a pretty-printed JSON object
        raise LogError("unknown format (the first line is not a JSON object)")
    raise LogError("unknown format (neither a Claude Code log, a Codex rollout nor a transcript)")


def _why(e: Exception) -> str:
    text = str(e).splitlines()[0][:200] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _skipped_line(skipped: list[str]) -> str:
    more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
    return f"{skipped[0]}{more}; skipped, the rest replayed"


def _sessions(fmt: str, f: IO[bytes], name: str) -> Iterator[Session | LogError]:
    if fmt == "claude-code":
        yield claudecode.read_claude_code(f, name)
    elif fmt == "codex":
        yield codex.read_codex(f, name)
    elif fmt == "transcript":
        yield transcripts.read_transcript(f, name)
    else:
        yield from transcripts.iter_transcript_list(f, name)


def iter_sessions(paths: Iterable[str | Path]) -> Iterator[tuple[str, Session | Problem]]:
    """(file, session or problem) for every session in the logs named, read lazily: a file
    is opened when its turn comes, and a list of transcripts yields one at a time."""
    for item in log_files(paths):
        if isinstance(item, Problem):
            yield item.path, item
            continue
        name, fmt = str(item), "JSON"
        try:
            with item.open("rb") as f:
                # A UTF-8 byte order mark (Windows editors save one) is not the log's.
                if f.read(len(BOM)) != BOM:
                    f.seek(0)
                fmt = detect(f)
                for s in _sessions(fmt, f, item.stem):
                    if isinstance(s, LogError):
                        yield name, Problem(name, str(s))
                        continue
                    if s.skipped:
                        yield name, Problem(name, _skipped_line(s.skipped))
                    yield name, s
        except LogError as e:
            yield name, Problem(name, str(e))
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            # Valid JSON of a recognised format whose records have another shape than the
            # readers expect (a value of the wrong type where a field was): a hand-edited or
            # newer log. The file is one problem line, not a traceback that ends the replay.
            why = f"a {fmt} log with a record this replay cannot read ({_why(e)})"
            yield name, Problem(name, why)
        except OSError as e:
            yield name, Problem(name, e.strerror or str(e))
