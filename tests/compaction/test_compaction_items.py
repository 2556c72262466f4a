"""The Responses and Messages compaction shapes the proxy writes and reads."""

from __future__ import annotations

from typing import Any

import pytest

from skillstate.compaction import items as ci
from skillstate.compaction import messages as cm
from skillstate.compaction.items import RESTORED_MARK


def test_a_stream_gains_the_item_first() -> None:
    item = ci.compaction_item("ssc1_x")
    resp = {"id": "r", "output": [{"type": "message"}]}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": resp},
        {"type": "response.in_progress", "response": resp},
        {"type": "response.output_item.added", "output_index": 0, "item": {"type": "message"}},
        {"type": "response.completed", "response": resp},
    ]
    out = [e for ev in events for e in ci.shifted_event(ev, item)]
    assert [e["type"] for e in out] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.output_item.done", "response.output_item.added", "response.completed",
    ]  # fmt: skip
    assert [e.get("output_index") for e in out[2:5]] == [0, 0, 1]
    assert out[-1]["response"]["output"] == [item, {"type": "message"}]


@pytest.mark.parametrize(
    ("cm_", "want"),
    [
        (None, None),
        ([{"type": "compaction", "compact_threshold": 500}], 500),
        ([{"type": "compaction"}], None),
    ],
)
def test_the_threshold(cm_: Any, want: int | None) -> None:
    assert ci.compact_threshold({"context_management": cm_}) == want


@pytest.mark.parametrize(
    "bad", ["x", [{"type": "trim"}], [{"type": "compaction", "compact_threshold": 0}]]
)
def test_a_bad_threshold(bad: Any) -> None:
    with pytest.raises(ValueError):
        ci.compact_threshold({"context_management": bad})


def test_messages_after_the_last_compaction_block() -> None:
    block = cm.compaction_block("ssc1_y", 3)
    messages = [
        {"role": "user", "content": "old"},
        {"role": "assistant", "content": [block, {"type": "text", "text": "after"}]},
        {"role": "user", "content": "new"},
    ]
    at = cm.last_compaction(messages)
    assert at == (1, 0)
    out = cm.after_compaction(messages, at, {"k": 1}, 3)
    assert (
        RESTORED_MARK in out[0]["content"][0]["text"] and '{"k":1}' in out[0]["content"][0]["text"]
    )
    assert out[1] == {"role": "assistant", "content": [{"type": "text", "text": "after"}]}
    assert out[2] == {"role": "user", "content": "new"}
    assert cm.last_compaction([{"role": "user", "content": [block]}]) is None  # users' do not count
