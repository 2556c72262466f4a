"""The replay's readers: format detection, streaming, and one problem line per bad file
(on the committed real logs, and on broken copies of them)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from skillstate.bench.replay import jsonstream
from skillstate.bench.replay.jsonstream import LogError, iter_json_array
from skillstate.bench.replay.session import Session
from skillstate.bench.replay.sources import Problem, detect, iter_sessions

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "replay"
CLAUDE = FIXTURES / "claude-code.jsonl"
CODEX = FIXTURES / "codex.jsonl"
# A Claude Code log without api-request lines: a first line of a type this replay does not
# know, an API error Claude Code wrote itself, and a rewind (an abandoned branch).
REWIND = FIXTURES / "claude-code-rewind.jsonl"
MESSAGES_USER = {"role": "user", "content": "hi"}


def sessions_and_problems(*paths: Path) -> tuple[list[Session], list[Problem]]:
    found = [item for _, item in iter_sessions(paths)]
    return (
        [s for s in found if isinstance(s, Session)],
        [p for p in found if isinstance(p, Problem)],
    )


def each_file_apart(top: Path) -> tuple[list[Session], list[Problem]]:
    """As ``sessions_and_problems``, each file read on its own: copies of one log (which a
    replay of them all counts once) each give their session."""
    sessions: list[Session] = []
    problems: list[Problem] = []
    for path in sorted(top.iterdir()):
        found = sessions_and_problems(path)
        sessions.extend(found[0])
        problems.extend(found[1])
    return sessions, problems


def test_each_format_is_detected_from_its_content() -> None:
    assert detect(io.BytesIO(CLAUDE.read_bytes())) == "claude-code"
    assert detect(io.BytesIO(CODEX.read_bytes())) == "codex"
    assert detect(io.BytesIO(b'[{"id": "a", "messages": []}]')) == "transcripts"
    assert detect(io.BytesIO(b'{\n  "id": "a",\n  "messages": [\n')) == "transcript"
    for head, why in [
        (b"", "empty"),
        (b"  \n", "empty"),
        (b"hello", "unknown format"),
        (b'{"type": "other"}\n', "unknown format"),
    ]:
        with pytest.raises(LogError, match=why):
            detect(io.BytesIO(head))


def test_the_claude_code_log_is_rebuilt_request_by_request() -> None:
    from skillstate.bench.replay.forms import RequestBuilder

    (session,), problems = sessions_and_problems(CLAUDE)
    assert problems == []
    sent = json.loads((FIXTURES / "claude-code.requests.json").read_text())
    assert session.source == "claude-code" and session.dialect == "anthropic"
    assert len(session.calls) == len(sent) == 4
    assert session.tools and session.system  # the logged request shape
    builder = RequestBuilder(session, "claude-opus-5-5")
    for call, messages in zip(session.calls, sent, strict=True):
        # Byte for byte the messages Claude Code sent, breakpoints included.
        assert json.loads(builder.body(call))["messages"] == messages
        assert call.usage is not None and call.usage.output_tokens > 0
    assert [len(c.reply.tool_calls) for c in session.calls] == [1, 1, 1, 0]


def test_the_codex_rollout_is_rebuilt_call_by_call() -> None:
    (session,), _ = sessions_and_problems(CODEX)
    sent = json.loads((FIXTURES / "codex.requests.json").read_text())
    assert session.source == "codex" and session.dialect == "responses"
    assert len(session.calls) == len(sent) == 4
    for call, items in zip(session.calls, sent, strict=True):
        rebuilt = [session.pool[i] for i in call.messages]
        assert len(rebuilt) == len(items)
        # Codex sends a shorter version of session_meta.base_instructions first (it drops
        # sections for the tools it has off); every other item is as logged.
        assert rebuilt[0]["role"] == items[0]["role"] == "developer"
        assert rebuilt[1:] == items[1:]
        assert call.usage is not None


def test_a_json_array_streams_an_element_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonstream, "CHUNK", 7)  # elements far longer than a read
    items = [{"id": str(i), "text": "é" * (i * 13), "n": [1.5, None, True]} for i in range(20)]
    data = json.dumps(items, ensure_ascii=False).encode()
    assert list(iter_json_array(io.BytesIO(data))) == items
    for broken, why in [
        (data[:-1], "truncated"),
        (data[:200], "truncated"),
        (data.replace(b'"n"', b"n", 1), "not JSON"),
        (b"[1] 2", "after"),
        (b"[1, " + b"[" * 100_000, "element 2 is not JSON \\(depth limit exceeded\\)"),
    ]:
        with pytest.raises(LogError, match=why):
            list(iter_json_array(io.BytesIO(broken)))


def test_bad_files_are_one_problem_each_and_the_rest_replays(tmp_path: Path) -> None:
    lines = CODEX.read_bytes().splitlines(keepends=True)
    (tmp_path / "malformed.jsonl").write_bytes(b"".join([*lines[:5], b"{oops\n", *lines[5:]]))
    (tmp_path / "truncated.jsonl").write_bytes(CLAUDE.read_bytes()[:5000])
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "unknown.json").write_bytes(b"\x89PNG not a log\n")
    (tmp_path / "nologs").mkdir()
    (tmp_path / "nologs" / "readme.txt").write_text("no logs here")
    sessions, problems = sessions_and_problems(
        tmp_path, tmp_path / "nologs", tmp_path / "missing.jsonl", CLAUDE
    )
    reasons = {Path(p.path).name: p.reason for p in problems}
    assert reasons == {
        "malformed.jsonl": (
            "line 6 is not JSON (unexpected character, expected a string key); "
            "skipped, the rest replayed"
        ),
        "truncated.jsonl": reasons["truncated.jsonl"],
        "empty.jsonl": "empty file",
        "unknown.json": "unknown format (not JSON lines or a JSON transcript)",
        "nologs": "a directory with no .jsonl or .json logs",
        "missing.jsonl": "no such file or directory",
    }
    assert reasons["truncated.jsonl"].startswith("truncated: line ")
    assert all("\n" not in p.line() for p in problems)
    # The malformed rollout still replays (its other lines), and so does the good log.
    assert sorted(s.source for s in sessions) == ["claude-code", "codex"]


def _older_claude_code(lines: list[bytes]) -> io.BytesIO:
    """The fixture as a Claude Code without the api-request lines would have logged it."""
    kept = [line for line in lines if not json.loads(line)["type"].startswith("api-request")]
    return io.BytesIO(b"".join(kept))


def test_an_older_claude_code_log_is_rebuilt_from_its_message_chain() -> None:
    from skillstate.bench.replay.claudecode import read_claude_code

    session = read_claude_code(_older_claude_code(CLAUDE.read_bytes().splitlines(True)), "old")
    assert session.notes == ["no api-request lines: system prompt and tools not logged"]
    assert session.tools is None and session.system is None
    assert [len(c.messages) for c in session.calls] == [1, 3, 5, 7]
    last = [session.pool[i] for i in session.calls[-1].messages]
    assert [m["role"] for m in last] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert [b["type"] for b in last[1]["content"]] == ["thinking", "tool_use"]


def test_a_compaction_restarts_the_context() -> None:
    from skillstate.bench.replay.claudecode import read_claude_code

    lines = CLAUDE.read_bytes().splitlines(True)
    # Before the third assistant message: a compact boundary and the summary it starts with.
    third = [k for k, line in enumerate(lines) if json.loads(line)["type"] == "assistant"]
    ids = []
    for k in third:
        mid = json.loads(lines[k])["message"]["id"]
        if mid not in ids:
            ids.append(mid)
    at = next(k for k in third if json.loads(lines[k])["message"]["id"] == ids[2])
    boundary = {
        "type": "system",
        "subtype": "compact_boundary",
        "sessionId": "s",
        "uuid": "boundary",
        "parentUuid": None,
    }
    summary = {
        "type": "user",
        "sessionId": "s",
        "isCompactSummary": True,
        "uuid": "summary",
        "parentUuid": "boundary",
        "message": {"role": "user", "content": "Summary: two files were read."},
    }
    extra = [json.dumps(boundary).encode() + b"\n", json.dumps(summary).encode() + b"\n"]
    # As Claude Code links them: the next line's parent is the summary.
    after = json.loads(lines[at]) | {"parentUuid": "summary"}
    rest = [json.dumps(after).encode() + b"\n", *lines[at + 1 :]]
    session = read_claude_code(_older_claude_code(lines[:at] + extra + rest), "compacted")
    assert [len(c.messages) for c in session.calls] == [1, 3, 1, 3]
    first_after = session.pool[session.calls[2].messages[0]]
    assert first_after["content"] == "Summary: two files were read."


def _edited(path: Path, line: int, edit: Any) -> bytes:
    lines = path.read_bytes().splitlines(keepends=True)
    record = json.loads(lines[line])
    edit(record)
    return b"".join([*lines[:line], json.dumps(record).encode() + b"\n", *lines[line + 1 :]])


def test_a_record_of_another_shape_is_one_problem_line_or_ignored(tmp_path: Path) -> None:
    from skillstate.bench.replay.forms import RequestBuilder

    # An assistant message whose content is a number: a shape the reader does not foresee.
    (tmp_path / "a.jsonl").write_bytes(_edited(CODEX, 15, lambda r: r["payload"].update(content=5)))
    (tmp_path / "b.jsonl").write_bytes(_edited(CLAUDE, 16, lambda r: r.update(cacheControl=5)))
    odd_marks = [{"path": []}, {"path": ["messages", 1, "content", "0"]}, {"path": "system"}]
    (tmp_path / "c.jsonl").write_bytes(
        _edited(CLAUDE, 16, lambda r: r.update(cacheControl=odd_marks))
    )
    sessions, problems = each_file_apart(tmp_path)
    assert [(Path(p.path).name, p.reason.split(" (")[0]) for p in problems] == [
        ("a.jsonl", "a codex log with a record this replay cannot read")
    ]
    assert all("\n" not in p.line() for p in problems)
    # The logged breakpoints that are no paths are no breakpoints; the calls still replay.
    assert [s.source for s in sessions] == ["claude-code", "claude-code"]
    for session in sessions:
        builder = RequestBuilder(session, "claude-opus-5-5")
        assert all(json.loads(builder.body(call))["messages"] for call in session.calls)


def test_a_transcript_tool_call_of_another_shape_is_answered_as_a_function_call() -> None:
    from skillstate.bench.replay.transcripts import session_of

    calls = [
        {"id": "a", "type": "function", "function": {"name": "f"}},  # no arguments
        {"id": "b", "function": "f"},  # not an object
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}},
    ]
    messages = [
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": None, "tool_calls": calls},
    ]
    session = session_of({"id": "t", "messages": messages}, "t")
    (call,) = session.calls
    # The simulated upstream answers every call with JSON text arguments (what it bills).
    assert call.reply.tool_inputs() == ["{}", "{}", '{"x":1}']
    assert [c["id"] for c in call.reply.tool_calls] == ["a", "b", "c"]


def test_a_log_saved_with_a_byte_order_mark_replays(tmp_path: Path) -> None:
    """Editors on Windows save UTF-8 with a BOM; it is not part of the log."""
    transcript = {"id": "t", "messages": [MESSAGES_USER, {"role": "assistant", "content": "yo"}]}
    bom = b"\xef\xbb\xbf"
    (tmp_path / "claude.jsonl").write_bytes(bom + CLAUDE.read_bytes())
    (tmp_path / "codex.jsonl").write_bytes(bom + CODEX.read_bytes())
    (tmp_path / "one.json").write_bytes(bom + json.dumps(transcript).encode())
    (tmp_path / "list.json").write_bytes(bom + json.dumps([transcript, transcript]).encode())
    sessions, problems = sessions_and_problems(tmp_path)
    assert problems == []
    assert sorted(s.source for s in sessions) == sorted(
        [
            *(s.source for s in sessions_and_problems(CLAUDE, CODEX)[0]),
            "transcript",
            "transcript",
            "transcript",
        ]
    )


def test_an_element_of_another_shape_leaves_the_rest_of_its_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An element the reader cannot read (a crash of a shape no check foresaw, here made
    by the test) is its own problem line; the elements after it in the file replay."""
    from skillstate.bench.replay import transcripts

    read = transcripts.session_of

    def session_of(obj: Any, name: str) -> Session:
        if obj.get("id") == "odd":
            raise TypeError("'int' object is not iterable")
        return read(obj, name)

    monkeypatch.setattr(transcripts, "session_of", session_of)
    elements = [
        {"id": k, "messages": [MESSAGES_USER, {"role": "assistant", "content": "yo"}]}
        for k in ("a", "odd", "b")
    ]
    (tmp_path / "list.json").write_text(json.dumps(elements))
    sessions, problems = sessions_and_problems(tmp_path)
    assert [p.reason for p in problems] == [
        "element 2 (odd): a transcript this replay cannot read"
        " (TypeError: 'int' object is not iterable)"
    ]
    assert len(sessions) == 2


