"""header_safe: header values from model or client text are visible ASCII and capped."""

from __future__ import annotations

import re
from urllib.parse import unquote

from hypothesis import given
from hypothesis import strategies as st

from skillstate.headertext import header_safe


@given(st.text(), st.integers(min_value=8, max_value=300))
def test_any_text_becomes_visible_ascii_within_the_cap(text: str, limit: int) -> None:
    value = header_safe(text, limit)
    assert len(value) <= limit
    assert all(0x20 <= ord(c) < 0x7F for c in value)
    assert re.search(r"%[0-9A-F]?$", value) is None  # no escape cut in half


@given(st.text(max_size=40))
def test_short_text_is_reversible_up_to_whitespace(text: str) -> None:
    assert unquote(header_safe(text, 10_000)) == " ".join(text.split())
