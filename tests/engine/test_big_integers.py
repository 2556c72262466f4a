"""An integer beyond 64 bits in a state patch: orjson reads it as the nearest float, another
number (``123456789012345678901234567890`` -> ``1.2345678901234568e+29``) with no error, so
the state silently held something else. The patch is now invalid, the error naming where the
integer is (the re-ask tells the model what to rewrite), in every form a model writes its
envelope and through both readings of a reply (the stripper's sole envelope, the extractor).
A float written as one, however large, and every integer orjson holds (-2**63 to 2**64 - 1)
stay valid; a normal patch is judged exactly as before."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from skillstate.config import Settings
from skillstate.engine.patch import Envelope, PatchPolicy, extract_envelope, validate_and_merge
from skillstate.engine.stripper import strip_envelope
from skillstate.engine.verdict import Outcome, Verdicts

BIG = 123456789012345678901234567890
VERDICTS = Verdicts(Settings())


def error_at(where: str, value: int) -> str:
    return (
        f"state_patch has an integer beyond 64 bits at '{where}', which would be kept as the"
        f" float {float(value)!r}: send it as a string"
    )


def judged(text: str, state: dict[str, Any] | None = None) -> list[Outcome]:
    """The verdict on a model reply ``text`` as a non-streamed turn reaches it (with the
    envelope stripping found, when it was the reply's only candidate) and as a streamed
    one does (the extractor reads the text); the two must agree."""
    stripped = strip_envelope(text)
    sole = stripped.envelope if stripped.sole else None
    state = {} if state is None else state
    return [
        VERDICTS.judge(text, False, state, [], "block", sole),
        VERDICTS.judge(text, False, state, [], "block", None),
    ]


def env(patch_json: str) -> str:
    """An envelope's text around a patch's text."""
    return '{"state_patch": ' + patch_json + ', "action": "next"}'


def block(patch_json: str) -> str:
    """A reply: one ```json block holding an envelope around a patch's text."""
    return "```json\n" + env(patch_json) + "\n```"


# Every form a model writes its envelope in, each read by a different path of the stripper
# and the extractor.
FORMS = {
    "only a json block": "```json\n{}\n```",
    "prose, then the block": "Saved the id.\n```json\n{}\n```",
    "bare object (constrained decoding)": "{}",
    "unfenced object after prose": "Saved the id.\n{}\nDone.",
    "closing fence glued to the json": "```json\n{}```",
    "untagged block": "Saved.\n```\n{}\n```",
    "the last of two blocks": '```json\n{{"state_patch": {{}}}}\n```\nFixed:\n```json\n{}\n```',
}


@pytest.mark.parametrize("form", FORMS.values(), ids=list(FORMS))
def test_an_integer_beyond_64_bits_makes_the_patch_invalid(form: str) -> None:
    text = form.format(env(f'{{"id": {BIG}, "name": "x"}}'))
    for outcome in judged(text):
        assert outcome.status == "invalid"
        assert outcome.errors == [error_at("id", BIG)]
        assert outcome.state is None and outcome.patch is None


def test_each_place_is_named_and_the_list_is_capped() -> None:
    text = FORMS["only a json block"].format(
        env(f'{{"a": {{"b": [1, -{BIG}]}}, "c": 18446744073709551616, "d": 2.5}}')
    )
    for outcome in judged(text):
        assert sorted(outcome.errors) == [error_at("a.b[1]", -BIG), error_at("c", 2**64)]
    many = json.dumps({"state_patch": {"ids": [BIG + i for i in range(8)]}})
    for outcome in judged(f"```json\n{many}\n```"):
        assert outcome.errors == [error_at(f"ids[{i}]", BIG + i) for i in range(5)] + [
            "and 3 more integers beyond 64 bits"
        ]


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        ("18446744073709551615", 2**64 - 1),  # the largest int orjson holds (unsigned)
        ("-9223372036854775808", -(2**63)),  # the smallest (signed)
        ("9223372036854775808", 2**63),
        ("1e30", 1e30),  # floats written as floats, however large
        ("123456789012345678901234567890.0", 1.2345678901234568e29),
        ("1.5E+19", 1.5e19),
        ("-9.3e18", -9.3e18),
        ("9223372036854775808e0", 9.223372036854776e18),
        ("-2.5e300", -2.5e300),
    ],
)
def test_what_orjson_holds_stays_valid(literal: str, value: int | float) -> None:
    for outcome in judged(block('{"n": ' + literal + "}")):
        assert outcome.status == "valid", outcome.errors
        assert outcome.state == {"n": value}
        assert type(outcome.state["n"]) is type(value)


@pytest.mark.parametrize(
    "literal", ["18446744073709551616", "-9223372036854775809", "9" * 300, "-" + "9" * 300]
)
def test_just_past_64_bits_and_far_past_are_refused(literal: str) -> None:
    for outcome in judged(block('{"n": ' + literal + "}")):
        assert outcome.status == "invalid"
        assert outcome.errors == [error_at("n", int(literal))]


def test_an_operator_patch_is_checked_against_its_body() -> None:
    body = b'{"facts": {"id": 123456789012345678901234567890, "size": 1e30}}'
    patch = orjson.loads(body)
    refused = VERDICTS.check_patch({}, patch, [], source=body)
    assert not refused.ok and refused.errors == [error_at("facts.id", BIG)]
    floats = b'{"facts": {"id": 1.2345678901234568e+29, "size": 1e30}}'
    assert VERDICTS.check_patch({}, orjson.loads(floats), [], source=floats).ok


def test_the_text_is_what_tells_an_integer_from_a_float() -> None:
    # The parsed patches are the same: only the text the patch came from tells them apart.
    as_int, as_float = b'{"n": 123456789012345678901234567890}', b'{"n": 1.2345678901234568e29}'
    assert orjson.loads(as_int) == orjson.loads(as_float)
    patch = orjson.loads(as_int)
    assert not validate_and_merge({}, patch, PatchPolicy(), source=as_int).ok
    assert validate_and_merge({}, patch, PatchPolicy(), source=as_float).ok
    assert validate_and_merge({}, patch, PatchPolicy()).ok  # no text: nothing can tell


def test_the_extracted_envelope_carries_its_text() -> None:
    text = "Saved.\n" + block(f'{{"id": {BIG}}}') + "\nok"
    extracted = extract_envelope(text).envelope
    stripped = strip_envelope(text).envelope
    assert extracted is not None and stripped is not None
    for envelope in (extracted, stripped):
        # The text is no part of the envelope's value.
        assert envelope == Envelope({"id": float(BIG)}, "next", envelope.reasoning)
        assert envelope.source is not None and str(BIG) in envelope.source


# A patch of every JSON value orjson holds: integers across the whole 64-bit range, floats of
# any size (written by json.dumps with a "." or an exponent: floats).
TEXT = st.characters(exclude_categories=["Cs"])  # JSON text is UTF-8: no lone surrogate
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(TEXT, max_size=6)
)
VALUES = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(TEXT, max_size=3), children, max_size=4)
    ),
    max_leaves=12,
)
PATCHES = st.dictionaries(st.sampled_from(["a", "b", "c"]), VALUES, max_size=3)


@given(state=PATCHES, patch=PATCHES)
def test_property_a_normal_patch_is_judged_as_before(
    state: dict[str, Any], patch: dict[str, Any]
) -> None:
    text = "ok\n```json\n" + json.dumps({"state_patch": patch}) + "\n```"
    parsed = orjson.loads(json.dumps(patch))  # the patch as orjson reads it
    before = validate_and_merge(state, parsed, VERDICTS.policy(()))  # no text to read again
    for outcome in judged(text, state):
        assert outcome.status == ("valid" if before.ok else "invalid")
        assert outcome.errors == (before.warnings if before.ok else before.errors)
        assert outcome.state_json == before.new_state_json


@given(
    patch=PATCHES,
    key=st.sampled_from(["a", "b", "z"]),
    # Up to 10**300: past the float range orjson refuses the text ("number is infinity").
    big=st.integers(min_value=2**64, max_value=10**300)
    | st.integers(min_value=-(10**300), max_value=-(2**63) - 1),
)
def test_property_an_integer_beyond_64_bits_is_refused_wherever_it_is(
    patch: dict[str, Any], key: str, big: int
) -> None:
    patch = {**patch, key: {"deep": [0, big]}}
    text = "```json\n" + json.dumps({"state_patch": patch}) + "\n```"
    for outcome in judged(text):
        assert outcome.status == "invalid"
        assert error_at(f"{key}.deep[1]", big) in outcome.errors
