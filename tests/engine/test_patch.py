"""Tests for skillstate.engine.patch: envelope extraction, validation, RFC 7386 merge."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema.exceptions import SchemaError

from skillstate.engine.patch import (
    NO_ENVELOPE_ERROR,
    Envelope,
    Extraction,
    PatchPolicy,
    Transition,
    extract_envelope,
    infer_key_types,
    merge_patch,
    validate_and_merge,
)


def only(text: str) -> Envelope:
    """The envelope extracted from ``text``; fails the test if there is none."""
    result = extract_envelope(text)
    assert result.envelope is not None, result.errors
    assert result.errors == []
    return result.envelope


def failure(text: str) -> list[str]:
    """The errors for ``text``; fails the test if an envelope was found."""
    result = extract_envelope(text)
    assert result.envelope is None, result.envelope
    assert result.errors
    return result.errors


# =========================================================================== extraction


def test_reasoning_then_fenced_json() -> None:
    text = (
        "The file list shows two candidates. I'll record them and open the first.\n\n"
        "```json\n"
        '{"state_patch": {"candidates": ["a.py", "b.py"], "step": 2}, "action": "open a.py"}\n'
        "```\n"
    )
    env = only(text)
    assert env.state_patch == {"candidates": ["a.py", "b.py"], "step": 2}
    assert env.action == "open a.py"
    assert env.reasoning == (
        "The file list shows two candidates. I'll record them and open the first."
    )


def test_pretty_printed_block() -> None:
    text = (
        "Plan updated.\n"
        "```json\n"
        "{\n"
        '  "state_patch": {\n'
        '    "plan": [\n'
        '      {"id": 1, "done": true},\n'
        '      {"id": 2, "done": false}\n'
        "    ],\n"
        '    "scratch": null\n'
        "  },\n"
        '  "action": "run tests"\n'
        "}\n"
        "```"
    )
    env = only(text)
    assert env.state_patch == {
        "plan": [{"id": 1, "done": True}, {"id": 2, "done": False}],
        "scratch": None,
    }
    assert env.action == "run tests"


def test_two_blocks_last_valid_wins() -> None:
    text = (
        "First I thought:\n"
        '```json\n{"state_patch": {"x": 1}, "action": "first"}\n```\n'
        "On reflection, better:\n"
        '```json\n{"state_patch": {"x": 2}, "action": "second"}\n```\n'
    )
    env = only(text)
    assert env.state_patch == {"x": 2}
    assert env.action == "second"


def test_last_block_invalid_earlier_valid_wins() -> None:
    text = (
        '```json\n{"state_patch": {"x": 1}, "action": "good"}\n```\n'
        "and then a broken one:\n"
        '```json\n{"state_patch": {"x": 2} "action": "bad"}\n```\n'
    )
    env = only(text)
    assert env.state_patch == {"x": 1}
    assert env.action == "good"


def test_bare_json_whole_content() -> None:
    env = only('  {"state_patch": {"k": "v"}, "action": "done"}\n')
    assert env == Envelope({"k": "v"}, "done", None)


def test_constrained_decoding_envelope_with_reasoning() -> None:
    text = orjson.dumps(
        {
            "reasoning": "The test failed at line 3, so ```json fences\nare not needed here.",
            "state_patch": {"failures": 1},
            "action": "fix line 3",
        }
    ).decode()
    env = only(text)
    assert env.reasoning == "The test failed at line 3, so ```json fences\nare not needed here."
    assert env.state_patch == {"failures": 1}
    assert env.action == "fix line 3"


def test_reasoning_field_overrides_prose() -> None:
    text = 'prose\n```json\n{"reasoning": "field", "state_patch": {}, "action": "a"}\n```'
    assert only(text).reasoning == "field"


def test_non_string_reasoning_field_falls_back_to_prose() -> None:
    text = 'prose\n```json\n{"reasoning": 5, "state_patch": {}, "action": "a"}\n```'
    assert only(text).reasoning == "prose"


def test_garbage() -> None:
    assert failure("I am not sure what to do next.") == [NO_ENVELOPE_ERROR]
    assert failure("") == [NO_ENVELOPE_ERROR]
    assert failure("   \n\n ") == [NO_ENVELOPE_ERROR]


def test_result_types() -> None:
    result = extract_envelope("nothing")
    assert isinstance(result, Extraction)
    assert result == Extraction(None, [NO_ENVELOPE_ERROR])


def test_invalid_json_message() -> None:
    errors = failure('```json\n{"state_patch": {"a": 1} "action": "x"}\n```')
    assert len(errors) == 1
    assert errors[0].startswith("invalid JSON in ```json block: ")
    assert "line 1 col 26" in errors[0]


def test_invalid_json_line_numbers_are_relative_to_the_block() -> None:
    text = 'a\nb\nc\n```json\n{\n  "state_patch": {},\n  "action": "x",\n}\n```'
    (error,) = failure(text)
    assert "trailing comma" in error
    assert error.endswith("at line 3 col 16")  # the comma, counted within the block


def test_state_patch_must_be_object() -> None:
    errors = failure('```json\n{"state_patch": [1, 2], "action": "x"}\n```')
    assert errors == ["state_patch must be an object, got array"]
    errors = failure('```json\n{"state_patch": "x", "action": "x"}\n```')
    assert errors == ["state_patch must be an object, got string"]
    errors = failure('```json\n{"state_patch": null, "action": "x"}\n```')
    assert errors == ["state_patch must be an object, got null"]


def test_missing_state_patch() -> None:
    assert failure('```json\n{"action": "x"}\n```') == ["```json block has no state_patch key"]


def test_block_must_be_an_object() -> None:
    assert failure("```json\n[1, 2]\n```") == ["```json block must be a JSON object, got array"]
    assert failure('```json\n"hi"\n```') == ["```json block must be a JSON object, got string"]


def test_empty_json_block() -> None:
    assert failure("```json\n\n```") == ["empty ```json block"]
    assert failure("```json\n```") == ["empty ```json block"]


def test_action_optional_but_must_be_string() -> None:
    assert only('```json\n{"state_patch": {"a": 1}}\n```').action is None
    assert only('```json\n{"state_patch": {"a": 1}, "action": null}\n```').action is None
    assert failure('```json\n{"state_patch": {}, "action": 3}\n```') == [
        "action must be a string, got integer"
    ]
    assert failure('```json\n{"state_patch": {}, "action": {"tool": "ls"}}\n```') == [
        "action must be a string, got object"
    ]


def test_extra_envelope_keys_are_tolerated() -> None:
    env = only('```json\n{"state_patch": {"a": 1}, "action": "x", "confidence": 0.9}\n```')
    assert env.state_patch == {"a": 1}


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_rejected(literal: str) -> None:
    (error,) = failure('```json\n{"state_patch": {"a": ' + literal + '}, "action": "x"}\n```')
    assert error.startswith("invalid JSON in ```json block")
    (error,) = failure('{"state_patch": {"a": ' + literal + '}, "action": "x"}')
    assert error.startswith("invalid JSON in reply")


def test_unterminated_fence() -> None:
    text = 'Thinking...\n```json\n{"state_patch": {"a": 1}, "action": "x"}\n'
    env = only(text)
    assert env.state_patch == {"a": 1}
    assert env.reasoning == "Thinking..."


def test_unterminated_fence_cut_mid_json() -> None:
    (error,) = failure('```json\n{"state_patch": {"a": 1}, "act')
    assert error.startswith("invalid JSON in ```json block: ")


def test_closing_fence_glued_to_json() -> None:
    env = only('```json\n{"state_patch": {"a": 1}, "action": "x"}```')
    assert env.state_patch == {"a": 1}


def test_glued_fence_followed_by_another_block() -> None:
    text = (
        '```json\n{"state_patch": {"a": 1}, "action": "x"}```\n'
        "retry:\n"
        '```\n{"state_patch": {"a": 2}, "action": "y"}\n```'
    )
    assert only(text).state_patch == {"a": 2}


def test_json_with_trailing_text_in_block() -> None:
    text = '```json\n{"state_patch": {"a": 1}, "action": "x"}\n// that is all\n```'
    assert only(text).state_patch == {"a": 1}


def test_bare_json_with_trailing_text() -> None:
    env = only('{"state_patch": {"a": 1}, "action": "x"}\nHope this helps!')
    assert env.state_patch == {"a": 1}
    assert env.reasoning == "Hope this helps!"


def test_untagged_fence() -> None:
    env = only('Okay.\n```\n{"state_patch": {"a": 1}, "action": "x"}\n```')
    assert env.state_patch == {"a": 1}
    assert env.reasoning == "Okay."


def test_untagged_non_json_block_is_ignored() -> None:
    text = (
        '```json\n{"state_patch": {"a": 1}, "action": "x"}\n```\n'
        "Output will look like:\n```\n$ ls\nfoo bar\n```"
    )
    assert only(text).state_patch == {"a": 1}


def test_other_language_blocks_are_not_envelopes() -> None:
    text = '```python\nx = {"state_patch": {"a": 1}, "action": "x"}\n```'
    assert failure(text) == [NO_ENVELOPE_ERROR]
    text = '```python\nprint({"state_patch": {}})\n```\n```json\n{"state_patch": {"b": 2}}\n```'
    assert only(text).state_patch == {"b": 2}


@pytest.mark.parametrize(
    "opener",
    ["```json", "```JSON", "``` json", "~~~json", "````json", "```json title=envelope"],
)
def test_fence_variants(opener: str) -> None:
    closer = opener.split("json")[0].split("JSON")[0].strip()
    text = f'Reasoning.\n{opener}\n{{"state_patch": {{"a": 1}}, "action": "x"}}\n{closer}\n'
    env = only(text)
    assert env.state_patch == {"a": 1}
    assert env.reasoning == "Reasoning."


def test_indented_fence_in_a_list() -> None:
    text = (
        "1. Look at the log\n"
        "2. Record it:\n"
        "   ```json\n"
        '   {"state_patch": {"log": "seen"}, "action": "next"}\n'
        "   ```\n"
    )
    assert only(text).state_patch == {"log": "seen"}


def test_crlf_line_endings() -> None:
    text = 'Reasoning.\r\n```json\r\n{"state_patch": {"a": 1}, "action": "x"}\r\n```\r\n'
    env = only(text)
    assert env.state_patch == {"a": 1}
    assert env.reasoning == "Reasoning."


def test_single_line_fenced_block() -> None:
    env = only('Done. ```json is below.\n```json {"state_patch": {"a": 7}, "action": "x"} ```')
    assert env.state_patch == {"a": 7}


def test_forgotten_closing_fence_then_new_block() -> None:
    text = (
        '```json\n{"state_patch": {"a": 1}, "action": "x"}\n'
        '```json\n{"state_patch": {"a": 5}, "action": "y"}\n```'
    )
    assert only(text).state_patch == {"a": 5}


def test_inline_fence_mentions_in_prose_are_ignored() -> None:
    text = (
        "I must answer with a ```json block, like ```json {...}``` but real.\n"
        '```json\n{"state_patch": {"a": 1}, "action": "x"}\n```'
    )
    assert only(text).state_patch == {"a": 1}


def test_fence_inside_a_longer_fence_is_content() -> None:
    text = (
        "````markdown\n"
        '```json\n{"state_patch": {"quoted": true}, "action": "example"}\n```\n'
        "````\n"
        '```json\n{"state_patch": {"real": true}, "action": "go"}\n```'
    )
    assert only(text).state_patch == {"real": True}


def test_think_tags_then_block() -> None:
    text = (
        "<think>\nThe state says step 3. Maybe "
        '```json\n{"state_patch": {"step": 99}}\n```\nno, wrong.\n</think>\n'
        'Moving on.\n```json\n{"state_patch": {"step": 4}, "action": "step 4"}\n```'
    )
    assert only(text).state_patch == {"step": 4}


def test_unfenced_object_after_prose() -> None:
    text = 'I will now save.\n{"state_patch": {"saved": true}, "action": "save"}\n'
    env = only(text)
    assert env.state_patch == {"saved": True}
    assert env.reasoning == "I will now save."


def test_unfenced_broken_object_after_prose_is_reported() -> None:
    (error,) = failure('I will now save.\n{"state_patch": {"saved": true} "action": "save"}\n')
    assert error.startswith("invalid JSON in unfenced JSON object: ")


def test_unfenced_brace_in_prose_is_not_an_error() -> None:
    assert failure("The set is\n{1, 2, 3}\nso done.") == [NO_ENVELOPE_ERROR]


def test_pretty_bare_object_with_column_zero_inner_lines() -> None:
    text = '{\n"state_patch": {\n"items": [\n{"a": 1},\n{"b": 2}\n]\n},\n"action": "x"\n}'
    env = only(text)
    assert env.state_patch == {"items": [{"a": 1}, {"b": 2}]}
    assert env.action == "x"


def test_errors_are_capped() -> None:
    text = "\n".join(f"```json\n{{broken {i}\n```" for i in range(20))
    errors = failure(text)
    assert len(errors) == 5
    assert all(e.startswith("invalid JSON in ```json block") for e in errors)


def test_errors_from_several_blocks() -> None:
    text = '```json\n{"state_patch": 1}\n```\n```json\n{"state_patch": {}, "action": []}\n```'
    assert failure(text) == [
        "state_patch must be an object, got integer",
        "action must be a string, got array",
    ]


def test_unicode_content() -> None:
    text = (
        "Überlegung: ✓ 日本語\n"
        '```json\n{"state_patch": {"note": "naïve ☃"}, "action": "écrire"}\n```'
    )
    env = only(text)
    assert env.state_patch == {"note": "naïve ☃"}
    assert env.action == "écrire"


def test_lone_surrogate_is_an_error_not_a_crash() -> None:
    errors = failure('```json\n{"state_patch": {"a": "\ud800"}}\n```')
    assert errors[0].startswith("invalid JSON in ```json block")


MB = 1_000_000

ADVERSARIAL = [
    "`" * MB,
    "```\n" * (MB // 4),
    "```json\n" * (MB // 8),
    "``` " * (MB // 4),
    "~~~\n```\n" * (MB // 8),
    "a```\n" * (MB // 5),
    "```\n{\n" * (MB // 6),
    "{" * MB,
    "[" * MB,
    "{\n" * (MB // 2),
    '{"a":[1,\n' * (MB // 9),
    '{"state_patch": ' * (MB // 16),
    '\n{"state_patch": {' * (MB // 18),
    "```json\n" + "[" * MB,
    "```json\n" + '{"state_patch": {"a": "' + "\\" * MB,
    " " * MB + "x",
    "\n" * MB,
    '"' * MB,
    "```json\n" + '{"a": "' + "x" * MB,
]


@pytest.mark.parametrize("text", ADVERSARIAL, ids=lambda t: repr(t[:12]))
def test_adversarial_megabyte_inputs_finish(text: str) -> None:
    result = extract_envelope(text)
    assert result.envelope is None
    assert 1 <= len(result.errors) <= 5


def test_megabyte_valid_reply() -> None:
    prose = ("Some reasoning with `code` and {braces}.\n" * (MB // 40))[:MB]
    big = "x" * MB
    text = prose + '```json\n{"state_patch": {"blob": "' + big + '"}, "action": "x"}\n```'
    env = only(text)
    assert env.state_patch == {"blob": big}


# --------------------------------------------------------------------------- properties

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
KEYS = st.sampled_from(["a", "b", "c", "d", "e"])
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=4),
    max_leaves=12,
)
JSON_OBJECTS = st.dictionaries(KEYS, JSON_VALUES, max_size=4)

PROSE = st.text(
    alphabet=st.characters(exclude_characters="`~{", exclude_categories=["Cs"]),
    max_size=200,
)


@given(patch=JSON_OBJECTS, action=st.none() | st.text(max_size=20), before=PROSE, after=PROSE)
def test_property_fenced_roundtrip(
    patch: dict[str, Any], action: str | None, before: str, after: str
) -> None:
    envelope = orjson.dumps({"state_patch": patch, "action": action}).decode()
    text = f"{before}\n```json\n{envelope}\n```\n{after}"
    env = only(text)
    assert orjson.dumps(env.state_patch) == orjson.dumps(patch)
    assert env.action == action
    expected = "\n\n".join(p for p in (before.strip(), after.strip()) if p) or None
    assert env.reasoning == expected


FRAGMENTS = st.sampled_from(
    [
        "```",
        "```json",
        "~~~",
        "\n",
        " ",
        "{",
        "}",
        "[",
        "]",
        '"state_patch"',
        '"action"',
        '"x"',
        ":",
        ",",
        "{}",
        "null",
        "1",
        "text",
        "\r\n",
        "\\",
        '"',
    ]
)


@settings(max_examples=300)
@given(parts=st.lists(FRAGMENTS, max_size=60))
def test_property_extraction_never_crashes(parts: list[str]) -> None:
    result = extract_envelope("".join(parts))
    if result.envelope is None:
        assert result.errors
    else:
        assert result.errors == []
        assert isinstance(result.envelope.state_patch, dict)
        assert result.envelope.action is None or isinstance(result.envelope.action, str)


@given(text=st.text(max_size=300))
def test_property_arbitrary_text_never_crashes(text: str) -> None:
    result = extract_envelope(text)
    assert (result.envelope is None) == bool(result.errors)


# =========================================================================== validation


STATE: dict[str, Any] = {
    "goal": "fix the bug",
    "step": 1,
    "score": 0.5,
    "done": False,
    "notes": [],
    "config": {"verbose": True, "level": 2},
    "extra": None,
}
KEY_TYPES = infer_key_types(STATE)
STRICT = PatchPolicy(allowed_keys=frozenset(STATE), key_types=KEY_TYPES)
DROP = PatchPolicy(allowed_keys=frozenset(STATE), key_types=KEY_TYPES, schema_violation="drop")


def check(state: dict[str, Any], patch: dict[str, Any], policy: PatchPolicy) -> Transition:
    """validate_and_merge, asserting that neither input is mutated."""
    state_before, patch_before = copy.deepcopy(state), copy.deepcopy(patch)
    result = validate_and_merge(state, patch, policy)
    assert state == state_before
    assert patch == patch_before
    if result.ok:
        assert result.errors == []
        assert result.new_state is not None and result.applied_patch is not None
    else:
        assert result.errors
        assert result.new_state is None and result.applied_patch is None
    return result


def test_infer_key_types() -> None:
    assert KEY_TYPES == {
        "goal": "string",
        "step": "integer",
        "score": "number",
        "done": "boolean",
        "notes": "array",
        "config": "object",
    }
    assert infer_key_types({}) == {}


def test_valid_patch() -> None:
    patch = {"step": 2, "notes": ["saw error"], "config": {"level": None, "x": 1}}
    result = check(STATE, patch, STRICT)
    assert result.ok
    assert result.new_state == {
        **STATE,
        "step": 2,
        "notes": ["saw error"],
        "config": {"verbose": True, "x": 1},
    }
    assert result.applied_patch == patch
    assert result.warnings == []


def test_result_objects_are_fresh() -> None:
    patch = {"notes": ["a"], "config": {"x": [1]}}
    result = check(STATE, patch, STRICT)
    assert result.new_state is not None and result.applied_patch is not None
    assert result.applied_patch is not patch
    result.new_state["notes"].append("mutated")
    result.new_state["config"]["verbose"] = "mutated"
    result.applied_patch["config"]["x"].append(2)
    assert patch == {"notes": ["a"], "config": {"x": [1]}}
    assert STATE["config"] == {"verbose": True, "level": 2}
    assert STATE["notes"] == []


def test_out_of_schema_key_rejected_by_default() -> None:
    result = check(STATE, {"step": 2, "mood": "happy"}, STRICT)
    assert not result.ok
    (error,) = result.errors
    assert error.startswith("key 'mood' is not in the state schema (allowed: ")
    assert "goal" in error


def test_out_of_schema_key_dropped() -> None:
    result = check(STATE, {"step": 2, "mood": "happy", "x": None}, DROP)
    assert result.ok
    assert result.applied_patch == {"step": 2}
    assert result.new_state == {**STATE, "step": 2}
    assert result.warnings == [
        "dropped key 'mood': not in the state schema",
        "dropped key 'x': not in the state schema",
    ]


def test_empty_allowed_keys_means_any_key() -> None:
    result = check(STATE, {"anything": {"goes": [1]}}, PatchPolicy())
    assert result.ok
    assert result.new_state is not None and result.new_state["anything"] == {"goes": [1]}


def test_wrong_type() -> None:
    result = check(STATE, {"step": "two"}, STRICT)
    assert result.errors == ["key 'step' must be integer, got string"]
    result = check(STATE, {"notes": {"0": "x"}}, STRICT)
    assert result.errors == ["key 'notes' must be array, got object"]
    result = check(STATE, {"goal": ["a"]}, STRICT)
    assert result.errors == ["key 'goal' must be string, got array"]


def test_bool_is_not_an_integer_but_int_is_a_number() -> None:
    assert check(STATE, {"step": True}, STRICT).errors == [
        "key 'step' must be integer, got boolean"
    ]
    assert check(STATE, {"step": 2.0}, STRICT).errors == ["key 'step' must be integer, got number"]
    assert check(STATE, {"score": 1}, STRICT).ok
    assert check(STATE, {"score": 1.25}, STRICT).ok
    assert check(STATE, {"score": False}, STRICT).errors == [
        "key 'score' must be number, got boolean"
    ]


def test_null_deletes_whatever_the_type() -> None:
    result = check(
        STATE, {"step": None, "config": None, "missing": None}, PatchPolicy(key_types=KEY_TYPES)
    )
    assert result.ok
    assert result.new_state is not None
    assert "step" not in result.new_state and "config" not in result.new_state


def test_nested_object_patch_type_is_the_merged_type() -> None:
    # a merge-patch object onto a string key yields an object: rejected for "string"
    assert check(STATE, {"goal": {"a": None}}, STRICT).errors == [
        "key 'goal' must be string, got object"
    ]
    # and onto an object key it merges
    result = check(STATE, {"config": {"verbose": None}}, STRICT)
    assert result.new_state is not None and result.new_state["config"] == {"level": 2}


def test_all_key_errors_are_reported_together() -> None:
    result = check(STATE, {"mood": 1, "step": "x", "done": 0}, STRICT)
    assert result.errors[0].startswith("key 'mood' is not in the state schema")
    assert result.errors[1:] == [
        "key 'step' must be integer, got string",
        "key 'done' must be boolean, got integer",
    ]


def test_untyped_key_accepts_anything() -> None:
    assert check(STATE, {"extra": [1, {"a": 2}]}, STRICT).ok


def test_oversize_patch() -> None:
    policy = PatchPolicy(max_patch_bytes=50)
    assert check({}, {"a": "x" * 10}, policy).ok
    result = check({}, {"a": "x" * 100}, policy)
    assert result.errors == ["state_patch is 108 bytes, over the 50-byte limit"]


def test_oversize_merged_state() -> None:
    policy = PatchPolicy(max_state_bytes=100)
    state = {"log": "x" * 60}
    assert check(state, {"more": "y"}, policy).ok
    result = check(state, {"more": "y" * 60}, policy)
    (error,) = result.errors
    assert error.startswith("merged state would be ")
    assert error.endswith("bytes, over the 100-byte limit")
    # deleting makes room again
    assert check(state, {"log": None, "more": "y" * 60}, policy).ok


def test_too_deep() -> None:
    policy = PatchPolicy(max_depth=3)
    assert check({}, {"a": {"b": {"c": 1}}}, policy).ok  # the patch itself is level 1
    assert check({}, {"a": [[1]]}, policy).ok
    result = check({}, {"a": {"b": {"c": {"d": 1}}}}, policy)
    assert result.errors == ["state_patch is nested deeper than 3 levels under key 'a'"]
    assert not check({}, {"ok": 1, "a": [[[1]]]}, policy).ok


def test_default_depth_limit() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(100):
        node["k"] = {}
        node = node["k"]
    result = check({}, deep, PatchPolicy())
    assert result.errors == ["state_patch is nested deeper than 64 levels under key 'k'"]


def test_non_json_values_in_programmatic_patches() -> None:
    assert check({}, {"a": {"b": float("nan")}}, PatchPolicy()).errors == [
        "state_patch has a non-finite number at 'a.b'"
    ]
    assert check({}, {"a": [1, float("inf")]}, PatchPolicy()).errors == [
        "state_patch has a non-finite number at 'a[1]'"
    ]
    assert check({}, {"a": {1: 2}}, PatchPolicy()).errors == [
        "state_patch has a non-string key 1 at 'a'"
    ]
    assert check({}, {"a": {1, 2}}, PatchPolicy()).errors == [
        "state_patch has a non-JSON value (set) at 'a'"
    ]


def test_patch_must_be_an_object() -> None:
    result = validate_and_merge({}, [1], PatchPolicy())  # type: ignore[arg-type]
    assert result.errors == ["state_patch must be an object, got array"]


SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["goal"],
    "properties": {
        "goal": {"type": "string", "minLength": 1},
        "plan": {
            "type": "object",
            "properties": {"steps": {"type": "array", "items": {"type": "string"}}},
        },
    },
}


def test_state_schema_violation() -> None:
    policy = PatchPolicy(state_schema=SCHEMA)
    state = {"goal": "x", "plan": {"steps": ["a"]}}
    assert check(state, {"plan": {"steps": ["a", "b"]}}, policy).ok

    result = check(state, {"goal": None}, policy)
    assert result.errors == ["state_schema violation at top level: 'goal' is a required property"]

    result = check(state, {"plan": {"steps": ["a", 3]}}, policy)
    assert result.errors == ["state_schema violation at 'plan.steps[1]': 3 is not of type 'string'"]


def test_state_schema_long_messages_are_clipped() -> None:
    policy = PatchPolicy(state_schema={"type": "object", "properties": {"a": {"type": "string"}}})
    result = check({}, {"a": list(range(500))}, policy)
    (error,) = result.errors
    assert error.startswith("state_schema violation at 'a': [0, 1, 2")
    assert error.endswith("...")
    assert len(error) < 300


def test_state_schema_is_compiled_once() -> None:
    policy = PatchPolicy(state_schema=SCHEMA)
    validator = policy._validator
    assert validator is not None
    check({"goal": "x"}, {"goal": "y"}, policy)
    check({"goal": "x"}, {"goal": None}, policy)
    assert policy._validator is validator


def test_invalid_state_schema_fails_at_construction() -> None:
    with pytest.raises(SchemaError):
        PatchPolicy(state_schema={"type": "no-such-type"})


def test_policy_validation() -> None:
    with pytest.raises(ValueError, match="unknown JSON type"):
        PatchPolicy(key_types={"a": "str"})
    with pytest.raises(ValueError, match="schema_violation"):
        PatchPolicy(schema_violation="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_depth"):
        PatchPolicy(max_depth=0)
    policy = PatchPolicy(allowed_keys={"a", "b"})  # type: ignore[arg-type]
    assert policy.allowed_keys == frozenset({"a", "b"})


def test_policy_owns_its_key_types() -> None:
    types = {"a": "string"}
    policy = PatchPolicy(key_types=types)
    types["a"] = "integer"
    assert policy.key_types == {"a": "string"}


def test_extracted_then_validated() -> None:
    reply = (
        'Step done.\n```json\n{"state_patch": {"step": 2, "notes": ["ok"]}, "action": "next"}\n```'
    )
    env = only(reply)
    result = check(STATE, env.state_patch, STRICT)
    assert result.ok
    assert result.new_state is not None and result.new_state["step"] == 2


@given(state=JSON_OBJECTS, patch=JSON_OBJECTS)
def test_property_permissive_policy_is_merge_patch(
    state: dict[str, Any], patch: dict[str, Any]
) -> None:
    result = check(state, patch, PatchPolicy())
    assert result.ok
    assert result.new_state == merge_patch(state, patch)


# =========================================================================== merge


def rfc7386_reference(target: Any, patch: Any) -> Any:
    """The RFC 7386 section 2 pseudocode, transcribed (works on copies)."""
    if isinstance(patch, dict):
        target = dict(target) if isinstance(target, dict) else {}
        for name, value in patch.items():
            if value is None:
                target.pop(name, None)
            else:
                target[name] = rfc7386_reference(target.get(name), value)
        return target
    return patch


# RFC 7386 Appendix A
RFC_EXAMPLES = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(("target", "patch", "expected"), RFC_EXAMPLES)
def test_rfc7386_appendix_examples(target: Any, patch: Any, expected: Any) -> None:
    target_before, patch_before = copy.deepcopy(target), copy.deepcopy(patch)
    assert merge_patch(target, patch) == expected
    assert target == target_before
    assert patch == patch_before


def test_rfc7386_section3_example() -> None:
    target = {
        "title": "Goodbye!",
        "author": {"givenName": "John", "familyName": "Doe"},
        "tags": ["example", "sample"],
        "content": "This will be unchanged",
    }
    patch = {
        "title": "Hello!",
        "phoneNumber": "+01-123-456-7890",
        "author": {"familyName": None},
        "tags": ["example"],
    }
    assert merge_patch(target, patch) == {
        "title": "Hello!",
        "author": {"givenName": "John"},
        "tags": ["example"],
        "content": "This will be unchanged",
        "phoneNumber": "+01-123-456-7890",
    }


def _containers(value: Any) -> list[Any]:
    """Every dict and list inside value (including itself)."""
    found: list[Any] = []
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            found.append(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            found.append(node)
            stack.extend(node)
    return found


def canonical(value: Any) -> bytes:
    """Type-exact comparison (1, 1.0 and True differ)."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