def test_the_format_is_told_past_unknown_first_lines_and_long_ones(tmp_path: Path) -> None:
    claude = CLAUDE.read_bytes().splitlines(keepends=True)
    codex = CODEX.read_bytes().splitlines(keepends=True)
    first = json.loads(claude[2])  # the first user line
    first["message"]["content"] = "x" * 100_000  # longer than any fixed sniff window
    meta = json.loads(codex[0])
    meta["payload"]["base_instructions"]["text"] += "y" * 100_000
    snapshot = {"type": "file-history-snapshot", "messageId": "m", "snapshot": {}}
    pretty = {"id": "t", "tools": [{"type": "function", "description": "z" * 70_000}]}
    pretty["messages"] = [MESSAGES_USER, {"role": "assistant", "content": "ok"}]
    files = {
        "snapshot_first.jsonl": json.dumps(snapshot).encode() + b"\n" + b"".join(claude),
        "unknown_first.jsonl": REWIND.read_bytes(),
        "long_first.jsonl": b"".join([*claude[:2], json.dumps(first).encode() + b"\n"])
        + b"".join(claude[3:]),
        "long_meta.jsonl": json.dumps(meta).encode() + b"\n" + b"".join(codex[1:]),
        "pretty.json": json.dumps(pretty, indent=2).encode(),
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    sessions, problems = each_file_apart(tmp_path)
    assert problems == []
    assert sorted(s.source for s in sessions) == [
        "claude-code",
        "claude-code",
        "claude-code",
        "codex",
        "transcript",
    ]


def test_an_api_error_claude_code_wrote_is_no_call_and_not_sent_back() -> None:
    from skillstate.bench.replay.claudecode import read_claude_code

    with REWIND.open("rb") as f:
        session = read_claude_code(f, "rewind")
    assert session.model == "claude-sonnet-4-5"  # not the error message's "<synthetic>"
    assert len(session.calls) == 3
    first = [session.pool[i] for i in session.calls[0].messages]
    # The question and the retry after the error, merged into one user message.
    assert first == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "first question"},
                {"type": "text", "text": "try again"},
            ],
        }
    ]
    assert "API Error" not in json.dumps(session.pool)


