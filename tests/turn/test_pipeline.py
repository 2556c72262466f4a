"""``Pipeline`` alone: the sequence of one turn (lock, load, plan, call and re-ask, judge,
commit) against a fake ``Store`` and a fake ``UpstreamPool`` (unit tests; the same turns over
HTTP with the real store and the fake provider are in tests/e2e/).

What is checked here is what only the sequence decides: the re-ask, what a cancellation at
each stage leaves behind, a step conflict, and ``auto``'s switch (with its context built once
and the dialect looked up once per turn)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from skillstate.choices import Mode
from skillstate.config import Settings
from skillstate.cost.auto import AutoPlanner, TurnSizes
from skillstate.cost.pricing import PriceBook
from skillstate.cost.usage import Usage
from skillstate.dialects.registry import get_dialect
from skillstate.errors import ProxyError
from skillstate.store import SessionCommit, SessionRecord, StepConflict, TransitionRecord
from skillstate.store.records import LedgerRow
from skillstate.turn import plan as plan_module
from skillstate.turn import types as types_module
from skillstate.turn.pipeline import Pipeline
from skillstate.turn.types import Reply, StreamReply, Turn
from skillstate.upstream.client import Outbound

JSON = dict[str, Any]


def envelope(n: int, action: str = "next") -> str:
    body = {"state_patch": {"n": n}, "action": action}
    return f"Done.\n```json\n{json.dumps(body)}\n```"


def completion(text: str) -> JSON:
    """A chat completion, as an OpenAI-kind upstream sends it."""
    return {
        "id": "c1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
    }


# -- the fake store ---------------------------------------------------------------------------


@dataclass
class FakeStore:
    """The ``Store`` methods a turn uses, in memory; ``gate`` (per method name) holds a call
    until set, ``conflict`` makes the next commit a step conflict."""

    sessions: dict[str, SessionRecord] = field(default_factory=dict)
    transitions: list[TransitionRecord] = field(default_factory=list)
    ledger: list[LedgerRow] = field(default_factory=list)
    gates: dict[str, asyncio.Event] = field(default_factory=dict)
    entered: dict[str, asyncio.Event] = field(default_factory=dict)
    conflict: bool = False

    async def _at(self, name: str) -> None:
        self.entered.setdefault(name, asyncio.Event()).set()
        gate = self.gates.get(name)
        if gate is not None:
            await gate.wait()

    async def load(self, session: str, *, fresh: bool = False) -> SessionRecord | None:
        await self._at("load")
        return self.sessions.get(session)

    async def ensure_writable(self, timeout: float) -> None:
        return None

    def ensure_room_for_session(self) -> None:
        return None

    async def commit(self, c: SessionCommit) -> int:
        assert c.kept is None  # an Idempotency-Key's reply: these turns send none
        session, state, now, transition = c.session, c.state, c.now, c.transition
        await self._at("commit")
        current = self.sessions.get(session)
        if self.conflict or (current.step if current else 0) != c.expected_step:
            raise StepConflict(f"expected step {c.expected_step}")
        kept = state if state is not None else (current.state if current else {})
        created = current.created if current else now
        self.sessions[session] = SessionRecord(
            session, kept, c.schema, transition.step, created, now
        )
        self.transitions.append(transition)
        self.ledger.extend(c.ledger or ())
        return transition.step

    def commit_at_once(self, c: SessionCommit) -> int | None:
        return None  # every commit through commit(), whose gate the tests hold

    async def add_ledger_rows(self, rows: list[LedgerRow]) -> None:
        self.ledger.extend(rows)


# -- the fake upstream pool -------------------------------------------------------------------


class FakeExchange:
    """What the pipeline reads of an upstream's answer (``upstream.client.Exchange``)."""

    def __init__(self, status: int, body: bytes, chunks: list[bytes], gate: asyncio.Event | None):
        self.status = status
        self.body = body
        self.first_chunk = chunks[0] if chunks else b""
        self._more = list(chunks[1:])
        self._gate = gate
        self.failed_attempts: list[Any] = []
        self.ticket = None
        self.closed = False
        self.released = False
        self.reading: Any = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    upstream_name = "up"
    kind = "openai"
    provider_hint = "http://upstream.invalid/v1"

    def regime(self, model: str | None) -> Any:
        return UPSTREAM.cache_regime(model)

    def usage_of(self, resp: JSON) -> Usage | None:
        return get_dialect("openai").usage(resp.get("usage"))

    async def settle(self, usage: Usage | None) -> None:
        return None

    def relay_headers(self) -> dict[str, str]:
        return {"x-skillstate-upstream": self.upstream_name}

    async def read(self) -> bytes:
        if self._gate is not None:
            await self._gate.wait()
        return self.body

    async def read_chunk(self) -> bytes:
        if self._gate is not None:
            await self._gate.wait()
        return self._more.pop(0) if self._more else b""

    def close(self) -> None:
        self.closed = True

    def release(self) -> None:
        self.released = True


