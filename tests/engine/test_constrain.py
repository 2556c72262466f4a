from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skillstate.engine.constrain import (
    BOUNDED_ARRAY_GROWTH,
    BOUNDED_STRING_MAX_LENGTH,
    ENVELOPE_SCHEMA_NAME,
    asks_for_no_output,
    infer_schema,
    nullable,
    patch_schema,
    response_format_for,
    should_constrain,
)
from skillstate.engine.constrain import envelope_schema as _envelope_schema


def envelope_schema(*args: Any, **kw: Any) -> dict[str, Any]:
    """These tests pin the "reasoning first" shape; the proxy itself constrains with "off"."""
    kw.setdefault("reasoning", "first")
    return _envelope_schema(*args, **kw)


INITIAL: dict[str, Any] = {
    "goal": "fix the bug",
    "step": 3,
    "score": 0.5,
    "done": False,
    "files": ["a.py", "b.py"],
    "todo": [],
    "meta": {"x": 1},
    "unknown": None,
}
KEYS = list(INITIAL)


def is_valid(schema: dict[str, Any], instance: Any) -> bool:
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema).is_valid(instance)


def nn(t: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [t, {"type": "null"}]}


# --------------------------------------------------------------------------- shape


def test_typed_keys_shape() -> None:
    s = envelope_schema(KEYS, INITIAL)
    assert s["type"] == "object"
    assert s["additionalProperties"] is False
    assert list(s["properties"]) == ["reasoning", "state_patch", "action"]
    assert s["required"] == ["reasoning", "state_patch", "action"]
    assert s["properties"]["reasoning"] == {"type": "string", "maxLength": 400}
    assert s["properties"]["action"] == {"type": "string", "maxLength": 200}

    sp = s["properties"]["state_patch"]
    assert sp["type"] == "object"
    assert sp["additionalProperties"] is False
    assert "required" not in sp
    assert list(sp["properties"]) == KEYS
    props = sp["properties"]
    assert props["goal"] == nn({"type": "string"})
    assert props["step"] == nn({"type": "integer"})
    assert props["score"] == nn({"type": "number"})
    assert props["done"] == nn({"type": "boolean"})
    assert props["files"] == nn({"type": "array", "items": {"type": "string"}})
    assert props["todo"] == nn({"type": "array"})
    assert props["meta"] == nn({"type": "object"})
    assert props["unknown"] == {}  # None initial value: any (already accepts null)


def test_allowed_key_missing_from_initial_state_accepts_anything() -> None:
    s = envelope_schema(["new_key"], {})
    assert s["properties"]["state_patch"]["properties"] == {"new_key": {}}


def test_duplicate_keys_are_deduped() -> None:
    s = envelope_schema(["step", "step", "goal"], INITIAL)
    assert list(s["properties"]["state_patch"]["properties"]) == ["step", "goal"]


def test_empty_keys_gives_free_object() -> None:
    s = envelope_schema([], INITIAL)
    assert s["properties"]["state_patch"] == {"type": "object"}
    assert is_valid(s, {"reasoning": "", "state_patch": {"anything": [1, 2]}, "action": "x"})


def test_action_max_length_and_validation() -> None:
    s = envelope_schema(["goal"], INITIAL, action_max_length=5)
    assert s["properties"]["action"]["maxLength"] == 5
    assert is_valid(s, {"reasoning": "", "state_patch": {}, "action": "12345"})
    assert not is_valid(s, {"reasoning": "", "state_patch": {}, "action": "123456"})
    with pytest.raises(ValueError):
        envelope_schema(["goal"], INITIAL, action_max_length=0)


def test_reasoning_modes() -> None:
    opt = envelope_schema(["goal"], INITIAL, reasoning="optional")
    assert list(opt["properties"]) == ["reasoning", "state_patch", "action"]
    assert opt["required"] == ["state_patch", "action"]
    assert is_valid(opt, {"state_patch": {}, "action": "go"})

    off = envelope_schema(["goal"], INITIAL, reasoning="off")
    assert list(off["properties"]) == ["state_patch", "action"]
    assert not is_valid(off, {"reasoning": "hm", "state_patch": {}, "action": "go"})

    first = envelope_schema(["goal"], INITIAL, reasoning_max_length=3)
    assert not is_valid(first, {"state_patch": {}, "action": "go"})  # required
    assert not is_valid(first, {"reasoning": "long", "state_patch": {}, "action": "go"})

    with pytest.raises(ValueError):
        envelope_schema(["goal"], INITIAL, reasoning="bogus")  # type: ignore[arg-type]


