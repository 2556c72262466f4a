"""A 20-turn state-mode session against the real model: the prompt llama.cpp reports per turn
stays flat while the client's transcript grows."""

from __future__ import annotations

import json
import sys
from typing import Any

import openai
import pytest

from tests.helpers import SESSION_HEADER
from tests.real.conftest import MODEL, SEED, Tap
from tests.real.wire import TRANSITIONS, cost, history

pytestmark = pytest.mark.real

TURNS = 20
LOG = (
    "2025-03-0{d}T1{h}:00:0{d}Z INFO worker-{h} flushed segment {n} in {ms}ms; "
    "2025-03-0{d}T1{h}:00:1{d}Z DEBUG cache-{d} evicted {n} keys; "
)


def observation(turn: int) -> str:
    lines = "".join(
        LOG.format(d=turn % 9 + 1, h=i, n=1000 + 37 * turn + i, ms=10 * i + turn) for i in range(3)
    )
    return f"Observation {turn}: {lines}"


def test_twenty_turns_stay_flat(real_proxy, tap: Tap) -> None:  # type: ignore[no-untyped-def]
    p = real_proxy(constrain="json_schema")
    c = openai.OpenAI(base_url=p.v1, api_key="k", max_retries=0, timeout=300)
    session = "flat"
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an on-call assistant. Be brief."},
        {"role": "user", "content": "TASK: watch the logs I paste, one per turn; note anomalies."},
    ]
    prompt: list[int] = []
    client_chars: list[int] = []
    transitions: list[str] = []
    mark = tap.mark()
    for turn in range(1, TURNS + 1):
        if turn > 1:
            msgs.append({"role": "user", "content": observation(turn)})
        raw = c.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=msgs,
            max_tokens=48,
            temperature=0,
            seed=SEED,
            extra_headers={SESSION_HEADER: session},
        )
        completion = raw.parse()
        assert completion.usage is not None
        prompt.append(completion.usage.prompt_tokens)
        transitions.append(raw.headers["x-skillstate-transition"])
        assert raw.headers["x-skillstate-step"] == str(turn)
        msgs.append({"role": "assistant", "content": completion.choices[0].message.content or ""})
        client_chars.append(len(json.dumps(msgs)))

    # The server's own usage, per turn, as llama.cpp reported it to the proxy.
    upstream = [json.loads(e.body)["usage"]["prompt_tokens"] for e in tap.generations(mark)]
    assert upstream == prompt
    sys.stdout.write(
        json.dumps(
            {"prompt_tokens": prompt, "client_chars": client_chars, "transitions": transitions}
        )
        + "\n"
    )
    flat = prompt[4:]  # turns 5-20
    assert max(flat) <= 2 * min(flat), flat
    assert client_chars[-1] > 3 * client_chars[4]  # while the transcript keeps growing
    assert set(transitions) <= set(TRANSITIONS) - {"tool-noop"}

    h = history(p, session)
    assert h["step"] == TURNS
    assert [t["status"] for t in h["history"]] == transitions
    t = cost(p, session)
    assert t["requests"] == TURNS
    assert t["input_tokens"] == sum(prompt)
    # The ledger's estimate of what the full transcript would have cost grows past what was sent.
    assert t["baseline_input_tokens"] > t["input_tokens"]
