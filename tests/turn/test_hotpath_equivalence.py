"""Hot-path rewrites give exactly what the plain definitions they replaced give.

Each per-turn helper that was made cheaper (integer rounding instead of Fractions, a fence
regex the engine can scan faster, ledger clamps with a fast first line, an inline-scalar
deep copy, the enums' str) is checked here against the straightforward definition, over
edge values and seeded random inputs.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import re
from collections import OrderedDict
from fractions import Fraction
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from starlette.requests import Request

from skillstate.choices import CacheBreakpoints, Choice, Constrain, Mode, ReplyEnvelope
from skillstate.cost.baseline import (
    CacheRegime,
    PrefixCache,
    PrefixPoint,
    PrefixPointsMemo,
    _digests,
    baseline_output_tokens,
    envelope_output_share,
    prefix_points,
    round_ratio,
)
from skillstate.cost.tokens import estimate_tokens, request_parts
from skillstate.cost.usage import MAX_TOKEN_COUNT
from skillstate.dialects.openai import (
    _check_tool_answers,
    _validate_message,
    validate_openai_request,
)
from skillstate.dialects.registry import get_dialect
from skillstate.engine.patch import _FENCE_RUN, _copy_json
from skillstate.engine.stripper import NOTHING, _strip_by_machine, strip_content, strip_envelope
from skillstate.errors import ProxyError
from skillstate.jsondepth import nesting_exceeds
from skillstate.sessions.transcripts import SessionTranscripts
from skillstate.store.rows import MAX_USD, clamp_amount, clamp_count, clamp_signed
from skillstate.web.turns import _header_choice, check_body

PLAIN_FENCE_RUN = re.compile(r"`{3,}|~{3,}")


def test_round_ratio_is_round_of_the_fraction() -> None:
    rng = random.Random(7)
    pairs = [(n, d) for d in range(1, 13) for n in range(-40, 41)]
    pairs += [(rng.randint(-(10**12), 10**12), rng.randint(1, 10**6)) for _ in range(20_000)]
    for n, d in pairs:
        assert round_ratio(n, d) == round(Fraction(n, d)), (n, d)


def test_envelope_share_and_output_tokens_match_fraction_arithmetic() -> None:
    rng = random.Random(11)
    for _ in range(20_000):
        text = "x" * rng.randint(0, 80)
        removed, tools = rng.randint(-2, 90), rng.randint(-5, 40)
        share = envelope_output_share(text, removed, tools)
        whole = len(text) + max(tools, 0)
        expected = Fraction(0) if whole <= 0 or removed <= 0 else min(Fraction(removed, whole), 1)
        assert share == expected and type(share) is Fraction
        out = rng.randint(0, 10_000)
        assert baseline_output_tokens(out, share) == round(out * (1 - share))
    assert baseline_output_tokens(7, Fraction(1, 2)) == 4  # 3.5 rounds to even
    assert baseline_output_tokens(5, Fraction(1, 2)) == 2  # 2.5 rounds to even


def _spans(pattern: re.Pattern[str], text: str) -> list[tuple[int, int]]:
    return [m.span() for m in pattern.finditer(text)]


def test_fence_run_finds_the_same_runs_as_the_plain_pattern() -> None:
    rng = random.Random(3)
    texts = ["", "``", "```", "~~~~", "``~~~", "~``~```", "a```b~~~c", "```json\n{}\n```"]
    texts += [
        "".join(rng.choice("`~ a\n{") for _ in range(rng.randint(0, 40))) for _ in range(30_000)
    ]
    for text in texts:
        assert _spans(_FENCE_RUN, text) == _spans(PLAIN_FENCE_RUN, text), text
        for pos in range(len(text) + 1):
            got, want = _FENCE_RUN.match(text, pos), PLAIN_FENCE_RUN.match(text, pos)
            assert (got and got.span()) == (want and want.span()), (text, pos)


def _plain_clamp(value: Any, low: float, ceiling: float, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None
    return kind(min(max(value, low), ceiling))


CLAMP_VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 7, 2**63, 2**70, -(2**70), 0.0, -0.0, 0.5, -0.5, 1e13,
    -1e13, 1e300, float("nan"), float("inf"), float("-inf"), "3", [1], MAX_TOKEN_COUNT,
    MAX_TOKEN_COUNT + 1, MAX_USD, -MAX_USD, 999, 1000,
]  # fmt: skip


@pytest.mark.parametrize("value", CLAMP_VALUES, ids=repr)
def test_ledger_clamps_match_their_general_rule(value: Any) -> None:
    for got, want in (
        (clamp_count(value), _plain_clamp(value, 0, MAX_TOKEN_COUNT, int)),
        (clamp_count(value, 999), _plain_clamp(value, 0, 999, int)),
        (clamp_amount(value), _plain_clamp(value, 0.0, MAX_USD, float)),
        (clamp_signed(value), _plain_clamp(value, -MAX_USD, MAX_USD, float)),
    ):
        assert type(got) is type(want)
        if isinstance(want, float):
            assert got == want and math.copysign(1, got) == math.copysign(1, want)
        else:
            assert got == want


def test_copy_json_is_a_deep_copy_sharing_no_container() -> None:
    value = {"a": [1, {"b": [2, 3], "c": "s"}, [4, [5]]], "d": {"e": None, "f": 1.5}, "g": "t"}
    copy = _copy_json(value)
    assert copy == value

    def containers(v: Any) -> list[Any]:
        inner = v.values() if isinstance(v, dict) else v if isinstance(v, list) else []
        found = [v] if isinstance(v, dict | list) else []
        for item in inner:
            found += containers(item)
        return found

    originals = {id(c) for c in containers(value)}
    assert not originals & {id(c) for c in containers(copy)}


@pytest.mark.parametrize("enum", [Mode, Constrain, ReplyEnvelope, CacheBreakpoints])
def test_choices_print_and_format_as_their_value(enum: Any) -> None:
    for member in enum:
        assert str(member) == member.value and type(str(member)) is str
        assert f"{member}" == member.value and f"{member:>20}" == f"{member.value:>20}"


# --- per-turn work on the new messages only (sessions/transcripts.py) ----------------------

_ENVELOPE = '{"state_patch": {"step": 1}, "action": "run"}'
_TEXT_BITS = [
    "THOUGHT: look at it.",
    "\n",
    "\n\n",
    f"```json\n{_ENVELOPE}\n```",
    f"```\n{_ENVELOPE}\n```",
    _ENVELOPE,
    "{not json}",
    "```python\ndef f(x: dict) -> dict:\n    return {'a': x}\n```",
    "`` ``",
    "{",
    "}",
    '{"state_patch": 3}',
]
_texts = st.lists(st.sampled_from(_TEXT_BITS), max_size=5).map("".join)
_marker = st.sampled_from([{}, {"cache_control": {"type": "ephemeral"}}])
_part = st.builds(
    lambda kind, text, mark: {"type": kind, "text": text, **mark},
    st.sampled_from(["text", "output_text", "image"]),
    _texts,
    _marker,
)
_content = st.one_of(_texts, st.lists(_part, max_size=3), st.none())
_message = st.one_of(
    st.builds(
        lambda role, content: {"role": role, "content": content},
        st.sampled_from(["user", "assistant", "assistant", "tool", "system"]),
        _content,
    ),
    st.builds(
        lambda args: {"role": "assistant", "content": None, "tool_calls": [{"arguments": args}]},
        _texts,
    ),
    st.integers(min_value=0, max_value=200),  # not a message: its JSON still has to match
    st.text(max_size=3),
)
_tools = st.sampled_from([None, [], [{"name": "run", "schema": {"type": "object"}}]])
_system = st.sampled_from([None, "", "You are an agent.", [{"type": "text", "text": "S"}]])
_dialects = st.sampled_from(["openai", "anthropic", "openai-responses"])
# How a session's request follows its previous one. Mostly it extends it: the turn that reuses
# the previous turn's results. Else it repeats it, rewrites a message, truncates it, changes
# its tools or system or its dialect, or adds a digit to a trailing number (its JSON then
# extends the previous one's, its messages do not).
_STEPS = ["extend"] * 6 + ["same", "rewrite", "truncate", "head", "dialect", "digit"]


def _next_transcript(
    draw: st.DrawFn, step: str, messages: list[Any], message: st.SearchStrategy[Any] = _message
) -> list[Any]:
    """The transcript after ``messages`` by ``step`` (one of ``_STEPS``), new messages drawn
    from ``message``."""
    messages = list(messages)
    if step == "extend":
        messages += draw(st.lists(message, min_size=1, max_size=3))
    elif step == "rewrite" and messages:
        messages[draw(st.integers(0, len(messages) - 1))] = draw(message)
    elif step == "truncate" and messages:
        messages = messages[: draw(st.integers(0, len(messages) - 1))]
    elif step == "digit" and messages and type(messages[-1]) is int:
        messages[-1] = messages[-1] * 10 + draw(st.integers(0, 9))
    elif step == "digit":
        messages.append(draw(st.integers(0, 9)))
    return messages


@st.composite
def _session_requests(draw: st.DrawFn) -> list[tuple[str, str, dict[str, Any]]]:
    """Requests of up to three sessions, interleaved, each (session, dialect, body). A
    session's first request has a transcript of its own; each later one follows the
    session's previous request by a step of ``_STEPS``. The second request extends the
    first, so that every example reuses a previous turn's results at least once."""
    order = [0, 0, *draw(st.lists(st.integers(0, 2), max_size=14))]
    last: dict[int, tuple[str, list[Any], Any, Any]] = {}
    requests = []
    for k, session in enumerate(order):
        if session not in last:
            dialect, messages = draw(_dialects), draw(st.lists(_message, min_size=1, max_size=4))
            tools, system = draw(_tools), draw(_system)
        else:
            dialect, messages, tools, system = last[session]
            step = "extend" if k == 1 else draw(st.sampled_from(_STEPS))
            messages = _next_transcript(draw, step, messages)
            if step == "head":
                tools, system = draw(_tools), draw(_system)
            elif step == "dialect":
                dialect = draw(_dialects)
        last[session] = (dialect, messages, tools, system)
        body: dict[str, Any] = {"model": "m", "tools": tools, "system": system}
        body["input" if dialect == "openai-responses" else "messages"] = messages
        if draw(st.booleans()):
            body["cache_control"] = {"type": "ephemeral"}
        # what the proxy sees: a body parsed from the client's bytes, new objects every turn
        requests.append((f"s{session}", dialect, orjson.loads(orjson.dumps(body))))
    return requests


