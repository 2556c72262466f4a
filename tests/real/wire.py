"""Helpers for the real tier: SSE framing, the proxy's outcome, the ledger."""

from __future__ import annotations

import json
import re
from typing import Any

from skillstate.engine.patch import extract_envelope, merge_patch
from tests.conftest import Proxy
from tests.real.conftest import INITIAL_STATE

TRANSITIONS = ("valid", "invalid", "tool-noop")
COMMENT = re.compile(
    rb": skillstate transition=(valid|invalid|tool-noop) step=(\d+)((?: [a-z-]+=\S+)*)\n\n"
)


def sse_events(raw: bytes) -> list[bytes]:
    """Split an SSE body into events, each with its blank-line terminator (exact bytes)."""
    assert raw.endswith(b"\n\n"), raw[-80:]
    parts = raw.split(b"\n\n")
    assert parts[-1] == b""
    return [p + b"\n\n" for p in parts[:-1]]


def fields(event: bytes) -> dict[str, str]:
    """`event:` / `data:` of one SSE event (comments ignored)."""
    out: dict[str, str] = {}
    for line in event.decode().split("\n"):
        if not line or line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        assert name in ("event", "data", "id", "retry"), line
        out[name] = value[1:] if value.startswith(" ") else value
    return out


def comment_fields(comment: bytes) -> dict[str, str]:
    m = COMMENT.fullmatch(comment)
    assert m, comment
    extra = dict(kv.split("=", 1) for kv in m.group(3).decode().split())
    return {"transition": m.group(1).decode(), "step": m.group(2).decode(), **extra}


def check_openai_stream(raw: bytes) -> tuple[list[bytes], dict[str, str]]:
    """OpenAI SSE from the proxy: every data line is JSON, the skillstate comment comes right
    before `data: [DONE]`, which is last. Returns (events without the comment, comment)."""
    events = sse_events(raw)
    assert events[-1] == b"data: [DONE]\n\n"
    comments = [e for e in events if e.startswith(b":")]
    assert len(comments) == 1 and events[-2] == comments[0], events[-3:]
    for e in events[:-2]:
        data = fields(e)["data"]
        assert isinstance(json.loads(data), dict)
    return [e for e in events if not e.startswith(b":")], comment_fields(comments[0])


def check_anthropic_stream(raw: bytes) -> tuple[list[bytes], dict[str, str]]:
    """Anthropic SSE from the proxy: each event names its type and carries JSON of that type,
    message_start first, message_stop last, the skillstate comment after the last content
    delta and before message_stop (a translated stream closes its blocks after it)."""
    events = sse_events(raw)
    comments = [e for e in events if e.startswith(b":")]
    assert len(comments) == 1, events
    at = events.index(comments[0])
    assert at < len(events) - 1
    assert not any(b"event: content_block_delta" in e for e in events[at:]), events[at:]
    typed = [fields(e) for e in events if not e.startswith(b":")]
    for f in typed:
        assert json.loads(f["data"])["type"] == f["event"], f
    names = [f["event"] for f in typed]
    assert names[0] == "message_start" and names[-1] == "message_stop", names
    assert "message_delta" in names
    return [e for e in events if not e.startswith(b":")], comment_fields(comments[0])


def openai_usage_of_stream(events: list[bytes]) -> dict[str, Any]:
    usages = [
        json.loads(fields(e)["data"]).get("usage")
        for e in events
        if e != b"data: [DONE]\n\n" and json.loads(fields(e)["data"]).get("usage")
    ]
    assert len(usages) == 1, usages
    return usages[0]


def anthropic_input_of_stream(events: list[bytes]) -> tuple[int, int]:
    """(total input tokens, output tokens) of an Anthropic stream, as Anthropic counts them."""
    start = next(json.loads(fields(e)["data"]) for e in events if b"message_start" in e)
    delta = next(
        json.loads(fields(e)["data"]) for e in reversed(events) if b"event: message_delta" in e
    )
    u = start["message"]["usage"]
    total_in = u["input_tokens"] + u.get("cache_read_input_tokens", 0)
    total_in += u.get("cache_creation_input_tokens", 0)
    return total_in, delta["usage"]["output_tokens"]


def cost(p: Proxy, session: str) -> dict[str, Any]:
    r = p.get("/cost", params={"session": session, "since": "all"})
    assert r.status_code == 200, r.text
    return r.json()["totals"]


def history(p: Proxy, session: str) -> dict[str, Any]:
    r = p.get("/state", params={"session": session, "history": "1"})
    assert r.status_code == 200, r.text
    return r.json()


def check_commit(
    p: Proxy,
    session: str,
    transition: str,
    step: int,
    reply_text: str,
    before: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The turn is committed as the proxy said: the step advanced to `step`, and the state is
    the previous state merged with the reply's envelope (valid) or untouched (otherwise)."""
    assert transition in TRANSITIONS
    before = dict(INITIAL_STATE) if before is None else before
    h = history(p, session)
    assert h["step"] == step
    last = h["history"][-1]
    assert last["step"] == step and last["status"] == transition
    if transition == "valid":
        env = extract_envelope(reply_text).envelope
        assert env is not None
        assert last["patch"] == env.state_patch
        assert h["state"] == merge_patch(before, env.state_patch)
    else:
        assert h["state"] == before
        assert last["errors"] or transition == "tool-noop"
    return h
