"""``replystream.responses_events``: a finished Responses reply as the events of its stream
(what an upstream that answered JSON to a streamed request is relayed as, and what
``GET /v1/responses/{id}?stream=true`` answers for a background response)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from skillstate.dialects import sse
from skillstate.dialects.replystream import responses_events

MESSAGE = {
    "id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
    "content": [{"type": "output_text", "text": "Hello there.", "annotations": []}],
}  # fmt: skip
CALL = {
    "id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_1",
    "name": "get_weather", "arguments": '{"city": "Paris"}',
}  # fmt: skip


def reply(status: str = "completed") -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "status": status, "output": [MESSAGE, CALL]}


def events(resp: dict[str, Any], after: int = -1) -> list[dict[str, Any]]:
    parsed = sse.SSEParser().feed(b"".join(responses_events(resp, after)))
    out = []
    for e in parsed:
        data = orjson.loads(e.data)
        assert data["type"] == e.event  # the SSE event name is the data's type
        out.append(data)
    return out


@pytest.mark.parametrize(
    ("status", "terminal"),
    [("completed", "response.completed"), ("incomplete", "response.incomplete"),
     ("failed", "response.failed")],
)  # fmt: skip
def test_the_terminal_event_is_the_one_the_status_names(status: str, terminal: str) -> None:
    got = events(reply(status))
    assert [e["type"] for e in got][:2] == ["response.created", "response.in_progress"]
    assert got[0]["response"]["status"] == "in_progress" and got[0]["response"]["output"] == []
    assert got[-1]["type"] == terminal and got[-1]["response"] == reply(status)
    assert [e["sequence_number"] for e in got] == list(range(len(got)))


def test_the_items_text_and_arguments_come_whole_in_one_delta() -> None:
    got = events(reply())
    text = [e["delta"] for e in got if e["type"] == "response.output_text.delta"]
    args = [e["delta"] for e in got if e["type"] == "response.function_call_arguments.delta"]
    assert text == ["Hello there."] and args == ['{"city": "Paris"}']
    done = [e["item"] for e in got if e["type"] == "response.output_item.done"]
    assert done == [MESSAGE, CALL]


@pytest.mark.parametrize("after", [0, 3, 7])
def test_after_leaves_out_the_events_up_to_that_number(after: int) -> None:
    whole = events(reply())
    assert events(reply(), after) == whole[after + 1 :]


def test_after_the_last_event_there_is_none() -> None:
    whole = events(reply())
    assert events(reply(), len(whole) - 1) == []