def _plain(dialect: str, body: dict[str, Any]) -> tuple[Any, int, list[PrefixPoint]]:
    clean = get_dialect(dialect).strip_request(body)
    return clean, estimate_tokens(request_parts(clean)), prefix_points(clean)


def _reusable(previous: tuple[str, dict[str, Any]] | None, dialect: str, body: Any) -> int:
    """The messages whose results a view may take from the session's previous one (its
    ``kept``), by definition: all of the previous request's messages when there were some,
    the dialect, tools and system are the same, and this transcript's JSON begins with
    theirs."""
    if previous is None or previous[0] != dialect:
        return 0
    key = get_dialect(dialect).transcript[0]
    before, items = previous[1][key], body[key]
    head = orjson.dumps([body.get("tools"), body.get("system")])
    if head != orjson.dumps([previous[1].get("tools"), previous[1].get("system")]):
        return 0
    same = bool(before) and orjson.dumps(items[: len(before)]) == orjson.dumps(before)
    return len(before) if same and len(items) >= len(before) else 0


@given(_session_requests())
def test_transcript_views_match_the_plain_definitions(requests: list[Any]) -> None:
    memos = SessionTranscripts(max_sessions=2)  # three sessions: one is dropped now and then
    alive: OrderedDict[str, tuple[str, dict[str, Any]]] = OrderedDict()  # the LRU, plainly
    reused = 0
    for session, dialect, body in requests:
        before = orjson.dumps(body)
        view = memos.view(session, get_dialect(dialect), body)
        clean, est, points = _plain(dialect, body)
        assert view.clean == clean and view.est_tokens == est and view.points == points
        assert _digests(view.points) == b"".join([p.digest for p in points])
        assert (view.clean is body) == (clean is body)  # "untouched" depends on it
        assert orjson.dumps(body) == before  # nothing mutated
        # the results above came from the previous turn's where they may, and only there
        assert view.kept == _reusable(alive.pop(session, None), dialect, body)
        reused += view.kept > 0
        alive[session] = (dialect, body)
        if len(alive) > 2:
            alive.popitem(last=False)
    assert reused >= 1  # the incremental path ran (the strategy's second request is one)