UPSTREAM = Settings(upstreams=[{"name": "up", "url": "http://upstream.invalid/v1"}]).upstreams[0]


class _Candidate:
    """One ``UpstreamRuntime`` as ``auto`` reads it (its config)."""

    cfg = UPSTREAM
    name = "up"
    kind = "openai"


@dataclass
class FakePool:
    """``UpstreamPool.dispatch`` answering from ``answer(outbound)``; ``gate`` holds the call
    (``dispatch``) or the body's read (``read``) until set."""

    answer: Callable[[Outbound], str]
    sent: list[Outbound] = field(default_factory=list)
    exchanges: list[FakeExchange] = field(default_factory=list)
    gates: dict[str, asyncio.Event] = field(default_factory=dict)
    entered: dict[str, asyncio.Event] = field(default_factory=dict)
    stream_chunks: list[bytes] | None = None

    def candidates(self, model: str | None = None) -> list[Any]:
        return [_Candidate()]

    async def dispatch(
        self,
        out: Outbound,
        failures: list[Any] | None = None,
        before_attempt: Any = None,
        read: Any = None,
    ) -> FakeExchange:
        self.sent.append(out)
        self.entered.setdefault("dispatch", asyncio.Event()).set()
        gate = self.gates.get("dispatch")
        if gate is not None:
            await gate.wait()
        body = orjson.dumps(completion(self.answer(out)))
        ex = FakeExchange(200, body, self.stream_chunks or [], self.gates.get("read"))
        if read is not None and not out.stream:
            ex.reading = read(ex)  # as the pool reads a non-streamed 2xx
        self.exchanges.append(ex)
        return ex


# -- helpers ----------------------------------------------------------------------------------


def make(tmp_path: Path, answer: Callable[[Outbound], str], **settings: Any) -> Pipeline:
    s = Settings(data_dir=tmp_path, schema=["n"], initial_state={"n": 0}, **settings)
    prices = PriceBook.from_config(s.prices, s.upstreams)
    return Pipeline(s, FakeStore(), FakePool(answer), prices)  # type: ignore[arg-type]


def store_of(p: Pipeline) -> FakeStore:
    assert isinstance(p.store, FakeStore)
    return p.store


def pool_of(p: Pipeline) -> FakePool:
    assert isinstance(p.pool, FakePool)
    return p.pool


def turn(messages: list[JSON], mode: Mode = Mode.STATE, stream: bool = False) -> Turn:
    body: JSON = {"model": "m", "messages": messages}
    if stream:
        body["stream"] = True
    return Turn("openai", body, {"x-skillstate-session": "s"}, "s", mode)


def said(text: str) -> list[JSON]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]


async def run_json(p: Pipeline, t: Turn) -> Reply:
    reply = await p.run(t)
    assert isinstance(reply, Reply)
    return reply


# -- re-ask -----------------------------------------------------------------------------------


async def test_an_invalid_answer_is_re_asked_with_what_was_wrong_and_the_next_one_committed(
    tmp_path: Path,
) -> None:
    answers = iter(["I forgot the envelope.", envelope(1)])
    p = make(tmp_path, lambda out: next(answers))
    reply = await run_json(p, turn(said("go")))
    assert reply.status == 200
    assert reply.headers["x-skillstate-retries"] == "1"
    assert reply.headers["x-skillstate-transition"] == "valid"
    assert reply.headers["x-skillstate-step"] == "1"
    first, again = pool_of(p).sent
    asked = json.dumps(again.body)
    assert "I forgot the envelope." in asked and "no valid state envelope" in asked
    assert "I forgot the envelope." not in json.dumps(first.body)
    assert store_of(p).sessions["s"].state == {"n": 1}
    # Both calls are in the ledger: the discarded one as a rollback-retry row.
    await p.settle()
    kinds = sorted(r.kind for r in store_of(p).ledger)
    assert kinds == ["generation", "rollback-retry"]


