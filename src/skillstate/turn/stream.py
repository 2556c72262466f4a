"""A streamed turn after the upstream said yes: relay its stream in the client's dialect,
then judge and commit before the terminal event (the verdict and cost go out in a closing
SSE comment). Metered whichever way it ends (a cut is a 499 row)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from fractions import Fraction

from ..cancelsafe import shielded
from ..choices import ReplyEnvelope
from ..config import Settings
from ..cost.baseline import envelope_output_share
from ..dialects.base import StreamRelay
from ..dialects.registry import make_relay
from ..dialects.streaming import failure, relay_events
from ..engine.strip_events import StrippingRelay
from ..engine.stripper import strip_envelope
from ..engine.verdict import Outcome, Verdicts
from ..errors import CLIENT_CLOSED, ProxyError
from ..store import KeptReply, StoredResponse
from ..upstream.client import Exchange, Outbound
from . import render
from .commit import Committer
from .idempotency import StreamCapture
from .plan import Planner
from .types import TurnMeta, strips, with_envelope

log = logging.getLogger("skillstate")


class StreamPath:
    """Relays a turn's 2xx stream; ``commit`` commits the judged turn (the pipeline's), and
    ``commits`` writes the ledger rows it did not take (``Committer.close_ledger``)."""

    def __init__(
        self,
        settings: Settings,
        verdicts: Verdicts,
        planner: Planner,
        commit: Callable[
            [TurnMeta, Outcome, KeptReply | None, StoredResponse | None], Awaitable[int]
        ],
        commits: Committer,
    ) -> None:
        self.settings = settings
        self.verdicts = verdicts
        self.planner = planner
        self.commit = commit
        self.commits = commits

    async def relay(
        self, ex: Exchange, out: Outbound, meta: TurnMeta, stack: AsyncExitStack
    ) -> AsyncIterator[bytes]:
        """Relay a 2xx stream in the client's dialect, then judge and commit before the
        terminal event. Metered whichever way it ends (a cut is a 499 row)."""
        turn = meta.turn
        meter = meta.meter
        meta.streamed = True
        relay: StreamRelay = make_relay(
            turn.dialect,
            ex.kind,
            request_model=turn.model,
            client_wants_usage=turn.wire.stream_usage_requested(turn.body),
            capture_limit=self.settings.capture_limit_bytes,
        )
        envelope = with_envelope(meta.shape)
        stripping: StrippingRelay | None = None
        if envelope:
            rewrite = self.settings.reply_envelope == ReplyEnvelope.STRIP and strips(turn)
            relay = stripping = StrippingRelay(relay, turn.dialect, rewrite=rewrite)
        clean = False
        limit = self.settings.idempotency_max_reply_bytes
        capture = None if turn.idempotency is None else StreamCapture(limit)

        try:
            problem = None
            events = relay_events(ex.first_chunk, ex.read_chunk, relay, ex.upstream_name)
            async with contextlib.aclosing(events):
                async for ready in events:
                    if isinstance(ready, bytes):
                        if capture is not None:
                            capture.add(ready)
                        yield ready
                    else:
                        problem = ready.problem
            await ex.settle(relay.usage)
            self._answered(meta, ex, out, relay, stripping, ex.status if problem is None else 502)
            if problem is not None:
                if not relay.error_forwarded:
                    yield relay.error(problem)
                return
            tail = relay.finish()
            if envelope or meta.window is not None:
                note, committed = await self._commit(meta, relay, ex, b"".join(tail), capture)
                if not committed:
                    yield note  # the error event: the reply is out but not committed
                    clean = True
                    return
                tail.insert(0, note)
            else:
                kept = None
                if capture is not None:
                    headers, body = render.base_headers(meta, ex), capture.body(b"".join(tail))
                    kept = self.commits.kept(meta, ex.status, headers, body, stream=True)
                response = _stored(meta, tail)
                await self.commits.keep_uncommitted(meta, kept, response)
            await self.commits.close_ledger(turn, meter)  # before the last bytes go out
            yield b"".join(tail)
            clean = True
        finally:
            if clean:
                ex.release()
            else:
                ex.close()  # the upstream sees the request cancelled
                if not meter.answered_yet:
                    self._answered(meta, ex, out, relay, stripping, CLIENT_CLOSED)
            turn.telemetry.metered(meter.rows)
            await self.commits.close_ledger(turn, meter)
            await shielded(stack.aclose())

    def closer(
        self, ex: Exchange, meta: TurnMeta, stack: AsyncExitStack
    ) -> Callable[[], Awaitable[None]]:
        """The stream reply's ``abort``, which the response calls once when it is over. A
        client gone before the response pumped its first chunk leaves ``relay`` never
        started, so its close never ran: the upstream had the request and may bill it,
        so the call is metered here as a cut stream (a 499 row, charged its estimate)."""

        async def abort() -> None:
            ex.close()
            if not meta.streamed:
                if not meta.meter.answered_yet:
                    meta.meter.failed(ex.upstream_name, CLIENT_CLOSED, "stream")
                meta.turn.telemetry.metered(meta.meter.rows)
                await self.commits.close_ledger(meta.turn, meta.meter)
            await stack.aclose()

        return abort

    def _answered(
        self,
        meta: TurnMeta,
        ex: Exchange,
        out: Outbound,
        relay: StreamRelay,
        stripping: StrippingRelay | None,
        status: int,
    ) -> None:
        """Meter the stream's answer; with an envelope (``stripping``), the planner learns
        what share of the output it took."""
        usage = relay.usage
        if not relay.complete:
            # Cut before its end, by the client or the upstream: what usage it reported so
            # far is not the bill (Messages reports the input first and the output last),
            # so it is charged an estimate.
            usage = None
        share = Fraction(0)
        if stripping is not None:
            text = relay.text
            removed = strip_envelope(text).removed_chars
            share = envelope_output_share(text, removed, stripping.tool_chars)
            self.planner.envelope_seen(meta, usage, share)
        meta.meter.answered(
            upstream=ex.upstream_name,
            provider_hint=ex.provider_hint,
            usage=usage,
            status=status,
            model=relay.model,
            est_sent=out.est_tokens,
            kind="stream",
            regime=ex.regime(relay.model or meta.turn.model),
            envelope_share=share,
        )

    async def _commit(
        self,
        meta: TurnMeta,
        relay: StreamRelay,
        ex: Exchange,
        tail: bytes,
        capture: StreamCapture | None,
    ) -> tuple[bytes, bool]:
        """Judge and commit a finished stream: the SSE comment carrying the verdict and cost
        (headers are long gone) and True, or the error event and False when that failed.
        With ``capture`` (an Idempotency-Key) the whole stream, the comment and ``tail``
        that follow it, is kept in the commit."""
        turn = meta.turn
        try:
            if with_envelope(meta.shape):
                outcome = self.verdicts.judge(
                    relay.text, relay.has_tool_calls, meta.state, meta.schema, turn.envelope_form
                )
            else:
                outcome = Outcome("window")  # a window turn: recorded, no envelope asked
            step = meta.step + 1  # what the commit writes
            note = render.stream_note(outcome, step, meta.meter)
            kept = None
            if capture is not None:
                headers, body = render.base_headers(meta, ex), capture.body(note + tail)
                kept = self.commits.kept(
                    meta, ex.status, headers, body, step=step, stream=True, verdict=outcome.status
                )
            # Commit before the terminal event: a client that reads /state right after the
            # stream ends sees the new state (and one that chains on it, the response).
            await self.commit(meta, outcome, kept, _stored(meta, [tail]))
        except Exception as e:
            # Say so in-band, as an upstream error would be, rather than by cutting the
            # connection.
            if not isinstance(e, ProxyError):
                log.exception("turn %s: judging or committing a stream", turn.session)
            internal = failure(f"internal proxy error ({type(e).__name__})")
            return relay.error(e if isinstance(e, ProxyError) else internal), False
        return note, True


def _stored(meta: TurnMeta, tail: list[bytes]) -> StoredResponse | None:
    """The response a Responses stream with ``store`` keeps: its terminal event's (in the
    stream's last bytes); None for any other turn."""
    link = meta.turn.stored
    return None if link is None else link.from_stream(b"".join(tail))