def _chat(messages: list[Any]) -> dict[str, Any]:
    return orjson.loads(orjson.dumps({"model": "m", "messages": messages}))


def test_a_growing_transcript_reuses_the_earlier_messages_and_a_rewrite_does_not() -> None:
    openai = get_dialect("openai")
    memos = SessionTranscripts()
    history: list[Any] = [{"role": "user", "content": "task"}]
    for k in range(5):
        history += [
            {"role": "assistant", "content": f"ok {k}\n```json\n{_ENVELOPE}\n```"},
            {"role": "user", "content": f"output {k}"},
        ]
        view = memos.view("s", openai, _chat(history))
        assert view.kept == (len(history) - 2 if k else 0)
        assert view.clean["messages"][-2]["content"] == f"ok {k}"
    assert memos.view("s", openai, _chat(history)).kept == len(history)  # sent again
    edited = [*history[:3], {"role": "user", "content": "changed"}, *history[4:]]
    assert memos.view("s", openai, _chat(edited)).kept == 0
    assert memos.view("s", openai, _chat(edited[:-2])).kept == 0  # truncated
    assert memos.view("s", openai, _chat([*edited[:-2], 7])).kept == len(edited) - 2
    # a number that grew is not a message that stayed: [.., 7] then [.., 71]
    assert memos.view("s", openai, _chat([*edited[:-2], 71])).kept == 0
    assert memos.view(None, openai, _chat(history)).kept == 0  # an unnamed session


def test_transcript_memos_are_bounded_by_sessions_and_bytes() -> None:
    openai = get_dialect("openai")
    big = _chat([{"role": "user", "content": "x" * 10_000}])
    memos = SessionTranscripts(max_sessions=3, max_bytes=50_000)
    for i in range(5):
        memos.view(f"s{i}", openai, big)
    assert len(memos) == 2 and memos.nbytes <= 50_000  # two of ~20 KB each fit
    memos = SessionTranscripts(max_sessions=3, max_bytes=10**9)
    for i in range(5):
        memos.view(f"s{i}", openai, _chat([{"role": "user", "content": "hi"}]))
    assert len(memos) == 3
    assert memos.view("s4", openai, _chat([{"role": "user", "content": "hi"}])).kept == 1
    assert memos.view("s0", openai, _chat([{"role": "user", "content": "hi"}])).kept == 0
    with pytest.raises(ValueError):
        SessionTranscripts(max_sessions=0)


_odd_value = st.one_of(
    st.none(), st.integers(), st.text(max_size=4), st.lists(st.none(), max_size=1)
)
_chat_message = st.one_of(
    _odd_value,
    st.fixed_dictionaries(
        {},
        optional={
            "role": st.one_of(
                st.sampled_from(["system", "developer", "user", "assistant", "tool", "function"]),
                _odd_value,
            ),
            "content": st.one_of(_texts, _odd_value, st.lists(_part, max_size=2)),
            "tool_calls": st.one_of(st.none(), st.just([]), _odd_value),
            "tool_call_id": st.one_of(st.just("call_1"), _odd_value),
        },
    ),
)