async def test_re_asks_stop_at_max_retries_and_the_last_answer_is_committed_invalid(
    tmp_path: Path,
) -> None:
    p = make(tmp_path, lambda out: "never an envelope", max_retries=1)
    reply = await run_json(p, turn(said("go")))
    assert len(pool_of(p).sent) == 2
    assert reply.headers["x-skillstate-transition"] == "invalid"
    assert reply.headers["x-skillstate-retries"] == "1"
    assert store_of(p).sessions["s"].step == 1
    assert store_of(p).sessions["s"].state == {"n": 0}  # an invalid turn keeps the state


# -- cancellation at each stage ---------------------------------------------------------------


async def _cancelled_at(p: Pipeline, entered: asyncio.Event, t: Turn) -> asyncio.Task[Any]:
    task = asyncio.ensure_future(p.run(t))
    await asyncio.wait_for(entered.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return task


async def test_cancelled_while_waiting_for_the_session_nothing_is_sent(tmp_path: Path) -> None:
    p = make(tmp_path, lambda out: envelope(1))
    store = store_of(p)
    store.gates["commit"] = asyncio.Event()
    first = asyncio.ensure_future(p.run(turn(said("one"))))
    await asyncio.wait_for(store.entered.setdefault("commit", asyncio.Event()).wait(), 5)
    waiting = asyncio.ensure_future(p.run(turn(said("two"))))
    await asyncio.sleep(0)  # it waits for the first turn's hold
    assert p.locks.__len__() == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    store.gates["commit"].set()
    assert isinstance(await first, Reply)
    assert len(pool_of(p).sent) == 1  # the cancelled turn never called upstream
    assert store.sessions["s"].step == 1
    assert len(p.locks) == 0


async def test_cancelled_while_loading_nothing_is_sent_and_the_session_is_free(
    tmp_path: Path,
) -> None:
    p = make(tmp_path, lambda out: envelope(1))
    store = store_of(p)
    store.gates["load"] = asyncio.Event()
    await _cancelled_at(p, store.entered.setdefault("load", asyncio.Event()), turn(said("go")))
    assert pool_of(p).sent == [] and store.transitions == []
    assert len(p.locks) == 0
    store.gates.pop("load")
    assert (await run_json(p, turn(said("go")))).headers["x-skillstate-step"] == "1"


async def test_cancelled_during_the_upstream_call_nothing_is_committed(tmp_path: Path) -> None:
    p = make(tmp_path, lambda out: envelope(1))
    pool = pool_of(p)
    pool.gates["dispatch"] = asyncio.Event()
    await _cancelled_at(p, pool.entered.setdefault("dispatch", asyncio.Event()), turn(said("go")))
    assert store_of(p).transitions == [] and "s" not in store_of(p).sessions
    assert len(p.locks) == 0


async def test_cancelled_while_reading_the_answer_the_upstream_sees_it_go(tmp_path: Path) -> None:
    p = make(tmp_path, lambda out: envelope(1))
    pool = pool_of(p)
    pool.gates["read"] = asyncio.Event()
    await _cancelled_at(p, pool.entered.setdefault("dispatch", asyncio.Event()), turn(said("go")))
    (ex,) = pool.exchanges
    assert ex.closed and not ex.released
    assert store_of(p).transitions == []
    assert len(p.locks) == 0


async def test_cancelled_during_the_commit_the_commit_finishes_before_the_session_is_free(
    tmp_path: Path,
) -> None:
    p = make(tmp_path, lambda out: envelope(len(pool_of(p).sent)))
    store = store_of(p)
    store.gates["commit"] = asyncio.Event()
    task = asyncio.ensure_future(p.run(turn(said("one"))))
    await asyncio.wait_for(store.entered.setdefault("commit", asyncio.Event()).wait(), 5)
    task.cancel()
    await asyncio.sleep(0.01)
    assert not task.done()  # the commit runs on; the turn still holds the session
    assert len(p.locks) == 1
    store.gates["commit"].set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert store.sessions["s"].step == 1 and store.sessions["s"].state == {"n": 1}
    assert len(p.locks) == 0
    # The next turn builds on the committed step (no conflict).
    reply = await run_json(p, turn(said("two")))
    assert reply.headers["x-skillstate-step"] == "2"


async def test_a_stream_cut_by_the_client_is_not_committed_and_is_metered(
    tmp_path: Path,
) -> None:
    chunk = b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":' + (
        b'[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}\n\n'
    )
    p = make(tmp_path, lambda out: "")
    pool = pool_of(p)
    pool.stream_chunks = [chunk, chunk]
    pool.gates["read"] = asyncio.Event()  # the second chunk never comes
    reply = await p.run(turn(said("go"), stream=True))
    assert isinstance(reply, StreamReply)
    first = await reply.chunks.__anext__()
    assert b"Hi" in first
    await reply.chunks.aclose()  # type: ignore[attr-defined]
    await reply.abort()
    (ex,) = pool.exchanges
    assert ex.closed
    assert store_of(p).transitions == []
    await p.settle()
    assert [r.status for r in store_of(p).ledger] == [499]
    assert len(p.locks) == 0


