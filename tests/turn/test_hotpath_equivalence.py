"""Hot-path rewrites give exactly what the plain definitions they replaced give.

Each per-turn helper that was made cheaper (integer rounding instead of Fractions, a fence
regex the engine can scan faster, ledger clamps with a fast first line, an inline-scalar
deep copy, the enums' str) is checked here against the straightforward definition, over
edge values and seeded random inputs.
"""

from __future__ import annotations

import math
import random
import re
from fractions import Fraction
from typing import Any

import pytest

from skillstate.choices import CacheBreakpoints, Constrain, Mode, ReplyEnvelope
from skillstate.cost.baseline import baseline_output_tokens, envelope_output_share, round_ratio
from skillstate.cost.usage import MAX_TOKEN_COUNT
from skillstate.engine.patch import _FENCE_RUN, _copy_json
from skillstate.store.rows import MAX_USD, clamp_amount, clamp_count, clamp_signed

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