def test_a_rewound_branch_is_not_sent_after_the_rewind() -> None:
    from skillstate.bench.replay.claudecode import read_claude_code

    with REWIND.open("rb") as f:
        session = read_claude_code(f, "rewind")
    sent = [[session.pool[i]["content"] for i in c.messages] for c in session.calls]
    assert [len(m) for m in sent] == [1, 3, 3]
    assert sent[1][2] == "ABANDONED branch question"
    assert sent[2][2] == "rewound question"  # its parent is the first answer, not the branch
    assert "ABANDONED" not in json.dumps(sent[2])


def test_items_codex_keeps_but_does_not_send_are_not_replayed() -> None:
    from skillstate.bench.replay.codex import read_codex

    lines = CODEX.read_bytes().splitlines(keepends=True)
    ghost = {"type": "ghost_snapshot", "ghost_commit": {"id": "abc", "parent": "def"}}
    system = {"type": "message", "role": "system", "content": [{"type": "input_text"}]}
    extra = [
        json.dumps(
            {"timestamp": "2025-10-01T12:00:00Z", "type": "response_item", "payload": p}
        ).encode()
        + b"\n"
        for p in (ghost, system, {"type": "compaction_trigger"})
    ]
    plain = read_codex(io.BytesIO(b"".join(lines)), "plain")
    at = next(
        k for k, line in enumerate(lines) if b'"role": "user"' in line or b'"role":"user"' in line
    )
    noisy = read_codex(io.BytesIO(b"".join([*lines[:at], *extra, *lines[at:]])), "noisy")
    assert [[noisy.pool[i] for i in c.messages] for c in noisy.calls] == [
        [plain.pool[i] for i in c.messages] for c in plain.calls
    ]


