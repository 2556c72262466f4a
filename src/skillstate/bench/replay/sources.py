"""Which logs to replay: files and directories on the command line, each file's format, and
its sessions, one at a time. A file that cannot be replayed becomes one ``Problem`` line
and the rest goes on.

Formats (detected from the content, not the name): Claude Code JSONL, Codex CLI rollout
JSONL, a JSON list of ``{id, tools, messages}`` transcripts, one such transcript.
A directory is searched recursively for ``*.jsonl`` and ``*.json`` files, less the
bookkeeping files the agents keep beside their logs (see ``BOOKKEEPING_NAMES``); a file named
twice (after resolving links) is read once. A session with no model call is a ``Skipped``
note, not a problem.
"""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from . import claudecode, codex, transcripts
from .jsonstream import EmptyLog, LogError
from .session import Session

__all__ = ["FORMATS", "Problem", "Skipped", "detect", "iter_sessions", "log_files"]

FORMATS = ("claude-code", "codex", "transcripts", "transcript")
# Lines after the first looked at for one that names the format (each read whole).
SNIFF_LINES = 200
BOM = b"\xef\xbb\xbf"
# Files Claude Code (2.1.2 and later) writes beside its session logs, found when a directory
# is searched: the session index, a sub-agent's ``agent-<id>.meta.json``, and the directories
# of tool outputs it keeps out of the log. None of them is a session.
BOOKKEEPING_NAMES = frozenset({"sessions-index.json"})
BOOKKEEPING_SUFFIXES = (".meta.json",)
BOOKKEEPING_DIRS = frozenset({"tool-results"})


@dataclass(frozen=True, slots=True)
class Problem:
    """A file (or part of one) that was not replayed, and the one line that says why."""

    path: str
    reason: str

    def line(self) -> str:
        return f"{self.path}: {self.reason}"


class Skipped(Problem):
    """A file or session with nothing to replay and nothing wrong (a session without a model
    call): said as a note; it does not make the replay fail."""


def log_files(paths: Iterable[str | Path]) -> Iterator[Path | Problem]:
    """The files named, and the ``*.jsonl`` / ``*.json`` files under the directories named
    (sorted), each once; a missing or unreadable path, a directory with none, or one under a
    directory named that cannot be searched is a Problem."""
    seen: set[Path] = set()
    for item in _named_files(paths):
        if isinstance(item, Path):
            try:
                real = item.resolve()
            except (OSError, RuntimeError):  # a symlink loop: opening it says why
                real = item
            if real in seen:
                continue  # named twice (or a link to a file named): its calls once
            seen.add(real)
        yield item


def _named_files(paths: Iterable[str | Path]) -> Iterator[Path | Problem]:
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

    found: list[Path] = []
    for root, dirs, names in os.walk(top, onerror=unreadable):
        dirs[:] = [d for d in dirs if d not in BOOKKEEPING_DIRS]
        found.extend(
            Path(root, name) for name in names if _is_log_name(name) and Path(root, name).is_file()
        )
    found.sort()
    yield from unsearched
    if not found and not unsearched:
        yield Problem(str(top), "a directory with no .jsonl or .json logs")
    yield from found


def _is_log_name(name: str) -> bool:
    return (
        name.endswith((".jsonl", ".json"))
        and name not in BOOKKEEPING_NAMES
        and not name.endswith(BOOKKEEPING_SUFFIXES)
    )


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
    # Only Claude Code's own line types (a summary-only or snapshot-only file, whose lines
    # name no session): its log, with no call in it.
    only_claude_types = True
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
        only_claude_types = only_claude_types and claudecode.is_bookkeeping_line(obj)
    if not first_is_json:
        if scanned > 0 or b'"messages"' in first:
            return "transcript"  # a pretty-printed JSON object
        raise LogError("unknown format (the first line is not a JSON object)")
    if only_claude_types:
        return "claude-code"
    raise LogError("unknown format (neither a Claude Code log, a Codex rollout nor a transcript)")


def _why(e: Exception) -> str:
    text = str(e).splitlines()[0][:200] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _skipped_line(skipped: list[str]) -> str:
    more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
    return f"{skipped[0]}{more}; skipped, the rest replayed"


def _sessions(
    fmt: str, f: IO[bytes], name: str, seen_calls: set[Any]
) -> Iterator[Session | LogError]:
    if fmt == "claude-code":
        yield claudecode.read_claude_code(f, name, seen_calls)
    elif fmt == "codex":
        yield codex.read_codex(f, name, seen_calls)
    elif fmt == "transcript":
        yield transcripts.read_transcript(f, name)
    else:
        yield from transcripts.iter_transcript_list(f, name)


def iter_sessions(
    paths: Iterable[str | Path], seen_calls: set[Any] | None = None
) -> Iterator[tuple[str, Session | Problem]]:
    """(file, session or problem) for every session in the logs named, read lazily: a file
    is opened when its turn comes, and a list of transcripts yields one at a time. A call
    of a session yielded before (a resumed or forked session's copy in another file, by its
    ``Session.call_keys``) is left out of the later one. ``seen_calls``: the caller's own
    set of those, which it adds a session's keys to once it has replayed it (a session that
    fails leaves its calls to the next file that has them); by default every session's
    keys are added when it is yielded."""
    register = seen_calls is None
    seen: set[Any] = set() if seen_calls is None else seen_calls
    for item in log_files(paths):
        if isinstance(item, Problem):
            yield item.path, item
            continue
        for name, found in _file_sessions(item, seen):
            yield name, found
            if register and isinstance(found, Session):
                seen.update(k for k in found.call_keys if k is not None)


def _file_sessions(item: Path, seen_calls: set[Any]) -> Iterator[tuple[str, Session | Problem]]:
    name, fmt = str(item), "JSON"
    try:
        with item.open("rb") as f:
            # A UTF-8 byte order mark (Windows editors save one) is not the log's.
            if f.read(len(BOM)) != BOM:
                f.seek(0)
            fmt = detect(f)
            for s in _sessions(fmt, f, item.stem, seen_calls):
                if isinstance(s, EmptyLog):
                    yield name, Skipped(name, str(s))
                    continue
                if isinstance(s, LogError):
                    yield name, Problem(name, str(s))
                    continue
                if s.skipped:
                    yield name, Problem(name, _skipped_line(s.skipped))
                yield name, s
    except EmptyLog as e:
        yield name, Skipped(name, str(e))
    except LogError as e:
        yield name, Problem(name, str(e))
    except OSError as e:
        yield name, Problem(name, e.strerror or str(e))
    except Exception as e:
        # Valid JSON of a recognised format whose records have another shape than the
        # readers expect (a value of the wrong type where a field was): a hand-edited or
        # newer log. The file is one problem line, not a traceback that ends the replay.
        why = f"a {fmt} log with a record this replay cannot read ({_why(e)})"
        yield name, Problem(name, why)
