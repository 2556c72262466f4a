"""Tests for skillstate.engine.stripper and the dialects' strip_reply: the reply without the
envelope, streamed and not."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from skillstate.dialects.anthropic import ANTHROPIC
from skillstate.dialects.openai import OPENAI
from skillstate.engine.patch import extract_envelope
from skillstate.engine.stripper import (
    EnvelopeStripper,
    strip_envelope,
    strip_texts,
    strip_transcript,
)

ENV = '{"state_patch": {"step": 2}, "action": "ask the user"}'


def streamed(text: str, cuts: list[int]) -> str:
    """The stripper's output when ``text`` arrives cut at ``cuts``."""
    stripper = EnvelopeStripper()
    out = []
    last = 0
    for cut in sorted(set(cuts)):
        out.append(stripper.feed(text[last:cut]))
        last = cut
    out.append(stripper.feed(text[last:]))
    out.append(stripper.flush())
    return "".join(out)


# -- examples ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (f"Done, the flight is booked.\n\n```json\n{ENV}\n```", "Done, the flight is booked."),
        (f"Done.\n\n```json\n{ENV}\n```\n\nAnything else?", "Done.\n\nAnything else?"),
        (f"Done.\n```\n{ENV}\n```", "Done."),  # untagged block
        (f"Done.\n~~~json\n{ENV}\n~~~", "Done."),
        (f"Done.\n  ```JSON\n{ENV}\n  ```", "Done."),  # indented, tag case
        (f"Done.\n```json {ENV} ```", "Done."),  # content on the fence line
        (f"Done.\n```json\n{ENV}```", "Done."),  # closing fence glued to the JSON
        (f"Done.\n```json\n{ENV}", "Done."),  # never closed: runs to the end
        (f"Done.\n{ENV}\nBye.", "Done.\nBye."),  # unfenced, at a line start
        (f"{ENV} and more", "and more"),  # bare object, then text
        (ENV, "ask the user"),  # nothing but the envelope: its action
        (f"  \n{ENV}\n", "ask the user"),
        (f"```json\n{ENV}\n```", "ask the user"),
        ('{"state_patch": {}}', '{"state_patch": {}}'),  # no action: left as it was
        (
            f"First.\n```json\n{ENV}\n```\nSecond.\n```json\n{ENV}\n```",
            "First.\nSecond.",
        ),  # every envelope goes, not only the one that counts
    ],
)
def test_strips_envelopes(reply: str, expected: str) -> None:
    result = strip_envelope(reply)
    assert result.text == expected
    assert extract_envelope(result.text).envelope is None or result.text == reply


@pytest.mark.parametrize(
    "reply",
    [
        "Plain answer, no envelope.",
        '```json\n{"name": "x", "items": [1, 2]}\n```',  # JSON, but not an envelope
        f"```python\n{ENV}\n```",  # a python block is never an envelope
        '```json\n{"state_patch": [1]}\n```',  # invalid envelope: the turn will re-ask
        '```json\n{"state_patch": {},}\n```',  # invalid JSON
        "{curly prose} is fine\n{\n  not json\n}",
        "Use `code` and ``two`` ticks\n``\nok",
        "   leading and trailing   \n",
        "",
    ],
)
def test_leaves_replies_without_an_envelope_alone(reply: str) -> None:
    assert strip_envelope(reply).text == reply
    assert streamed(reply, list(range(len(reply)))) == reply


def test_result_reports_the_removed_envelope_and_its_size() -> None:
    block = f"```json\n{ENV}\n```"
    result = strip_envelope(f"Hi.\n\n{block}")
    assert result.envelope is not None
    assert result.envelope.state_patch == {"step": 2}
    assert result.envelope.action == "ask the user"
    assert result.removed_chars == len(block)