def test_a_missing_or_corrupt_request_line_falls_back_to_the_message_chain() -> None:
    from skillstate.bench.replay.claudecode import read_claude_code

    lines = CLAUDE.read_bytes().splitlines(keepends=True)
    requests = [k for k, line in enumerate(lines) if json.loads(line)["type"] == "api-request"]
    without_first = [line for k, line in enumerate(lines) if k != requests[0]]
    corrupt = list(lines)
    corrupt[requests[1]] = corrupt[requests[1]][:40] + b"\n"
    exact = read_claude_code(io.BytesIO(b"".join(lines)), "exact")
    for broken in (without_first, corrupt):
        session = read_claude_code(io.BytesIO(b"".join(broken)), "broken")
        assert len(session.calls) == 4  # every call replays, not none
        assert session.tools == exact.tools  # the logged request shape is still used
        assert session.notes and "rebuilt from the message chain" in session.notes[0]
        last = [session.pool[i] for i in session.calls[-1].messages]
        assert [m["role"] for m in last] == ["user", "assistant"] * 3 + ["user"]


def test_an_unsearchable_path_is_one_problem_and_the_rest_replays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    tree = tmp_path / "tree"
    (tree / "locked").mkdir(parents=True)
    (tree / "ok.jsonl").write_bytes(CLAUDE.read_bytes())
    (tree / "locked" / "hidden.jsonl").write_bytes(CODEX.read_bytes())
    hidden = tmp_path / "closed" / "log.jsonl"  # under a directory this user may not search
    real_scandir, real_stat = os.scandir, Path.stat

    def scandir(path: Any = ".") -> Any:
        if Path(path) == tree / "locked":
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    def stat(self: Path, **kwargs: Any) -> Any:
        if self == hidden:
            raise PermissionError(13, "Permission denied", str(self))
        return real_stat(self, **kwargs)

    # Root (as tests may run) searches any directory: the refusals are the OS's, simulated.
    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(Path, "stat", stat)
    sessions, problems = sessions_and_problems(hidden, tree)
    assert [(Path(p.path).name, p.reason) for p in problems] == [
        ("log.jsonl", "Permission denied"),
        ("locked", "Permission denied; its logs were not searched"),
    ]
    assert [s.source for s in sessions] == ["claude-code"]


