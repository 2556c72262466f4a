"""Verbatim reach (issue 23's definition), the one implementation the replay and the benches
share: which tokens count, and where they must sit to count."""

from __future__ import annotations

from skillstate.bench.reach import (
    CallReach,
    ReachMeter,
    action_tokens,
    distinctive_tokens,
    mean_reach,
    strings_of,
)


def test_distinctive_tokens_are_identifiers_and_paths_of_eight_characters() -> None:
    text = "Edit django/db/models/query.py: values_list() and qs1.union(x). ok len=12345678."
    # Dotted names count whole; a number or a short word does not.
    assert distinctive_tokens(text) == {"django/db/models/query.py", "values_list", "qs1.union"}


def test_strings_are_content_not_structure() -> None:
    message = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_0123456789", "input": {"path": "a/b.py"}}],
        "tool_calls": [
            {"id": "call_1", "function": {"name": "bash", "arguments": '{"c": "ls x"}'}}
        ],
    }
    assert sorted(strings_of(message)) == ["a/b.py", "bash", "ls x"]
    assert action_tokens(['{"command": "cat /testbed/setup.cfg"}', {"q": "find_package"}]) == {
        "/testbed/setup.cfg",
        "find_package",
    }


def test_a_token_counts_verbatim_only_inside_a_transcript_string() -> None:
    meter = ReachMeter()
    history = ["output: helpers_module.py and config_loader.py", "task: read notes.txt"]
    action = action_tokens(['{"cmd": "cat helpers_module.py config_loader.py"}'])
    reachable = meter.reachable(action, history, excluded=["task: read notes.txt"])
    assert reachable == {"helpers_module.py", "config_loader.py"}
    transcript = set(history)
    # Passthrough: the transcript as sent.
    assert meter.measure(reachable, transcript, history) == CallReach(2, 2, 2)
    # A state block that names one of them: reach with state only.
    state = '{"notes": "config_loader.py"}'
    assert meter.measure(reachable, transcript, [state, history[1]]) == CallReach(2, 0, 1)
    # A rewritten (masked, cut) string is not verbatim.
    cut = "output: helpers_module.py and config_loader"
    assert meter.measure(reachable, transcript, [cut]) == CallReach(2, 0, 1)
    assert meter.measure(set(), transcript, history).verbatim_share is None


def test_the_mean_leaves_out_calls_without_reachable_tokens() -> None:
    calls = [CallReach(2, 1, 2), CallReach(0, 0, 0), CallReach(4, 4, 4)]
    assert mean_reach(calls) == {"verbatim": 0.75, "with_state": 1.0, "calls": 2}
    assert mean_reach([]) == {"verbatim": None, "with_state": None, "calls": 0}