def _problem(check: Any, *args: Any) -> str | None:
    try:
        check(*args)
    except ProxyError as e:
        return f"{e.message} ({e.param})"
    return None


@given(_chat_message)
def test_chat_request_checks_judge_every_message_as_the_full_check_does(message: Any) -> None:
    body = {"model": "m", "messages": [message]}
    # each message on its own, then (across messages) tool results paired with their calls
    want = _problem(_validate_message, message, "messages[0]")
    want = want or _problem(_check_tool_answers, [message], 0)
    assert _problem(validate_openai_request, body) == want


def _plain_depth(value: Any) -> int:
    """How deep containers nest in ``value`` (``[]`` and ``{}``: 1, a scalar: 0)."""
    if isinstance(value, dict):
        return 1 + max((_plain_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_plain_depth(v) for v in value), default=0)
    return 0


def _nested(depth: int, leaf: Any, as_dict: bool) -> Any:
    for _ in range(depth):
        leaf = {"k": leaf} if as_dict else [leaf]
    return leaf


_tree = st.recursive(
    st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=2)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=2), inner, max_size=3)
    ),
    max_leaves=12,
)


@given(
    st.integers(min_value=0, max_value=140),
    _tree,
    st.booleans(),
    st.sampled_from([0, 1, 2, 5, 127, 128, 129, 254, 300]),
    st.booleans(),
)
def test_nesting_check_matches_the_plain_depth(
    depth: int, leaf: Any, as_dict: bool, limit: int, with_raw: bool
) -> None:
    value = _nested(depth, leaf, as_dict)
    raw = orjson.dumps(value) if with_raw else None
    assert nesting_exceeds(value, limit, raw) == (_plain_depth(value) > limit)


def test_nesting_check_walks_what_orjson_cannot_write() -> None:
    assert not nesting_exceeds({"n": 2**70, "s": [[1]]}, 3)  # >64-bit int: orjson refuses
    assert nesting_exceeds({"n": 2**70, "s": [[1]]}, 2)
    assert nesting_exceeds(_nested(300, 1, False), 128)  # deeper than orjson writes
    big = {"messages": [{"content": "{[" * 20_000}], "x": _nested(129, 0, True)}
    assert nesting_exceeds(big, 128, orjson.dumps(big))
    assert not nesting_exceeds(big, 130, orjson.dumps(big))


# --- request checks on the new messages only (web/turns.check_body) ------------------------


def _deep(depth: int) -> Any:
    return _nested(depth, "x", False)


_valid_message = st.builds(
    lambda role, text: {"role": role, "content": text},
    st.sampled_from(["user", "assistant"]),
    _texts,
)  # valid in every dialect: most of a session's messages, so that its requests pass
_checked_message = st.one_of(
    _valid_message,
    _valid_message,
    _valid_message,
    _message,
    _chat_message,
    st.builds(
        lambda role, depth: {
            "role": role,
            "content": [{"type": "text", "text": "t", "x": _deep(depth)}],
        },
        st.sampled_from(["user", "assistant"]),
        st.sampled_from([1, 100, 125, 126, 127, 200, 300]),
    ),
)


@st.composite
def _checked_turns(draw: st.DrawFn) -> list[tuple[str, bytes]]:
    """A session's requests as the client sends them (bytes): a transcript that mostly
    grows, with edits, truncations, other validators' dialects and invalid or too deep
    messages anywhere."""
    dialect = draw(st.sampled_from(["openai", "anthropic", "openai-responses"]))
    messages: list[Any] = draw(st.lists(_checked_message, max_size=3))
    turns = []
    for _ in range(draw(st.integers(min_value=1, max_value=10))):
        step = draw(st.sampled_from(["extend"] * 5 + ["same", "rewrite", "truncate", "dialect"]))
        messages = _next_transcript(draw, step, messages, _checked_message)
        if step == "dialect":
            dialect = draw(st.sampled_from(["openai", "anthropic", "openai-responses"]))
        body: dict[str, Any] = {"model": "m", "max_tokens": 5}
        body["input" if dialect == "openai-responses" else "messages"] = messages
        # json, not orjson: a message deeper than orjson writes is still sent
        turns.append((dialect, json.dumps(body).encode()))
    return turns


@given(st.lists(_checked_turns(), min_size=1, max_size=3))
def test_request_checks_on_the_new_messages_judge_as_the_full_checks(sessions: list[Any]) -> None:
    memos = SessionTranscripts(max_sessions=2)  # three sessions: one is dropped now and then
    for turn in range(max(len(s) for s in sessions)):
        for i, session in enumerate(sessions):
            if turn >= len(session):
                continue
            dialect, raw = session[turn]
            wire = get_dialect(dialect)
            want = _problem(check_body, orjson.loads(raw), raw, wire, wire.validate)
            got = _problem(
                check_body, orjson.loads(raw), raw, wire, wire.validate, (memos, f"s{i}")
            )
            assert got == want