# -- real log trees: what the agents write besides the calls (synthetic lines) ---------------

USAGE = {
    "input_tokens": 10,
    "output_tokens": 5,
    "cache_read_input_tokens": 0,
    "cache_creation_input_tokens": 0,
}


def cc_user(uid: str, parent: str | None, content: Any, sid: str = "s1", **extra: Any) -> dict:
    message = {"role": "user", "content": content}
    return {"type": "user", "sessionId": sid, "uuid": uid, "parentUuid": parent} | {
        "message": message,
        **extra,
    }


def cc_assistant(
    uid: str, parent: str, mid: str, blocks: list[Any], sid: str = "s1", **extra: Any
) -> dict:
    message = {
        "id": mid,
        "role": "assistant",
        "model": extra.pop("model", "claude-sonnet-4-5"),
        "content": blocks,
        "usage": extra.pop("usage", USAGE),
    }
    line = {"type": "assistant", "sessionId": sid, "uuid": uid, "parentUuid": parent}
    return line | {"requestId": f"req-{mid}", "message": message, **extra}


def jsonl(*records: Any) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def text(t: str) -> dict[str, str]:
    return {"type": "text", "text": t}


def tool_use(tid: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": tid, "name": "Read", "input": {"path": tid}}


def tool_result(tid: str) -> list[dict[str, Any]]:
    return [{"type": "tool_result", "tool_use_id": tid, "content": "ok"}]


def two_calls(sid: str = "s1", **extra: Any) -> list[dict[str, Any]]:
    """A Claude Code session of two calls (the first a tool call)."""
    return [
        cc_user("u1", None, "read it", sid, **extra),
        cc_assistant("a1", "u1", f"{sid}-m1", [tool_use("t1")], sid, **extra),
        cc_user("u2", "a1", tool_result("t1"), sid, **extra),
        cc_assistant("a2", "u2", f"{sid}-m2", [text("done")], sid, **extra),
    ]


def codex_line(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {"timestamp": "2025-10-20T11:00:00.000Z", "type": kind, "payload": payload}


def codex_rollout(sid: str, ask: str, reply: str, **meta: Any) -> list[dict[str, Any]]:
    usage = {"input_tokens": 100, "cached_input_tokens": 0, "output_tokens": 7}
    return [
        codex_line("session_meta", {"id": sid, **meta}),
        codex_line("turn_context", {"model": "gpt-5-codex"}),
        codex_line(
            "response_item",
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ask}]},
        ),
        codex_line(
            "response_item",
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": reply}],
            },
        ),
        codex_line("event_msg", {"type": "token_count", "info": {"last_token_usage": usage}}),
    ]


