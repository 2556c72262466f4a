"""The per-session transcript memos' memory count (skillstate.sessions.transcripts)."""

from __future__ import annotations

from typing import Any

import orjson

from skillstate.dialects.registry import get_dialect
from skillstate.sessions.transcripts import SessionTranscripts


def test_an_anchor_refused_on_its_check_leaves_the_memory_count_true() -> None:
    """A body with its transcript member twice, sent again as it was (a client's retry): the
    bytes found as the transcript are the first member, refused when checked. The memos'
    count stays what the sessions hold: it once kept the refused anchor's bytes on every
    such request, so that past ``max_bytes`` every session's memo was dropped on each turn."""
    openai = get_dialect("openai")
    memos = SessionTranscripts(max_bytes=100_000)

    def turn(session: str, raw: bytes) -> None:
        text = memos.text(session, openai, orjson.loads(raw), openai.validate, raw)
        memos.passed(text)
        memos.view(session, openai, orjson.loads(raw), text)

    other = [{"role": "user", "content": "another task"}]
    turn("other", b'{"model":"m","messages":' + orjson.dumps(other) + b"}")
    history: list[Any] = [{"role": "user", "content": "task " + "x" * 2000}]
    items = orjson.dumps(history)
    raw = b'{"model":"m","messages":' + items + b',"messages":' + items + b"}"
    turn("s", raw)
    held = memos.nbytes
    for _ in range(60):
        turn("s", raw)
        assert memos.nbytes == held
    assert len(memos) == 2  # neither session's memo was dropped


def test_only_bytes_holding_every_key_once_are_vouched_for() -> None:
    """A compact session's request spliced on its previous one may go upstream as its own
    bytes (``vouches_for_raw``) only when nothing around its transcript holds a key twice,
    at the top or nested (the transcript itself is orjson's serialisation): a parser keeping
    the first value would read other bytes otherwise than the proxy."""
    openai = get_dialect("openai")
    memos = SessionTranscripts()
    tools = b'"tools":[{"type":"function","function":{"name":"sh","parameters":{}}}]'
    arounds = {
        "once": (b'{"model":"m",' + tools + b',"messages":', b"}"),
        "top": (b'{"model":"big","model":"m","messages":', b"}"),
        "escaped": (b'{"model":"m","messages":', b',"\\u006dodel":"m"}'),
        "nested": (
            b'{"model":"m","messages":',
            b"," + tools.replace(b'"sh"', b'"rm","name":"sh"') + b"}",
        ),
    }
    for name, (lead, tail) in arounds.items():
        history: list[Any] = [{"role": "user", "content": "task"}]
        vouched = []
        for k in range(3):
            raw = lead + orjson.dumps(history) + tail
            text = memos.text(name, openai, orjson.loads(raw), openai.validate, raw)
            assert text is not None
            memos.passed(text)
            vouched.append(text.vouches_for_raw)
            history += [
                {"role": "assistant", "content": f"ok {k}"},
                {"role": "user", "content": "o"},
            ]
        # the first request has no previous one to be spliced on
        assert vouched == ([False, True, True] if name == "once" else [False] * 3), name
