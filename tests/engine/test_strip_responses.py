"""The reply envelope and the Responses API: a ``response`` object, its event stream and a
request's ``input`` items without the envelope (skillstate.dialects.responses)."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from skillstate.dialects import sse
from skillstate.dialects.responses import RESPONSES, strip_response
from skillstate.dialects.responses.stream import ChatToResponsesRelay
from skillstate.dialects.sse import SSEParser
from skillstate.engine.strip_events import StrippingRelay
from skillstate.engine.stripper import strip_envelope
from tests.engine.test_strip_events import BLOCK, replies

REASONING = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "enc=="}
CALL = {
    "type": "function_call",
    "id": "fc_1",
    "call_id": "c1",
    "name": "ls",
    "arguments": '{"dir": "."}',
    "status": "completed",
}


def message(text: str, item_id: str = "msg_1") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "type": "message",
        "id": item_id,
        "status": "completed",
        "role": "assistant",
        "content": [part],
    }


def pieces(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted(set(c for c in cuts if c < len(text))), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def events(text: str, cuts: list[int], call: bool = True) -> list[tuple[str, dict[str, Any]]]:
    """A stream as the API sends it: a reasoning item, the message, a function call (unless
    not ``call``)."""
    output = [REASONING, message(text), CALL][: 3 if call else 2]
    start = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
    out: list[dict[str, Any]] = [
        {"type": "response.created", "response": start},
        {"type": "response.in_progress", "response": start},
        {"type": "response.output_item.added", "output_index": 0, "item": REASONING},
        {"type": "response.output_item.done", "output_index": 0, "item": REASONING},
    ]
    ids = {"item_id": "msg_1", "output_index": 1, "content_index": 0}
    part = output[1]["content"][0]
    out += [
        {"type": "response.output_item.added", "output_index": 1,
         "item": {**output[1], "content": []}},
        {"type": "response.content_part.added", **ids, "part": {**part, "text": ""}},
        *(
            {"type": "response.output_text.delta", **ids, "delta": p, "logprobs": []}
            for p in pieces(text, cuts)
        ),
        {"type": "response.output_text.done", **ids, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **ids, "part": part},
        {"type": "response.output_item.done", "output_index": 1, "item": output[1]},
    ]  # fmt: skip
    out += [
        {"type": "response.output_item.added", "output_index": 2,
         "item": {**CALL, "arguments": ""}},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 2,
         "delta": CALL["arguments"]},
        {"type": "response.function_call_arguments.done", "item_id": "fc_1", "output_index": 2,
         "arguments": CALL["arguments"]},
        {"type": "response.output_item.done", "output_index": 2, "item": CALL},
    ] if call else []  # fmt: skip
    out += [
        {"type": "response.completed", "response": {**start, "status": "completed",
                                                     "output": output}},
    ]  # fmt: skip
    return [(e["type"], {**e, "sequence_number": n}) for n, e in enumerate(out)]


def run(stream: list[tuple[str, dict[str, Any]]]) -> list[tuple[str | None, dict[str, Any]]]:
    stripper = RESPONSES.stream_stripper()
    return [e for name, data in stream for e in stripper.event(name, data)]


def check_stream(
    out: list[tuple[str | None, dict[str, Any]]], text: str, call: bool = True
) -> str | None:
    """What a client's accumulator checks: consecutive numbers, deltas adding up to every
    closing event's text, the other items as they came, and the same output as the
    stripped ``response`` object (:func:`strip_response`). Returns the message's text, or
    None when the message item was dropped (an envelope-only text beside a tool call)."""
    assert [d["sequence_number"] for _, d in out] == list(range(len(out)))
    assert all(name == d["type"] for name, d in out)
    expected_output = strip_response(
        {"output": events(text, [], call)[-1][1]["response"]["output"]}
    )[0]["output"]
    by_type = {d["type"]: d for _, d in out}
    assert by_type["response.completed"]["response"]["output"] == expected_output
    items = [d["item"] for _, d in out if d["type"] == "response.output_item.done"]
    assert items == expected_output
    assert [d["output_index"] for _, d in out if "output_index" in d] == sorted(
        d["output_index"] for _, d in out if "output_index" in d
    )
    messages = [item for item in expected_output if item["type"] == "message"]
    if not messages:
        assert not any("content_index" in d for _, d in out)
        return None
    expected = messages[0]["content"][0]["text"]
    deltas = "".join(d["delta"] for _, d in out if d["type"] == "response.output_text.delta")
    assert deltas == expected
    assert by_type["response.output_text.done"]["text"] == expected
    assert by_type["response.content_part.done"]["part"]["text"] == expected
    return expected


@settings(max_examples=200, deadline=None)
@given(replies, st.lists(st.integers(0, 200), max_size=10))
def test_stream_text_equals_the_stripped_reply_wherever_it_is_cut(
    text: str, cuts: list[int]
) -> None:
    alone = strip_envelope(text).text
    assert check_stream(run(events(text, cuts, call=False)), text, call=False) == alone
    beside_a_call = check_stream(run(events(text, cuts)), text)
    if strip_envelope(text, fallback=False).text:
        assert beside_a_call == strip_envelope(text, fallback=False).text
    else:  # nothing said but the envelope: the message item goes, not the action
        assert beside_a_call in (None, "")


def test_stream_of_prose_and_envelope() -> None:
    out = run(events(f"Listing.\n{BLOCK}", [3, 12, 40]))
    assert check_stream(out, f"Listing.\n{BLOCK}") == "Listing."
    # the function call's events are the same objects' values, numbered on
    names = [name for name, _ in out]
    assert names.count("response.function_call_arguments.delta") == 1


def test_stream_of_only_the_envelope_shows_its_action() -> None:
    out = run(events(BLOCK, [5, 30], call=False))
    assert check_stream(out, BLOCK, call=False) == "ask the user"
    # the action goes out as one delta right before the part's done event
    names = [name for name, _ in out]
    at = names.index("response.output_text.done")
    assert names[at - 1] == "response.output_text.delta"


def test_stream_of_only_the_envelope_and_a_call_drops_the_message_item() -> None:
    out = run(events(BLOCK, [5, 30]))
    assert check_stream(out, BLOCK) is None
    added = [d["item"]["type"] for _, d in out if d["type"] == "response.output_item.added"]
    assert added == ["reasoning", "function_call"]
    assert {d["output_index"] for _, d in out if d.get("item_id") == "fc_1"} == {1}


def test_stream_without_an_envelope_passes_unchanged() -> None:
    stream = events("Plain {not json} reply.", [4, 9])
    assert run(stream) == stream


def test_stream_tool_chars_count_the_call() -> None:
    stripper = RESPONSES.stream_stripper()
    total = sum(stripper.tool_chars(name, data) for name, data in events("x", []))
    assert total == len("ls") + len(CALL["arguments"])
    assert total == RESPONSES.tool_call_chars({"output": [REASONING, message("x"), CALL]})


def test_reply_strips_the_message_and_keeps_other_items() -> None:
    resp = {
        "id": "resp_1",
        "object": "response",
        "output": [REASONING, message(f"Listing.\n{BLOCK}"), CALL],
    }
    out, removed = RESPONSES.strip_reply(resp)
    assert out["output"][1]["content"][0]["text"] == "Listing."
    assert out["output"][0] is REASONING and out["output"][2] is CALL
    assert removed.envelope is not None and removed.envelope.action == "ask the user"
    assert removed.removed_chars == len(BLOCK)
    assert resp["output"][1]["content"][0]["text"] == f"Listing.\n{BLOCK}"  # not mutated


def test_reply_of_only_the_envelope_becomes_its_action() -> None:
    resp = {"output": [message(BLOCK)]}
    assert strip_response(resp)[0]["output"][0]["content"][0]["text"] == "ask the user"


def test_reply_of_only_the_envelope_beside_a_call_has_no_message_item() -> None:
    resp = {"output": [REASONING, message(BLOCK), CALL], "output_text": BLOCK}
    out, removed = strip_response(resp)
    assert out["output"] == [REASONING, CALL]
    assert out["output_text"] == ""
    assert removed.envelope is not None


def test_reply_without_an_envelope_is_the_same_object() -> None:
    for resp in ({"output": [message("Plain {x} text.")]}, {"output": [CALL]}, {"error": {}}):
        assert strip_response(resp)[0] is resp


def test_request_strips_earlier_assistant_items_only() -> None:
    user = {"role": "user", "content": [{"type": "input_text", "text": BLOCK}]}
    easy = {"role": "assistant", "content": f"Done.\n{BLOCK}"}
    body = {
        "model": "m",
        "input": [user, message(f"Looked.\n{BLOCK}"), REASONING, CALL, easy],
    }
    clean = RESPONSES.strip_request(body)
    items = clean["input"]
    assert items[0] is user  # the user's own text is theirs
    assert items[1]["content"][0]["text"] == "Looked."
    assert items[2] is REASONING and items[3] is CALL
    assert items[4] == {"role": "assistant", "content": "Done."}
    assert body["input"][1]["content"][0]["text"] == f"Looked.\n{BLOCK}"  # not mutated
    plain = {"model": "m", "input": [user, message("Looked."), CALL]}
    assert RESPONSES.strip_request(plain) is plain


def test_relay_keeps_numbering_through_dropped_deltas_and_an_error() -> None:
    """A chat upstream's stream as Responses events, stripped: the deltas held back as a
    possible envelope are not sent, and the error event a cut stream ends with carries the
    next number after the last event the client got."""
    inner = ChatToResponsesRelay(request_model="m", capture_limit=1 << 20)
    relay = StrippingRelay(inner, "openai-responses", rewrite=True)
    said = f"Listing.\n{BLOCK}"
    chunks = [
        {"id": "c", "object": "chat.completion.chunk", "model": "m",
         "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}
        for p in pieces(said, [4, 12, 20, 40])
    ]  # fmt: skip
    events = [e for c in chunks for e in SSEParser().feed(sse.encode(c))]
    raw = b"".join(b for e in events for b in relay.feed(e))
    raw += relay.error("upstream cut")
    got = [orjson.loads(e.data) for e in SSEParser().feed(raw)]
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    assert got[-1]["type"] == "error"
    assert "".join(e["delta"] for e in got if e["type"] == "response.output_text.delta") == (
        "Listing."
    )
    assert relay.text == said  # the judge reads the reply as the model wrote it
