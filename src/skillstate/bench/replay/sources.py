"""Which logs to replay: files and directories on the command line, each file's format, and
its sessions, one at a time. A file that cannot be replayed becomes one ``Problem`` line
and the rest goes on.

Formats (detected from the content, not the name): Claude Code JSONL, Codex CLI rollout
JSONL, a JSON list of ``{id, tools, messages}`` transcripts, one such transcript.
A directory is searched recursively for ``*.jsonl`` and ``*.json`` files.
"""

from __future__ import annotations

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
SNIFF = 1 << 16  # bytes read to tell the format of a file
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
    (sorted); a missing path or a directory with none is a Problem."""
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_dir():
            found = sorted(
                p for p in path.rglob("*") if p.suffix in (".jsonl", ".json") and p.is_file()
            )
            if not found:
                yield Problem(str(path), "a directory with no .jsonl or .json logs")
            yield from found
        elif path.is_file():
            yield path
        elif path.exists():
            yield Problem(str(path), "not a regular file")
        else:
            yield Problem(str(path), "no such file or directory")


def detect(head: bytes) -> str:
    """The format of a file from its first bytes; LogError when it is none of ours."""
    text = head.lstrip()
    if not text:
        raise LogError("empty file")
    if text[:1] == b"[":
        return "transcripts"
    if text[:1] != b"{":
        raise LogError("unknown format (not JSON lines or a JSON transcript)")
    first, _, rest = text.partition(b"\n")
    try:
        obj = orjson.loads(first)
    except orjson.JSONDecodeError:
        if (len(head) < SNIFF and rest.strip()) or b'"messages"' in text:
            return "transcript"  # a pretty-printed JSON object
        raise LogError("unknown format (the first line is not a JSON object)") from None
    if claudecode.is_claude_code_line(obj):
        return "claude-code"
    if codex.is_codex_line(obj):
        return "codex"
    if transcripts.is_transcript(obj):
        return "transcript"
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
                head = f.read(SNIFF)
                # A UTF-8 byte order mark (Windows editors save one) is not the log's.
                start = len(BOM) if head.startswith(BOM) else 0
                fmt = detect(head[start:])
                f.seek(start)
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
