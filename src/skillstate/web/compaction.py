"""Compaction served from the session's state (``skillstate.compaction``), for the
Responses API: ``POST /v1/responses/compact``, a ``/v1/responses`` request that ends with a
``compaction_trigger`` item, and the ``compaction`` items later requests carry back.

A compaction is a **checkpoint** of the session: the ``window`` form's checkpoint turn over
the compaction's own input (a session with no state yet: a full turn with the contract),
whose patch folds that history into the state, committed as a transition and metered like
any turn. The client gets one
``compaction`` item whose ``encrypted_content`` is a token pinning that step; a later
request that carries the item gets, upstream, the state of that step in its place.

To an ``openai-responses`` upstream under ``compaction: native`` the upstream compacts: the
trigger and ``/responses/compact`` go to it as they came (a metered passthrough turn).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from ..auth.gate import Principal
from ..choices import Compaction, ContextShape, Mode
from ..compaction import items as ci
from ..compaction import messages as cm
from ..compaction.edits import COMPACT, apply_edits, edits_of
from ..compaction.pinned import Unrebuildable
from ..compaction.token import CompactionRef, TokenError, TokenSealer, looks_like_token
from ..cost.tokens import estimate_tokens
from ..dialects import sse
from ..dialects.anthropic import ANTHROPIC
from ..dialects.responses import RESPONSES, input_items
from ..engine.context import split_transcript
from ..errors import ProxyError
from ..store import StoreError
from ..turn.types import Reply, StreamReply, Turn
from .runtime import Runtime

JSON = dict[str, Any]


def _bad(message: str, param: str = "input") -> ProxyError:
    return ProxyError("invalid_request", message, param=param)


def sealer(rt: Runtime) -> TokenSealer:
    """The token sealer under the server secret (the keys' hasher's: it may be replaced
    when the lifespan reads a shared store's secret)."""
    return TokenSealer(rt.keys.hasher.derive(b"compaction token"))


def key_of(caller: Principal | None) -> str:
    return caller.name if caller is not None else ""


# A checkpoint that folded nothing: a client error no SDK retries on its own (_not_folded).
UNFOLDED_STATUS = 422

# The Responses API's compaction endpoint under an upstream's base URL (``.../v1``).
NATIVE_COMPACT_PATH = "/responses/compact"


def native(rt: Runtime, model: str) -> bool:
    """Whether compaction is the upstream's own: ``compaction: native`` and the upstream
    that would serve the model speaks the Responses API."""
    if rt.settings.compaction == Compaction.PROXY:
        return False
    candidates = rt.pool.candidates(model or None)
    return bool(candidates) and candidates[0].kind == RESPONSES.name


async def restore(rt: Runtime, turn: Turn, caller: Principal | None, adopt: bool) -> Turn:
    """The turn with the latest compaction item the proxy made replaced by the state its
    checkpoint committed, and the items before it left out but system and developer
    messages: as the API reads an input, the latest compaction item carries what came
    before it (its guide has clients drop those items; a client that appends instead must
    not be billed for them again, nor pass a ``compact_threshold`` on every turn).
    ``adopt``: the request named no session, so it continues the token's. A bad token is a
    400 here, before anything is sent upstream."""
    items = turn.body.get("input")
    if not isinstance(items, list):
        return turn
    found = [k for k, item in enumerate(items) if ci.kind(item) == ci.COMPACTION]
    if not found:
        return turn
    k = found[-1]
    content = items[k].get("encrypted_content")
    if native(rt, turn.model) and not looks_like_token(content):
        return turn  # the upstream's own compaction item: it reads it
    turn, ref, state = await _resolve(rt, turn, caller, content, f"input[{k}]", adopt)
    instructions = [i for i in items[:k] if isinstance(i, dict) and RESPONSES.context.is_system(i)]
    out = [*instructions, ci.restored_state(state, ref.step), *items[k + 1 :]]
    return dataclasses.replace(turn, body={**turn.body, "input": out})


async def _resolve(
    rt: Runtime,
    turn: Turn,
    caller: Principal | None,
    content: Any,
    where: str,
    adopt: bool,
    param: str = "input",
) -> tuple[Turn, CompactionRef, JSON]:
    """The turn (in the token's session when ``adopt``), the token's reference and the
    state it pins; a 400 for a token that is not the caller's, or not this session's."""
    ref = _open(rt, content, param)
    if ref.key != key_of(caller):
        raise _bad(f"{where}: a compaction item made for another client key", param)
    if ref.session != turn.session:
        if not adopt:
            raise _bad(f"{where}: a compaction item of another session", param)
        turn = _in_session(turn, ref.session, caller)
    return turn, ref, await _state_at(rt, ref.session, ref.step, where, param)


def _open(rt: Runtime, content: Any, param: str) -> CompactionRef:
    if not isinstance(content, str):
        raise _bad("a compaction item without encrypted_content", param)
    try:
        return sealer(rt).open(content)
    except TokenError as e:
        raise _bad(f"invalid compaction item: {e}", param) from None


def _in_session(turn: Turn, session: str, caller: Principal | None) -> Turn:
    shown = session.split(":", 1)[1] if caller is not None and ":" in session else session
    return dataclasses.replace(turn, session=session, client_session=shown)


async def _state_at(rt: Runtime, session: str, step: int, where: str, param: str) -> JSON:
    """The session's state right after ``step``, which a turn committed since does not
    change (a compaction's token pins it)."""
    try:
        record = await rt.sessions.load_current(session)
    except StoreError as e:
        raise e.for_client("could not load the session") from e
    if record is None:
        raise _bad(f"{where}: a compaction item of a session that no longer exists", param)
    if step > record.step:
        raise _bad(f"{where}: a compaction item of a step the session never reached", param)
    try:
        return await rt.pinned_states.at(record, step)
    except StoreError as e:
        raise e.for_client("could not read the session's history") from e
    except Unrebuildable as e:
        raise ProxyError("conflict", f"{e}: the compaction item cannot be restored") from e


# Request fields a checkpoint does not send: it is answered in full (not streamed), in
# text (the envelope), and stands for no stored response.
_NOT_FOR_CHECKPOINT = (
    "stream",
    "text",
    "output_config",
    "tool_choice",
    "context_management",
    "store",
    "include",
)


def trigger_of(turn: Turn) -> bool:
    """Whether the request asks for a compaction (its last input item is the trigger);
    a 400 when the trigger is elsewhere."""
    items = turn.body.get("input")
    if not isinstance(items, list):
        return False
    at = ci.trigger_at(items)
    if at is None:
        return False
    if at != len(items) - 1:
        raise _bad(f"input[{at}]: compaction_trigger must be the last input item")
    return True


async def compact(
    rt: Runtime, turn: Turn, caller: Principal | None, *, endpoint: bool
) -> Reply | StreamReply:
    """Serve a compaction: the checkpoint turn, then the answer with one compaction item
    (``endpoint``: ``POST /responses/compact``'s ``response.compaction`` object; else the
    ``response`` of a request that ended with the trigger, streamed if it asked to be)."""
    items = input_items(turn.body.get("input"))
    if not endpoint:
        items = items[:-1]  # the trigger
    folded = await _fold(rt, turn, caller, "input", items, ci.checkpoint_request)
    if isinstance(folded, Reply):
        return folded  # the upstream's error, in the client's dialect
    item = ci.compaction_item(folded.token)
    if endpoint:
        body = ci.compacted_response(items, item, folded.usage, folded.created_at)
    else:
        body = ci.triggered_response(turn.model, item, folded.usage, folded.created_at)
        if turn.stream:
            return StreamReply(folded.headers, _once(ci.response_events(body)), _nothing)
    return Reply(200, orjson.dumps(body), {**folded.headers, "content-type": "application/json"})


@dataclasses.dataclass(frozen=True, slots=True)
class _Folded:
    """A committed checkpoint: its reply (headers, usage), the step it committed and the
    compaction token that pins it."""

    reply: Reply
    step: int
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {k: v for k, v in self.reply.headers.items() if k != "content-type"}

    @property
    def usage(self) -> JSON | None:
        return _usage(self.reply.body)

    @property
    def created_at(self) -> int:
        """When the checkpoint answered: its reply's own ``created_at`` (a reply kept under
        an Idempotency-Key is replayed as it was, so a retry gets the same), else now."""
        when = _reply_field(self.reply.body, "created_at")
        return when if isinstance(when, int) and not isinstance(when, bool) else int(time.time())


async def _fold(
    rt: Runtime,
    turn: Turn,
    caller: Principal | None,
    key: str,
    items: list[Any],
    ask: Callable[[], JSON],
) -> _Folded | Reply:
    """The checkpoint over ``items`` and the token of the step it committed; the reply as
    it is when the checkpoint failed upstream, a 502 when it folded nothing."""
    reply = await _checkpoint(rt, turn, key, items, ask)
    if not 200 <= reply.status < 300:
        return reply
    if reply.headers.get("x-skillstate-transition") != "valid":
        return _not_folded(turn, reply)
    step = int(reply.headers["x-skillstate-step"])
    token = sealer(rt).seal(CompactionRef(turn.session, step, key_of(caller)))
    return _Folded(reply, step, token)


def _not_folded(turn: Turn, reply: Reply) -> Reply:
    """A checkpoint that folded nothing (no valid envelope after the re-asks, or tool calls
    in its place): an error in the client's dialect and no compaction token, so the client
    keeps the history it asked to compact instead of trading it for an unchanged state. The
    turn stays in the session's history as judged (state unchanged), with its ledger rows;
    its headers say so (``x-skillstate-transition``, ``-validation``, the cost).

    The status is a 422 with ``x-should-retry: false``, not a 5xx: the proxy already
    re-asked ``max_retries`` times, and clients retry a 5xx on their own (the openai and
    anthropic SDKs retry 408, 409, 429 and 5xx unless ``x-should-retry: false``; Codex
    retries 5xx), each retry billing the whole checkpoint again. Nothing is kept under an
    Idempotency-Key (``_checkpoint``), so a deliberate retry runs it again."""
    status = reply.headers.get("x-skillstate-transition", "none")
    errors = reply.headers.get("x-skillstate-validation")
    retries = reply.headers.get("x-skillstate-retries", "0")
    message = (
        f"the model did not produce a valid checkpoint (transition {status} after {retries} "
        f"re-asks{': ' + errors if errors else ''}); nothing was compacted and the "
        "conversation is unchanged: retry the compaction"
    )
    err = ProxyError(
        "upstream_unreachable", message, status=UNFOLDED_STATUS, code="invalid_checkpoint"
    )
    headers = {k: v for k, v in reply.headers.items() if k != "content-type"}
    headers["content-type"] = "application/json"
    headers["x-should-retry"] = "false"
    wire = turn.wire
    return Reply(wire.error_status(err), orjson.dumps(wire.error_body(err)), headers)


async def _checkpoint(
    rt: Runtime, turn: Turn, key: str, items: list[Any], ask: Callable[[], JSON]
) -> Reply:
    """The session's checkpoint over the compaction's transcript (``body[key]``:
    ``items``), answered in full. A session with state gets the ``window`` form's
    checkpoint turn (``WindowKeeper.checkpoint_body``): its window and the checkpoint
    instruction when its window continues this transcript, else the whole transcript with
    the contract, the state and the instruction. A session with no state yet gets a full
    turn with the contract, ending with ``ask()``."""
    try:
        record = await rt.sessions.load_current(turn.session)
    except StoreError:
        record = None  # the checkpoint's own turn reports the store
    body = {k: v for k, v in turn.body.items() if k not in _NOT_FOR_CHECKPOINT}
    body["stream"] = False
    # Under the request's Idempotency-Key, the checkpoint is a part of its own: the turn
    # that may follow it keeps the key's reply (a retry replays both, runs neither).
    # A checkpoint that folded nothing keeps nothing under it: a retry runs it again.
    idem = turn.idempotency
    idem = idem.part("checkpoint", only_valid=True) if idem is not None else None
    # It runs as a state or window turn, recorded under the session's own mode.
    if record is None:
        body[key] = [*items, ask()]
        mode, shape = Mode.STATE, ContextShape.FULL
    else:
        body[key] = items
        mode, shape = Mode.WINDOW, ContextShape.CHECKPOINT
    checkpoint = dataclasses.replace(
        turn,
        body=body,
        mode=mode,
        shape=shape,
        idempotency=idem,
        session_mode=turn.recorded_mode,
    )
    result = await rt.pipeline.run(checkpoint)
    assert isinstance(result, Reply)  # not streamed
    return result


async def _run_compacted(
    rt: Runtime,
    turn: Turn,
    body: JSON,
    first: Callable[[JSON], JSON],
    shift: Callable[[JSON], list[JSON]],
) -> Reply | StreamReply:
    """The request run on its compacted transcript (``body``), its answer carrying the
    compaction first: ``first`` on a JSON reply, ``shift`` on each event of a stream."""
    result = await rt.pipeline.run(dataclasses.replace(turn, body=body))
    if isinstance(result, StreamReply):
        return dataclasses.replace(result, chunks=_shifted(result.chunks, shift))
    return _rewritten(result, first)


def _rewritten(reply: Reply, rewrite: Callable[[JSON], JSON | None]) -> Reply:
    """A 2xx JSON object reply through ``rewrite``; the reply as it is when it is not one,
    or when ``rewrite`` returns None."""
    if not 200 <= reply.status < 300:
        return reply
    try:
        body = orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        return reply
    out = rewrite(body) if isinstance(body, dict) else None
    return reply if out is None else Reply(reply.status, orjson.dumps(out), reply.headers)


def _usage(raw: bytes) -> JSON | None:
    usage = _reply_field(raw, "usage")
    return usage if isinstance(usage, dict) else None


def _reply_field(raw: bytes, name: str) -> Any:
    """A member of a JSON reply body (None when it has none, or is no JSON object)."""
    try:
        resp = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return resp.get(name) if isinstance(resp, dict) else None


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _nothing() -> None:
    return None


# -- Anthropic context editing ------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class AppliedEdits:
    """The ``context_management`` edits the proxy applied to a Messages request, which the
    response reports (``applied_edits``) as the API's does."""

    applied: list[JSON]

    def reply(self, reply: Reply) -> Reply:
        """A JSON reply with ``context_management.applied_edits`` (a 2xx message only)."""
        return _rewritten(reply, self._reported)

    def _reported(self, message: JSON) -> JSON | None:
        if message.get("type") != "message":
            return None
        return {**message, "context_management": {"applied_edits": self.applied}}

    async def stream(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The stream, its ``message_delta`` event carrying ``context_management`` (events
        go out whole, as they complete)."""
        parser = sse.SSEParser()
        async for chunk in chunks:
            events = parser.feed(chunk)
            if events:
                yield b"".join(self._event(e) for e in events)
        rest = parser.flush()
        if rest:
            yield b"".join(self._event(e) for e in rest)

    def _event(self, event: sse.SSEEvent) -> bytes:
        if event.event != "message_delta":
            return event.raw
        try:
            data = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            return event.raw
        if not isinstance(data, dict):
            return event.raw
        data["context_management"] = {"applied_edits": self.applied}
        return sse.encode(data, event="message_delta")


Run = Callable[[], Awaitable[Reply | StreamReply]]


def anthropic_upstream(rt: Runtime, model: str) -> bool:
    candidates = rt.pool.candidates(model or None)
    return bool(candidates) and candidates[0].kind == ANTHROPIC.name


async def plan_messages(
    rt: Runtime, turn: Turn, caller: Principal | None, *, adopt: bool
) -> tuple[Turn, AppliedEdits | None, Run]:
    """A Messages request's ``context_management`` and compaction blocks: what the proxy
    applies (the edits, for an upstream that is not Anthropic-kind; compaction, for every
    upstream unless an Anthropic-kind one does its own under ``compaction: native``), the
    turn as it goes, and what runs it. ``adopt``: the request named no session."""
    found = edits_of(turn.body)
    ours = not anthropic_upstream(rt, turn.model)
    serve_compaction = ours or rt.settings.compaction == Compaction.PROXY
    turn = await _restore_blocks(rt, turn, caller, adopt, native=not serve_compaction)
    if found is None:
        return turn, None, lambda: rt.pipeline.run(turn)
    edit = cm.compact_edit(found)
    applied: AppliedEdits | None = None
    if ours:
        done = apply_edits(turn.body, found)
        turn, applied = dataclasses.replace(turn, body=done.body), AppliedEdits(done.applied)
    elif edit is not None and serve_compaction:  # the other edits stay Anthropic's
        rest = [e for e in found if e.get("type") != COMPACT]
        kept = {**turn.body["context_management"], "edits": rest}
        turn = dataclasses.replace(turn, body={**turn.body, "context_management": kept})
    else:
        return turn, None, lambda: rt.pipeline.run(turn)
    if edit is not None and serve_compaction and _messages_tokens(turn) > edit.trigger:
        return turn, applied, lambda: compact_messages(rt, turn, caller, edit)
    return turn, applied, lambda: rt.pipeline.run(turn)


def _messages_tokens(turn: Turn) -> int:
    b = turn.body
    return estimate_tokens([b.get("system"), b.get("messages"), b.get("tools")])


async def _restore_blocks(
    rt: Runtime, turn: Turn, caller: Principal | None, adopt: bool, *, native: bool
) -> Turn:
    """The messages after the last compaction block, the state its checkpoint committed in
    place of everything before it (as the API drops what precedes the block)."""
    messages = turn.body.get("messages")
    if not isinstance(messages, list):
        return turn
    at = cm.last_compaction(messages)
    if at is None:
        return turn
    content = messages[at[0]]["content"][at[1]].get("encrypted_content")
    if native and not looks_like_token(content):
        return turn  # Anthropic's own block: it reads it
    where = f"messages[{at[0]}].content[{at[1]}]"
    turn, ref, state = await _resolve(rt, turn, caller, content, where, adopt, "messages")
    restored = cm.after_compaction(messages, at, state, ref.step)
    return dataclasses.replace(turn, body={**turn.body, "messages": restored})


def _ask_messages() -> JSON:
    text = ci.checkpoint_request()["content"][0]["text"]
    return {"role": "user", "content": [{"type": "text", "text": text}]}


async def compact_messages(
    rt: Runtime, turn: Turn, caller: Principal | None, edit: cm.CompactEdit
) -> Reply | StreamReply:
    """``compact_20260112`` past its trigger: the checkpoint, then the compaction block,
    alone (``pause_after_compaction``) or first in the reply to the compacted request."""
    messages = list(turn.body.get("messages") or ())
    folded = await _fold(rt, turn, caller, "messages", messages, _ask_messages)
    if isinstance(folded, Reply):
        return folded
    block = cm.compaction_block(folded.token, folded.step)
    if edit.pause:
        message = cm.paused_message(turn.model, block, folded.token, folded.usage)
        headers = folded.headers
        if turn.stream:
            events = b"".join(sse.encode(e, event=e["type"]) for e in cm.message_events(message))
            return StreamReply(headers, _once(events), _nothing)
        return Reply(200, orjson.dumps(message), {**headers, "content-type": "application/json"})
    state = await _state_at(rt, turn.session, folded.step, "messages", "messages")
    split = split_transcript(messages, ANTHROPIC.context)
    restored = cm.after_compaction(
        [{"role": "assistant", "content": [block]}], (0, 0), state, folded.step
    )
    kept = [*restored, *messages[split.observation :]]
    return await _run_compacted(
        rt,
        turn,
        {**turn.body, "messages": kept},
        lambda message: {**message, "content": [block, *(message.get("content") or ())]},
        lambda data: cm.shifted_event(data, block),
    )


# -- context_management: compaction past a threshold ---------------------------------------


def threshold_of(rt: Runtime, turn: Turn) -> tuple[Turn, int | None]:
    """The request's compaction threshold when the proxy serves it (the field removed: the
    upstream must not compact too), else None (a native upstream gets the field as sent)."""
    try:
        threshold = ci.compact_threshold(turn.body)
    except ValueError as e:
        raise ProxyError("invalid_request", str(e), param="context_management") from None
    if threshold is None or native(rt, turn.model):
        return turn, None
    body = {k: v for k, v in turn.body.items() if k != "context_management"}
    return dataclasses.replace(turn, body=body), threshold


async def compact_then_run(
    rt: Runtime, turn: Turn, caller: Principal | None
) -> Reply | StreamReply:
    """The input passed its compaction threshold: checkpoint it, then run the turn on the
    compacted input (system text, the state, the latest observation); the response's
    output starts with the compaction item, as the API's does."""
    items = input_items(turn.body.get("input"))
    folded = await _fold(rt, turn, caller, "input", items, ci.checkpoint_request)
    if isinstance(folded, Reply):
        return folded
    item = ci.compaction_item(folded.token)
    state = await _state_at(rt, turn.session, folded.step, "input", "input")
    split = split_transcript(items, RESPONSES.context)
    kept = [*items[: split.system_end], ci.restored_state(state, folded.step)]
    kept += [i for i in items[split.observation :] if ci.kind(i) != ci.COMPACTION]
    return await _run_compacted(
        rt,
        turn,
        {**turn.body, "input": kept},
        lambda resp: ci.with_item_first(resp, item),
        lambda data: ci.shifted_event(data, item),
    )


async def _shifted(
    chunks: AsyncIterator[bytes], shift: Callable[[JSON], list[JSON]]
) -> AsyncIterator[bytes]:
    """A stream with each event's data through ``shift`` (an output item or content block
    added first: the indexes after it move up)."""
    parser = sse.SSEParser()
    async for chunk in chunks:
        out = []
        for event in parser.feed(chunk):
            try:
                data = orjson.loads(event.data) if event.data else None
            except orjson.JSONDecodeError:
                data = None
            if not isinstance(data, dict):
                out.append(event.raw)
                continue
            out += [sse.encode(e, event=str(e.get("type"))) for e in shift(data)]
        if out:
            yield b"".join(out)


def past_threshold(turn: Turn, threshold: int) -> bool:
    """Whether the request's input has reached its compaction threshold (estimated)."""
    return estimate_tokens([turn.body.get("instructions"), turn.body.get("input")]) >= threshold


def plan(
    rt: Runtime, turn: Turn, caller: Principal | None, *, endpoint: bool
) -> tuple[Turn, Callable[[], Awaitable[Reply | StreamReply]]]:
    """What serves a Responses request, and the turn as it goes: a compaction (the
    ``/responses/compact`` endpoint, or an input that ends with the trigger), a compaction
    and then the turn (the input passed its ``context_management`` threshold), or the turn.
    A native upstream gets the endpoint's request (at its own ``/responses/compact``), a
    trigger and the field as they came, metered like any passthrough call; the session's
    state is not touched (the upstream's compaction item is opaque to the proxy)."""
    if endpoint:
        if native(rt, turn.model):
            turn = dataclasses.replace(
                turn, mode=Mode.PASSTHROUGH, upstream_path=NATIVE_COMPACT_PATH
            )
            return turn, lambda: rt.pipeline.run(turn)
        return turn, lambda: compact(rt, turn, caller, endpoint=True)
    if trigger_of(turn):
        if native(rt, turn.model):  # the upstream compacts: the request goes as it came
            turn = dataclasses.replace(turn, mode=Mode.PASSTHROUGH)
            return turn, lambda: rt.pipeline.run(turn)
        turn = dataclasses.replace(turn, stored=None)  # its reply is made after its parts
        return turn, lambda: compact(rt, turn, caller, endpoint=False)
    turn, threshold = threshold_of(rt, turn)
    if threshold is not None and past_threshold(turn, threshold):
        turn = dataclasses.replace(turn, stored=None)  # its reply is made after its parts
        return turn, lambda: compact_then_run(rt, turn, caller)
    return turn, lambda: rt.pipeline.run(turn)
