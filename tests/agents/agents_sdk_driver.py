"""Runs one OpenAI Agents SDK agent (two function tools) to completion against a base URL and
prints ``{"final_output", "last_response_id"}`` as JSON. Run by test_agents_sdk.py with the
python of the tier's own venv (the one that has openai-agents), not the project's."""

from __future__ import annotations

import argparse
import asyncio
import json

from openai import AsyncOpenAI

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@function_tool
def get_time(tz: str) -> str:
    """The local time in a time zone."""
    return f"12:00 in {tz}"


async def run(args: argparse.Namespace) -> None:
    client = AsyncOpenAI(
        base_url=args.base_url,
        api_key="sk-dummy",
        max_retries=0,
        default_headers={
            "x-skillstate-session": args.session
        },  # a program of its own venv: no tests/ import
    )
    model = (
        OpenAIResponsesModel("gpt-test", client)
        if args.api == "responses"
        else OpenAIChatCompletionsModel("gpt-test", client)
    )
    settings = ModelSettings()
    if args.compact_threshold:  # the Responses API's server-side compaction
        cm = [{"type": "compaction", "compact_threshold": args.compact_threshold}]
        settings = ModelSettings(extra_args={"context_management": cm})
    agent = Agent(
        name="helper",
        instructions="Answer with the tools' help.",
        tools=[get_weather, get_time],
        model=model,
        model_settings=settings,
    )
    result = await Runner.run(agent, args.prompt, previous_response_id=args.previous)
    out = {"final_output": result.final_output, "last_response_id": result.last_response_id}
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api", choices=["responses", "chat"], required=True)
    ap.add_argument("--session", required=True)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--previous", default=None, help="previous_response_id for the run")
    ap.add_argument("--compact-threshold", type=int, default=0, help="context_management")
    set_tracing_disabled(True)  # no trace upload to api.openai.com
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
