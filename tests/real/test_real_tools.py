"""A real tool-call round trip: llama.cpp parses SmolLM2's `<tool_call>` output into native
`tool_calls`, the client runs the tool, and the proxy sends the call and its result upstream
as a native pair.

SmolLM2-135M only makes a call after a two-shot history of earlier calls, and only for some
seeds (seeds 1 and 5 at temperature 0.8 on this build). State mode replaces that history
with the state, and with it the model's only cue, so the turn that must produce the call is
sent with `x-skillstate-mode: passthrough` (the history reaches the model untouched); the
next turn, carrying the tool result, is an ordinary state-mode turn.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.helpers import SESSION_HEADER
from tests.real.conftest import MODEL, Tap, Tee
from tests.real.wire import check_commit, cost, history

pytestmark = pytest.mark.real

# Tried in order; 1 and 5 give a call on the build here. The rest cost a second each only if
# another CPU's floating point makes those two answer in text.
SEEDS = (1, 5, 4, 8, 2, 3, 6, 7, 9, 10, 11, 12)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def _call(i: int, city: str) -> dict[str, Any]:
    function = {"name": "get_weather", "arguments": json.dumps({"city": city})}
    return {"id": f"call_{i}", "type": "function", "function": function}


SYSTEM = "You are a weather assistant. Always answer weather questions by calling get_weather."
RESULT = '{"temp_c": 25, "sky": "clear"}'


def two_shot() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [_call(1, "Paris")]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21, "sky": "sunny"}'},
        {"role": "assistant", "content": "Paris: 21C, sunny."},
        {"role": "user", "content": "What is the weather in London?"},
        {"role": "assistant", "content": "", "tool_calls": [_call(2, "London")]},
        {"role": "tool", "tool_call_id": "call_2", "content": '{"temp_c": 14, "sky": "rain"}'},
        {"role": "assistant", "content": "London: 14C, rain."},
        {"role": "user", "content": "What is the weather in Rome?"},
    ]


def test_tool_call_round_trip(real_proxy, tap: Tap, tee: Tee) -> None:  # type: ignore[no-untyped-def]
    p = real_proxy()
    c = openai.OpenAI(base_url=p.v1, api_key="k", max_retries=0, http_client=tee.client())
    session = "tools"
    msgs = two_shot()

    # Turn 1 (passthrough): the model calls the tool.
    message = None
    for seed in SEEDS:
        mark = tap.mark()
        raw = c.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=msgs,
            tools=TOOLS,
            max_tokens=48,
            temperature=0.8,
            seed=seed,
            extra_headers={SESSION_HEADER: session, "x-skillstate-mode": "passthrough"},
        )
        [ex] = tap.generations(mark)
        assert ex.request is not None  # the client's request, untouched:
        assert ex.request["messages"] == msgs and ex.request["tools"] == TOOLS
        assert bytes(tee.bodies[-1]) == ex.body
        assert "x-skillstate-transition" not in raw.headers  # passthrough keeps no state
        choice = raw.parse().choices[0]
        if choice.message.tool_calls:
            message = choice.message
            assert choice.finish_reason == "tool_calls"
            break
    if message is None:
        pytest.fail(f"no seed of {SEEDS} produced a tool call on this llama.cpp build")
    assert message.tool_calls
    names = {t["function"]["name"] for t in TOOLS}
    for tc in message.tool_calls:
        assert tc.type == "function" and tc.id and tc.function.name in names
        assert isinstance(json.loads(tc.function.arguments), dict)
    ids = [tc.id for tc in message.tool_calls]
    assert len(set(ids)) == len(ids)
    assert cost(p, session)["requests"] >= 1  # passthrough is metered too

    # Turn 2 (state mode): the client ran the tool; the call and its result go up as a pair.
    msgs.append(message.model_dump(exclude_none=True))
    for tc in message.tool_calls:
        msgs.append({"role": "tool", "tool_call_id": tc.id, "content": RESULT})
    mark = tap.mark()
    raw = c.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=msgs,
        tools=TOOLS,
        max_tokens=48,
        temperature=0,
        seed=1,
        extra_headers={SESSION_HEADER: session, "x-skillstate-constrain": "json_schema"},
    )
    [ex] = tap.generations(mark)
    assert ex.status == 200 and ex.request is not None
    sent = ex.request["messages"]
    assert ex.request["tools"] == TOOLS
    assert "response_format" not in ex.request  # never a grammar on top of tools
    callers = [i for i, m in enumerate(sent) if m.get("tool_calls")]
    assert len(callers) == 1  # the two-shot calls are history now: not resent
    i = callers[0]
    assert [tc["id"] for tc in sent[i]["tool_calls"]] == ids
    assert [tc["function"] for tc in sent[i]["tool_calls"]] == [
        {"name": tc.function.name, "arguments": tc.function.arguments} for tc in message.tool_calls
    ]
    assert [m["role"] for m in sent[i + 1 :]] == ["tool"] * len(ids)
    assert [m["tool_call_id"] for m in sent[i + 1 :]] == ids
    assert [m["role"] for m in sent[:i]] == ["system", "user", "user"]  # system, task, state

    h = raw.headers
    reply = raw.parse().choices[0].message
    assert h["x-skillstate-step"] == "1"  # the first state-mode turn of the session
    if reply.tool_calls:
        assert h["x-skillstate-transition"] in ("tool-noop", "valid")
    else:
        assert h["x-skillstate-transition"] in ("valid", "invalid")
    check_commit(p, session, h["x-skillstate-transition"], 1, reply.content or "")
    assert len(history(p, session)["history"]) == 1
    assert cost(p, session)["requests"] >= 2