def test_state_schema_override() -> None:
    state_schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "step": {"type": "string", "enum": ["plan", "act"]},
            "maybe": {"type": ["integer", "null"]},
            "item": {"$ref": "#/$defs/Item"},
        },
        "$defs": {"Item": {"type": "object", "properties": {"id": {"type": "integer"}}}},
    }
    s = envelope_schema(["step", "goal", "maybe", "item"], INITIAL, state_schema)
    props = s["properties"]["state_patch"]["properties"]
    # declared type wins over the inferred integer
    assert props["step"] == nn({"type": "string", "enum": ["plan", "act"]})
    # not declared: inferred from initial_state
    assert props["goal"] == nn({"type": "string"})
    # already nullable: not wrapped again
    assert props["maybe"] == {"type": ["integer", "null"]}
    # $defs copied so the $ref resolves from the envelope root
    assert s["$defs"] == state_schema["$defs"]
    assert props["item"] == nn({"$ref": "#/$defs/Item"})

    env = {"reasoning": "", "action": "a"}
    assert is_valid(s, {**env, "state_patch": {"step": "plan", "maybe": None}})
    assert not is_valid(s, {**env, "state_patch": {"step": 3}})
    assert not is_valid(s, {**env, "state_patch": {"step": "other"}})
    assert is_valid(s, {**env, "state_patch": {"item": {"id": 1}}})
    assert not is_valid(s, {**env, "state_patch": {"item": {"id": "x"}}})
    # the input schema is not mutated
    assert state_schema["properties"]["step"] == {"type": "string", "enum": ["plan", "act"]}


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "patch",
    [
        {},
        {"goal": "new goal"},
        {"step": 4, "score": 1.25, "done": True},
        {"score": 2},  # an integer is a valid JSON-schema number
        {"files": ["c.py"], "todo": [1, "mixed"], "meta": {"x": None}},
        {"goal": None, "step": None, "files": None, "meta": None},  # merge-patch deletions
        {"unknown": {"anything": True}},
    ],
)
def test_valid_envelopes_pass(patch: dict[str, Any]) -> None:
    s = envelope_schema(KEYS, INITIAL)
    assert is_valid(s, {"reasoning": "because", "state_patch": patch, "action": "run tests"})


@pytest.mark.parametrize(
    "patch",
    [
        {"not_allowed": 1},
        {"goal": 5},
        {"step": "four"},
        {"step": 1.5},
        {"done": "yes"},
        {"files": "a.py"},
        {"files": [1, 2]},
        {"meta": [1]},
        {"score": "high"},
    ],
)
def test_invalid_patches_fail(patch: dict[str, Any]) -> None:
    s = envelope_schema(KEYS, INITIAL)
    assert not is_valid(s, {"reasoning": "", "state_patch": patch, "action": "x"})


@pytest.mark.parametrize(
    "envelope",
    [
        {"reasoning": "", "action": "x"},  # no state_patch
        {"reasoning": "", "state_patch": {}},  # no action
        {"reasoning": "", "state_patch": None, "action": "x"},
        {"reasoning": "", "state_patch": {}, "action": None},
        {"reasoning": "", "state_patch": {}, "action": "x", "extra": 1},
        {"reasoning": "", "state_patch": [], "action": "x"},
    ],
)
def test_invalid_envelopes_fail(envelope: dict[str, Any]) -> None:
    assert not is_valid(envelope_schema(KEYS, INITIAL), envelope)


# --------------------------------------------------------------------------- bounded re-ask


def is_finite(schema: Any) -> bool:
    """True when no instance of ``schema`` can grow without bound (no open map, no array
    without maxItems, no string without maxLength/pattern, no untyped value)."""
    if not isinstance(schema, dict):
        return True
    if "anyOf" in schema or "oneOf" in schema:
        return all(is_finite(a) for a in schema.get("anyOf", schema.get("oneOf")))
    if "const" in schema or "enum" in schema:
        return True
    kind = schema.get("type")
    if kind == "object":
        return schema.get("additionalProperties") is False and all(
            is_finite(v) for v in schema.get("properties", {}).values()
        )
    if kind == "array":
        return "maxItems" in schema and is_finite(schema.get("items"))
    if kind == "string":
        return "maxLength" in schema or "pattern" in schema
    return kind in ("integer", "number", "boolean", "null")