def test_a_log_tree_s_bookkeeping_and_empty_sessions_are_no_problems(tmp_path: Path) -> None:
    from skillstate.bench.replay.sources import Skipped

    project = tmp_path / "projects" / "-home-u-proj"
    (project / "s1" / "subagents").mkdir(parents=True)
    (project / "s1" / "tool-results").mkdir()
    (project / "s1.jsonl").write_bytes(jsonl(*two_calls()))
    (project / "sessions-index.json").write_text('{"version": 1, "entries": []}')
    (project / "s1" / "subagents" / "agent-a1.meta.json").write_text('{"agentType": "x"}')
    (project / "s1" / "tool-results" / "toolu_1.json").write_text('{"stdout": "x"}')
    summary = {"type": "summary", "summary": "Fixed the bug", "leafUuid": "u9"}
    snapshot = {"type": "file-history-snapshot", "messageId": "m", "snapshot": {}}
    (project / "summary-only.jsonl").write_bytes(jsonl(summary))
    (project / "snapshot-only.jsonl").write_bytes(jsonl(snapshot, snapshot))
    (project / "cancelled.jsonl").write_bytes(jsonl(cc_user("u1", None, "hi")))
    codex = tmp_path / "sessions"
    codex.mkdir()
    (codex / "rollout-meta-only.jsonl").write_bytes(jsonl(codex_line("session_meta", {"id": "c"})))
    sessions, problems = sessions_and_problems(tmp_path)
    assert [p.line() for p in problems if not isinstance(p, Skipped)] == []
    assert sorted(Path(p.path).name for p in problems) == [
        "cancelled.jsonl",
        "rollout-meta-only.jsonl",
        "snapshot-only.jsonl",
        "summary-only.jsonl",
    ]
    assert all("empty session" in p.reason for p in problems)
    assert [len(s.calls) for s in sessions] == [2]
    # A bookkeeping file named on the command line still gets its line.
    _, named = sessions_and_problems(project / "sessions-index.json")
    assert [type(p) for p in named] == [Problem]


def test_a_line_or_block_written_twice_is_sent_once() -> None:
    from skillstate.bench.replay.claudecode import read_claude_code

    u1, a1, u2, a2 = two_calls()
    # The tool call's message, one block a line: the text line written twice (same uuid),
    # the tool_use block repeated on a line of its own (same message id, another uuid).
    first = cc_assistant("a0", "u1", "s1-m1", [text("reading")])
    a1 = a1 | {"parentUuid": "a0"}
    again = a1 | {"uuid": "a1b", "parentUuid": "a1"}
    u2 = u2 | {"parentUuid": "a1b"}
    session = read_claude_code(io.BytesIO(jsonl(u1, first, first, a1, again, u2, u2, a2)), "s")
    assert len(session.calls) == 2
    sent = [session.pool[i] for i in session.calls[1].messages]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"] == [text("reading"), tool_use("t1")]
    assert sent[2]["content"] == tool_result("t1")
    assert session.calls[0].reply.text == "reading"
    assert len(session.calls[0].reply.tool_calls) == 1  # not the repeated block twice


