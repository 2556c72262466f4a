"""Claude Code's own ``/compact`` in ``window`` mode, and in ``auto`` once it moved the session
into the window: the pinned 2.1.332 runs ``claude -p ... --resume <session>`` in a chain
(two runs that each ``Read`` a file, then ``/compact``, then a new prompt).

A checkpoint restarts the window before the compaction, so the compacted transcript no
longer matches the window's start. A recording relay between Claude Code and the proxy keeps
what Claude Code sent; the fake provider keeps what went upstream. The request after the
``/compact`` must hold the client's whole post-compaction transcript in the window form (the
summary as the task, the state, then every message after it verbatim), none twice and none
missing; the transition record must say the window restarted; the state must be intact."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from skillstate.engine.context import STATE_MARK
from skillstate.engine.window import CHECKPOINT_MARK
from tests.agents.conftest import Agents, run_program
from tests.agents.test_claude_code import claude_env
from tests.agents.test_claude_code_compact import COMPACT_ASK, SUMMARY_MARK
from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, RecordedRequest, Reply, ToolCall

PROMPT_AFTER = "what did I read?"
NOTES = "".join(f"line {i}: the build step {i} wrote artefact_{i:04d}.o\n" for i in range(300))


@dataclass
class Relay:
    """An HTTP relay in front of the proxy that keeps each request body Claude Code sent."""

    target: str
    bodies: list[Any] = field(default_factory=list)
    url: str = ""

    def serve(self) -> ThreadingHTTPServer:
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.path.split("?")[0] == "/v1/messages" and body:  # (not count_tokens)
                    relay.bodies.append(json.loads(body))
                skip = {"host", "content-length", "connection"}
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                r = httpx.request(
                    self.command, relay.target + self.path, headers=headers, content=body,
                    timeout=120,
                )  # fmt: skip
                self.send_response(r.status_code)
                drop = {"content-length", "transfer-encoding", "connection", "content-encoding"}
                for k, v in r.headers.items():
                    if k.lower() not in drop:
                        self.send_header(k, v)
                self.send_header("content-length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            do_GET = do_POST = _relay  # http.server's handler names

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


@pytest.fixture
def relay_to() -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []

    def start(target: str) -> Relay:
        relay = Relay(target)
        servers.append(relay.serve())
        return relay

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def envelope(patch: dict[str, Any]) -> str:
    return f"```json\n{json.dumps({'state_patch': patch, 'action': 'answer'})}\n```"


def asks_checkpoint(req: RecordedRequest) -> bool:
    return CHECKPOINT_MARK in json.dumps(req.json["messages"][-1])


def last_is_tool_result(req: RecordedRequest) -> bool:
    content = req.json["messages"][-1]["content"]
    return isinstance(content, list) and any(b.get("type") == "tool_result" for b in content)


class Model:
    """A fake model that answers from what it receives: a ``Read`` for a prompt, an answer
    after its result, a summary when asked to compact; the envelope only when the request
    asks for a checkpoint (recording what it put in the state)."""

    def __init__(self, notes: Path) -> None:
        self.notes, self.turn = notes, 0

    def __call__(self, req: RecordedRequest) -> Reply:
        self.turn += 1
        tail = "\n" + envelope({"said": f"turn {self.turn}"}) if asks_checkpoint(req) else ""
        if COMPACT_ASK in json.dumps(req.json["messages"][-1]):
            return Reply(text="<summary>The user had notes.txt read twice.</summary>" + tail)
        if last_is_tool_result(req):
            return Reply(text=f"Read it (turn {self.turn})." + tail)
        read = ToolCall("Read", {"file_path": str(self.notes)}, id=f"toolu_01Read{self.turn}")
        return Reply(text=f"Reading (turn {self.turn})." + tail, tool_calls=[read])


def unmarked(value: Any) -> Any:
    """A message as the cache sees it: ``cache_control`` markers dropped (Claude Code moves
    its breakpoints to its newest messages, and the proxy adds its own)."""
    if isinstance(value, dict):
        return {k: unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [unmarked(v) for v in value]
    return value


def without_instruction(messages: list[Any]) -> list[Any]:
    """A checkpoint request's messages without the instruction after the latest one."""
    last = messages[-1]
    if isinstance(last["content"], list):
        kept = [b for b in last["content"] if CHECKPOINT_MARK not in json.dumps(b)]
        return [*messages[:-1], {**last, "content": kept}]
    return messages


def blocks(content: Any) -> list[Any]:
    """A message's content as blocks (a string is one text block)."""
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def texts(messages: list[Any]) -> list[str]:
    """Every block of the messages, as JSON."""
    return [json.dumps(b, sort_keys=True) for m in messages for b in blocks(m["content"])]


def turns(fake: FakeProvider) -> list[RecordedRequest]:
    """The Messages turns the upstream received (Claude Code also counts tokens: not turns)."""
    return [r for r in fake.requests if r.path == "/v1/messages"]


def history(proxy: Proxy, session: str) -> list[dict[str, Any]]:
    r = proxy.get("/state", params={"session": session, "history": "1"})
    return [] if r.status_code == 404 else list(r.json()["history"])


