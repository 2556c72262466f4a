"""Tests for skillstate.engine.strip_events: stripping at the level of client stream events."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from skillstate.engine.strip_events import AnthropicEventStripper, OpenAIChunkStripper
from skillstate.engine.stripper import strip_envelope

ENV = '{"state_patch": {"step": 2}, "action": "ask the user"}'
BLOCK = f"```json\n{ENV}\n```"


def pieces(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted(set(cuts)), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def openai_chunks(text: str, cuts: list[int]) -> list[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "c1",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    return [
        chunk({"role": "assistant", "content": ""}),
        *(chunk({"content": p}) for p in pieces(text, cuts)),
        chunk({}, "stop"),
        {
            "id": "c1",
            "object": "chat.completion.chunk",
            "choices": [],
            "usage": {"total_tokens": 3},
        },
    ]


def openai_text(chunks: list[dict[str, Any]]) -> str:
    return "".join(
        c["delta"].get("content") or "" for chunk in chunks for c in chunk.get("choices") or []
    )


def run_openai(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    stripper = OpenAIChunkStripper()
    out = [c for c in (stripper.chunk(chunk) for chunk in chunks) if c is not None]
    return out + stripper.finish()


# A reply's text: prose, fences, braces and envelopes in any order (test_strip_responses too).
replies = st.lists(
    st.sampled_from(["Booked", " it.", "\n", "\n\n", "```json", "```", "{", "}", ENV, BLOCK, " "]),
    max_size=10,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(replies, st.lists(st.integers(0, 200), max_size=10))
def test_openai_stream_text_equals_the_stripped_reply(text: str, cuts: list[int]) -> None:
    out = run_openai(openai_chunks(text, [c for c in cuts if c <= len(text)]))
    assert openai_text(out) == strip_envelope(text).text
    assert out[0]["choices"][0]["delta"]["role"] == "assistant"
    assert out[-1]["usage"] == {"total_tokens": 3}  # the usage chunk passes untouched
    assert [c["choices"][0]["finish_reason"] for c in out[:-1]][-1] == "stop"


def test_openai_drops_chunks_with_nothing_left_and_flushes_at_finish() -> None:
    out = run_openai(openai_chunks(f"Done.\n\n{BLOCK}", [5, 9, 20, 40]))
    texts = [c["choices"][0]["delta"].get("content") for c in out if c["choices"]]
    assert texts == [None, "Done.", None]  # role, text, finish: the envelope's chunks are gone
    assert len(out) == 4  # ... with the usage chunk
    assert openai_text(out) == "Done."


def test_openai_stream_without_finish_reason_is_flushed_by_finish() -> None:
    stripper = OpenAIChunkStripper()
    first = {
        "id": "x",
        "choices": [{"index": 0, "delta": {"content": "Hi "}, "finish_reason": None}],
    }
    assert stripper.chunk(first)["choices"][0]["delta"]["content"] == "Hi"  # type: ignore[index]
    assert stripper.finish() == [
        {"id": "x", "choices": [{"index": 0, "delta": {"content": " "}, "finish_reason": None}]}
    ]


def test_openai_tool_call_chunks_pass() -> None:
    call = {"index": 0, "id": "t", "type": "function", "function": {"name": "f", "arguments": ""}}
    chunk = {"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]}
    stripper = OpenAIChunkStripper()
    assert stripper.chunk(chunk) == chunk


def anthropic_events(
    blocks: list[tuple[str, Any]], cuts: list[int]
) -> list[tuple[str, dict[str, Any]]]:
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": {}})
    ]
    for index, (kind, value) in enumerate(blocks):
        if kind == "text":
            events.append(
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
            )
            for p in pieces(value, [c for c in cuts if c <= len(value)]):
                delta = {"type": "text_delta", "text": p}
                events.append(
                    (
                        "content_block_delta",
                        {"type": "content_block_delta", "index": index, "delta": delta},
                    )
                )
        else:
            events.append(
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": value},
                )
            )
            delta = {"type": "input_json_delta", "partial_json": "{}"}
            events.append(
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def run_anthropic(events: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    stripper = AnthropicEventStripper()
    return [e for name, data in events for e in stripper.event(name, data)]


def assemble(events: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The message content a client SDK would build from the events (indexes checked)."""
    content: list[dict[str, Any]] = []
    for name, data in events:
        if name == "content_block_start":
            assert data["index"] == len(content)
            content.append(dict(data["content_block"]))
        elif name == "content_block_delta":
            assert data["index"] == len(content) - 1
            if data["delta"]["type"] == "text_delta":
                content[-1]["text"] += data["delta"]["text"]
    return content


@settings(max_examples=200, deadline=None)
@given(replies, st.lists(st.integers(0, 200), max_size=10))
def test_anthropic_stream_text_equals_the_stripped_reply(text: str, cuts: list[int]) -> None:
    content = assemble(run_anthropic(anthropic_events([("text", text)], cuts)))
    expected = strip_envelope(text).text
    assert content == ([{"type": "text", "text": expected}] if expected else [])


def test_anthropic_empty_text_block_is_not_sent_and_later_blocks_move_down() -> None:
    tool = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
    events = anthropic_events(
        [("text", "Calling f."), ("text", BLOCK), ("tool_use", tool)], [3, 30]
    )
    content = assemble(run_anthropic(events))
    assert content == [{"type": "text", "text": "Calling f."}, tool]


def test_anthropic_envelope_only_message_shows_its_action() -> None:
    content = assemble(run_anthropic(anthropic_events([("text", BLOCK)], [7])))
    assert content == [{"type": "text", "text": "ask the user"}]


def test_anthropic_envelope_only_text_before_a_tool_call_is_dropped() -> None:
    # The action was never said to the user: no text block, the tool_use renumbered to 0.
    tool = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
    out = run_anthropic(anthropic_events([("text", BLOCK), ("tool_use", tool)], [7]))
    assert assemble(out) == [tool]
    assert {d["index"] for _, d in out if "index" in d} == {0}