def test_request_checks_skip_only_what_passed_them_on_the_last_request() -> None:
    openai = get_dialect("openai")
    memos = SessionTranscripts()

    def check(messages: list[Any], validate: Any = openai.validate) -> int:
        """The messages the checks skipped (a ProxyError when refused)."""
        raw = json.dumps({"model": "m", "messages": messages}).encode()
        text = check_body(orjson.loads(raw), raw, openai, validate, (memos, "s"))
        assert text is not None
        return text.checked

    history: list[Any] = [{"role": "user", "content": "task"}]
    assert check(history) == 0
    history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "out"}]
    assert check(history) == 1
    with pytest.raises(ProxyError, match="content must be"):
        check([*history, {"role": "assistant", "content": 5}])
    assert check([*history, {"role": "user", "content": "again"}]) == 3  # the refused one: not kept
    deep = [*history, {"role": "user", "content": [_deep(130)]}]
    with pytest.raises(ProxyError, match="nests JSON"):
        check(deep)
    assert check(history) == 0  # shorter than the last request that passed: all again
    assert check(history) == 3
    assert check(history, validate_openai_request) == 0  # another check: all of them again
    assert check([{"role": "user", "content": "other task"}, *history[1:]]) == 0
    raw = orjson.dumps({"model": "m", "messages": history})
    assert check_body(orjson.loads(raw), raw, openai, openai.validate) is None  # no session


# --- the transcript's serialisation taken from the client's bytes (sessions/transcripts) ----

_FORMATS = ["orjson", "compact", "compact", "spaced"]


def _written(value: Any, fmt: str) -> bytes:
    """``value`` as a client writes it: orjson's bytes, compact JSON as ``json`` writes it
    (its floats and escapes can differ from orjson's), or ``json``'s default (spaces, ASCII).
    A message deeper than orjson writes is written by ``json``."""
    if fmt == "orjson":
        with contextlib.suppress(TypeError):
            return orjson.dumps(value)
    if fmt != "spaced":
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    return json.dumps(value).encode()


_extra_value = st.one_of(
    st.integers(-3, 3),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=3),
)


@st.composite
def _raw_turns(draw: st.DrawFn) -> list[tuple[str, bytes]]:
    """A session's requests as bytes: a transcript that mostly grows, written compactly or
    not, among other members in an order kept until a step changes it (so that a request is
    often its previous one's bytes around the transcript), some of which change; now and then
    a decoy (the
    transcript's own bytes as another member's value, or inside a string) or the transcript's
    key twice (the parser keeps the last), or another member twice from some turn on."""
    dialect = draw(st.sampled_from(["openai", "anthropic", "openai-responses"]))
    messages: list[Any] = draw(st.lists(_checked_message, max_size=3))
    fmt, extra, order = draw(st.sampled_from(_FORMATS)), draw(_extra_value), draw(st.randoms())
    twice: list[tuple[str, bytes]] = []
    arrangement = ["model", "max_tokens", "x", "y", "messages", "input"]
    order.shuffle(arrangement)
    turns = []
    for _ in range(draw(st.integers(min_value=1, max_value=8))):
        steps = ["extend"] * 6 + ["same", "rewrite", "truncate", "dialect", "format", "extra"]
        steps += ["decoy", "twice", "order"]
        step = draw(st.sampled_from(steps))
        messages = _next_transcript(draw, step, messages, _checked_message)
        if step == "dialect":
            dialect = draw(st.sampled_from(["openai", "anthropic", "openai-responses"]))
        elif step == "format":
            fmt = draw(st.sampled_from(_FORMATS))
        elif step == "extra":
            extra = draw(_extra_value)
        elif step == "order":
            order.shuffle(arrangement)
        elif step == "twice":
            twice = [(draw(st.sampled_from(["model", "x"])), b'"other"')]
        key = "input" if dialect == "openai-responses" else "messages"
        members = [*twice, ("model", b'"m"'), ("max_tokens", b"5"), ("x", _written(extra, fmt))]
        members.append((key, _written(messages, fmt)))
        if step == "decoy":
            own = _written(messages, "orjson")
            decoy = draw(st.sampled_from([own, orjson.dumps(own.decode()), b"[]", own + b" "]))
            at = draw(st.integers(0, len(members)))  # before or after the transcript
            members.insert(at, (draw(st.sampled_from(["y", key])), decoy.strip()))
        members.sort(key=lambda member: arrangement.index(member[0]))  # a key twice: as drawn
        raw = b"{" + b",".join(orjson.dumps(k) + b":" + v for k, v in members) + b"}"
        turns.append((dialect, raw))
    return turns


# A request extending the last one with items nested past orjson's writing limit (255):
# parsed alone they could not be written back (found by the test below, a TypeError).
_GROWING = b'{"model":"m","max_tokens":5,"x":0,"messages":[{"role":"user","content":""}'
_DEEP_TAIL = b',{"role":"user","content":[{"type":"text","text":"t","x":%s"x"%s}]}' % (
    b"[" * 300,
    b"]" * 300,
)