async def test_a_stream_the_client_left_before_its_first_chunk_is_a_499_row(
    tmp_path: Path,
) -> None:
    """The client is gone before the response pumps its first chunk (its disconnect was
    already queued): the relay never starts, yet the upstream had the request and may
    bill it, so the call is in the ledger as a cut stream, charged its estimate."""
    chunk = b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":' + (
        b'[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}\n\n'
    )
    p = make(tmp_path, lambda out: "")
    pool_of(p).stream_chunks = [chunk]
    reply = await p.run(turn(said("go"), stream=True))
    assert isinstance(reply, StreamReply)
    await reply.abort()  # the response's close, its chunks never read
    (ex,) = pool_of(p).exchanges
    assert ex.closed
    assert store_of(p).transitions == []
    await p.settle()
    rows = store_of(p).ledger
    assert [(r.status, r.kind) for r in rows] == [(499, "stream")]
    assert rows[0].pricing == "usage-unavailable"
    assert len(p.locks) == 0


# -- step conflict ----------------------------------------------------------------------------


async def test_a_step_conflict_is_a_409_and_the_billed_call_is_still_in_the_ledger(
    tmp_path: Path,
) -> None:
    p = make(tmp_path, lambda out: envelope(1))
    store = store_of(p)
    store.conflict = True
    with pytest.raises(ProxyError) as err:
        await p.run(turn(said("go")))
    assert (err.value.status, err.value.code) == (409, "conflict")
    assert store.transitions == []
    await p.settle()
    assert [r.kind for r in store.ledger] == ["generation"]
    assert len(p.locks) == 0


# -- auto's switch ----------------------------------------------------------------------------


PRICED = {
    "name": "up",
    "url": "http://upstream.invalid/v1",
    "prices": {
        "input_per_mtok": 3.0,
        "output_per_mtok": 15.0,
        "cache_read_per_mtok": 0.3,
        "cache_write_per_mtok": 3.0,
    },
}


