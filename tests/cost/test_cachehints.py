"""Where ``with_breakpoint`` marks an Anthropic request's stable prefix, whichever format the
client sent: a block of its own (a Messages client), or one block that joins the contract
and the state (a chat-completions or Responses client's one message, translated)."""

from __future__ import annotations

from typing import Any

from skillstate.cost.cachehints import marked_message, with_breakpoint

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


HOUR = {"type": "ephemeral", "ttl": "1h"}
FIVE = {"type": "ephemeral"}


def marker_at(body: dict[str, Any], i: int, k: int) -> Any:
    return body["messages"][i]["content"][k]["cache_control"]


def test_the_added_breakpoint_is_one_hour_when_a_later_one_is() -> None:
    """The API refuses a one-hour breakpoint after a five-minute one (tools, system,
    messages): Claude Code can mark its newest message one-hour, so the proxy's breakpoint before
    it must be one-hour too; a five-minute one otherwise, and where the one-hour ones come
    only before it."""
    newest = {"role": "user", "content": [{**text("latest"), "cache_control": HOUR}]}
    first = {"role": "user", "content": [text("task"), text(CONTRACT), text(STATE)]}
    reply = {"role": "assistant", "content": [text("ok")]}
    assert marker_at(with_breakpoint(request(first, reply, newest), STATE), 0, 2) == HOUR
    automatic = {
        **request(first, reply, {"role": "user", "content": "latest"}),
        "cache_control": HOUR,
    }
    assert marker_at(with_breakpoint(automatic, STATE), 0, 2) == HOUR
    same_message = request({**first, "content": [*first["content"], newest["content"][0]]})
    assert marker_at(with_breakpoint(same_message, STATE), 0, 2) == HOUR
    five = {"role": "user", "content": [{**text("latest"), "cache_control": FIVE}]}
    assert marker_at(with_breakpoint(request(first, reply, five), STATE), 0, 2) == FIVE
    system_hour = {
        **request(first, reply, five),
        "system": [{**text("sys"), "cache_control": HOUR}],
    }
    assert marker_at(with_breakpoint(system_hour, STATE), 0, 2) == FIVE


def test_masks_breakpoint_takes_the_ttl_of_the_breakpoints_after_it() -> None:
    message = {"role": "user", "content": [text("observation")]}
    later_hour = [{"role": "user", "content": [{**text("new"), "cache_control": HOUR}]}]
    assert marked_message(message, later_hour)["content"][-1]["cache_control"] == HOUR
    assert marked_message(message, [])["content"][-1]["cache_control"] == FIVE
    top = {"cache_control": HOUR}
    assert marked_message(message, [], top)["content"][-1]["cache_control"] == HOUR