@given(target=JSON_VALUES, patch=JSON_VALUES)
def test_property_matches_rfc_pseudocode(target: Any, patch: Any) -> None:
    expected = rfc7386_reference(copy.deepcopy(target), copy.deepcopy(patch))
    assert canonical(merge_patch(target, patch)) == canonical(expected)


@given(target=JSON_VALUES, patch=JSON_VALUES)
def test_property_idempotent(target: Any, patch: Any) -> None:
    once = merge_patch(target, patch)
    assert canonical(merge_patch(once, patch)) == canonical(once)


def _untouched(target: Any, patch: Any) -> list[Any]:
    """The containers of ``target`` (a subtree's included) that ``patch`` leaves as they are:
    the values of keys it does not name, at any depth of the objects it merges into."""
    if not (isinstance(patch, dict) and isinstance(target, dict)):
        return []
    found: list[Any] = []
    for key, value in target.items():
        if key not in patch:
            found.extend(_containers(value))
        else:
            found.extend(_untouched(value, patch[key]))
    return found


@given(target=JSON_VALUES, patch=JSON_VALUES)
def test_property_inputs_not_mutated_and_untouched_subtrees_shared(target: Any, patch: Any) -> None:
    target_before, patch_before = canonical(target), canonical(patch)
    result = merge_patch(target, patch)
    assert canonical(target) == target_before
    assert canonical(patch) == patch_before
    result_ids = {id(c) for c in _containers(result)}
    assert not result_ids & {id(c) for c in _containers(patch)}
    # Shared with the target: exactly the subtrees the patch does not reach.
    untouched = {id(c) for c in _untouched(target, patch)}
    assert result_ids & {id(c) for c in _containers(target)} == untouched
    if isinstance(patch, dict) and isinstance(target, dict):
        for key, value in target.items():
            if key not in patch:
                assert result[key] is value