@pytest.mark.parametrize("mode", ["window", "auto"])
def test_claude_code_compact_restarts_the_window_with_nothing_lost(
    agents: Agents,
    fake: FakeProvider,
    start_proxy: StartProxy,
    relay_to: Any,
    tmp_path: Path,
    mode: str,
) -> None:
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    notes = work / "notes.txt"
    notes.write_text(NOTES)  # about 3,500 tokens a Read
    # An upstream without a priced prompt cache: carrying a Read's result costs its full
    # input price every turn, so auto's switch and a checkpoint pay within two runs. The
    # window keeps one exchange at a checkpoint (default 3), so the first one moves its start.
    up = {"name": "up", "url": fake.url, "kind": "anthropic", "cache_pricing": "none"}
    cfg = {"mode": mode, "schema": ["said"], "upstreams": [up], "window_keep": 1}
    proxy = start_proxy(None, config=cfg)
    relay = relay_to(proxy.url)
    session = f"claude-window-compact-{mode}"
    env = claude_env(home, relay.url, session)
    fake.responder = Model(notes)

    def claude(*argv: str) -> dict[str, Any]:
        cmd = [str(agents.claude), *argv, "--output-format", "json", "--allowedTools", "Read"]
        done = run_program(cmd, env=env, cwd=work)
        assert done.returncode == 0, done.stderr
        result = dict(json.loads(done.stdout))
        assert result["is_error"] is False, result
        return result

    sid = claude("-p", "read notes.txt")["session_id"]
    claude("-p", "read notes.txt again", "--resume", sid)
    before = history(proxy, session)
    state_before = proxy.state(session)
    # A checkpoint moved the window's start past the task before the compaction.
    assert any(h["context"] == "checkpoint" and h["status"] == "valid" for h in before), before
    assert before[-1]["estimate"]["window"]["start"] > 0, before[-1]
    if mode == "auto":  # it switched from passthrough into the window: a checkpoint that paid
        assert STATE_MARK not in json.dumps(turns(fake)[0].json)
        assert before[0]["context"] == "checkpoint" and before[0]["estimate"]["saving_usd"] > 0
        assert before[-1]["estimate"]["form"] in ("window", "checkpoint")

    n_before = len(turns(fake))
    claude("-p", "/compact", "--resume", sid)
    compacting = turns(fake)[n_before:]
    assert len(compacting) == 1 and compacting[0].status == 200
    assert COMPACT_ASK in json.dumps(compacting[0].json)
    assert STATE_MARK in json.dumps(compacting[0].json)  # a window turn

    third = claude("-p", PROMPT_AFTER, "--resume", sid)
    assert third["result"].startswith("Read it")
    after_compact = turns(fake)[n_before + 1 :]
    assert len(after_compact) == 2 and all(r.status == 200 for r in after_compact)
    first, second = after_compact
    client = next(b for b in relay.bodies if PROMPT_AFTER in json.dumps(b["messages"]))
    sent = client["messages"]
    assert SUMMARY_MARK in json.dumps(sent[0])  # Claude Code's summary leads its transcript
    assert len(sent) > 2  # and messages follow it besides the prompt (the ones it keeps)

    # The window restarted at the compacted transcript's start: the summary is the task (in
    # the stable prefix, then the contract and the state), and every message after it is
    # sent verbatim, in order, once.
    got = unmarked(first.json["messages"])
    if asks_checkpoint(first):
        got = without_instruction(got)
    head, task = got[0]["content"], unmarked(blocks(sent[0]["content"]))
    assert head[: len(task)] == task
    assert [b["text"].split("\n")[0] for b in head[len(task) :]] == [
        "[skillstate] STATE CONTRACT",
        "[skillstate] CURRENT STATE (JSON):",
    ]
    assert got[1:] == unmarked(sent[1:])  # none missing, none out of order
    every = texts(first.json["messages"])
    assert len(every) == len(set(every)), "a message went upstream twice"
    assert json.dumps(first.json).count(SUMMARY_MARK) == 1
    assert "Reading (turn 1)" not in json.dumps(first.json)  # nothing from before the summary
    # The next request goes on from there, append-only (Claude Code itself sends a message
    # as blocks while it carries its breakpoint, as a string after: the same message).
    if not asks_checkpoint(first):
        nxt = [{**m, "content": blocks(m["content"])} for m in unmarked(second.json["messages"])]
        assert nxt[: len(got)] == [{**m, "content": blocks(m["content"])} for m in got]

    records = history(proxy, session)[len(before) :]
    assert [r["estimate"]["window_start"] for r in records] == ["kept", "changed", "kept"]
    assert records[1]["estimate"]["window"]["start"] == 0
    state_after = proxy.state(session)
    assert state_after["step"] == state_before["step"] + 3  # every turn committed
    changed = {k: v for k, v in state_after["state"].items() if state_before["state"].get(k) != v}
    assert set(state_before["state"]) <= set(state_after["state"])  # no key lost
    assert set(changed) <= {"said"}  # changed only by a checkpoint's patch
