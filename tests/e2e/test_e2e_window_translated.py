"""``mode: window`` and ``auto`` ACROSS TRANSLATIONS, end to end: a chat-completions client
on an Anthropic or a Responses upstream, a Messages client (anthropic SDK) on a chat or a
Responses upstream, a Responses client on an Anthropic or a chat upstream (the real proxy
in-process, the real SDKs, the fake provider as the upstream, refusing what the real APIs
refuse).

The window is planned in the client's format and translated after: these tests check what
the upstream gets in its own format. Long sessions with parallel tool calls, text replies
followed by new prompts, JSON and streams: every request is accepted, keeps each tool call
with its result, sends every message of the window once and none before it; between
checkpoints each request extends the previous one; a checkpoint commits its state and the
client sees its reply without the envelope. Then the transcript changes under the proxy
(the client's compaction, an edited task, a new start, a proxy restart) and a rewrite past
the model's context is folded in parts that fit."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from typing import Any

import pytest

from skillstate.engine.context import CORRECTION_MARK, STATE_MARK
from tests.conftest import Proxy, StartProxy
from tests.e2e.test_e2e_window import (
    SYSTEM,
    Client,
    Folder,
    asks_checkpoint,
    envelope,
    history,
    long_rewritten_exchanges,
    long_rewritten_transcript,
    request_text,
    sent_prefix,
    start,
    upstream,
)
from tests.fakeprovider import FakeProvider, RecordedRequest, Reply

# (client dialect, upstream kind): every bridge the proxy has (dialects.registry.BRIDGES).
TRANSLATED = [
    ("openai", "anthropic"),
    ("anthropic", "openai"),
    ("responses", "anthropic"),
    ("responses", "openai"),
    ("openai", "openai-responses"),
    ("anthropic", "openai-responses"),
]
SAID = re.compile(r"(?:Running step|Done with part|Next prompt|Summary of part|Carry on) \d+\.")


class Agent:
    """A fake model that works only from what it receives: one tool call a turn, two in
    parallel every third turn, a text reply without calls every fifth (the client then
    writes a new prompt); the envelope (with the turn's number as ``step``) only when the
    last message asks for a checkpoint. ``invalid_first``: a checkpoint's first envelope
    has a key the schema does not allow (the proxy re-asks)."""

    def __init__(self, invalid_first: bool = False) -> None:
        self.turn = 0
        self.invalid_first = invalid_first

    def __call__(self, req: RecordedRequest) -> Reply:
        reasked = CORRECTION_MARK in json.dumps(transcript_of(req)[-1])
        if self.invalid_first and asks_checkpoint(req) and not reasked:
            return Reply(text=envelope({"bogus": 1}))  # (with calls: a tool-noop)
        self.turn += 1
        n = self.turn
        calls = [("run", {"cmd": f"step {n}"})]
        if n % 3 == 0:
            calls.append(("run", {"cmd": f"step {n}b"}))
        if n % 5 == 0:
            calls = []
        if asks_checkpoint(req):
            return Reply(text=envelope({"step": n}), tool_calls=calls)
        said = f"Running step {n}." if calls else f"Done with part {n}."
        return Reply(text=said, tool_calls=calls)


@dataclass
class Turn:
    """One turn as the client sent it and what came back."""

    sent: list[Any]  # the client's transcript
    text: str  # the reply's text as the client got it
    calls: list[RecordedRequest]  # the upstream requests of the turn (re-asks included)

    @property
    def request(self) -> RecordedRequest:
        """The turn's last call: the one whose reply the client got."""
        return self.calls[-1]


def agent(p: Proxy, dialect: str, session: str) -> Client:
    """A client whose system text (chat, Responses) or ``system`` (Messages) is long enough
    for the prompt cache (>= 1,024 tokens), as an agent's is; a Messages client moves its
    breakpoint to its newest message on every turn, as Claude Code does."""
    client = Client(p, dialect, session, marks_breakpoints=dialect == "anthropic")
    if dialect == "openai":
        client.transcript[0]["content"] = SYSTEM
    elif dialect == "responses":
        client.transcript.insert(0, {"type": "message", "role": "developer", "content": SYSTEM})
    return client


def tidy(client: Client) -> None:
    """The transcript as a chat client sends it: an assistant message without calls has no
    ``tool_calls`` member (the API refuses an empty list)."""
    last = client.transcript[-1]
    if client.dialect == "openai" and last.get("role") == "assistant" and not last["tool_calls"]:
        del last["tool_calls"]


def run(
    client: Client, fake: FakeProvider, turns: int, first: int = 0, streams: bool = True
) -> list[Turn]:
    """``turns`` turns of the agent loop, streamed every other one (``streams``); after a
    reply without calls the client writes a new prompt."""
    out = []
    for t in range(first, first + turns):
        sent = json.loads(json.dumps(client.transcript))
        n = len(fake.requests)
        text, calls = client.turn(stream=streams and t % 2 == 1)
        tidy(client)
        if not calls:
            prompt = f"Next prompt {t}."
            if client.dialect == "anthropic":  # content blocks, as Claude Code sends them
                # (the moving breakpoint makes the newest message blocks: a string would
                # go as one block while newest, then as the string)
                blocks = [{"type": "text", "text": prompt}]
                client.transcript.append({"role": "user", "content": blocks})
            else:
                client.say(prompt)
        out.append(Turn(sent, text, fake.requests[n:]))
    return out


# -- what the upstream got, in its own format --------------------------------------------


def tool_ids(items: list[Any], dialect: str) -> tuple[list[str], list[str]]:
    """The tool call ids and the ids the results answer, in order, of a transcript in
    ``dialect`` (the client's, or the upstream request's)."""
    calls: list[str] = []
    results: list[str] = []
    for m in items:
        if dialect == "openai":
            calls += [c["id"] for c in m.get("tool_calls") or ()]
            results += [m["tool_call_id"]] if m.get("role") == "tool" else []
        elif dialect == "anthropic":
            blocks = m["content"] if isinstance(m.get("content"), list) else []
            calls += [b["id"] for b in blocks if b.get("type") == "tool_use"]
            results += [b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"]
        else:
            calls += [m["call_id"] for m in [m] if m.get("type") == "function_call"]
            results += [m["call_id"] for m in [m] if m.get("type") == "function_call_output"]
    return calls, results


def transcript_of(req: RecordedRequest) -> list[Any]:
    return list(req.json["input" if req.dialect == "responses" else "messages"])


def assert_accepted_as_the_api_wants(req: RecordedRequest) -> None:
    """Accepted by the fake (it refuses unpaired calls and results), and what it does not
    check of the real APIs: Messages start with a user turn and end with one (no prefill),
    each ``tool_result`` answers the turn before and comes before any other block of its
    message, no message or text block is empty; a chat assistant message has content or
    calls, never an empty ``tool_calls`` list."""
    assert req.status == 200, (req.status, req.response_body[:300])
    msgs = transcript_of(req)
    if req.dialect == "anthropic":
        assert msgs[0]["role"] == "user" and msgs[-1]["role"] == "user", [m["role"] for m in msgs]
        for k, m in enumerate(msgs):
            content = m["content"]
            assert content, (k, m)
            blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
            assert all(b["text"] for b in blocks if b["type"] == "text"), (k, m)
            kinds = [b["type"] for b in blocks]
            results = kinds.count("tool_result")
            assert kinds[:results] == ["tool_result"] * results, (k, kinds)  # results first
            if results:
                offered, _ = tool_ids([msgs[k - 1]], "anthropic")
                _, answered = tool_ids([m], "anthropic")
                assert msgs[k - 1]["role"] == "assistant" and set(answered) <= set(offered), k
    elif req.dialect == "openai":
        for k, m in enumerate(msgs):
            if m["role"] == "assistant":
                assert m.get("content") or m.get("tool_calls"), (k, m)
                assert m.get("tool_calls", None) != [], (k, m)


def window_start(turns: list[dict[str, Any]], k: int, offset: int) -> int:
    """Where turn ``k``'s window started in the client's transcript: the mark the turn
    before left (``offset``: the turns ``auto`` ran in passthrough, which record none); the
    whole transcript for the first and a passthrough turn, and for a changed transcript."""
    if k <= offset or turns[k - offset]["estimate"]["window_start"] != "kept":
        return 0
    return int(turns[k - offset - 1]["estimate"]["window"]["start"])


def assert_window_sent_once(turn: Turn, start: int, dialect: str) -> None:
    """Every message of the window (the client's transcript from ``start``) is in the
    upstream request once, in order, and none from before it: its tool calls and their
    results by id, its texts by what they say."""
    window = turn.sent[start:]
    calls, results = tool_ids(transcript_of(turn.request), turn.request.dialect)
    wanted, _ = tool_ids(window, dialect)
    assert calls == wanted, (calls, wanted)
    assert results == wanted, (results, wanted)
    body = json.dumps(transcript_of(turn.request))
    assert SAID.findall(body) == SAID.findall(json.dumps(window))


def assert_append_only(turns: list[Turn], marks: bool) -> None:
    """Between checkpoints each request is the previous one plus new messages, and a
    checkpoint's re-ask is its request plus the reply and the correction (cache markers
    aside: so the bytes up to a request's last breakpoint are a prefix of the next one's);
    on an Anthropic upstream billed so (``marks``), whose cache is read only at
    breakpoints, each request (re-asks too) has the proxy's after the state."""
    for a, b in itertools.pairwise(t.calls[0] for t in turns):
        if not asks_checkpoint(a):
            head = sent_prefix(a, drop_instruction=False)
            assert sent_prefix(b, drop_instruction=True).startswith(head)
    for t in turns:
        for a, b in itertools.pairwise(t.calls):
            head = sent_prefix(a, drop_instruction=False)
            assert sent_prefix(b, drop_instruction=False).startswith(head)
    calls = [r for t in turns for r in t.calls]
    for r in calls if calls and calls[0].dialect == "anthropic" and marks else ():
        head = r.json["messages"][0]["content"]
        state = [b for b in head if STATE_MARK in b.get("text", "")]
        assert [b.get("cache_control") for b in state] == [{"type": "ephemeral"}], head


def check_session(
    p: Proxy,
    client: Client,
    turns: list[Turn],
    *,
    offset: int = 0,
    changed: frozenset[int] = frozenset(),
    marks: bool = True,
) -> list[int]:
    """What every session here must hold; returns the checkpoint turns."""
    recorded = history(p, client.session)
    assert len(recorded) == len(turns) - offset
    checkpoints = [k for k, t in enumerate(turns) if asks_checkpoint(t.request)]
    for k, turn in enumerate(turns):
        for call in turn.calls:
            assert_accepted_as_the_api_wants(call)
        if k > offset:
            reason = recorded[k - offset]["estimate"]["window_start"]
            assert reason == ("changed" if k in changed else "kept"), (k, reason)
        assert_window_sent_once(turn, window_start(recorded, k, offset), client.dialect)
        if k in checkpoints:
            # the client's reply without the envelope; the state it patched, committed
            assert turn.text in ("", "Noted."), turn.text  # (with calls: no text at all)
            assert recorded[k - offset]["status"] == "valid", recorded[k - offset]
            n = client_turn_number(turn)
            assert recorded[k - offset]["patch"] == {"step": n}
            if k + 1 < len(turns):  # the next turn carries the state it committed
                assert re.search(rf'\\?"step\\?":{n}\b', request_text(turns[k + 1].request))
        elif k >= offset:
            assert recorded[k - offset]["status"] == "window", (k, recorded[k - offset])
            assert turn.text.startswith(("Running step", "Done with part")), turn.text
    segments = [0, *sorted(changed), len(turns)]
    for lo, hi in itertools.pairwise(segments):
        assert_append_only(turns[lo:hi], marks)
    return checkpoints


def client_turn_number(turn: Turn) -> int:
    """The number the fake model gave its reply (its envelope's ``step``)."""
    assert turn.request.reply is not None and turn.request.reply.text is not None
    m = re.search(r'"step": (\d+)', turn.request.reply.text)
    assert m, turn.request.reply.text
    return int(m.group(1))


@pytest.mark.parametrize(
    ("dialect", "kind", "mode"),
    [(d, k, m) for d, k in TRANSLATED for m in ("window", "auto", "re-asked")]
    + [("anthropic", "anthropic", "re-asked")],  # (a re-ask's breakpoint, in any format)
)
def test_a_thirty_turn_window_session_across_a_translation(
    fake: FakeProvider, start_proxy: StartProxy, dialect: str, kind: str, mode: str
) -> None:
    """``re-asked``: in window mode, each checkpoint's first envelope is invalid, and its
    re-ask (the reply and the correction after the checkpoint) is judged instead (JSON
    turns: a stream's reply is the client's already, and is judged as it came)."""
    up = upstream(fake, kind)
    if mode == "auto":
        up["cache_pricing"] = "none"  # (the switch pays)
    reasks = mode == "re-asked"
    p = start(start_proxy, fake, kind, mode="window" if reasks else mode, upstreams=[up])
    fake.responder = Agent(invalid_first=reasks)
    client = agent(p, dialect, f"x-{dialect}-{kind}-{mode}")
    turns = run(client, fake, 30, streams=not reasks)
    offset = 30 - len(history(p, client.session))
    if mode == "auto":  # it began in passthrough, then switched with a checkpoint
        assert 0 < offset < 20 and asks_checkpoint(turns[offset].request), offset
        assert STATE_MARK not in request_text(turns[0].request)
    checkpoints = check_session(p, client, turns, offset=offset, marks=mode != "auto")
    assert len(checkpoints) >= 3, checkpoints  # window_max_tokens forces them
    assert [len(t.calls) for t in turns] == [1 + (reasks and k in checkpoints) for k in range(30)]
    assert p.state(client.session)["state"]["step"] == client_turn_number(turns[checkpoints[-1]])


def rewritten(client: Client, rounds: int) -> list[Any]:
    """The client's transcript rewritten (its own compaction): its system text and task,
    then a summary and ``rounds`` exchanges the proxy never saw, each result with a
    ``KEEP-`` token (in Messages and Responses every third round with two parallel calls)."""
    if client.dialect == "openai":
        return long_rewritten_transcript(client.transcript[:2], rounds)
    head = client.transcript[:2] if client.dialect == "responses" else client.transcript[:1]
    return long_rewritten_exchanges(client.dialect, head, rounds)


@pytest.mark.parametrize(("dialect", "kind"), TRANSLATED)
def test_a_rewrite_past_the_models_context_is_folded_across_a_translation(
    fake: FakeProvider, start_proxy: StartProxy, dialect: str, kind: str
) -> None:
    """A transcript the client rewrote, past the model's context: its oldest exchanges are
    folded into the state by calls of their own, then the turn sends the rest; across the
    translation every call is accepted and fits, keeps each call with its result, every
    message of the rewrite goes upstream once and in order, and none is lost."""
    from skillstate.cost.checkpoint import CONTEXT_SHARE
    from skillstate.cost.tokens import request_tokens

    limit = 6_000
    up = {**upstream(fake, kind), "context_tokens": limit}
    p = start(start_proxy, fake, kind, upstreams=[up], window_max_tokens=1_000_000)
    fake.responder = Folder()
    client = agent(p, dialect, f"fold-{dialect}-{kind}")
    for t in range(30):  # until a checkpoint (the model's context binds) moves the window
        run(client, fake, 1, first=t)
        if history(p, client.session)[-1]["estimate"]["window"]["start"] > 2:
            break
    client.transcript = rewritten(client, 40)
    sent = json.loads(json.dumps(client.transcript))
    wanted = set(re.findall(r"KEEP-\d+", json.dumps(sent)))
    before = len(fake.requests)
    client.turn(stream=dialect != "openai")
    calls = fake.requests[before:]
    assert len(calls) > 2  # folds, then the turn's own call
    assert all("Do not answer" in request_text(r) for r in calls[:-1])
    for r in calls:
        assert_accepted_as_the_api_wants(r)
    # Every call and result of the rewrite went upstream once, in order, and each text.
    ids, _ = tool_ids(sent, dialect)
    shown = [tool_ids(transcript_of(r), kind)[0] for r in calls]
    assert [i for s in shown for i in s] == ids
    assert [i for r in calls for i in tool_ids(transcript_of(r), kind)[1]] == ids
    texts = re.compile(r"SUMMARY of the work|Next prompt \d+\.|Done \d+\.|Running \d+\.")
    said = [t for r in calls for t in texts.findall(json.dumps(transcript_of(r)))]
    wanted_said = texts.findall(json.dumps(sent))
    if dialect != "anthropic":  # a summary right after the task (Codex's local compaction)
        # is the task's: in the prefix of every call
        assert all(json.dumps(transcript_of(r)).count("SUMMARY of the work") == 1 for r in calls)
        said = [t for t in said if t != "SUMMARY of the work"]
        wanted_said = [t for t in wanted_said if t != "SUMMARY of the work"]
    assert said == wanted_said
    assert {"KEEP-900", "KEEP-0"} <= set(p.state(client.session)["state"]["facts"])
    # the turn's record says its window restarted (not the ``kept`` of its re-plan)
    assert history(p, client.session)[-1]["estimate"]["window_start"] == "changed"
    for _ in range(3):
        tidy(client)
        client.turn(stream=False)
    for r in fake.requests[before:]:
        assert_accepted_as_the_api_wants(r)
    sizes = [request_tokens(r.json) for r in fake.requests[before:]]
    assert max(sizes) <= limit * CONTEXT_SHARE + 300, sizes  # within the share (+ one turn)
    facts = set(p.state(client.session)["state"].get("facts", []))
    visible = facts | set(re.findall(r"KEEP-\d+", json.dumps(transcript_of(fake.last))))
    assert wanted <= visible, sorted(wanted - visible)


def changed_transcript(client: Client, change: str, n: int) -> None:
    """The client's transcript changed under the proxy: its own compaction (its system
    text and task, a summary, a new prompt), its task edited (the rest as it was), or a new
    conversation on the same session."""
    head = 1 if client.dialect == "anthropic" else 2  # (system text,) task
    task = client.transcript[head - 1]
    if change == "edit":
        client.transcript[head - 1] = {**task, "content": f"TASK: build it, edited {n}."}
        return
    if change == "restart":
        task = {**task, "content": f"TASK: a new start {n}."}
    client.transcript = [*client.transcript[: head - 1], task]
    if change == "compaction":
        summary = f"Summary of part {n}."
        if client.dialect == "responses":
            said = [{"type": "output_text", "text": summary, "annotations": []}]
            client.transcript.append({"type": "message", "role": "assistant", "content": said})
        else:
            client.transcript.append({"role": "assistant", "content": summary})
        client.say(f"Carry on {n}.")


@pytest.mark.parametrize(("dialect", "kind"), TRANSLATED)
def test_a_transcript_changed_under_the_window_across_a_translation(
    fake: FakeProvider, start_proxy: StartProxy, dialect: str, kind: str
) -> None:
    """The client compacts its transcript, edits its task, the proxy restarts, the client
    starts over on the same session: each change restarts the window at the new
    transcript's start (a restart of the proxy does not: the window goes on), every
    request is accepted, sends every message of its window once, extends the one before
    between checkpoints, and the state committed before is kept."""
    p = start(start_proxy, fake, kind)
    fake.responder = Agent()
    client = agent(p, dialect, f"change-{dialect}-{kind}")
    turns = run(client, fake, 12)
    changed = set()
    for change in ("compaction", "edit", "proxy", "restart"):
        if change == "proxy":
            p.stop()  # type: ignore[attr-defined]
            p.start()  # type: ignore[attr-defined]
        else:  # (a window still at the task would take an edited task as it comes)
            assert history(p, client.session)[-1]["estimate"]["window"]["start"] > 2
            changed_transcript(client, change, len(turns))
            changed.add(len(turns))
        step = p.state(client.session)["state"]["step"]
        turns += run(client, fake, 10, first=len(turns))
        assert p.state(client.session)["state"]["step"] >= step  # nothing committed lost
    checkpoints = check_session(p, client, turns, changed=frozenset(changed))
    assert len(checkpoints) >= 4, checkpoints
