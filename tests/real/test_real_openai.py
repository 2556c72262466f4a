"""OpenAI chat completions through the real proxy to a real llama.cpp server."""

from __future__ import annotations

import json

import openai
import pytest

from tests.helpers import SESSION_HEADER
from tests.real.conftest import MAX_TOKENS, MODEL, SEED, Tap, Tee
from tests.real.wire import (
    check_commit,
    check_openai_stream,
    cost,
    fields,
    openai_usage_of_stream,
    sse_events,
)

pytestmark = pytest.mark.real

TASK = "TASK: keep a short log of the deploy. Record each finished step in the state."
OBS = "Observation: the database migration finished; the cache warm-up is next."


def messages(obs: str = OBS) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a deploy assistant. Be brief."},
        {"role": "user", "content": TASK},
        {"role": "assistant", "content": "Ready."},
        {"role": "user", "content": obs},
    ]


def client(p, tee: Tee) -> openai.OpenAI:  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=p.v1, api_key="k", max_retries=0, http_client=tee.client())


def params(session: str, **extra: object) -> dict[str, object]:
    return {
        "model": MODEL,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "seed": SEED,
        "extra_headers": {SESSION_HEADER: session},
        **extra,
    }


def test_json_turn_commits_and_is_metered(real_proxy, tap: Tap, tee: Tee) -> None:  # type: ignore[no-untyped-def]
    p = real_proxy(constrain="json_schema")
    c = client(p, tee)
    mark = tap.mark()
    raw = c.chat.completions.with_raw_response.create(messages=messages(), **params("oa-json"))
    completion = raw.parse()
    h = raw.headers

    # What went upstream: the compact context, with the envelope's JSON schema.
    [ex] = tap.generations(mark)
    sent = ex.request
    assert sent is not None and ex.status == 200
    assert sent["response_format"]["type"] == "json_schema"
    assert sent["response_format"]["json_schema"]["schema"]["required"][-2:] == [
        "state_patch",
        "action",
    ]
    roles = [m["role"] for m in sent["messages"]]
    assert roles == ["system", "user", "user", "user"]  # system, task, contract+state, obs
    assert "Ready." not in json.dumps(sent["messages"])  # earlier turns are not resent

    # The client got llama.cpp's body unchanged, plus the outcome headers.
    assert bytes(tee.bodies[-1]) == ex.body
    assert h["x-skillstate-transition"] in ("valid", "invalid")
    assert h["x-skillstate-step"] == "1"
    assert h["x-skillstate-retries"] == "0"
    assert h["x-skillstate-upstream"] == "llama"
    assert h["x-skillstate-pricing"] == "override"
    assert float(h["x-skillstate-cost-usd"]) == 0.0
    text = completion.choices[0].message.content or ""
    check_commit(p, "oa-json", h["x-skillstate-transition"], 1, text)

    # Metered from the server's own usage.
    up = json.loads(ex.body)["usage"]
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == up["prompt_tokens"] > 0
    t = cost(p, "oa-json")
    assert t["requests"] == 1
    assert t["input_tokens"] == up["prompt_tokens"]
    assert t["output_tokens"] == up["completion_tokens"] > 0
    assert t["cost_usd"] == 0.0 and t["unknown_pricing_rows"] == 0
    assert t["baseline_input_tokens"] is not None  # the full transcript, estimated

    # A second turn on the same session advances the step again.
    follow_up = [
        *messages(),
        {"role": "assistant", "content": text},
        {"role": "user", "content": "Observation: the cache is warm."},
    ]
    raw2 = c.chat.completions.with_raw_response.create(messages=follow_up, **params("oa-json"))
    assert raw2.headers["x-skillstate-step"] == "2"
    assert cost(p, "oa-json")["requests"] == 2


@pytest.mark.parametrize("client_usage", [True, False], ids=["include_usage", "no_usage"])
def test_stream_passes_llama_bytes_through(
    real_proxy,  # type: ignore[no-untyped-def]
    tap: Tap,
    tee: Tee,
    client_usage: bool,
) -> None:
    p = real_proxy()
    c = client(p, tee)
    session = f"oa-stream-{client_usage}"
    extra: dict[str, object] = {"stream": True}
    if client_usage:
        extra["stream_options"] = {"include_usage": True}
    headers = {SESSION_HEADER: session, "x-skillstate-constrain": "json_schema"}
    mark = tap.mark()
    kwargs = {**params(session, **extra), "extra_headers": headers}
    chunks = list(c.chat.completions.create(messages=messages(), **kwargs))
    [ex] = tap.generations(mark)
    assert ex.request is not None and ex.content_type.startswith("text/event-stream")
    # The proxy always asks for usage (to meter the turn) and constrained the envelope.
    assert ex.request["stream_options"] == {"include_usage": True}
    assert ex.request["response_format"]["type"] == "json_schema"

    events, note = check_openai_stream(bytes(tee.bodies[-1]))
    upstream = sse_events(ex.body)
    usage = openai_usage_of_stream(upstream)
    if client_usage:
        assert events == upstream  # byte for byte, only the comment added
    else:
        # ... minus the usage-only chunk the client did not ask for.
        usage_only = [e for e in upstream if b'"choices":[]' in e and b'"usage"' in e]
        assert len(usage_only) == 1
        assert events == [e for e in upstream if e not in usage_only]
    assert any(ch.choices and ch.choices[0].finish_reason for ch in chunks)
    assert (chunks[-1].usage is not None) == client_usage

    assert note["step"] == "1" and note["pricing"] == "override"
    assert float(note["cost-usd"]) == 0.0
    text = "".join(
        ch.choices[0].delta.content or "" for ch in chunks if ch.choices and ch.choices[0].delta
    )
    assert text == "".join(
        (json.loads(fields(e)["data"])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
        for e in upstream[:-1]
    )
    check_commit(p, session, note["transition"], 1, text)
    t = cost(p, session)
    assert t["input_tokens"] == usage["prompt_tokens"] > 0
    assert t["output_tokens"] == usage["completion_tokens"] > 0
    assert t["cost_usd"] == 0.0