@given(st.lists(_raw_turns(), min_size=1, max_size=3))
@example(
    sessions=[
        [
            ("openai", _GROWING + b"]}"),
            ("openai", _GROWING + b',{"role":"user","content":""}]}'),
            ("openai", _GROWING + b',{"role":"user","content":""}' + _DEEP_TAIL + b"]}"),
        ]
    ]
)
def test_serialisation_from_the_clients_bytes_is_the_serialisation(sessions: list[Any]) -> None:
    """With the client's bytes (``raw``), a session's transcript text (serialisation, head,
    items that passed the checks), the checks' verdict and the transcript results are what
    they are without them (every turn serialised), and the serialisation is orjson's."""
    memos, plain = SessionTranscripts(max_sessions=2), SessionTranscripts(max_sessions=2)
    for turn in range(max(len(s) for s in sessions)):
        for i, session in enumerate(sessions):
            if turn >= len(session):
                continue
            dialect, raw = session[turn]
            wire, body = get_dialect(dialect), orjson.loads(raw)
            known = memos.parsed(f"s{i}", raw)  # parsed from the new items only, if it can
            if known is not None:  # what the bytes parse to, members in the same order
                assert orjson.dumps(known) == orjson.dumps(body) and known == body
                body = known
            got = memos.text(f"s{i}", wire, body, wire.validate, raw)
            want = plain.text(f"s{i}", wire, orjson.loads(raw), wire.validate)
            assert (got is None) == (want is None)
            if got is None or want is None:
                continue
            assert got.blob == want.blob == orjson.dumps(body[wire.transcript[0]])
            assert (got.head, got.checked) == (want.head, want.checked)
            if got.vouches_for_raw:  # the bytes may go upstream: they mean the body to all
                assert _first_wins(raw) == body and not _repeats_a_key(raw)
            verdict = _problem(wire.validate, body, got.checked)
            assert verdict == _problem(wire.validate, orjson.loads(raw))
            if verdict is None:
                memos.passed(got)
                plain.passed(want)
            view = memos.view(f"s{i}", wire, body, got)
            assert view == plain.view(f"s{i}", wire, want.body, want)
            clean, est, points = _plain(dialect, orjson.loads(raw))
            assert view.clean == clean and view.est_tokens == est and view.points == points
            assert _digests(view.points) == b"".join([p.digest for p in points])


def test_a_request_extending_the_last_ones_bytes_is_parsed_from_its_new_items() -> None:
    """A compact client's request that is its previous one's bytes with new items appended to
    the transcript is not parsed whole: the earlier messages and the other members are the
    objects the previous request parsed to, the new ones parsed alone. A request with other
    bytes (an edit, other members, another client's formatting) is parsed as usual."""
    openai = get_dialect("openai")
    memos = SessionTranscripts()
    history: list[Any] = [{"role": "system", "content": "s"}, {"role": "user", "content": "t"}]

    def request(messages: list[Any]) -> bytes:
        return b'{"model":"m","messages":' + orjson.dumps(messages) + b',"max_tokens":9}'

    def turn(raw: bytes) -> dict[str, Any]:
        body = memos.parsed("s", raw)
        body = orjson.loads(raw) if body is None else body
        assert body == orjson.loads(raw)
        memos.passed(memos.text("s", openai, body, openai.validate, raw))
        return body

    bodies = [turn(request(history))]
    for k in range(3):
        history += [{"role": "assistant", "content": f"a{k}"}, {"role": "user", "content": "o"}]
        bodies.append(turn(request(history)))
    # from the third request on (the second verified the anchor) the earlier objects are reused
    assert bodies[-1]["messages"][0] is bodies[1]["messages"][0]
    assert bodies[-1]["messages"][-3] is bodies[-2]["messages"][-1]
    assert bodies[-1] is not bodies[-2] and bodies[-1]["messages"] is not bodies[-2]["messages"]
    assert memos.parsed("s", request(history)) == bodies[-1]  # the same request again
    edited = [*history[:-1], {"role": "user", "content": "edited"}]
    assert memos.parsed("s", request(edited)) is None
    assert memos.parsed("s", request(history).replace(b'"m"', b'"n"')) is None
    unlike_orjson = request(history).replace(b'],"max', b',{"role":"user","content":1.0e1}],"max')
    assert memos.parsed("s", unlike_orjson) is None  # orjson writes 10.0
    spaced = json.dumps({"model": "m", "messages": history, "max_tokens": 9}).encode()
    assert memos.parsed("s", spaced) is None
    assert memos.parsed("other", request(history)) is None


def _first_wins(raw: bytes) -> Any:
    """``raw`` as a parser that keeps a repeated key's first value reads it."""
    return json.loads(raw, object_pairs_hook=lambda pairs: dict(reversed(pairs)))


def _repeats_a_key(raw: bytes) -> bool:
    found = []
    json.loads(raw, object_pairs_hook=lambda p: found.append(len(p) != len(dict(p))) or dict(p))
    return any(found)