# the conversation bench's state: an open map of short strings
FACTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "step": {"type": "integer"},
        "facts": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 24}},
    },
}


def test_open_map_is_closed_to_its_current_keys() -> None:
    state = {"step": 2, "facts": {"region": "eu-1"}}
    s = envelope_schema(["step", "facts"], {}, FACTS_SCHEMA, 32, state=state, bounded=True)
    assert is_finite(s["properties"]["state_patch"])

    def ok(patch: dict[str, Any]) -> bool:
        return is_valid(s, {"reasoning": "", "state_patch": patch, "action": "x"})

    assert ok({"step": 3, "facts": {"region": "us-2"}})
    assert ok({"facts": {"region": None}})  # deletion still allowed
    assert ok({"facts": None})
    assert not ok({"facts": {"bucket": "b"}})  # no new key: the map cannot grow
    assert not ok({"facts": {"region": "x" * 25}})  # the declared maxLength stays
    # unbounded (a first attempt) the same map is open: new keys need a value, existing
    # ones may be deleted
    free = envelope_schema(["step", "facts"], {}, FACTS_SCHEMA, 32, state=state)

    def first(patch: dict[str, Any]) -> bool:
        return is_valid(free, {"reasoning": "", "state_patch": patch, "action": "x"})

    assert first({"facts": {"b": "c"}}) and first({"facts": {"region": None}})
    assert not first({"facts": {"b": None}})  # deleting an absent key: no null filler


def test_declared_objects_become_merge_patches() -> None:
    schema = {
        "type": "object",
        "required": ["a"],
        "properties": {
            "a": {"type": "object", "required": ["x"], "properties": {"x": {"type": "integer"}}},
            "m": {"additionalProperties": {"type": "string"}},
            "l": {"type": "array", "items": {"type": "integer"}},
        },
    }
    patch = patch_schema(schema, {"a": {"x": 1}, "m": {"k": "v"}, "l": [1]})
    assert is_valid(patch, {})  # nothing required
    assert is_valid(patch, {"a": {"x": None}, "m": {"k": None}, "l": None})  # nulls delete
    assert is_valid(patch, {"a": {}, "m": {"k": "v"}, "l": [1]})
    assert not is_valid(patch, {"a": {"x": "1"}})  # types stay
    assert not is_valid(patch, {"l": [None]})  # arrays are replaced whole: items keep their type
    assert not is_valid(patch, {"m": {"new": None}})  # only existing map keys can be deleted
    # and in the envelope: the bench's open map accepts a deletion of a key it has
    env = envelope_schema(
        ["facts"], {"facts": {"k": "v"}}, {"properties": {"facts": schema["properties"]["m"]}}
    )
    assert is_valid(env, {"reasoning": "", "state_patch": {"facts": {"k": None}}, "action": "x"})


def bounded(schema: dict[str, Any], current: Any) -> dict[str, Any]:
    return patch_schema(schema, current, bounded=True)


def test_bounded_arrays_strings_and_untyped_values() -> None:
    assert bounded({"type": "array", "items": {"type": "string"}}, ["a", "b"]) == {
        "type": "array",
        "items": {"type": "string", "maxLength": BOUNDED_STRING_MAX_LENGTH},
        "maxItems": 2 + BOUNDED_ARRAY_GROWTH,
    }
    assert bounded({"type": "array", "maxItems": 1}, [])["maxItems"] == 1
    assert bounded({"type": "string", "maxLength": 5}, "abc") == {
        "type": "string",
        "maxLength": 5,
    }
    untyped = bounded({}, 7)
    assert is_finite(untyped) and is_valid(untyped, 7) and is_valid(untyped, None)
    assert not is_valid(untyped, {"a": 1}) and not is_valid(untyped, "x" * 201)
    nested = bounded({}, {"a": {"b": [1]}})
    assert is_finite(nested)
    assert is_valid(nested, {"a": {"b": [1, 2]}}) and not is_valid(nested, {"c": 1})
    assert bounded({"type": ["string", "null"]}, None) == {
        "anyOf": [{"type": "string", "maxLength": BOUNDED_STRING_MAX_LENGTH}, {"type": "null"}]
    }
    ref = {"$ref": "#/$defs/Item"}
    assert bounded(ref, None) == ref  # left as is


