"""A 12-turn ``window`` session against the real model (llama.cpp + SmolLM2-135M), with
constrained decoding on its checkpoint turns: what the checkpoints commit, and that the
window turns carry no envelope request and no grammar."""

from __future__ import annotations

import json
import sys
from typing import Any

import openai
import pytest

from skillstate.engine.window import CHECKPOINT_MARK
from tests.real.conftest import MODEL, SEED, Tap
from tests.real.test_real_flat import observation
from tests.real.wire import history

pytestmark = pytest.mark.real

TURNS = 12


def test_a_window_session_commits_constrained_checkpoints(real_proxy, tap: Tap) -> None:  # type: ignore[no-untyped-def]
    # A small bound, so that a session this short checkpoints several times.
    p = real_proxy(mode="window", constrain="json_schema", window_max_tokens=1000, window_keep=2)
    c = openai.OpenAI(base_url=p.v1, api_key="k", max_retries=0, timeout=300)
    session = "window"
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an on-call assistant. Be brief."},
        {"role": "user", "content": "TASK: watch the logs I paste, one per turn; note anomalies."},
    ]
    contexts: list[str] = []
    transitions: list[str] = []
    mark = tap.mark()
    for turn in range(1, TURNS + 1):
        if turn > 1:
            msgs.append({"role": "user", "content": observation(turn) * 2})
        raw = c.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=msgs,  # type: ignore[arg-type]
            max_tokens=160,  # room for a whole envelope: 64 cut every checkpoint off in "action"
            temperature=0,
            seed=SEED,
            extra_headers={"x-skillstate-session": session},
        )
        contexts.append(raw.headers["x-skillstate-context"])
        transitions.append(raw.headers["x-skillstate-transition"])
        msgs.append({"role": "assistant", "content": raw.parse().choices[0].message.content or ""})

    sent = tap.generations(mark)
    assert len(sent) == TURNS
    for ctx, ex in zip(contexts, sent, strict=True):
        body = ex.request
        assert body is not None
        last = json.dumps(body["messages"][-1])
        if ctx == "checkpoint":
            assert CHECKPOINT_MARK in last and "response_format" in body  # constrained
        else:
            assert CHECKPOINT_MARK not in last and "response_format" not in body
    checkpoints = [t for c_, t in zip(contexts, transitions, strict=True) if c_ == "checkpoint"]
    valid = sum(t == "valid" for t in checkpoints)
    sys.stdout.write(
        json.dumps({"contexts": contexts, "transitions": transitions, "valid": valid,
                    "checkpoints": len(checkpoints)}) + "\n"
    )  # fmt: skip
    assert len(checkpoints) >= 2
    assert {t for c_, t in zip(contexts, transitions, strict=True) if c_ == "window"} == {"window"}
    assert valid >= 1  # the grammar makes the envelope parse; the patch must also validate
    h = history(p, session)
    assert [t["status"] for t in h["history"]] == transitions