def test_holds_back_only_from_a_possible_fence_start() -> None:
    stripper = EnvelopeStripper()
    assert stripper.feed("Booked the ") == "Booked the"  # trailing space waits
    assert stripper.feed("flight.\n") == " flight."
    assert stripper.feed("``") == ""  # may become a fence
    assert stripper.feed('`json\n{"state_patch"') == ""
    assert stripper.feed(": {}}\n```\nAnything else?") == "\nAnything else?"
    assert stripper.flush() == ""


def test_a_code_block_streams_through_once_its_tag_is_known() -> None:
    stripper = EnvelopeStripper()
    assert stripper.feed("```python\nprint(") == "```python\nprint("
    assert stripper.feed("1)\n```") == "1)\n"
    assert stripper.flush() == "```"


def test_a_curly_line_that_cannot_be_json_is_released_at_once() -> None:
    stripper = EnvelopeStripper()
    assert stripper.feed("Hi\n{the set") == "Hi\n{the set"


def test_strip_texts_applies_the_action_fallback_to_the_whole_message() -> None:
    parts, summary = strip_texts(["Let me check.", f"```json\n{ENV}\n```"])
    assert parts == ["Let me check.", ""]
    assert summary.envelope is not None and summary.text == "Let me check."
    parts, _ = strip_texts(["", f"```json\n{ENV}\n```"])
    assert parts == ["", "ask the user"]
    parts, summary = strip_texts(["no envelope"])
    assert parts == ["no envelope"] and summary.envelope is None


# -- properties --------------------------------------------------------------------------

_FRAGMENTS = [
    "Sure",
    " I will",
    " book it.",
    "\n",
    "\n\n",
    "  ",
    "\t",
    "```",
    "```json",
    "```JSON ",
    "```python",
    "````",
    "~~~",
    "~~~json",
    "``",
    "`",
    "{",
    "}",
    '"',
    '"state_patch"',
    ": ",
    ENV,
    '{"state_patch": {"a": [1, {"b": null}]}}',
    '{"state_patch": {}, "action": "x```y"}',
    '{"answer": 42}',
    '{"state_patch": 3}',
    "\\",
    "é",
]


def _envelope_parts() -> st.SearchStrategy[str]:
    action = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
    patch = st.dictionaries(
        st.sampled_from("abc"), st.integers(-(2**40), 2**40) | st.none(), max_size=3
    )
    return st.builds(
        lambda p, a, pretty: orjson.dumps(
            {"state_patch": p, "action": a}, option=orjson.OPT_INDENT_2 if pretty else 0
        ).decode(),
        patch,
        action,
        st.booleans(),
    )


replies = st.lists(st.sampled_from(_FRAGMENTS) | _envelope_parts(), max_size=14).map("".join)


@st.composite
def reply_and_cuts(draw: st.DrawFn) -> tuple[str, list[int]]:
    text = draw(replies)
    cuts = draw(st.lists(st.integers(0, len(text)), max_size=12))
    return text, cuts


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reply_and_cuts())
@example((f"Done.\n\n```json\n{ENV}\n```", []))
# Found by this test: removing the line-start envelope joined "``" and "```{...}" into a
# fenced envelope the stripper had read as prose.
@example(('``\n{"state_patch":{},"action":""}```{"state_patch":{},"action":""}', [3, 40]))
# And with two: the removed envelope's line break joined "``" and "``{...}" into "````{...}".
@example(('``\n{"state_patch":{},"action":""}``{"state_patch":{},"action":""}', []))
@example(('``\n{"state_patch":{},"action":""}``{"state_patch":{},"action":""}', [2, 3, 33]))
def test_streaming_equals_stripping_the_whole_reply(case: tuple[str, list[int]]) -> None:
    text, cuts = case
    whole = strip_envelope(text)
    assert streamed(text, cuts) == whole.text
    # No envelope survives, except a reply of bare envelopes without an action (left as is).
    assert extract_envelope(whole.text).envelope is None or whole.text == text


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80), st.text(max_size=80), _envelope_parts(), st.sampled_from(["json", ""]))
def test_a_fenced_envelope_is_removed_wherever_the_stream_splits_it(
    before: str, after: str, envelope: str, tag: str
) -> None:
    text = f"{before}\n```{tag}\n{envelope}\n```\n{after}"
    whole = strip_envelope(text).text
    for cut in range(len(text) + 1):  # every place, one cut
        assert streamed(text, [cut]) == whole
    assert streamed(text, list(range(len(text)))) == whole  # one character at a time
    assert extract_envelope(whole).envelope is None or whole == text


