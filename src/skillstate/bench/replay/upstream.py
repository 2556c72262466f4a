"""The simulated provider of a replay: it answers each call with the recorded reply.

A :class:`~skillstate.bench.simmodel.SimModel` (its server, dialects and prompt-cache
billing) with a different policy:

* the reply is the recorded assistant message of the call being replayed (its text and
  tool calls), whatever the request holds;
* an envelope is appended only when the request asks for one (:func:`asks_for_envelope`:
  the proxy's state contract is in the context, and with the ``window`` form's contract
  the last message is the checkpoint instruction). Its patch is a deterministic summary:
  the distinctive tokens of the client's transcript, newest first, filling
  ``envelope_tokens`` (the prior: 130 tokens, the envelopes the simulated coding agent
  wrote on 60 real SWE-bench traces, issue 23), under ``notes``, with the call number
  under ``step``;
* output tokens are the recorded ones when the log has them (thinking included), else the
  estimate of the reply; the envelope's estimate is added on top;
* the clock of the prompt cache is the call's recorded time, so a cache entry expires
  between calls that were minutes apart, as it did;
* every request is measured for verbatim reach (:mod:`skillstate.bench.reach`).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any

import orjson

from skillstate.bench.reach import CallReach, ReachMeter, strings_of
from skillstate.bench.simmodel import (
    SimError,
    SimModel,
    SimReply,
    SimRequest,
    asks_for_envelope,
    message_text,
)
from skillstate.cost.tokens import estimate_text_tokens, estimate_tokens
from skillstate.engine.context import CONTRACT_MARK

from .session import ENVELOPE_TOKENS, Reply

__all__ = ["ENVELOPE_TOKENS", "Answer", "CallScript", "ReplayUpstream", "asks_for_envelope"]


@dataclass
class CallScript:
    """What the upstream needs to answer and measure one replayed call."""

    reply: Reply
    step: int
    at: float
    summary: list[str]  # tokens for the envelope's notes, newest first
    reachable: set[str]  # the action's reachable tokens (reach.ReachMeter.reachable)
    transcript: set[str]  # the strings of the client's messages for this call


@dataclass
class Answer:
    """One upstream request answered during a call."""

    status: int
    prompt_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    envelope_tokens: int = 0
    reach: CallReach | None = None
    body: dict[str, Any] | None = None  # the request as received (``keep_bodies`` only)


@dataclass
class _Current:
    script: CallScript | None = None
    answers: list[Answer] = field(default_factory=list)
    envelope: int = 0  # the envelope tokens of the reply being sent


_ALLOWED = re.compile(r"Allowed top-level state keys: (.+?)\.?$", re.M)


def allowed_keys(messages: list[dict[str, Any]]) -> list[str] | None:
    """The state keys the contract in the request allows (None: any)."""
    for m in messages:
        text = message_text(m)
        if CONTRACT_MARK in text:
            found = _ALLOWED.search(text)
            if found and found.group(1).strip() != "any":
                return [k.strip() for k in found.group(1).split(",") if k.strip()]
            return None
    return None


def envelope_text(step: int, summary: list[str], tokens: int, keys: list[str] | None) -> str:
    """The envelope appended to a reply: about ``tokens`` tokens (skillstate.tokens), its
    notes under ``notes`` (or the first key the contract allows) and the call number under
    ``step`` when the contract allows it."""
    budget = max(0, tokens * 4 - 80)  # the JSON around the notes is about 20 tokens
    words: list[str] = []
    size = 0
    pool = summary or [f"call-{step}"]
    while size < budget:
        word = pool[len(words) % len(pool)]
        words.append(word)
        size += len(word) + 1
    notes = " ".join(words)[:budget]
    patch: dict[str, Any] = {}
    if keys is None or "step" in keys:
        patch["step"] = step
    notes_key = "notes" if keys is None or "notes" in keys else None
    notes_key = notes_key or next((k for k in keys or () if k != "step"), None)
    if notes_key is not None:
        patch[notes_key] = notes
    body = orjson.dumps({"state_patch": patch, "action": "continue"}).decode()
    return f"\n\n```json\n{body}\n```"


class ReplayUpstream(SimModel):
    """``with ReplayUpstream(regime) as up:`` ... ``up.play(script)`` before each call."""

    def __init__(
        self, regime: Any, *, envelope_tokens: int = ENVELOPE_TOKENS, keep_bodies: bool = False
    ) -> None:
        self._now = 0.0
        self.keep_bodies = keep_bodies  # keep every request as received (for checks)
        super().__init__(regime=regime, clock=lambda: self._now)
        self.envelope_tokens = envelope_tokens
        self.meter = ReachMeter()
        self._cur = _Current()
        self._guard = threading.Lock()

    def begin_session(self) -> None:
        """Forget the cache and the tokenized strings of the previous session."""
        self.reset_cache()
        self.meter = ReachMeter()
        with self._lock:
            self.requests.clear()

    def prime(self, body: dict[str, Any], at: float) -> None:
        """Count ``body`` in the prompt cache at time ``at``, unbilled: what an earlier
        session left in the cache (the stand-in for an unlogged prefix its first call read)."""
        with self._guard:
            self._now = at
        self.cache.count(body)

    def play(self, script: CallScript) -> None:
        """The next call's script (the answers of the previous call are dropped)."""
        with self._guard:
            self._cur = _Current(script)
            self._now = script.at

    def answers(self) -> list[Answer]:
        with self._guard:
            return list(self._cur.answers)

    # SimModel's policy hooks
    def reply(self, body: dict[str, Any]) -> SimReply:
        script = self._cur.script
        if script is None:
            raise SimError("no recorded reply for this request (nothing is being replayed)")
        recorded = script.reply
        text = recorded.text
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        envelope = 0
        if asks_for_envelope(messages):
            keys = allowed_keys(messages)
            extra = envelope_text(script.step, script.summary, self.envelope_tokens, keys)
            envelope = estimate_text_tokens(extra)
            text += extra
        self._cur.envelope = envelope
        return SimReply(text, [dict(c) for c in recorded.tool_calls], "continue", None)

    def completion_tokens(self, reply: SimReply) -> int:
        script = self._cur.script
        if script is None:
            return 0
        recorded = script.reply.output_tokens
        if recorded is None:  # the log has no usage: the estimate of the recorded reply
            calls = script.reply.tool_calls
            recorded = estimate_text_tokens(script.reply.text)
            recorded += estimate_tokens(list(calls)) if calls else 0
        return recorded + self._cur.envelope

    def answered(self, received: dict[str, Any], rec: SimRequest) -> None:
        script = self._cur.script
        answer = Answer(rec.status, body=received if self.keep_bodies else None)
        if rec.status == 200 and script is not None:
            answer.prompt_tokens = rec.prompt_tokens
            answer.cache_read_tokens = rec.cached_tokens
            answer.cache_write_tokens = rec.cache_write_tokens
            answer.output_tokens = rec.completion_tokens
            answer.envelope_tokens = self._cur.envelope
            seen = strings_of(
                [received.get("system"), received.get("messages"), received.get("input")]
            )
            answer.reach = self.meter.measure(script.reachable, script.transcript, seen)
        with self._guard:
            self._cur.answers.append(answer)