def test_a_compact_clients_transcript_is_taken_from_its_bytes_and_checked_once() -> None:
    openai = get_dialect("openai")
    memos = SessionTranscripts()
    history: list[Any] = [{"role": "user", "content": "task"}]

    def text(raw: bytes) -> Any:
        got = memos.text("s", openai, orjson.loads(raw), openai.validate, raw)
        assert got is not None and got.blob == orjson.dumps(orjson.loads(raw)["messages"])
        memos.passed(got)
        return got

    def request(messages: list[Any], more: bytes = b"") -> bytes:
        return b'{"model":"m","messages":' + orjson.dumps(messages) + more + b',"stream":false}'

    first = text(request(history))
    assert first.anchor is not None and not first.anchor.verified  # found, not yet shown
    for k in range(3):
        history += [{"role": "assistant", "content": f"ok {k}"}, {"role": "user", "content": "o"}]
        got = text(request(history))
        assert got.checked == len(history) - 2
        assert got.anchor is not None and got.anchor.verified
    # a later duplicate key: the bytes that look like the transcript are not its value
    dup = request(history, b',"messages":' + orjson.dumps([*history, history[-1]]))
    assert text(dup).checked == len(history)
    assert text(request(history)).checked == 0  # shorter than the duplicate's
    spaced = json.dumps({"model": "m", "messages": history}).encode()
    assert text(spaced).anchor is None  # not orjson's bytes: serialised, as before
    assert text(request(history)).checked == len(history)  # the same messages, written so


# --- the baseline's OpenAI cache model (cost/baseline.PrefixCache) -------------------------


class _PlainOpenAICache:
    """The OpenAI regime's definition: the last point whose digest was one of the previous
    request's (within the ttl) is read, in OpenAI's steps of 128 tokens."""

    def __init__(self) -> None:
        self.previous: set[bytes] = set()
        self.at = float("-inf")

    def charge(self, points: list[PrefixPoint], tokens: int, now: float, regime: Any) -> int:
        read = 0
        if now - self.at <= regime.ttl_s:
            hits = [k for k, p in enumerate(points) if p.digest in self.previous]
            if hits:
                total = points[-1].est_tokens
                at = round(Fraction(tokens * points[hits[-1]].est_tokens, total)) if total else 0
                read = at // 128 * 128 if at >= regime.min_tokens else 0
        self.previous, self.at = {p.digest for p in points}, now
        return read


_digest = st.one_of(
    st.sampled_from([bytes([b]) * 16 for b in range(6)]),  # shared by unrelated requests
    st.binary(min_size=16, max_size=16),
    st.sampled_from([b"a" * 8 + b"b" * 8, b"b" * 8 + b"a" * 8, b"a" * 16, b"b" * 16]),  # overlaps
)


@given(
    st.lists(
        st.tuples(
            st.lists(st.tuples(_digest, st.integers(0, 5000)), max_size=30),
            st.integers(0, 10_000),
            st.sampled_from([0.0, 1.0, 400.0]),
        ),
        max_size=8,
    ),
    st.booleans(),
)
def test_openai_cache_reads_match_the_plain_definition(requests: list[Any], grow: bool) -> None:
    regime = CacheRegime("openai", ttl_s=300.0, min_tokens=1000)
    cache, plain = PrefixCache(), _PlainOpenAICache()
    now, previous = 0.0, []
    for pieces, tokens, wait in requests:
        points = [
            PrefixPoint(d, sum(s for _, s in pieces[: k + 1]), False)
            for k, (d, _) in enumerate(pieces)
        ]
        if grow:  # a transcript that grows: the previous request's points, then new ones
            points = previous + points
        now += wait
        got = cache.charge(points, tokens, now, regime).cache_read_tokens
        assert got == plain.charge(points, tokens, now, regime)
        previous = points


def test_openai_cache_reads_on_a_growing_transcript() -> None:
    regime = CacheRegime("openai", ttl_s=300.0, min_tokens=0)
    cache, plain = PrefixCache(), _PlainOpenAICache()
    memo, memo_cache = PrefixPointsMemo(), PrefixCache()  # points made turn after turn
    messages: list[Any] = [{"role": "system", "content": "s"}]
    for k in range(40):
        kept = len(messages) if k not in (0, 20) else 0
        messages += [
            {"role": "assistant", "content": f"a{k}"},
            {"role": "user", "content": f"u{k}"},
        ]
        if k == 20:  # the client rewrote its history
            messages = [{"role": "system", "content": "s2"}, *messages[1:]]
        points = prefix_points({"messages": messages})
        tokens = 100 * len(messages)  # enough that every shared prefix holds a 128-token step
        got = cache.charge(points, tokens, float(k), regime).cache_read_tokens
        want = plain.charge(points, tokens, float(k), regime)
        assert got == want
        assert (got == 0) == (k in (0, 20))
        made = memo.points({"messages": messages}, kept)
        assert made == points and _digests(made) == b"".join([p.digest for p in points])
        split = memo_cache.charge(made, tokens, float(k), regime)
        assert split.cache_read_tokens == want


# --- a reply that is one ```json block (engine/stripper.py) --------------------------------

