"""Codex CLI (``codex exec``) in ``window`` mode through ``/v1/responses``: a run of eight
shell commands, each reading a file, against a fake model that answers only from what it
receives. The window is bounded tightly (``window_max_tokens``), so the run checkpoints
several times; the final answer needs a file read three exchanges before it, which the
window keeps verbatim (``window_keep: 3``) where the compact context would not.

What must hold on every upstream request: the fake provider accepts it (a call without its
output, or an output without its call, is the API's 400), no item is sent twice, and
between checkpoints each request is the previous one plus the new items (the cache's
prefix). What Codex gets: the model's replies with the envelope stripped, and a clean end."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

from skillstate.engine.window import CHECKPOINT_MARK
from tests.agents.conftest import Agents, codex_home, run_codex
from tests.conftest import StartProxy
from tests.fakeprovider import FakeProvider, RecordedRequest, Reply, ToolCall
from tests.helpers import envelope

FILES = 8
PROMPT = "Read the eight part files in order, then tell me the code in part 5."
SECRET = re.compile(r"code_5_[a-z]{12}")


def part(i: int) -> str:
    """A file's text: a code line and enough filler (about 600 tokens) to fill the window."""
    code = f"code_{i}_" + "".join("abcdefghijklmnopqrstuvwxyz"[(i * 7 + j) % 26] for j in range(12))
    filler = "".join(f"row {r} of part {i}: nothing to see\n" for r in range(60))
    return f"{code}\n{filler}"


def asks_checkpoint(req: RecordedRequest) -> bool:
    return CHECKPOINT_MARK in json.dumps(req.json["input"][-1])


def outputs(items: list[Any]) -> list[dict[str, Any]]:
    return [i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]


class Model:
    """Reads part 0..7 one call at a time (the next after the latest output it sees), then
    answers with part 5's code if it sees it verbatim in a tool output, else says it cannot.
    Writes the envelope only when the request asks for a checkpoint."""

    def __init__(self) -> None:
        self.checkpoints = 0

    def __call__(self, req: RecordedRequest) -> Reply:
        items = req.json["input"]
        done = [int(m.group(1)) for o in outputs(items) if (m := re.search(r"code_(\d)_", str(o)))]
        tail = ""
        if asks_checkpoint(req):
            self.checkpoints += 1
            tail = envelope({"parts_read": max(done, default=-1) + 1}, "continue", "").strip()
        latest = outputs(items[-2:])  # the newest item (before a checkpoint's instruction)
        step = (max(done) + 1) if done and latest else 0
        if step < FILES:
            cat = ToolCall("exec_command", {"cmd": f"cat part{step}.txt"}, id=f"call_cat_{step}")
            return Reply(text=tail or None, tool_calls=[cat])
        seen = SECRET.search(" ".join(str(o["output"]) for o in outputs(items)))
        answer = f"The code in part 5 is {seen.group(0)}." if seen else "I cannot see part 5."
        return Reply(text=answer + ("\n" + tail if tail else ""))


def call_ids(items: list[Any], kind: str) -> list[str]:
    return [i["call_id"] for i in items if isinstance(i, dict) and i.get("type") == kind]


def test_codex_in_window_mode_checkpoints_and_keeps_what_it_needs(
    agents: Agents, fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    for i in range(FILES):
        (work / f"part{i}.txt").write_text(part(i))
    up = {"name": "up", "url": fake.url + "/v1", "kind": "openai-responses"}
    cfg = {
        "mode": "window",
        "schema": ["parts_read"],
        "upstreams": [up],
        "window_keep": 3,
        "window_max_tokens": 1000,
    }
    proxy = start_proxy(None, config=cfg)
    model = Model()
    fake.responder = model
    session = "codex-window"
    run = run_codex(agents, tmp_path, codex_home(tmp_path, proxy.v1, session), PROMPT, timeout=300)
    assert run.done.returncode == 0, run.done.stderr
    expected = SECRET.search(part(5))
    assert expected is not None
    assert run.last_message.strip() == f"The code in part 5 is {expected.group(0)}."

    turns = [r for r in fake.requests if r.path == "/v1/responses"]
    assert len(turns) == FILES + 1 and all(r.status == 200 for r in turns)
    assert model.checkpoints >= 2  # the bound made the run checkpoint more than once
    for r in turns:
        items = r.json["input"]
        calls, outs = call_ids(items, "function_call"), call_ids(items, "function_call_output")
        assert len(set(calls)) == len(calls) and len(set(outs)) == len(outs), r.json
        assert set(calls) == set(outs)  # every call with its output, and no stray output
    for before, after in itertools.pairwise(turns):
        if asks_checkpoint(before):
            continue
        # Append-only between checkpoints: the previous request's items, then the new ones.
        assert after.json["input"][: len(before.json["input"])] == before.json["input"]
        assert after.json.get("instructions") == before.json.get("instructions")
    # Codex saw no envelope: a checkpoint's reply was an envelope and a call, so with the
    # envelope stripped it had no text, and Codex has no assistant message to send back.
    items = turns[-1].json["input"]
    assert [i for i in items if isinstance(i, dict) and i.get("role") == "assistant"] == []

    state = proxy.state(session)["state"]
    assert isinstance(state["parts_read"], int) and state["parts_read"] >= 3
    history = proxy.get("/state", params={"session": session, "history": "1"}).json()["history"]
    checkpoints = [h for h in history if h["context"] == "checkpoint"]
    assert [h["status"] for h in checkpoints] == ["valid"] * model.checkpoints, history
