"""The offline model of ``bench bfcl``: it replays a task's ground truth, step by step.

It finds its place (turn, calls done) only from what it receives: the transcript in the
baseline arm, the state in the state arm (so the state has to carry it), and refuses
(``SimError``, HTTP 400) when the context does not match the task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from skillstate.bench.bfcl.constants import HISTORY_CHARS, RESULT_CHARS
from skillstate.bench.bfcl.tasks import FuncCall, Task, decoded_text, group_calls
from skillstate.bench.simmodel import SimError, SimModel, SimReply, message_text, read_state
from skillstate.bench.wire import shorten as _short
from skillstate.cost.baseline import CachePricing
from skillstate.engine.context import CONTRACT_MARK, CORRECTION_MARK, STATE_MARK


@dataclass
class ScriptTurn:
    user: str  # the text of the turn's (last) user message, to check the context against
    steps: list[list[FuncCall]]


@dataclass
class Script:
    task_id: str
    turns: list[ScriptTurn]

    @property
    def model_calls(self) -> int:
        return sum(len(t.steps) + 1 for t in self.turns)


def make_script(task: Task, grouping: str) -> Script:
    turns = []
    for t, calls in enumerate(task.gt_calls()):
        msgs = task.turn_messages(t)
        user = message_text(msgs[-1]) if msgs else ""
        turns.append(ScriptTurn(user, group_calls(calls, grouping)))
    return Script(task.id, turns)


def _marked(msg: Mapping[str, Any]) -> bool:
    text = message_text(dict(msg))
    return CONTRACT_MARK in text or STATE_MARK in text or CORRECTION_MARK in text


def _result_line(call: str, output: str) -> str:
    return f"{_short(call, 120)} -> {_short(output, RESULT_CHARS)}"


def _history_line(n: int, request: str, outcomes: Sequence[tuple[str, str]]) -> str:
    done = "; ".join(f"{_short(c, 80)} -> {_short(o, 60)}" for c, o in outcomes)
    return _short(f"turn {n} ({_short(request, 60)}): {done or 'no function call'}", HISTORY_CHARS)


@dataclass
class _SeenTurn:
    user: str
    calls: list[tuple[str, str]]  # (call text, output)


def _calls_by_id(messages: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for m in messages:
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function") or {}
            out[str(tc.get("id"))] = decoded_text(str(fn.get("name")), fn.get("arguments"))
    return out


def _transcript_turns(messages: Sequence[Mapping[str, Any]]) -> list[_SeenTurn]:
    ids = _calls_by_id(messages)
    turns: list[_SeenTurn] = []
    for m in messages:
        role = m.get("role")
        if role in ("system", "developer") or _marked(m):
            continue
        if role == "user":
            turns.append(_SeenTurn(message_text(dict(m)), []))
        elif role == "tool" and turns:
            turns[-1].calls.append(
                (ids.get(str(m.get("tool_call_id")), "?"), message_text(dict(m)))
            )
    return turns


def _observation_calls(messages: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """The trailing tool results, paired with the calls that asked for them."""
    ids = _calls_by_id(messages)
    out: list[tuple[str, str]] = []
    for m in reversed(messages):
        if m.get("role") != "tool":
            break
        out.append((ids.get(str(m.get("tool_call_id")), "?"), message_text(dict(m))))
    return out[::-1]


def _first_turn_request(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The one unmarked user message of a compact context with no tool results (the first
    turn's request, in the stable prefix), or None."""
    users = [m for m in messages if m.get("role") == "user" and not _marked(m)]
    if len(users) != 1 or any(m.get("role") == "tool" for m in messages):
        return None
    return message_text(dict(users[0]))


