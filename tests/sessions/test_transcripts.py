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