@given(
    first=JSON_OBJECTS,
    patches=st.lists(JSON_OBJECTS | st.lists(JSON_VALUES, max_size=3), min_size=1, max_size=6),
)
def test_property_a_sessions_earlier_states_never_change(
    first: dict[str, Any], patches: list[Any]
) -> None:
    """A session's states share subtrees turn after turn (each merge shares what its patch
    leaves untouched): no later merge, valid or refused, changes an earlier state."""
    states = [first]
    snapshots = [canonical(first)]
    policy = PatchPolicy(max_state_bytes=200)  # some merges are refused, after merging
    for patch in patches:
        if isinstance(patch, dict):
            result = validate_and_merge(states[-1], patch, policy)
            if not result.ok:
                continue
            assert result.new_state is not None
            assert result.new_state_json == orjson.dumps(result.new_state)
            new = result.new_state
        else:
            new = merge_patch(states[-1], {"k": patch})
        states.append(new)
        snapshots.append(canonical(new))
    for state, snapshot in zip(states, snapshots, strict=True):
        assert canonical(state) == snapshot


@given(target=JSON_OBJECTS, keys=st.lists(KEYS, max_size=5), rest=JSON_OBJECTS)
def test_property_null_deletes(
    target: dict[str, Any], keys: list[str], rest: dict[str, Any]
) -> None:
    patch = {**rest, **dict.fromkeys(keys)}
    result = merge_patch(target, patch)
    for key in keys:
        assert key not in result
    for key, value in target.items():
        if key not in patch:
            assert canonical(result[key]) == canonical(value)


@given(target=JSON_OBJECTS, key=KEYS, array=st.lists(JSON_VALUES, max_size=4))
def test_property_arrays_replace(target: dict[str, Any], key: str, array: list[Any]) -> None:
    result = merge_patch(target, {key: array})
    assert canonical(result[key]) == canonical(array)


@given(target=JSON_VALUES, patch=JSON_SCALARS | st.lists(JSON_VALUES, max_size=4))
def test_property_non_object_patch_replaces(target: Any, patch: Any) -> None:
    assert canonical(merge_patch(target, patch)) == canonical(patch)


@given(patch=JSON_OBJECTS)
def test_property_result_of_object_patch_has_no_patch_nulls(patch: dict[str, Any]) -> None:
    result = merge_patch(None, patch)
    assert canonical(result) == canonical(rfc7386_reference({}, patch))
    assert all(value is not None for value in result.values())