@pytest.mark.parametrize(
    "read_01, auto_compact, form",
    [
        # relative rates, OpenAI's cache read at 0.5x, 1,000-token observations: compact
        (False, True, "compact"),
        # ... where compact is no candidate (the default): the window
        (False, False, "window"),
        # read at 0.1x, 200-token observations and a long envelope: the window
        (True, True, "window"),
    ],
)
async def test_auto_switches_to_the_cheaper_form_building_compact_only_to_weigh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_01: bool, auto_compact: bool, form: str
) -> None:
    compacts: list[JSON] = []
    build_compact = plan_module.context.build_compact

    def counted(*args: Any, **kwargs: Any) -> JSON:
        compacts.append(build_compact(*args, **kwargs))
        return compacts[-1]

    monkeypatch.setattr(plan_module.context, "build_compact", counted)
    lookups: list[str] = []
    monkeypatch.setattr(types_module, "get_dialect", lambda n: lookups.append(n) or get_dialect(n))
    action, observation, upstreams = "next", "x" * 4_000, []
    if read_01:
        observation = "lorem ipsum dolor sit amet " * 30
        upstreams = [PRICED]
        monkeypatch.setattr(_Candidate, "cfg", Settings(upstreams=upstreams).upstreams[0])
        action = "a long account of what was done " * 40  # an envelope of ~300 tokens
        sized = completion

        def usage_by_length(text: str) -> JSON:  # output tokens as long as the reply
            body = sized(text)
            body["usage"]["completion_tokens"] = len(text) // 4
            return body

        monkeypatch.setitem(globals(), "completion", usage_by_length)

    def like_a_model(out: Outbound) -> str:
        asked = "[skillstate] CHECKPOINT" in json.dumps(out.body["messages"][-1])
        return envelope(len(pool_of(p).sent), action) if asked else "Noted."

    p = make(tmp_path, like_a_model, mode=Mode.AUTO, upstreams=upstreams, auto_compact=auto_compact)
    transcript: list[JSON] = [{"role": "system", "content": "Be brief."}]
    shapes: list[str] = []
    built: list[int] = []
    for k in range(40):
        transcript.append({"role": "user", "content": f"observation {k}: {observation}"})
        before = len(compacts)
        lookups.clear()
        reply = await run_json(p, turn(list(transcript), Mode.AUTO))
        shapes.append(reply.headers["x-skillstate-context"])
        built.append(len(compacts) - before)
        assert lookups == ["openai"]  # one dialect lookup per turn
        transcript.append({"role": "assistant", "content": "Noted."})
        if len(shapes) > 2 and shapes[-3] == "checkpoint":
            break
    # passthrough until another form pays, one checkpoint that builds the state, then the
    # cheaper form (weighed again once the envelope's real size is known).
    switch = shapes.index("checkpoint")
    assert switch > 0 and set(shapes[:switch]) == {"passthrough"}
    assert shapes[switch + 1 :] == [form, form]
    assert store_of(p).transitions[0].context == "checkpoint"
    assert store_of(p).transitions[0].status == "valid"
    assert store_of(p).transitions[-1].context == form
    # compact is built at most once a turn: to weigh the forms, or to send it; a window turn
    # that weighs nothing builds none.
    assert all(n == 1 for n in built[: switch + 1])
    # the first turn after the envelope weighs window against compact (when compact may be)
    assert built[switch + 1] == (1 if auto_compact else 0)
    assert built[switch + 2] == (1 if form == "compact" else 0)


@pytest.mark.parametrize("keep", [1, 3, 6])
async def test_auto_weighs_the_window_with_the_configured_window_keep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep: int
) -> None:
    """The window's estimate rewrites the kept exchanges at each checkpoint: as many as the
    proxy's ``window_keep``, not the default's 3."""
    seen: list[int] = []
    decide = AutoPlanner.decide

    def spied(self: AutoPlanner, session: str, sizes: TurnSizes, **kw: Any) -> Any:
        seen.append(sizes.keep)
        return decide(self, session, sizes, **kw)

    monkeypatch.setattr(AutoPlanner, "decide", spied)
    p = make(tmp_path, lambda out: "Noted.", mode=Mode.AUTO, window_keep=keep)
    await run_json(p, turn([{"role": "user", "content": "observation: " + "x" * 4_000}], Mode.AUTO))
    assert seen and set(seen) == {keep}


# -- the window's checkpoints and the model's context limit -----------------------------------