def test_values_of_another_type_are_missing_not_a_crash() -> None:
    from skillstate.bench.replay.claudecode import read_claude_code
    from skillstate.bench.replay.codex import read_codex

    lines = two_calls(sid=7)  # type: ignore[arg-type]
    for line in lines:
        if line["type"] == "assistant":
            line["message"]["model"] = 5
            line["requestRef"] = {"id": 1}
    lines[3]["message"]["usage"] = {"input_tokens": "12", "output_tokens": None}
    session = read_claude_code(io.BytesIO(jsonl(*lines)), "file-stem")
    assert (session.id, session.model) == ("file-stem", None)
    assert "usage unreadable on 1 call(s): not checked" in session.notes
    rollout = codex_rollout("x", "hi", "yo")
    rollout[0]["payload"] |= {"id": 9, "base_instructions": "not an object"}
    rollout[1]["payload"]["model"] = ["gpt"]
    session = read_codex(io.BytesIO(jsonl(*rollout)), "rollout-stem")
    assert (session.id, session.model, len(session.calls)) == ("rollout-stem", None, 1)


def test_an_unexpected_error_is_one_session_s_problem_and_the_rest_replays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from skillstate.bench.replay import claudecode
    from skillstate.bench.replay.run import Replayer, ReplayOptions, replay

    read = claudecode.read_claude_code

    def reader(f: Any, name: str, seen: Any = None) -> Session:
        if name == "bad":
            raise RuntimeError("a shape no check foresaw")
        return read(f, name, seen)

    monkeypatch.setattr(claudecode, "read_claude_code", reader)
    (tmp_path / "bad.jsonl").write_bytes(jsonl(*two_calls("bad")))
    (tmp_path / "good.jsonl").write_bytes(jsonl(*two_calls("good")))
    (tmp_path / "odd.jsonl").write_bytes(jsonl(*two_calls("odd")))
    (tmp_path / "zz.jsonl").write_bytes(jsonl(*two_calls("zz")))
    replay_session = Replayer.replay_session

    def replaying(self: Replayer, file: str, session: Session, progress: Any) -> Any:
        if session.id == "odd":
            raise KeyError("while replaying")
        return replay_session(self, file, session, progress)

    monkeypatch.setattr(Replayer, "replay_session", replaying)
    found = [item for _, item in replay([str(tmp_path)], ReplayOptions(arms=("passthrough",)))]
    problems = [p.line() for p in found if isinstance(p, Problem)]
    assert [Path(p).name.split(":")[0] for p in problems] == ["bad.jsonl", "odd.jsonl"]
    assert "RuntimeError: a shape no check foresaw" in problems[0]
    assert "session odd: cannot be replayed (KeyError" in problems[1]
    assert sorted(r.id for r in found if not isinstance(r, Problem)) == ["good", "zz"]


def test_sub_agent_calls_are_noted_or_labelled_as_the_sub_agent_s(tmp_path: Path) -> None:
    from skillstate.bench.replay.claudecode import read_claude_code

    side = dict(isSidechain=True, agentId="a2271d1")
    inline = [
        *two_calls(),
        cc_user("s1u", None, "sub task", **side),
        cc_assistant("s1a", "s1u", "sm1", [text("sub done")], **side),
    ]
    session = read_claude_code(io.BytesIO(jsonl(*inline)), "s1")
    assert len(session.calls) == 2
    assert "1 sub-agent call(s) (isSidechain) not replayed" in session.notes
    agent = read_claude_code(io.BytesIO(jsonl(*two_calls(**side))), "agent-a2271d1")
    assert agent.id == "s1/agent-a2271d1"  # not the parent's sessionId alone


def test_a_file_named_twice_or_a_resumed_copy_counts_its_calls_once(tmp_path: Path) -> None:
    first = tmp_path / "s1.jsonl"
    first.write_bytes(jsonl(*two_calls()))
    # `claude --resume`: a new session file with the first's lines copied, then a new call.
    resumed = [line | {"sessionId": "s2"} for line in two_calls()]
    resumed += [
        cc_user("u3", "a2", "and now?", "s2"),
        cc_assistant("a3", "u3", "m3", [text("now this")], "s2"),
    ]
    (tmp_path / "s2.jsonl").write_bytes(jsonl(*resumed))
    sessions, problems = sessions_and_problems(first, tmp_path / "s2.jsonl", tmp_path, first)
    assert problems == []
    assert [(s.id, len(s.calls)) for s in sessions] == [("s1", 2), ("s2", 1)]
    assert "2 call(s) also in another file; counted once" in sessions[1].notes
    # The new call is still sent the whole conversation, the copied part included.
    assert len(sessions[1].calls[0].messages) == 5