@settings(max_examples=200, deadline=None)
@given(
    _envelope_parts(), st.sampled_from(["```json", "``` json", "~~~", "````JSON"]), st.booleans()
)
def test_a_fence_glued_to_the_end_of_a_line_goes_with_the_envelope_after_it(
    envelope: str, opener: str, more: bool
) -> None:
    """A model that writes its fence after text on one line ("Hello there. ```json"): the
    extractor takes the envelope on the next line; the client saw the fence and its closing
    line left behind as an empty code block (probe Q). They go with the envelope."""
    closer = opener.rstrip("JSONjson ").strip()
    after = "\nBye." if more else ""
    text = f"Hello there. {opener}\n{envelope}\n{closer}{after}"
    whole = strip_envelope(text)
    assert whole.envelope is not None
    assert whole.text == "Hello there." + after
    for cut in range(len(text) + 1):
        assert streamed(text, [cut]) == whole.text
    assert streamed(text, list(range(len(text)))) == whole.text
    # Not followed by an envelope, a glued fence is the model's text, left as it was.
    prose = f"Use {opener}\nnot json\n{closer}"
    assert strip_envelope(prose).text == prose
    assert streamed(prose, list(range(len(prose)))) == prose


def test_whitespace_before_a_possible_fence_is_read_once() -> None:
    assert streamed("\n```", [2]) == strip_envelope("\n```").text == "\n```"


# -- transcripts -------------------------------------------------------------------------

BLOCK = f"```json\n{ENV}\n```"


def test_strip_transcript_openai_chat() -> None:
    messages = [
        {"role": "system", "content": f"Example:\n{BLOCK}"},  # not the proxy's: kept
        {"role": "user", "content": BLOCK},  # only assistant messages change
        {"role": "assistant", "content": f"Booked.\n\n{BLOCK}"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": BLOCK},
        {"role": "assistant", "content": [{"type": "text", "text": f"Ok.\n{BLOCK}"}]},
        {"role": "assistant", "content": ENV},  # the bare object: its action
    ]
    original = orjson.dumps(messages)
    out = strip_transcript(messages)
    assert orjson.dumps(messages) == original  # not mutated
    assert out[0] is messages[0] and out[1] is messages[1] and out[3] is messages[3]
    assert out[4] is messages[4]
    assert out[2] == {"role": "assistant", "content": "Booked."}
    assert out[5] == {"role": "assistant", "content": [{"type": "text", "text": "Ok."}]}
    assert out[6] == {"role": "assistant", "content": "ask the user"}


def test_strip_transcript_anthropic_messages() -> None:
    tool_use = {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"q": "x"}}
    messages = [
        {"role": "user", "content": "Book a flight"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking it up.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": BLOCK},
                tool_use,
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}],
        },
        {"role": "assistant", "content": [{"type": "text", "text": BLOCK}]},
        {"role": "assistant", "content": "Plain reply."},
    ]
    out = strip_transcript(messages)
    assert out[1]["content"] == [
        {"type": "text", "text": "Looking it up.", "cache_control": {"type": "ephemeral"}},
        tool_use,
    ]
    assert out[3]["content"] == [{"type": "text", "text": "ask the user"}]
    assert out[0] is messages[0] and out[2] is messages[2] and out[4] is messages[4]


# -- replies -----------------------------------------------------------------------------


