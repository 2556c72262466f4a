"""mode: mask's /cost baseline against a measurement: the same agent conversation run once in
passthrough and once in mask, through one real proxy (in-process) with the real SDKs, against
fake providers that bill their prompt cache wire-faithfully (Anthropic's breakpoints, OpenAI's
automatic cache with its cached-token discount, or none).

The passthrough run's input is what the mask session's baseline input must be: the mask
request is the client's transcript with some observations' content replaced, so the baseline
adds the estimated difference to what the provider counted instead of scaling everything the
two requests share by the compression ratio (which overstated it by 0.5-1.5% here, 18% on the
demo's longer transcript). Dollars are compared without a cache: the fake counts a cached
prefix as compact JSON / 4 but a prompt as ``json.dumps`` (spaces included) / 4, so it bills
about 2.5% of every cached prompt as plain input where the provider's own units (and the
ledger's model) would not; ``tests/bench`` checks the dollars under the simulated provider's
caches, whose units agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import InProcessProxy, launch_in_process
from tests.fakeprovider import FakeProvider, Reply, ToolCall
from tests.helpers import SESSION_HEADER, ant, oai

TURNS = 24
# The baseline input may differ from the passthrough's by this share: the proxy's estimator
# (compact JSON / 4, plus 4 a message) counts the masked text's JSON, the fake its own way.
TOKENS_TOLERANCE = 0.003
PRICES = {  # USD per million tokens, our own
    "claude-mine": {  # Anthropic's multipliers: reads 0.1x, writes 1.25x
        "input_per_mtok": 3.0,
        "output_per_mtok": 15.0,
        "cache_read_per_mtok": 0.3,
        "cache_write_per_mtok": 3.75,
    },
    "gpt-mine": {"input_per_mtok": 2.0, "output_per_mtok": 8.0, "cache_read_per_mtok": 0.5},
    "plain-mine": {"input_per_mtok": 2.0, "output_per_mtok": 8.0},
}
TOOL = {
    "name": "run",
    "description": "Runs a shell command in the repository and returns its output. " * 4,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}


def observation(turn: int) -> str:
    """A tool result worth masking, of a size that varies as a real agent's do."""
    return f"$ make test-{turn}\n" + "".join(
        f"tests/unit/test_module_{turn}_{k}.py::test_case PASSED [{k}%]\n"
        for k in range(20 + 9 * (turn % 4))
    )


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    fakes = {
        "anthropic": FakeProvider(cache="anthropic").start(),
        "openai": FakeProvider(cache="openai").start(),
        "none": FakeProvider().start(),
    }
    config = {
        "upstreams": [
            {"name": "a", "url": fakes["anthropic"].url, "kind": "anthropic",
             "api_key": "k", "models": ["claude-*"]},
            {"name": "o", "url": fakes["openai"].url + "/v1", "kind": "openai",
             "api_key": "k", "models": ["gpt-*"]},
            {"name": "n", "url": fakes["none"].url + "/v1", "kind": "openai",
             "api_key": "k", "models": ["plain-*"], "cache_pricing": "none"},
        ],
        "prices": PRICES,
    }  # fmt: skip
    proxy = launch_in_process(tmp_path_factory.mktemp("mask-savings"), config=config)
    try:
        yield {"proxy": proxy, "fakes": fakes}
    finally:
        proxy.stop()
        for fake in fakes.values():
            fake.stop()


def anthropic_run(proxy: InProcessProxy, session: str, mode: str) -> None:
    """An agent loop on /v1/messages that marks its newest message for the cache, as Claude
    Code does."""
    client = ant(proxy)
    tools = [{"name": TOOL["name"], "description": TOOL["description"],
              "input_schema": TOOL["parameters"]}]  # fmt: skip
    transcript: list[dict[str, Any]] = [{"role": "user", "content": "TASK: fix the build."}]
    for turn in range(1, TURNS + 1):
        last = transcript[-1]
        blocks = (
            last["content"]
            if isinstance(last["content"], list)
            else [{"type": "text", "text": last["content"]}]
        )
        marked = {
            **last,
            "content": [*blocks[:-1], {**blocks[-1], "cache_control": {"type": "ephemeral"}}],
        }
        got = client.messages.create(
            model="claude-mine",
            max_tokens=200,
            tools=tools,  # type: ignore[arg-type]
            messages=[*transcript[:-1], marked],  # type: ignore[list-item]
            extra_headers={SESSION_HEADER: session, "x-skillstate-mode": mode},
        )
        use = got.content[0]
        assert use.type == "tool_use"
        transcript += [
            {"role": "assistant", "content": [use.model_dump(exclude_none=True)]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": observation(turn)}
            ]},
        ]  # fmt: skip


def openai_run(model: str) -> Callable[[InProcessProxy, str, str], None]:
    def run(proxy: InProcessProxy, session: str, mode: str) -> None:
        """An agent loop on chat completions (the cache, if any, is automatic)."""
        client = oai(proxy)
        transcript: list[dict[str, Any]] = [
            {"role": "system", "content": "You fix builds."},
            {"role": "user", "content": "TASK: fix the build."},
        ]
        for turn in range(1, TURNS + 1):
            got = client.chat.completions.create(
                model=model,
                messages=transcript,  # type: ignore[arg-type]
                tools=[{"type": "function", "function": TOOL}],  # type: ignore[list-item]
                extra_headers={SESSION_HEADER: session, "x-skillstate-mode": mode},
            )
            call = got.choices[0].message.tool_calls[0]  # type: ignore[index]
            transcript += [
                {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": observation(turn)},
            ]

    return run


RUNS = {
    "anthropic": anthropic_run,
    "openai": openai_run("gpt-mine"),
    "none": openai_run("plain-mine"),
}


def totals(proxy: InProcessProxy, session: str) -> dict[str, Any]:
    r = httpx.get(proxy.url + "/cost", params={"session": session}, timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json()["totals"])


@pytest.mark.parametrize("regime", ["anthropic", "openai", "none"])
def test_mask_baseline_on_cost_is_what_passthrough_measures(
    env: dict[str, Any], regime: str
) -> None:
    proxy, fake = env["proxy"], env["fakes"][regime]
    billed = {}
    for mode in ("passthrough", "mask"):
        fake.reset()  # each run starts with the provider's cache cold, as its own client would
        fake.enqueue(*(
            Reply(text="", tool_calls=[ToolCall("run", {"cmd": f"make test-{t}"}, id=f"call_{t}")])
            for t in range(1, TURNS + 1)
        ))  # fmt: skip
        RUNS[regime](proxy, f"{regime}-{mode}", mode)
        billed[mode] = totals(proxy, f"{regime}-{mode}")
        assert billed[mode]["requests"] == TURNS
    mask, passthrough = billed["mask"], billed["passthrough"]
    assert mask["input_tokens"] < 0.8 * passthrough["input_tokens"]  # it did mask
    assert mask["baseline_input_tokens"] == pytest.approx(
        passthrough["input_tokens"], rel=TOKENS_TOLERANCE
    )
    assert mask["baseline_output_tokens"] == passthrough["output_tokens"]
    if regime == "none":  # the dollars, where no cache's units enter
        measured = passthrough["cost_usd"] - mask["cost_usd"]
        assert mask["saved_cost_usd"] == pytest.approx(
            measured, abs=0.001 * passthrough["cost_usd"]
        )
