"""mode: mask (issue 14 §5) end to end: the real proxy (in-process), the real openai SDK and
native /v1/messages, the fake provider. What the upstream receives is checked: every tool
call stays paired with its result, and old observations are masked in blocks of
``mask_keep``, so between re-masks each request is a byte-prefix of the next."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai

from skillstate.engine.mask import MASK_MARK
from tests.conftest import StartProxy
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER

BIG = "line of build output\n" * 40  # an observation worth masking


def masked(message: dict[str, Any]) -> bool:
    return MASK_MARK in json.dumps(message)


def test_openai_mask_keeps_pairing_and_masks_in_blocks(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start_proxy(fake.url + "/v1", "--mode", "mask", config={"mask_keep": 2})
    c = openai.OpenAI(base_url=p.v1, api_key="k", max_retries=0)
    transcript: list[dict[str, Any]] = [{"role": "user", "content": "TASK: build it."}]
    contexts = []
    for turn in range(1, 13):
        fake.enqueue(Reply(text="", tool_calls=[("run", {"n": turn})]))
        raw = c.chat.completions.with_raw_response.create(
            model="m", messages=transcript, extra_headers={SESSION_HEADER: "mask-o"}
        )
        contexts.append(raw.headers["x-skillstate-context"])
        assert "x-skillstate-transition" not in raw.headers  # mask keeps no state
        call = raw.parse().choices[0].message.tool_calls[0]  # type: ignore[index]
        transcript += [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": f"{turn}: {BIG}"},
        ]
    assert contexts == ["mask"] * 12
    counts = []
    for req in fake.requests:
        msgs = req.json["messages"]
        calls = {c["id"] for m in msgs if m.get("tool_calls") for c in m["tool_calls"]}
        results = [m["tool_call_id"] for m in msgs if m["role"] == "tool"]
        assert sorted(results) == sorted(calls)  # every call keeps its result
        assert not masked(msgs[0])  # the task never is
        counts.append(sum(masked(m) for m in msgs))
    # Request g holds g observations (the task, then one tool result per turn). With
    # keep = 2 the first M = ((g - 2) // 2) * 2 are masked (none while g < 4), except the
    # task, which never is.
    assert counts == [0, 0, 0, 1, 1, 3, 3, 5, 5, 7, 7, 9]
    # Between re-masks a request is a byte-prefix of the next (cache-friendly).
    for k in range(len(counts) - 1):
        if counts[k] == counts[k + 1]:
            a, b = fake.requests[k].json["messages"], fake.requests[k + 1].json["messages"]
            assert b[: len(a)] == a


def test_anthropic_mask_per_request_header(fake: FakeProvider, start_proxy: StartProxy) -> None:
    p = start_proxy(config={"upstreams": [{"name": "a", "url": fake.url, "kind": "anthropic"}]})
    headers = {
        SESSION_HEADER: "mask-a",
        "x-skillstate-mode": "mask",
        "anthropic-version": "2023-06-01",
    }
    transcript: list[dict[str, Any]] = [{"role": "user", "content": "TASK: build it."}]
    for turn in range(1, 9):
        fake.enqueue(Reply(text="", tool_calls=[("run", {"n": turn})]))
        body = {"model": "claude-x", "max_tokens": 100, "messages": transcript}
        r = httpx.post(p.url + "/v1/messages", json=body, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        assert r.headers["x-skillstate-context"] == "mask"
        use = r.json()["content"][0]
        transcript += [
            {"role": "assistant", "content": [use]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": BIG}],
            },
        ]
    last = fake.requests[-1].json["messages"]
    uses = [b["id"] for m in last if m["role"] == "assistant" for b in m["content"]]
    results = [b["tool_use_id"] for m in last[1:] if m["role"] == "user" for b in m["content"]]
    assert results == uses
    # 8 observations, keep = 3 (the default): the first ((8 - 3) // 3) * 3 = 3, less the
    # task, which never is masked.
    assert sum(masked(m) for m in last) == 2