def test_strip_reply_openai_every_choice() -> None:
    resp = {
        "id": "x",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": f"Booked.\n{BLOCK}"}},
            {"index": 1, "message": {"role": "assistant", "content": ENV}},
        ],
        "usage": {"prompt_tokens": 1},
    }
    before = orjson.dumps(resp)
    out, removed = OPENAI.strip_reply(resp)
    assert orjson.dumps(resp) == before
    assert [c["message"]["content"] for c in out["choices"]] == ["Booked.", "ask the user"]
    assert out["usage"] == resp["usage"] and out["id"] == "x"
    assert removed.envelope is not None and removed.removed_chars == len(BLOCK)
    plain = {"choices": [{"message": {"role": "assistant", "content": "Hi"}}]}
    assert OPENAI.strip_reply(plain)[0] is plain
    calls = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": []}}]}
    assert OPENAI.strip_reply(calls)[0] is calls


def test_strip_reply_anthropic_text_blocks() -> None:
    tool_use = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
    resp = {
        "type": "message",
        "content": [{"type": "text", "text": f"Calling f.\n\n{BLOCK}"}, tool_use],
        "stop_reason": "tool_use",
    }
    out, removed = ANTHROPIC.strip_reply(resp)
    assert out["content"] == [{"type": "text", "text": "Calling f."}, tool_use]
    assert removed.envelope is not None
    only = {"type": "message", "content": [{"type": "text", "text": BLOCK}, tool_use]}
    # Beside a tool call the action was never said to the user: no text block (issue 23).
    assert ANTHROPIC.strip_reply(only)[0]["content"] == [tool_use]
    alone = {"type": "message", "content": [{"type": "text", "text": BLOCK}]}
    assert ANTHROPIC.strip_reply(alone)[0]["content"] == [{"type": "text", "text": "ask the user"}]


# -- the sole envelope: the verdict's reading taken from the strip ---------------------------


@pytest.mark.parametrize(
    ("reply", "sole"),
    [
        (f"```json\n{ENV}\n```", True),
        (f"Checked the logs.\n\n```json\n{ENV}\n```\n", True),
        (f"Plan:\n```python\nprint(1)\n```\n```json\n{ENV}\n```", True),  # python: no candidate
        (f"{ENV}", False),  # unfenced: not a ```json block
        (f"```json\n{ENV}\n```\n```json\n{ENV}\n```", False),  # two candidates
        (f"```json\n{ENV}\n```\n{{not json", False),  # a line-start "{" after it
        (f"```\n{ENV}\n```", False),  # untagged
        ('```json\n{"state_patch": 3}\n```', False),  # no envelope
    ],
)
def test_sole_marks_a_reply_whose_only_candidate_is_its_json_envelope(
    reply: str, sole: bool
) -> None:
    assert strip_envelope(reply).sole is sole


def _assert_sole_is_the_extracted_envelope(text: str) -> None:
    stripped = strip_envelope(text)
    if not stripped.sole:
        return
    assert stripped.envelope is not None
    extracted = extract_envelope(text).envelope
    assert extracted is not None
    assert (extracted.state_patch, extracted.action) == (
        stripped.envelope.state_patch,
        stripped.envelope.action,
    )


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(replies)
def test_a_sole_envelope_is_the_one_the_extractor_finds(text: str) -> None:
    # The verdict takes Stripped.sole's envelope instead of extracting it again: it must be
    # the extractor's own pick whenever it is set.
    _assert_sole_is_the_extracted_envelope(text)


_AROUND = st.lists(st.sampled_from(_FRAGMENTS), max_size=6).map("".join)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    _AROUND,
    _AROUND,
    _envelope_parts(),
    st.sampled_from(["```json", "~~~json", "````json", "```JSON", "  ```json", "```json {"]),
    st.sampled_from(["```", "~~~", "````", " ```", "```  ", ""]),
)
def test_a_sole_envelope_in_a_json_block_among_prose_is_the_extracted_one(
    before: str, after: str, envelope: str, opener: str, closer: str
) -> None:
    body = envelope[1:] if opener.endswith("{") else envelope
    text = f"{before}\n{opener}\n{body}\n{closer}\n{after}"
    _assert_sole_is_the_extracted_envelope(text)
