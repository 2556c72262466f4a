"""Where ``with_breakpoint`` marks an Anthropic request's stable prefix, whichever format the
client sent: a block of its own (a Messages client), or one block that joins the contract
and the state (a chat-completions or Responses client's one message, translated)."""

from __future__ import annotations

from typing import Any

from skillstate.cost.cachehints import with_breakpoint

CONTRACT = "[contract]"
STATE = "[state] {}"


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def marked_at(body: dict[str, Any]) -> list[tuple[int, int]]:
    return [
        (i, k)
        for i, m in enumerate(body["messages"])
        for k, b in enumerate(m["content"] if isinstance(m["content"], list) else [])
        if "cache_control" in b
    ]


def request(*messages: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 10, "messages": list(messages)}


def test_a_block_of_its_own_is_marked() -> None:
    body = request({"role": "user", "content": [text("task"), text(CONTRACT), text(STATE)]})
    assert marked_at(with_breakpoint(body, CONTRACT)) == [(0, 1)]
    assert marked_at(with_breakpoint(body, STATE)) == [(0, 2)]


def test_a_joined_contract_and_state_block() -> None:
    joined = CONTRACT + "\n\n" + STATE
    body = request({"role": "user", "content": [text("task"), text(joined)]})
    # the window form: the state ends the block, which changes only at checkpoints
    assert marked_at(with_breakpoint(body, STATE)) == [(0, 1)]
    # the compact form: the state changes every turn, so the task's block before it
    assert marked_at(with_breakpoint(body, CONTRACT)) == [(0, 0)]
    alone = request({"role": "user", "content": [text(joined)]})
    assert with_breakpoint(alone, CONTRACT) == alone  # nothing stable before it


def test_leading_system_messages_are_passed_and_the_search_stops_at_the_assistant() -> None:
    system = {"role": "system", "content": [text("environment")]}
    body = request(system, {"role": "user", "content": [text("task"), text(CONTRACT)]})
    assert marked_at(with_breakpoint(body, CONTRACT)) == [(1, 1)]
    later = request(
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": [text("ok")]},
        {"role": "user", "content": [text(CONTRACT)]},
    )
    assert with_breakpoint(later, CONTRACT) == later