_BLOCK_OPENERS = ["```json\n", "```json \n", "```JSON\n", "````json\n", "~~~json\n", "```json\r\n"]
_BLOCK_OPENERS += ["```\n", "x```json\n", "\n```json\n", "```json"]
_BLOCK_CLOSERS = ["\n```", "\n```\n", "\n````", "```", "\n~~~", "\n``` ", "\n```x", "\n", ""]
_block_envelope = st.builds(
    lambda patch, action, pretty: orjson.dumps(
        {"state_patch": patch, "action": action} if action != "-" else {"state_patch": patch},
        option=orjson.OPT_INDENT_2 if pretty else 0,
    ).decode(),
    st.dictionaries(st.sampled_from("ab"), st.integers(-5, 5) | st.text(max_size=3), max_size=2),
    st.sampled_from(["run", "", "-", None, 3, "a`b", "a~b", "x\ny", " "]) | st.text(max_size=4),
    st.booleans(),
)
_BLOCK_BITS = ["", " ", "\n", "\r", "{", "}", "`", "~", "```", '{"answer": 42}']
_BLOCK_BITS += ['{"state_patch": 3}']
_block_content = st.lists(_block_envelope | st.sampled_from(_BLOCK_BITS), max_size=3).map("".join)


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from(_BLOCK_OPENERS), _block_content, st.sampled_from(_BLOCK_CLOSERS))
@example("```json\n", '{"state_patch": {"step": 1}, "action": "run"}', "\n```")
@example("```json\n", '{"state_patch": {"step": 1}}', "\n```")
@example("```json\n", '{"state_patch": {"step": 1}, "action": ""}', "\n```")
@example("```json\n", '{"state_patch": {}}{"state_patch": {}}', "\n```")
@example("```json\n", '{"state_patch": {}} trailing', "\n```")
@example("```json\n", "", "\n```")
def test_a_reply_of_one_json_block_strips_as_the_machine_strips_it(
    opener: str, content: str, closer: str
) -> None:
    text = opener + content + closer
    for fallback in (True, False):
        assert strip_envelope(text, fallback) == _strip_by_machine(text, fallback), fallback


# --- a mode header read (web/turns.py) ------------------------------------------------------


def _plain_header_choice(sent: str | None, name: str, default: Choice) -> Choice:
    """The definition: the header's value (else the setting's), stripped and lower-cased,
    one of the enum's values, else a 400."""
    kind = type(default)
    value = (sent or default.value).strip().lower()
    if value not in kind.values():
        allowed = ", ".join(kind.values())
        raise ProxyError("invalid_request", f"{name} must be one of {allowed}", param=name)
    return kind(value)


def _choice_or_error(read: Any, *args: Any) -> Any:
    try:
        return read(*args)
    except ProxyError as e:
        return ("error", e.status, str(e), e.param)


def _enums() -> list[type[Choice]]:
    found, todo = [], list(Choice.__subclasses__())
    while todo:
        kind = todo.pop()
        found.append(kind)
        todo.extend(kind.__subclasses__())
    return found


@pytest.mark.parametrize("kind", _enums(), ids=lambda k: k.__name__)
def test_a_mode_header_is_read_as_the_plain_definition_reads_it(kind: type[Choice]) -> None:
    name = "x-skillstate-mode"
    sent: list[str | None] = [None, "", " ", "nope", "State ", "\tstate", "STATE", "stat"]
    for member in kind:
        sent += [member.value, member.value.upper(), f"  {member.value}\t", member.value + "x"]
    for default in kind:
        for value in sent:
            headers = [] if value is None else [(name.encode(), value.encode("latin-1"))]
            request = Request({"type": "http", "headers": headers})
            got = _choice_or_error(_header_choice, request, name, default)
            expected = _choice_or_error(_plain_header_choice, value, name, default)
            assert got == expected and type(got) is type(expected), (default, value)
            if isinstance(got, Choice):
                assert got is expected


# --- a chat completion's choices stripped (dialects/openai.py) -----------------------------


def _plain_strip_reply(resp: dict[str, Any], known: Any = None) -> tuple[Any, Any]:
    """The definition: every choice's message content stripped, the reply copied when one
    changed (``OpenAIDialect.strip_reply`` before it copied the choices only on a change)."""
    choices = resp.get("choices")
    if not isinstance(choices, list):
        return resp, NOTHING
    first, out = NOTHING, list(choices)
    for k, choice in enumerate(choices):
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            continue
        calls = bool(message.get("tool_calls") or message.get("function_call"))
        content, summary = strip_content(message.get("content"), known=known, fallback=not calls)
        if k == 0:
            first = summary
        if content is not message.get("content"):
            if calls and not content:
                content = None
            out[k] = {**choice, "message": {**message, "content": content}}
    changed = any(a is not b for a, b in zip(out, choices, strict=True))
    return ({**resp, "choices": out} if changed else resp), first


_reply_message = st.builds(
    lambda content, calls: {"role": "assistant", "content": content, **calls},
    _content,
    st.sampled_from([{}, {"tool_calls": [{"id": "c"}]}, {"tool_calls": []}, {"function_call": 1}]),
)
_choices = st.lists(
    st.builds(lambda m: {"index": 0, "message": m}, _reply_message) | st.sampled_from([1, {}]),
    max_size=3,
)


@settings(max_examples=400, deadline=None)
@given(_choices | st.sampled_from([None, {}, "x"]), st.booleans())
def test_a_chat_reply_strips_as_the_plain_definition_strips_it(choices: Any, known: bool) -> None:
    resp = {"id": "r", "choices": choices}
    first = choices[0] if isinstance(choices, list) and choices else None
    said = first.get("message", {}).get("content") if isinstance(first, dict) else None
    hint = (said, strip_envelope(said)) if known and isinstance(said, str) else None
    got, got_first = get_dialect("openai").strip_reply(resp, hint)
    expected, expected_first = _plain_strip_reply(resp, hint)
    assert got == expected and got_first == expected_first
    assert (got is resp) == (expected is resp)