@pytest.mark.parametrize(
    ("model", "configured"),
    [("gpt-4o-mini", None), ("my-local-model", None), ("my-local-model", 64_000)],
)
async def test_a_window_checkpoints_before_it_passes_its_share_of_the_models_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str, configured: int | None
) -> None:
    from skillstate.cost.checkpoint import CONTEXT_SHARE
    from skillstate.cost.tokens import request_tokens

    def like_a_model(out: Outbound) -> str:
        asked = "[skillstate] CHECKPOINT" in json.dumps(out.body["messages"][-1])
        return envelope(len(pool_of(p).sent)) if asked else "Noted."

    # window_max_tokens far out of reach: only the model's context limit can force a checkpoint
    p = make(tmp_path, like_a_model, mode=Mode.WINDOW, window_max_tokens=10_000_000)
    limit = p.planner.prices.context_window(model)
    if configured is not None:  # the upstream entry's context_tokens_by_model (a local server)
        cfg = UPSTREAM.model_copy(update={"context_tokens_by_model": {"my-local-*": configured}})
        monkeypatch.setattr(_Candidate, "cfg", cfg)
        assert limit is None
        limit = configured
    transcript: list[JSON] = [{"role": "system", "content": "Be brief."}]
    sent: list[int] = []
    for k in range(7):
        transcript.append({"role": "user", "content": f"observation {k}: " + "x" * 48_000})
        body: JSON = {"model": model, "messages": list(transcript)}
        await run_json(p, Turn("openai", body, {"x-skillstate-session": "s"}, "s", Mode.WINDOW))
        sent.append(request_tokens(pool_of(p).sent[-1].body))
        transcript.append({"role": "assistant", "content": "Noted."})
    reasons = [t.estimate.get("reason") for t in store_of(p).transitions]
    if limit is None:  # a model genai-prices does not know: the bill alone decides
        assert "context_limit" not in reasons
        return
    assert limit == (configured or 128_000)
    assert "context_limit" in reasons
    # every request stayed within the share (plus at most the one turn it grew by)
    assert max(sent) <= limit * CONTEXT_SHARE + 12_500


# -- auto's switch timed as the window's first checkpoint -------------------------------------


async def auto_session(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    observations: list[str],
    extra: JSON | None = None,
) -> tuple[Pipeline, list[str]]:
    """An ``auto`` session at Sonnet's prices under OpenAI's cache (read 0.1x), one turn per
    observation: each turn's ``x-skillstate-context``."""
    monkeypatch.setattr(_Candidate, "cfg", Settings(upstreams=[PRICED]).upstreams[0])

    def like_a_model(out: Outbound) -> str:
        asked = "[skillstate] CHECKPOINT" in json.dumps(out.body["messages"][-1])
        return envelope(len(pool_of(p).sent)) if asked else "Noted."

    p = make(tmp_path, like_a_model, mode=Mode.AUTO, upstreams=[PRICED])
    transcript: list[JSON] = [{"role": "system", "content": "Be brief."}]
    shapes: list[str] = []
    for k, observation in enumerate(observations):
        transcript.append({"role": "user", "content": f"observation {k}: {observation}"})
        t = turn(list(transcript), Mode.AUTO)
        t.body.update(extra or {})
        reply = await run_json(p, t)
        shapes.append(reply.headers["x-skillstate-context"])
        transcript.append({"role": "assistant", "content": "Noted."})
    return p, shapes


SMALL = "lorem ipsum dolor sit amet " * 30  # ~200 tokens


@pytest.mark.parametrize("big", [7, 8, 9])
async def test_auto_does_not_switch_while_a_large_exchange_is_among_those_it_would_keep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, big: int
) -> None:
    observations = [SMALL] * 30
    observations[big] = "a long test log line " * 1_200  # ~6,000 tokens
    _, shapes = await auto_session(tmp_path, monkeypatch, observations)
    switch = shapes.index("checkpoint")
    assert set(shapes[:switch]) == {"passthrough"}
    # The switch is a checkpoint: it keeps the last 3 exchanges and writes them into the
    # cache again. While the large one is among them (turns big .. big + 2), the same
    # switch a turn or two later costs less.
    assert not big <= switch < big + 3


async def test_after_auto_s_switch_the_checkpoint_rule_counts_the_passthrough_turns_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from skillstate.cost.checkpoint import CheckpointPolicy

    counted: list[int] = []
    decide = CheckpointPolicy.decide

    def recorded(self: CheckpointPolicy, sizes: Any, **kw: Any) -> Any:
        counted.append(sizes.turns)
        return decide(self, sizes, **kw)

    monkeypatch.setattr(CheckpointPolicy, "decide", recorded)
    _, shapes = await auto_session(tmp_path, monkeypatch, [SMALL] * 24)
    switch = shapes.index("checkpoint")
    after = len(shapes) - switch - 1
    assert switch > 3 and after > 3
    # The turns after the switch are the session's turns switch + 2 .. (1-based), not the
    # steps committed since the switch: a session that has run n turns is expected to run
    # about n more, the switch's passthrough turns included.
    assert counted[-after:] == list(range(switch + 2, len(shapes) + 1))


