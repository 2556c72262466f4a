"""The turn's ``x-skillstate-*`` headers and the replies that carry them: a judged answer's,
an upstream error's, the closing SSE comment of a stream (whose headers are long gone), and
a reply kept under an Idempotency-Key, replayed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson

from ..choices import ContextShape, Mode, ReplyEnvelope
from ..cost.meter import TurnMeter
from ..dialects import sse
from ..engine.verdict import Outcome
from ..headertext import header_safe
from ..sessions.ids import SESSION_HEADER
from ..store import KeptReply
from ..upstream.client import Exchange
from .types import Answer, Reply, StreamReply, TurnMeta, strips, with_envelope

# On a reply kept under its Idempotency-Key and sent again (turn/idempotency.py).
REPLAYED_HEADER = "x-skillstate-replayed"


def base_headers(meta: TurnMeta, ex: Exchange | None) -> dict[str, str]:
    """The headers every reply of the turn carries: session, mode, context and auto's
    figures, and the answering upstream's."""
    h = {SESSION_HEADER: meta.turn.shown_session, "x-skillstate-mode": str(meta.turn.recorded_mode)}
    if meta.shape != ContextShape.PASSTHROUGH or meta.turn.mode == Mode.AUTO:
        h["x-skillstate-context"] = str(meta.shape)
    if meta.decision is not None:
        figures = meta.decision.as_dict()
        h["x-skillstate-auto"] = "; ".join(f"{k}={v}" for k, v in figures.items())
    if ex is not None:
        h.update(ex.relay_headers())
    return h


def reply(
    answer: Answer,
    meta: TurnMeta,
    outcome: Outcome | None,
    step: int | None,
    retries: int,
    reply_envelope: ReplyEnvelope,
) -> Reply:
    """The client's reply: the answer's body, with the turn's verdict and cost headers."""
    h = base_headers(meta, answer.ex)
    h["content-type"] = "application/json"
    h["x-skillstate-retries"] = str(retries + meta.reasked)  # the folds' re-asks too
    if outcome is not None and step is not None:
        h["x-skillstate-step"] = str(step)
        h["x-skillstate-transition"] = outcome.status
        if outcome.errors:
            h["x-skillstate-validation"] = header_safe("; ".join(outcome.errors), 500)
        if outcome.action:
            h["x-skillstate-action"] = header_safe(outcome.action)
    h.update(meta.meter.headers())
    raw = answer.raw
    strip = outcome is not None and with_envelope(meta.shape) and strips(meta.turn)
    if strip and reply_envelope == ReplyEnvelope.STRIP:
        # The verdict above was made on the unstripped text; the client gets the reply
        # without the protocol (an envelope-only reply becomes its action).
        stripped, _ = meta.turn.wire.strip_reply(answer.resp, answer.stripped)
        if stripped is not answer.resp:
            raw = orjson.dumps(stripped)
    return Reply(answer.ex.status, raw, h)


def error(status: int, raw: bytes, meta: TurnMeta, ex: Exchange) -> Reply:
    """An upstream error answer (already in the client's dialect), with the turn's headers."""
    h = base_headers(meta, ex)
    h["content-type"] = "application/json"
    return Reply(status, raw, h)


def stream_note(outcome: Outcome, step: int, meter: TurnMeter) -> bytes:
    """The SSE comment that closes a committed stream: its verdict, step and cost."""
    costs = meter.headers().items()
    extra = "".join(f" {k.removeprefix('x-skillstate-')}={v}" for k, v in costs)
    note = f"skillstate transition={outcome.status} step={step}{extra}"
    return sse.comment(note)


def replayed(kept: KeptReply) -> Reply | StreamReply:
    """The reply kept under an Idempotency-Key, as it was sent (nothing runs)."""
    assert kept.body is not None  # Idempotency.replay refused a reply that was not kept
    headers = {**kept.headers, REPLAYED_HEADER: "true"}
    if kept.stream:
        return StreamReply(headers, _replayed_stream(kept.body), _nothing)
    return Reply(kept.status, kept.body, headers)


async def _nothing() -> None:
    """A replayed stream's abort: it holds nothing."""


async def _replayed_stream(body: bytes) -> AsyncIterator[bytes]:
    """A kept stream's bytes, as one chunk (the client's SSE parser splits the events)."""
    yield body
