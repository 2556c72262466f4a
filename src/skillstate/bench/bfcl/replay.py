"""The offline model of ``bench bfcl``: it replays a task's ground truth, step by step.

It finds its place (turn, calls done) only from what it receives: the transcript in the
baseline arm, the state in the state arm (so the state has to carry it), the state as of the
last checkpoint and the messages after it in the window form (the call ids ``call_T_K`` and
the answers' ``turn T done`` say where each message of the window stands, so a kept exchange
the state already holds is not counted twice), and refuses (``SimError``, HTTP 400) when the
context does not match the task. It writes the envelope only when asked for it: on every
turn of a state contract, at checkpoints of the window's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from skillstate.bench.bfcl.constants import HISTORY_CHARS, RESULT_CHARS
from skillstate.bench.bfcl.tasks import FuncCall, Task, decoded_text, group_calls
from skillstate.bench.simmodel import (
    SimError,
    SimModel,
    SimReply,
    asks_for_envelope,
    message_text,
    read_state,
    without_corrections,
)
from skillstate.bench.wire import shorten as _short
from skillstate.cost.baseline import CachePricing
from skillstate.engine.context import CONTRACT_MARK, CORRECTION_MARK, STATE_MARK
from skillstate.engine.window import CHECKPOINT_MARK

_CALL_ID = re.compile(r"call_(\d+)_(\d+)")  # the ids replay_reply gives: turn, call number
_DONE = re.compile(r"\[replay\] turn (\d+) done")  # a turn's answer


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
    return any(m in text for m in (CONTRACT_MARK, STATE_MARK, CORRECTION_MARK, CHECKPOINT_MARK))


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


@dataclass
class _Position:
    """Where a window context stands: the turn (0-based), its calls done, its request and
    results by call number, and the history of the turns answered."""

    turn: int
    done: int
    request: str
    results: dict[int, str]
    history: list[str]


def _window_start(messages: Sequence[Mapping[str, Any]]) -> int:
    """The index of the first window message: after the last one holding the state (the
    stable prefix and the state come before it), or 0 when the state follows the transcript
    (``auto``'s switch: the transcript as it is, then the contract and the state)."""
    at = max((i for i, m in enumerate(messages) if STATE_MARK in message_text(dict(m))), default=-1)
    if not any(not _marked(m) for m in messages[at + 1 :]):
        return 0
    return at + 1


def _window_position(messages: Sequence[Mapping[str, Any]], state: Mapping[str, Any]) -> _Position:
    """The position of a window context: the state's, then every window message in turn."""
    turn_no, done = state.get("turn", 0), state.get("calls_done", 0)
    if not isinstance(turn_no, int) or not isinstance(done, int):
        raise SimError("replay: the state has no integer turn/calls_done")
    results = [str(r) for r in state.get("results") or []]
    start = _window_start(messages)
    request = str(state.get("request") or "")
    if not turn_no:  # no checkpoint yet: the first turn's request is the task, in the prefix
        users = (m for m in messages[:start] if m.get("role") == "user" and not _marked(m))
        task = next(users, None)
        request = message_text(dict(task)) if task is not None else request
    pos = _Position(
        max(turn_no - 1, 0),
        done,
        request,
        dict(enumerate(results, 1)),
        [str(h) for h in state.get("history") or []],
    )
    window = [m for m in messages[start:] if not _marked(m)]
    ids = _calls_by_id(window)
    for m in window:
        role = m.get("role")
        if role == "user":  # a turn starts: the one after every turn answered
            pos = _Position(len(pos.history), 0, message_text(dict(m)), {}, pos.history)
        elif role == "tool":
            call_id = str(m.get("tool_call_id"))
            found = _CALL_ID.fullmatch(call_id)
            if found is None:
                raise SimError(f"replay: a tool result for an unknown call {call_id!r}")
            t, k = int(found[1]) - 1, int(found[2])
            if t < len(pos.history):  # a kept exchange of a turn the state has answered
                continue
            if t != pos.turn:
                raise SimError(f"replay: a result of turn {t + 1} in turn {pos.turn + 1}")
            pos.results[k] = _result_line(ids.get(call_id, "?"), message_text(dict(m)))
            pos.done = max(pos.done, k)
        elif role == "assistant" and (answer := _DONE.match(message_text(dict(m)))):
            n = int(answer[1])
            if n > len(pos.history):  # answered after the state was written
                outcomes = [(*r.split(" -> ", 1), "")[:2] for r in _ordered(pos.results)]
                line = _history_line(n, pos.request, [(a, b) for a, b in outcomes])
                pos.history = [*pos.history, line]
    return pos


def _ordered(results: Mapping[int, str]) -> list[str]:
    return [results[k] for k in sorted(results)]


def _first_turn_request(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The one unmarked user message of a compact context with no tool results (the first
    turn's request, in the stable prefix), or None."""
    users = [m for m in messages if m.get("role") == "user" and not _marked(m)]
    if len(users) != 1 or any(m.get("role") == "tool" for m in messages):
        return None
    return message_text(dict(users[0]))


def _envelope(patch: dict[str, Any], action: str) -> str:
    body = orjson.dumps({"state_patch": patch, "action": action}).decode()
    return f"```json\n{body}\n```"


def _window_form(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the context holds the window form's contract (it speaks of checkpoints)."""
    return any(
        CONTRACT_MARK in (text := message_text(dict(m))) and "checkpoint" in text.lower()
        for m in messages
    )


def _position(
    messages: list[dict[str, Any]], state: dict[str, Any] | None, window: bool
) -> tuple[int, int, str, list[str], list[str]]:
    """Where the context is in the task: (turn index, calls done in it, its user request,
    the history before it, the results of its calls so far), read from the window form,
    the compact context's state or a full transcript (``SimError`` when it cannot be)."""
    last = messages[-1]
    history: list[str]
    if window:
        unmarked = [m for m in messages if not _marked(m)]
        last = unmarked[-1] if unmarked else last
        if last.get("role") not in ("user", "tool"):
            raise SimError(f"replay: cannot read the position from a {last.get('role')} message")
        pos = _window_position(messages, state or {})
        t, k, request, history = pos.turn, pos.done, pos.request, pos.history
        results = _ordered(pos.results)
    elif state is not None:  # the proxy's compact context: the position comes from the state
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
    return t, k, request, history, results


def replay_reply(messages: list[dict[str, Any]], script: Script) -> SimReply:
    """The replay model's reply: a pure function of the context and the task's script.

    Raises ``SimError`` when the context does not fit the script (the arm is out of sync)."""
    messages = without_corrections([m for m in messages if isinstance(m, dict)])
    if not messages:
        raise SimError("replay: no messages")
    contract = asks_for_envelope(messages)
    state = read_state(messages)
    window = _window_form(messages)
    t, k, request, history, results = _position(messages, state, window)
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
    if window:  # a checkpoint folds the turns answered in the window into the history
        patch["history"] = history
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
