"""A request that extends its session's last one is parsed from its new items only: the
session keeps the objects its last request parsed to, and the next request's body shares
them (``sessions/transcripts``, ``_Reference.reparsed``). That is only right while no stage
of a turn changes a body it parsed: every change must be made on a copy. Nothing else
enforces it, so here long sessions in every mode, on every route and translation, JSON and
streamed, check after every turn that the objects each session keeps are still exactly
what their bytes parse to. They also check that the objects were shared, turn after turn:
a check of a path never taken would cover nothing. The real proxy in-process (its runtime
is read directly, as only a test may), the real SDKs, whose bodies are compact JSON as
orjson writes it, the fake provider as the upstream."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from tests.conftest import Proxy, StartProxy
from tests.e2e.test_e2e_window import BIG, Client, asks_checkpoint, envelope, start
from tests.fakeprovider import FakeProvider, RecordedRequest, Reply

# (client dialect, upstream kind): each route on its own kind and through every bridge.
ROUTES = [
    ("openai", "openai"),
    ("anthropic", "anthropic"),
    ("responses", "openai-responses"),
    ("openai", "anthropic"),
    ("anthropic", "openai"),
    ("responses", "anthropic"),
    ("responses", "openai"),
    ("openai", "openai-responses"),
    ("anthropic", "openai-responses"),
]
MODES = ["passthrough", "state", "window", "auto", "mask"]
TURNS = 9


class Builder:
    """One tool call a turn (two every third), a text reply every fourth; the envelope
    where the proxy asks for one (every turn in state mode, at a window's checkpoints)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.turn = 0

    def __call__(self, req: RecordedRequest) -> Reply:
        self.turn += 1
        n = self.turn
        calls = [("run", {"cmd": f"step {n}"})]
        if n % 3 == 0:
            calls.append(("run", {"cmd": f"step {n}b"}))
        if n % 4 == 0:
            calls = []
        wants = self.mode == "state" or asks_checkpoint(req)
        text = envelope({"step": n}) if wants else f"Step {n} under way."
        return Reply(text=text, tool_calls=calls)


def kept(proxy: Proxy) -> dict[str, tuple[dict[str, Any], bytes, str]]:
    """Per session: the objects its last checked request parsed to, the bytes they came
    from, and the member holding the transcript."""
    transcripts = proxy._server._app.app.state.runtime.transcripts  # type: ignore[attr-defined]
    out = {}
    for session, memo in transcripts._memos.items():
        ref = memo.checked
        if ref.body is not None and ref.anchor is not None:
            out[session] = (ref.body, ref.anchor.lead + ref.blob + ref.anchor.tail, ref.anchor.key)
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("dialect", "kind"), ROUTES)
def test_no_stage_changes_the_objects_a_session_keeps(
    start_proxy: StartProxy, fake: FakeProvider, dialect: str, kind: str, mode: str
) -> None:
    proxy = start(start_proxy, fake, kind, mode=mode)
    fake.responder = Builder(mode)
    session = f"shared-{dialect}-{kind}-{mode}"
    # No moving breakpoint: a Messages client that moves it changes its previous last
    # message, and such a request is parsed whole.
    client = Client(proxy, dialect, session, marks_breakpoints=False)
    # One session streams or not throughout, as a client does (a request that adds
    # ``stream`` is not the last one's bytes extended); the matrix has both.
    stream = (ROUTES.index((dialect, kind)) + MODES.index(mode)) % 2 == 1
    shared = 0
    first: Any = None
    for n in range(TURNS):
        if n and n % 4 == 0:  # after a text reply, the user writes again
            client.say(f"Now part {n}.")
        sent = json.loads(json.dumps(client.transcript))
        client.turn(stream=stream, result=BIG)
        memos = kept(proxy)
        assert session in memos, f"turn {n}: the session keeps no parsed request"
        body, raw, key = memos[session]
        assert body == orjson.loads(raw), f"turn {n}: a kept object was changed in place"
        assert body[key] == sent
        items = body[key]
        if first is not None and items[0] is first:
            shared += 1  # this turn's body was the last one's objects plus its new items
        first = items[0]
    # Every turn after the second extends the last one's bytes (the first has nothing
    # to extend, and the second's anchor is verified then).
    assert shared >= TURNS - 2, f"objects shared on {shared} of {TURNS - 1} turns"