def test_free_form_state_patch_is_bounded_too() -> None:
    state = {"goal": "g", "files": ["a"]}
    s = envelope_schema([], state, None, 32, bounded=True)
    patch_schema = s["properties"]["state_patch"]
    assert is_finite(patch_schema)
    assert set(patch_schema["properties"]) == {"goal", "files"}


json_leaf = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
json_value = st.recursive(
    json_leaf,
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3)
    ),
    max_leaves=12,
)


@settings(deadline=None, max_examples=60)
@given(st.dictionaries(st.text(min_size=1, max_size=4), json_value, max_size=4))
def test_bounded_schema_is_finite_and_admits_the_current_state(state: dict[str, Any]) -> None:
    s = envelope_schema(list(state), {}, None, 32, state=state, bounded=True)
    assert is_finite(s["properties"]["state_patch"])
    # re-sending the current values (strings here are short) is always a valid patch
    assert is_valid(s, {"reasoning": "", "state_patch": state, "action": "x"})


# --------------------------------------------------------------------------- helpers


def test_infer_schema_bool_is_not_integer() -> None:
    assert infer_schema(True) == {"type": "boolean"}
    assert infer_schema(1) == {"type": "integer"}
    assert infer_schema([{"a": 1}]) == {"type": "array", "items": {"type": "object"}}
    assert infer_schema([[1]]) == {
        "type": "array",
        "items": {"type": "array", "items": {"type": "integer"}},
    }
    assert infer_schema([None]) == {"type": "array"}
    assert infer_schema(object()) == {}


def test_nullable_idempotent() -> None:
    once = nullable({"type": "string"})
    assert nullable(once) == once
    assert nullable({"enum": ["a", None]}) == {"enum": ["a", None]}
    assert nullable({"const": None}) == {"const": None}


def test_response_format_for() -> None:
    s = envelope_schema(["goal"], INITIAL)
    rf = response_format_for(s)
    assert rf == {
        "type": "json_schema",
        "json_schema": {"name": ENVELOPE_SCHEMA_NAME, "strict": True, "schema": s},
    }
    assert rf["json_schema"]["schema"] is not s  # a copy
    assert response_format_for(s, strict=False)["json_schema"]["strict"] is False
    assert response_format_for(s, name="x")["json_schema"]["name"] == "x"


# --------------------------------------------------------------------------- should_constrain


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"messages": []}, True),
        ({"messages": [], "tools": []}, True),
        ({"messages": [], "tools": None}, True),
        ({"messages": [], "response_format": None}, True),
        ({"messages": [], "response_format": {"type": "text"}}, True),
        ({"messages": [], "tools": [{"type": "function", "function": {"name": "f"}}]}, False),
        ({"messages": [], "functions": [{"name": "f"}]}, False),
        ({"messages": [], "response_format": {"type": "json_object"}}, False),
        (
            {"messages": [], "response_format": response_format_for({"type": "object"})},
            False,
        ),
        ({"messages": [], "json_schema": {"type": "object"}}, False),
        ({"messages": [], "grammar": 'root ::= "x"'}, False),
        ({"messages": [], "output_format": {"type": "json_schema", "schema": {}}}, False),
        ({"messages": [], "output_config": {"format": {"type": "json_schema"}}}, False),
        ({"messages": [], "output_config": {"effort": "low"}}, True),
    ],
)
def test_should_constrain(body: dict[str, Any], expected: bool) -> None:
    assert should_constrain(body) is expected


def test_a_zero_output_cap_asks_for_no_output_and_is_not_constrained() -> None:
    for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        body = {"model": "m", field: 0}
        assert asks_for_no_output(body) and not should_constrain(body)
        assert not asks_for_no_output({"model": "m", field: 1})
    # false is no 0 here (a bool is an int in Python), and a missing cap asks for output
    assert not asks_for_no_output({"max_tokens": False})
    assert not asks_for_no_output({"model": "m"})
    assert should_constrain({"model": "m", "max_tokens": 5})