def _drop_corrections(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Remove trailing (reply, CORRECTION) pairs the proxy adds when it re-asks."""
    while (
        len(messages) >= 2
        and messages[-1].get("role") == "user"
        and CORRECTION_MARK in message_text(messages[-1])
    ):
        messages = messages[:-2]
    return messages


def _envelope(patch: dict[str, Any], action: str) -> str:
    body = orjson.dumps({"state_patch": patch, "action": action}).decode()
    return f"```json\n{body}\n```"


def replay_reply(messages: list[dict[str, Any]], script: Script) -> SimReply:
    """The replay model's reply: a pure function of the context and the task's script.

    Raises ``SimError`` when the context does not fit the script (the arm is out of sync)."""
    messages = _drop_corrections([m for m in messages if isinstance(m, dict)])
    if not messages:
        raise SimError("replay: no messages")
    contract = any(CONTRACT_MARK in message_text(m) for m in messages)
    state = read_state(messages)
    last = messages[-1]
    history: list[str]
    if state is not None:  # the proxy's compact context: the position comes from the state
        turn_no = state.get("turn")
        done = state.get("calls_done")
        if not isinstance(turn_no, int) or not isinstance(done, int):
            raise SimError("replay: the state has no integer turn/calls_done")
        history = [str(h) for h in state.get("history") or []]
        if last.get("role") == "tool":
            t, k = turn_no - 1, done
            request = str(state.get("request") or "")
            results = [str(r) for r in state.get("results") or []]
            results += [_result_line(c, o) for c, o in _observation_calls(messages)]
        elif last.get("role") == "user" and not _marked(last):
            t, k, request, results = turn_no, 0, message_text(last), []
        elif last.get("role") == "user" and (first := _first_turn_request(messages)) is not None:
            # The first turn: the task leads the stable prefix, before the contract and the
            # state (issue 14 §2), in one merged user message under Anthropic.
            t, k, request, results = turn_no, 0, first, []
        else:
            raise SimError(f"replay: cannot read the position from a {last.get('role')} message")
    else:  # a full transcript: count turns and results
        seen = _transcript_turns(messages)
        if not seen:
            raise SimError("replay: no user turn in the context")
        t, k, request = len(seen) - 1, len(seen[-1].calls), seen[-1].user
        results = [_result_line(c, o) for c, o in seen[-1].calls]
        history = [_history_line(i + 1, s.user, s.calls) for i, s in enumerate(seen[:-1])]
    if not 0 <= t < len(script.turns):
        raise SimError(
            f"replay: turn {t + 1} is outside task {script.task_id} (0..{len(script.turns)})"
        )
    turn = script.turns[t]
    if request != turn.user:
        raise SimError(
            f"replay: task {script.task_id} turn {t + 1} expects the user message "
            f"{_short(turn.user, 60)!r}, the context has {_short(request, 60)!r}"
        )
    bounds = [0]
    for step in turn.steps:
        bounds.append(bounds[-1] + len(step))
    if k not in bounds:
        raise SimError(f"replay: {k} calls done in turn {t + 1}, not a step boundary {bounds}")
    i = bounds.index(k)
    patch: dict[str, Any] = {"turn": t + 1, "request": request}
    if i < len(turn.steps):
        step = turn.steps[i]
        calls = [
            {
                "id": f"call_{t + 1}_{k + j + 1}",
                "type": "function",
                "function": {"name": c.name, "arguments": orjson.dumps(c.args).decode()},
            }
            for j, c in enumerate(step)
        ]
        patch.update(calls_done=k + len(step), results=results)
        reply = SimReply("", tool_calls=calls, action="call_tools", patch=patch)
    else:
        names = ", ".join(c.name for s in turn.steps for c in s) or "no function call needed"
        outcomes = [(*r.split(" -> ", 1), "")[:2] for r in results]
        line = _history_line(t + 1, request, [(a, b) for a, b in outcomes])
        patch.update(calls_done=k, results=[], history=[*history, line])
        text = f"[replay] turn {t + 1} done: {names}."
        reply = SimReply(text, action="answer", patch=patch)
    if contract:
        env = _envelope(patch, reply.action)
        reply.content = f"{reply.content}\n\n{env}" if reply.content else env
    else:
        reply.patch = None
    return reply


class ReplayModel(SimModel):
    """The simulated model, replaying ``script`` (set it before each task)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        cache: bool = True,
        regime: CachePricing = "openai",
    ) -> None:
        super().__init__(host, port, cache=cache, regime=regime)
        self.script: Script | None = None

    def reply(self, body: dict[str, Any]) -> SimReply:
        script = self.script
        if script is None:
            raise SimError("replay: no task is loaded")
        return replay_reply(list(body.get("messages") or []), script)