async def test_auto_switches_where_the_client_forces_a_tool_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under a forced tool call the window's checkpoint is a fold (its reply cannot carry the
    # envelope): the rule takes it, so the switch is not put off for good.
    tool = {"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}
    forced = {"tools": [tool], "tool_choice": "required"}
    _, shapes = await auto_session(tmp_path, monkeypatch, [SMALL] * 24, forced)
    _, free = await auto_session(tmp_path / "free", monkeypatch, [SMALL] * 24)
    assert "checkpoint" in shapes
    assert shapes.index("checkpoint") == free.index("checkpoint")


# -- states are shared, never changed in place --------------------------------------------------


class _FrozenDict(dict):  # type: ignore[type-arg]
    """A state's object that fails the test when anything changes it in place."""

    def _changed(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("a loaded state was changed in place")

    __setitem__ = __delitem__ = __ior__ = _changed  # type: ignore[assignment]
    pop = popitem = clear = update = setdefault = _changed  # type: ignore[assignment]


class _FrozenList(list):  # type: ignore[type-arg]
    def _changed(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("a loaded state was changed in place")

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _changed  # type: ignore[assignment]
    append = extend = insert = pop = remove = clear = sort = reverse = _changed  # type: ignore[assignment]


def frozen(value: Any) -> Any:
    if isinstance(value, dict):
        return _FrozenDict({k: frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return _FrozenList(frozen(v) for v in value)
    return value


class FrozenStore(FakeStore):
    """Hands out every loaded state frozen: a merge shares the subtrees its patch leaves
    untouched with the state it merged into (``engine.patch.merge_patch``), so a change in
    place anywhere in a turn would change the session's earlier states too."""

    async def commit(self, c: SessionCommit) -> int:
        if c.state is not None:
            assert c.state_json is None or c.state_json == orjson.dumps(c.state)
            c = dataclasses.replace(c, state=frozen(c.state), state_json=None)
        return await super().commit(c)


INITIAL = {"n": 0, "notes": {"a": [1, {"b": 2}], "keep": {"c": [3]}}, "log": ["start"]}


def nested_envelope(k: int) -> str:
    patch: JSON = {"n": k, "notes": {"a": [k, {"b": k}], "new": {"d": [k]}}}
    if k % 3 == 0:
        patch["log"] = None if k % 2 else ["again"]
    return f"Done.\n```json\n{json.dumps({'state_patch': patch, 'action': 'next'})}\n```"


@pytest.mark.parametrize("mode", [Mode.STATE, Mode.WINDOW])
async def test_no_turn_changes_a_loaded_state_in_place(tmp_path: Path, mode: Mode) -> None:
    """Each turn's state shares its untouched subtrees with the last one: with the states
    the store hands out frozen, state and window turns (re-asks and checkpoints among them)
    never change one in place; every committed state stays as it was committed, and the
    initial state as configured."""
    calls = 0

    def answer(out: Outbound) -> str:
        nonlocal calls
        calls += 1
        return "no envelope this time" if calls % 4 == 0 else nested_envelope(calls)

    settings = Settings(
        data_dir=tmp_path, schema=list(INITIAL), initial_state=INITIAL, mode=mode, window_keep=1
    )
    prices = PriceBook.from_config(settings.prices, settings.upstreams)
    p = Pipeline(settings, FrozenStore(), FakePool(answer), prices)  # type: ignore[arg-type]
    transcript: list[JSON] = [{"role": "system", "content": "Be brief."}]
    states: list[tuple[Any, bytes]] = []
    for k in range(8):
        transcript.append({"role": "user", "content": f"observation {k}"})
        reply = await run_json(p, turn(list(transcript), mode))
        assert reply.status == 200, reply.body
        transcript.append({"role": "assistant", "content": "Noted."})
        record = store_of(p).sessions.get("s")
        if record is not None:
            states.append((record.state, orjson.dumps(record.state)))
    assert store_of(p).transitions and {t.status for t in store_of(p).transitions} & {"valid"}
    for state, was in states:  # every state as it was committed
        assert orjson.dumps(state) == was
    assert settings.initial_state == INITIAL
