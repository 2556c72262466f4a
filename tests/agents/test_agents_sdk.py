"""The OpenAI Agents SDK (openai-agents) through the proxy: an agent with two function tools
runs to completion, once through ``/v1/responses`` (OpenAIResponsesModel, the SDK's
default) and once through chat completions (OpenAIChatCompletionsModel); and a second run that
continues the first with ``previous_response_id`` against a chat-completions upstream (the
proxy keeps the chain). The SDK runs in its own venv (see conftest), as a subprocess."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.agents.conftest import run_program
from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply, ToolCall

DRIVER = Path(__file__).with_name("agents_sdk_driver.py")
ENVELOPE = '```json\n{"state_patch": {"notes": "sunny, noon"}, "action": "answer"}\n```'
ANSWER = "Sunny in Oslo, and it is noon."
# The kind of upstream each API is served by: its native one.
UPSTREAM_KIND = {"responses": "openai-responses", "chat": "openai"}


def both_tools() -> Reply:
    return Reply(
        tool_calls=[
            ToolCall("get_weather", {"city": "Oslo"}, id="call_weather"),
            ToolCall("get_time", {"tz": "CET"}, id="call_time"),
        ]
    )


def run_agent(
    python: Path, proxy: Proxy, api: str, session: str, prompt: str, previous: str | None = None
) -> dict[str, Any]:
    argv = [str(python), str(DRIVER), "--base-url", proxy.v1, "--api", api]
    argv += ["--session", session, "--prompt", prompt]
    if previous:
        argv += ["--previous", previous]
    done = run_program(argv, env={}, cwd=DRIVER.parent)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def tool_outputs(api: str, body: dict[str, Any]) -> dict[str, str]:
    """call id -> the tool's output, as the SDK sent them back."""
    if api == "responses":
        items = [i for i in body["input"] if i.get("type") == "function_call_output"]
        return {i["call_id"]: i["output"] for i in items}
    return {m["tool_call_id"]: m["content"] for m in body["messages"] if m["role"] == "tool"}


@pytest.mark.parametrize("mode", ["state", "passthrough"])
@pytest.mark.parametrize("api", ["responses", "chat"])
def test_agent_with_two_tools_runs_to_completion(
    sdk_python: Path, fake: FakeProvider, start_proxy: StartProxy, api: str, mode: str
) -> None:
    up = {"name": "up", "url": fake.url + "/v1", "kind": UPSTREAM_KIND[api]}
    proxy = start_proxy(None, config={"mode": mode, "schema": ["notes"], "upstreams": [up]})
    fake.enqueue(both_tools(), Reply(text=f"{ANSWER}\n{ENVELOPE}"))
    session = f"sdk-{api}-{mode}"

    out = run_agent(sdk_python, proxy, api, session, "Weather and time in Oslo?")

    # State mode strips its envelope from the reply (chat completions and Responses alike);
    # passthrough relays what the model said.
    final = out["final_output"].strip()
    assert final == (ANSWER if mode == "state" else f"{ANSWER}\n{ENVELOPE}")
    path = "/v1/responses" if api == "responses" else "/v1/chat/completions"
    turns = [r for r in fake.requests if r.path == path]
    assert len(turns) == 2 and all(r.status == 200 for r in turns)
    names = {t.get("name") or t["function"]["name"] for t in turns[0].json["tools"]}
    assert names == {"get_weather", "get_time"}
    assert tool_outputs(api, turns[1].json) == {
        "call_weather": "sunny in Oslo",
        "call_time": "12:00 in CET",
    }
    cost = proxy.get("/cost", params={"session": session}).json()["totals"]
    assert cost["requests"] == 2, cost
    if mode == "state":
        assert proxy.state(session)["state"] == {"notes": "sunny, noon"}


def test_previous_response_id_continues_on_a_chat_completions_upstream(
    sdk_python: Path, fake: FakeProvider, start_proxy: StartProxy
) -> None:
    up = {"name": "up", "url": fake.url + "/v1", "kind": "openai"}
    proxy = start_proxy(None, config={"mode": "passthrough", "upstreams": [up]})
    fake.enqueue(both_tools(), Reply(text=ANSWER))
    first = run_agent(sdk_python, proxy, "responses", "sdk-chain", "Weather and time in Oslo?")
    assert first["last_response_id"]

    fake.enqueue(Reply(text="Yes, take sunglasses."))
    second = run_agent(
        sdk_python, proxy, "responses", "sdk-chain", "Sunglasses?", first["last_response_id"]
    )

    assert second["final_output"] == "Yes, take sunglasses."
    sent = fake.last.json  # chat completions: the chain rebuilt by the proxy
    assert fake.last.path == "/v1/chat/completions"
    texts = json.dumps(sent["messages"])
    for earlier in ("Weather and time in Oslo?", "sunny in Oslo", "12:00 in CET", ANSWER):
        assert earlier in texts
    assert sent["messages"][-1] == {"role": "user", "content": "Sunglasses?"}


def test_responses_compaction_through_context_management_on_a_chat_upstream(
    sdk_python: Path, fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """``context_management: [{"type": "compaction", "compact_threshold"}]`` (ModelSettings'
    extra_args) on a chat-completions upstream: once the input passes the threshold the
    proxy compacts it into the state before the call, the response starts with the
    compaction item, and the SDK carries that item on; the proxy puts the state there."""
    from skillstate.compaction.items import CHECKPOINT_MARK, RESTORED_MARK

    up = {"name": "up", "url": fake.url + "/v1", "kind": "openai"}
    proxy = start_proxy(None, config={"mode": "passthrough", "upstreams": [up]})
    asked = {"calls": 0, "checkpoints": 0}

    def model(rec: Any) -> Reply:
        if CHECKPOINT_MARK in json.dumps(rec.json):
            asked["checkpoints"] += 1
            env = json.dumps(
                {"state_patch": {"notes": f"{asked['calls']} lookups"}, "action": "go"}
            )
            return Reply(text=f"```json\n{env}\n```")
        if asked["calls"] < 3:
            asked["calls"] += 1
            return Reply(tool_calls=[ToolCall("get_weather", {"city": f"Oslo{asked['calls']}"})])
        return Reply(text=ANSWER)

    fake.responder = model
    argv = [str(sdk_python), str(DRIVER), "--base-url", proxy.v1, "--api", "responses"]
    argv += ["--session", "sdk-compact", "--prompt", "Weather?", "--compact-threshold", "150"]
    done = run_program(argv, env={}, cwd=DRIVER.parent)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["final_output"] == ANSWER
    assert asked["calls"] == 3 and asked["checkpoints"] >= 1
    sent = [r for r in fake.requests if r.path == "/v1/chat/completions"]
    texts = [json.dumps(r.json) for r in sent]
    first = next(k for k, t in enumerate(texts) if CHECKPOINT_MARK in t)
    assert all(RESTORED_MARK in t for t in texts[first + 1 :])
    assert not any("ssc1_" in t or "context_management" in t for t in texts)
    assert proxy.state("sdk-compact")["step"] == asked["checkpoints"]
