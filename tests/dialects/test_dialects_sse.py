"""SSE parsing: however the bytes are split into reads, the same events come out."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from skillstate.dialects import sse

ANTHROPIC_CRLF = (
    b'event: message_start\r\ndata: {"type":"message_start"}\r\n\r\n'
    b'event: content_block_delta\r\ndata: {"type":"content_block_delta"}\r\n\r\n'
    b'event: message_stop\r\ndata: {"type":"message_stop"}\r\n\r\n'
)


def events_of(reads: list[bytes]) -> list[tuple[str | None, str]]:
    parser = sse.SSEParser()
    out = [e for r in reads for e in parser.feed(r)] + parser.flush()
    return [(e.event, e.data) for e in out]


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted(set(cuts)), len(data)]
    return [data[a:b] for a, b in pairwise(edges)]


def test_a_crlf_split_between_reads_is_one_line_break() -> None:
    cut = ANTHROPIC_CRLF.index(b"\r\n") + 1  # the read ends between \r and \n
    assert events_of(split_at(ANTHROPIC_CRLF, [cut])) == [
        ("message_start", '{"type":"message_start"}'),
        ("content_block_delta", '{"type":"content_block_delta"}'),
        ("message_stop", '{"type":"message_stop"}'),
    ]


@given(st.lists(st.integers(0, len(ANTHROPIC_CRLF)), max_size=12))
def test_any_split_of_a_crlf_stream_gives_the_same_events(cuts: list[int]) -> None:
    assert events_of(split_at(ANTHROPIC_CRLF, cuts)) == events_of([ANTHROPIC_CRLF])


@given(st.lists(st.integers(0, 40), max_size=8))
def test_lone_cr_line_endings_at_any_split(cuts: list[int]) -> None:
    data = b"data: a\r\rdata: b\r\r"
    assert events_of(split_at(data, cuts)) == [(None, "a"), (None, "b")]


def test_a_trailing_cr_still_ends_the_last_event_at_flush() -> None:
    assert events_of([b"data: last\r\n\r"]) == [(None, "last")]


def test_one_read_of_many_events_keeps_only_the_unfinished_tail() -> None:
    parser = sse.SSEParser()
    event = b'data: {"x": 1}\n\n'
    events = parser.feed(event * 20_000 + b"data: tail")
    assert len(events) == 20_000 and all(e.data == '{"x": 1}' for e in events)
    assert [e.data for e in parser.flush()] == ["tail"]