def test_a_codex_fork_keeps_its_id_and_counts_its_parent_s_calls_once(tmp_path: Path) -> None:
    parent = codex_rollout("parent-id", "fix the bug", "Fixed.")
    fork = [
        codex_rollout("fork-id", "", "", forked_from_id="parent-id")[0],
        *parent,  # the parent's session_meta, items and token counts, copied
        *codex_rollout("fork-id", "also refactor", "Refactored.")[1:],
    ]
    (tmp_path / "rollout-1-parent.jsonl").write_bytes(jsonl(*parent))
    (tmp_path / "rollout-2-fork.jsonl").write_bytes(jsonl(*fork))
    sessions, problems = sessions_and_problems(tmp_path)
    assert problems == []
    assert [(s.id, len(s.calls)) for s in sessions] == [("parent-id", 1), ("fork-id", 1)]
    assert sessions[1].notes == ["1 call(s) also in another file; counted once"]
    alone, _ = sessions_and_problems(tmp_path / "rollout-2-fork.jsonl")
    assert [(s.id, len(s.calls)) for s in alone] == [("fork-id", 2)]
    assert "a fork of session parent-id" in alone[0].notes[0]


def test_one_hour_cache_writes_are_read_from_the_usage() -> None:
    from skillstate.bench.replay.claudecode import read_claude_code

    usage = USAGE | {
        "cache_creation_input_tokens": 300,
        "cache_creation": {"ephemeral_5m_input_tokens": 100, "ephemeral_1h_input_tokens": 200},
    }
    lines = two_calls()
    lines[3]["message"]["usage"] = usage
    session = read_claude_code(io.BytesIO(jsonl(*lines)), "s")
    last = session.calls[1].usage
    assert last is not None
    assert (last.cache_write_tokens, last.cache_write_1h_tokens) == (300, 200)


def test_a_copy_s_calls_replay_in_the_next_file_when_the_first_cannot(tmp_path: Path) -> None:
    from skillstate.bench.replay.run import ReplayOptions, replay

    broken = two_calls()
    for line in broken:
        if line["type"] == "assistant":
            line["message"]["model"] = 5  # no model: this copy cannot be priced
    (tmp_path / "a.jsonl").write_bytes(jsonl(*broken))
    (tmp_path / "b.jsonl").write_bytes(jsonl(*two_calls()))
    found = [item for _, item in replay([str(tmp_path)], ReplayOptions(arms=("passthrough",)))]
    assert [Path(p.path).name for p in found if isinstance(p, Problem)] == ["a.jsonl"]
    assert [(r.file.rsplit("/", 1)[-1], r.calls) for r in found if not isinstance(r, Problem)] == [
        ("b.jsonl", 2)
    ]


def test_a_codex_rollout_from_before_wrapped_lines_is_read() -> None:
    """Rollouts written before openai/codex#3380 (September 2025): a bare session meta, bare
    ResponseItems and record_type lines, no turn_context or token counts."""
    from skillstate.bench.replay.codex import read_codex

    def message(role: str, kind: str, text: str) -> dict[str, Any]:
        return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}

    call = {"type": "function_call", "name": "shell", "arguments": "{}", "call_id": "c1"}
    lines = [
        {"id": "legacy-1", "timestamp": "2025-08-01T10:00:00.000Z", "instructions": None,
         "git": {"commit_hash": "abc"}},
        {"record_type": "state"},
        message("user", "input_text", "fix the bug"),
        call,
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"record_type": "state"},
        message("assistant", "output_text", "Fixed."),
    ]  # fmt: skip
    data = jsonl(*lines)
    assert detect(io.BytesIO(data)) == "codex"
    session = read_codex(io.BytesIO(data), "rollout-legacy.jsonl")
    assert session.id == "legacy-1"
    assert len(session.calls) == 2  # the call, then the answer after its output
    assert [session.pool[i]["type"] for i in session.calls[1].messages] == [
        "message",
        "function_call",
        "function_call_output",
    ]
