from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import orjson
import pytest
from rich.console import Console

from skillstate.cli.cost import render_table
from skillstate.cost.ledger import (
    NOTE,
    Usage,
    baseline_cost_usd,
    baseline_input_tokens,
    make_row,
    parse_since,
    parse_window,
    summarize,
)
from skillstate.cost.pricing import PriceBook, PriceOverride, Prices
from skillstate.dialects.anthropic import usage_from_anthropic
from skillstate.dialects.openai import usage_from_openai
from skillstate.store.records import LedgerRow

# --- usage normalisation ------------------------------------------------------------------


def test_openai_prompt_tokens_include_cached_tokens() -> None:
    u = usage_from_openai(
        {
            "prompt_tokens": 1200,
            "completion_tokens": 80,
            "total_tokens": 1280,
            "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
        }
    )
    assert u == Usage(input_tokens=1200, output_tokens=80, cache_read_tokens=1024)
    assert u.uncached_input_tokens == 176


def test_openai_variants() -> None:
    assert usage_from_openai({"prompt_tokens": 5, "completion_tokens": 2}) == Usage(5, 2)
    assert usage_from_openai(
        {"prompt_tokens": 5, "completion_tokens": 2, "prompt_tokens_details": None}
    ) == Usage(5, 2)
    # Responses API
    assert usage_from_openai(
        {"input_tokens": 50, "output_tokens": 7, "input_tokens_details": {"cached_tokens": 32}}
    ) == Usage(50, 7, 32)
    # DeepSeek
    assert usage_from_openai(
        {"prompt_tokens": 100, "completion_tokens": 1, "prompt_cache_hit_tokens": 64}
    ) == Usage(100, 1, 64)
    # integral floats from sloppy servers
    assert usage_from_openai({"prompt_tokens": 5.0, "completion_tokens": 2.0}) == Usage(5, 2)


@pytest.mark.parametrize(
    "raw",
    [
        None,
        {},
        [],
        "usage",
        {"prompt_tokens": 5},
        {"prompt_tokens": "5", "completion_tokens": 1},
        {"prompt_tokens": True, "completion_tokens": 1},
        {"prompt_tokens": -1, "completion_tokens": 1},
        {"prompt_tokens": 1.5, "completion_tokens": 1},
        {"prompt_tokens": 5, "completion_tokens": None},
        {"prompt_tokens": 5, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 6}},
        {
            "prompt_tokens": 5,
            "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": "x"},
        },
    ],
)
def test_openai_garbage_is_none(raw: Any) -> None:
    assert usage_from_openai(raw) is None


def test_anthropic_input_tokens_exclude_cache_tokens() -> None:
    u = usage_from_anthropic(
        {
            "input_tokens": 12,
            "cache_creation_input_tokens": 3000,
            "cache_read_input_tokens": 20000,
            "output_tokens": 300,
        }
    )
    assert u == Usage(
        input_tokens=23012, output_tokens=300, cache_read_tokens=20000, cache_write_tokens=3000
    )
    assert u.uncached_input_tokens == 12
    # cache fields absent or null -> 0
    assert usage_from_anthropic({"input_tokens": 9, "output_tokens": 1}) == Usage(9, 1)
    assert usage_from_anthropic(
        {
            "input_tokens": 9,
            "output_tokens": 1,
            "cache_read_input_tokens": None,
            "cache_creation_input_tokens": None,
        }
    ) == Usage(9, 1)


@pytest.mark.parametrize(
    "raw",
    [
        None,
        {},
        {"input_tokens": 1},
        {"output_tokens": 1},
        {"input_tokens": "1", "output_tokens": 1},
        {"input_tokens": 1, "output_tokens": 1, "cache_read_input_tokens": -5},
        {"input_tokens": 1, "output_tokens": 1, "cache_creation_input_tokens": "big"},
    ],
)
def test_anthropic_garbage_is_none(raw: Any) -> None:
    assert usage_from_anthropic(raw) is None


# --- baseline -----------------------------------------------------------------------------


def test_baseline_input_tokens() -> None:
    assert baseline_input_tokens(1000, 5000, 1000) == 5000
    assert baseline_input_tokens(1000, 1000, 1000) == 1000
    assert baseline_input_tokens(300, 1000, 400) == 750
    assert baseline_input_tokens(10, 1, 3) == 3  # 3.33 -> 3
    assert baseline_input_tokens(10, 2, 3) == 7  # 6.67 -> 7
    assert baseline_input_tokens(1, 5, 2) == 2  # 2.5 -> 2 (round half to even, exact)
    assert baseline_input_tokens(1, 7, 2) == 4  # 3.5 -> 4
    assert baseline_input_tokens(1234, 999, 0) == 1234  # guard
    assert baseline_input_tokens(0, 999, 10) == 0


def test_mask_baseline_input_adds_the_estimated_difference() -> None:
    """A mask request is the transcript with contents replaced: what both carry (tools,
    framing, what the provider counts beyond the estimate) is not scaled. The demo's turn 30:
    2,964 provider tokens for a masked request estimated at 2,408, the transcript 12,647."""
    assert baseline_input_tokens(2964, 12_647, 2408, "mask") == 13_203
    assert baseline_input_tokens(2964, 12_647, 2408, "compact") == 15_567  # scaled
    assert baseline_input_tokens(2964, 12_647, 2408) == 15_567
    assert baseline_input_tokens(500, 500, 500, "mask") == 500  # nothing masked
    assert baseline_input_tokens(10, 5, 100, "mask") == 0  # never below 0


def test_baseline_cost_prices_extra_tokens_at_full_input_price() -> None:
    prices = Prices(2.0, 10.0, 0.2, 2.5)
    # actual cost $0.0305 with 46000 input tokens; baseline 100000 input:
    # 0.0305 + (100000 - 46000) * 2.00 / 1e6 = 0.0305 + 0.108 = 0.1385
    assert baseline_cost_usd(0.0305, prices, 46_000, 100_000) == pytest.approx(0.1385)
    assert baseline_cost_usd(None, prices, 1, 2) is None
    assert baseline_cost_usd(0.1, None, 1, 2) is None
    assert baseline_cost_usd(0.000001, prices, 1000, 0) == 0.0  # never negative


M1 = PriceOverride(
    input_per_mtok=1.0, output_per_mtok=2.0, cache_read_per_mtok=0.1, cache_write_per_mtok=1.25
)
BOOK = PriceBook(overrides_by_model={"m1": M1})
DAY1 = datetime(2025, 3, 1, 23, 0, tzinfo=timezone.utc).timestamp()
DAY2 = datetime(2025, 3, 2, 1, 0, tzinfo=timezone.utc).timestamp()


def test_make_row_generation() -> None:
    row = make_row(
        book=BOOK,
        usage=Usage(1300, 120),
        kind="generation",
        status=200,
        mode="state",
        session="s1",
        upstream="up",
        model="m1",
        est_transcript=5000,
        est_sent=1300,
        ts=DAY1,
    )
    assert row.cost_usd == pytest.approx(0.00154)  # 1300 * 1.00 + 120 * 2.00 = 1540 µ$
    assert row.baseline_cost_usd == pytest.approx(0.00524)  # + (5000 - 1300) * 1.00
    assert row == LedgerRow(
        ts=DAY1,
        session="s1",
        upstream="up",
        model="m1",
        kind="generation",
        status=200,
        input_tokens=1300,
        output_tokens=120,
        cache_read_tokens=0,
        cache_write_tokens=0,
        pricing="override",
        cost_usd=row.cost_usd,
        baseline_input_tokens=5000,
        baseline_cost_usd=row.baseline_cost_usd,
        mode="state",
        baseline_cached_tokens=0,  # no cache model: the call's own cache fields
        baseline_output_tokens=120,
        saved_cost_usd=row.saved_cost_usd,
        saved_cost_pct=70.61,  # 100 * 3700 / 5240
    )
    assert row.saved_cost_usd == pytest.approx(0.0037)
    # round-trips through JSON / a mapping, as the store will do
    again = LedgerRow.from_mapping(orjson.loads(orjson.dumps(row.as_dict())))
    assert again == row


def test_make_row_retry_and_unavailable_and_unknown() -> None:
    retry = make_row(
        book=BOOK,
        usage=Usage(1300, 50),
        kind="rollback-retry",
        status=200,
        mode="state",
        model="m1",
        est_transcript=5000,
        est_sent=1300,
    )
    assert (retry.baseline_input_tokens, retry.baseline_cost_usd) == (0, 0.0)
    assert retry.cost_usd == pytest.approx(0.0014)

    failed = make_row(
        book=BOOK, usage=None, kind="transport-retry", status=503, mode="state", model="m1"
    )
    assert failed.pricing == "usage-unavailable"
    assert failed.input_tokens is None and failed.cost_usd is None
    assert failed.baseline_input_tokens is None and failed.baseline_cost_usd is None

    unknown = make_row(
        book=BOOK,
        usage=Usage(1600, 100),
        kind="generation",
        status=200,
        mode="state",
        model="mystery",
        est_transcript=11200,
        est_sent=1600,
    )
    assert unknown.pricing == "unknown" and unknown.cost_usd is None
    assert unknown.baseline_input_tokens == 11200 and unknown.baseline_cost_usd is None

    no_estimates = make_row(
        book=BOOK, usage=Usage(10, 1), kind="stream", status=200, mode="passthrough", model="m1"
    )
    assert no_estimates.baseline_input_tokens is None

    with pytest.raises(ValueError, match="kind"):
        make_row(book=BOOK, usage=None, kind="bogus", status=200, mode="state")  # type: ignore[arg-type]


def eight_row_session() -> list[LedgerRow]:
    """One session, prices per Mtok: input 1.00, output 2.00, cache read 0.10, cache write 1.25.

    #  kind             in/out/cr/cw        est trans/sent  baseline  cost  baseline cost
    1  generation       1000/100/0/0        1000/1000       1000      1200  1200
    2  generation       1200/100/0/0        3000/1500       2400      1400  1400+1200=2600
    3  rollback-retry   1300/50/0/0         -               0         1400  0
    4  generation       1300/120/0/0        5000/1300       5000      1540  1540+3700=5240
    5  transport-retry  none (503)          -               -         -     -
    6  stream           1400/80/1000/0      7000/1400       7000      660   660+5600=6260
    7  stream           1500/90/1200/100    9000/1500       9000      625   625+7500=8125
    8  generation       1600/100 (unknown)  11200/1600      11200     -     -
    (costs in millionths of a dollar; row 6: 400*1 + 1000*0.1 + 80*2 = 660;
     row 7: 200*1 + 1200*0.1 + 100*1.25 + 90*2 = 625)
    Rows 1-4 on DAY1, 5-8 on DAY2.
    """
    spec: list[tuple[str, Usage | None, int | None, int | None, str, int]] = [
        ("generation", Usage(1000, 100), 1000, 1000, "m1", 200),
        ("generation", Usage(1200, 100), 3000, 1500, "m1", 200),
        ("rollback-retry", Usage(1300, 50), None, None, "m1", 200),
        ("generation", Usage(1300, 120), 5000, 1300, "m1", 200),
        ("transport-retry", None, None, None, "m1", 503),
        ("stream", Usage(1400, 80, 1000, 0), 7000, 1400, "m1", 200),
        ("stream", Usage(1500, 90, 1200, 100), 9000, 1500, "m1", 200),
        ("generation", Usage(1600, 100), 11200, 1600, "mystery", 200),
    ]
    return [
        make_row(
            book=BOOK,
            usage=usage,
            kind=kind,  # type: ignore[arg-type]
            status=status,
            mode="state",
            session="s1",
            upstream="up",
            model=model,
            est_transcript=est_t,
            est_sent=est_s,
            ts=DAY1 if i < 4 else DAY2,
        )
        for i, (kind, usage, est_t, est_s, model, status) in enumerate(spec)
    ]


def test_summarize_eight_row_session_by_hand() -> None:
    s = summarize(eight_row_session(), None)
    t = s["totals"]
    assert s["group_by"] is None and s["groups"] == []
    assert s["note"] == NOTE and "not a provider invoice" in NOTE
    assert t["requests"] == 6  # rows 1, 2, 4, 6, 7, 8
    assert t["attempts"] == {
        "generation": 4,
        "stream": 2,
        "rollback-retry": 1,
        "transport-retry": 1,
    }
    assert t["input_tokens"] == 1000 + 1200 + 1300 + 1300 + 1400 + 1500 + 1600 == 9300
    assert t["output_tokens"] == 100 + 100 + 50 + 120 + 80 + 90 + 100 == 640
    assert t["cache_read_tokens"] == 2200
    assert t["cache_write_tokens"] == 100
    assert t["unknown_pricing_rows"] == 1
    assert t["usage_unavailable_rows"] == 1
    # cost: known rows only
    assert t["cost_usd"] == pytest.approx((1200 + 1400 + 1400 + 1540 + 660 + 625) / 1e6)
    # baseline tokens over the 7 rows with usage (row 5 has none; row 3 counts with 0)
    assert t["baseline_input_tokens"] == 1000 + 2400 + 0 + 5000 + 7000 + 9000 + 11200 == 35600
    assert t["saved_input_tokens"] == 35600 - 9300 == 26300
    # saved_pct = round(100 * 26300 / 35600, 2) = round(73.8764..., 2)
    assert t["saved_pct"] == 73.88
    # dollars over the rows with both a cost and a baseline cost (1, 2, 3, 4, 6, 7)
    assert t["baseline_cost_usd"] == pytest.approx((1200 + 2600 + 0 + 5240 + 6260 + 8125) / 1e6)
    assert t["saved_cost_usd"] == pytest.approx((23425 - 6825) / 1e6)
    # plain JSON
    assert orjson.loads(orjson.dumps(s)) == s


def test_summarize_groups() -> None:
    rows = eight_row_session()
    by_model = summarize(rows, "model")
    assert [g["key"] for g in by_model["groups"]] == ["m1", "mystery"]
    mystery = by_model["groups"][1]
    assert mystery["requests"] == 1
    assert mystery["cost_usd"] is None and mystery["baseline_cost_usd"] is None
    assert mystery["saved_cost_usd"] is None
    assert mystery["saved_pct"] == round(100 * (11200 - 1600) / 11200, 2) == 85.71
    m1 = by_model["groups"][0]
    assert m1["saved_pct"] == round(100 * (24400 - 7700) / 24400, 2)

    by_day = summarize(rows, "day")
    assert [g["key"] for g in by_day["groups"]] == ["2025-03-01", "2025-03-02"]
    assert [g["requests"] for g in by_day["groups"]] == [3, 3]
    assert by_day["groups"][1]["attempts"]["transport-retry"] == 1

    other = make_row(
        book=BOOK, usage=Usage(10, 1), kind="generation", status=200, mode="state", model="m1"
    )
    by_session = summarize([*rows, other], "session")
    assert [g["key"] for g in by_session["groups"]] == ["s1", None]
    assert by_session["totals"]["requests"] == 7

    by_upstream = summarize([r.as_dict() for r in rows], "upstream")  # mappings work too
    assert by_upstream["groups"][0]["key"] == "up"
    assert by_upstream["groups"][0]["saved_pct"] == 73.88


def test_summarize_empty_and_all_unknown() -> None:
    t = summarize([], "model")["totals"]
    assert t["requests"] == 0 and t["cost_usd"] is None and t["saved_pct"] is None
    assert t["baseline_input_tokens"] is None and t["saved_input_tokens"] is None
    rows = [
        make_row(book=BOOK, usage=None, kind="generation", status=502, mode="state"),
        make_row(
            book=BOOK, usage=Usage(5, 5), kind="generation", status=200, mode="state", model="zz"
        ),
    ]
    t = summarize(rows, None)["totals"]
    assert t["cost_usd"] is None  # null, not 0, when nothing could be priced
    assert t["unknown_pricing_rows"] == 1 and t["usage_unavailable_rows"] == 1
    with pytest.raises(ValueError, match="group_by"):
        summarize(rows, "colour")


# --- parse_since --------------------------------------------------------------------------

NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, NOW - 86400),
        ("24h", NOW - 86400),
        ("7d", NOW - 7 * 86400),
        ("30m", NOW - 1800),
        ("90s", NOW - 90),
        ("2w", NOW - 14 * 86400),
        ("1.5h", NOW - 5400),
        (" 12H ", NOW - 43200),
        ("all", 0.0),
        ("2023-11-14T22:13:20Z", 1_700_000_000.0),
        ("2023-11-14T22:13:20+00:00", 1_700_000_000.0),
        ("2023-11-15T00:13:20+02:00", 1_700_000_000.0),
        ("2023-11-14T22:13:20", 1_700_000_000.0),  # naive = UTC
        ("2023-11-14", datetime(2023, 11, 14, tzinfo=timezone.utc).timestamp()),
    ],
)
def test_parse_since(value: str | None, expected: float) -> None:
    assert parse_since(value, NOW) == pytest.approx(expected)


def test_parse_window() -> None:
    assert parse_window(None, None, NOW) == (NOW - 86400, NOW)
    assert parse_window("2h", "1h", NOW) == (NOW - 7200, NOW - 3600)
    assert parse_window("1h", "1h", NOW) == (NOW - 3600, NOW - 3600)  # empty, not backwards
    with pytest.raises(ValueError, match=r"^--since '1h' is after --until '2h': the window is"):
        parse_window("1h", "2h", NOW, ("--since", "--until"))
    with pytest.raises(ValueError, match=r"^since 24h \(the default\) is after until '2020-01-01'"):
        parse_window(None, "2020-01-01", NOW)
    with pytest.raises(ValueError, match=r"invalid until value 'soon'"):
        parse_window("1h", "soon", NOW)


def test_parse_since_default() -> None:
    assert parse_since(None, NOW, default="7d") == NOW - 7 * 86400


@pytest.mark.parametrize(
    "bad",
    ["", "   ", "yesterday", "24", "-5h", "5x", "5 hours", "2023-13-01", "\uff11h", "\u0663d"],
)
def test_parse_since_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match=r"invalid --since value .*24h.*ISO"):
        parse_since(bad, NOW)


# --- render_table -------------------------------------------------------------------------


def test_render_table() -> None:
    console = Console(record=True, width=200, color_system=None)
    render_table(summarize(eight_row_session(), "model"), console)
    out = " ".join(console.export_text().split())  # undo rich's wrapping
    assert "m1" in out and "mystery" in out and "total" in out
    assert "73.9%" in out  # total saved_pct
    assert "not a provider invoice" in out
    assert "1 row(s) with unknown prices" in out
    empty = Console(record=True, width=200, color_system=None)
    render_table(summarize([], None), empty)
    assert "total" in empty.export_text()


def test_render_table_shows_a_clients_model_name_as_plain_text() -> None:
    # A model name is whatever a client sent: "[/]" made `skillstate cost` fail (rich read
    # it as markup), "[link=...]" drew a link, and escape sequences went to the terminal.
    markup = ["[/]", "[bold]loud[/bold]", "[link=http://evil.example]x[/link]"]
    names = [*markup, "\x1b[2Jgone", "a\nb"]
    rows = [
        make_row(book=BOOK, usage=Usage(10, 1), kind="generation", status=200, mode="state",
                 model=name, session="s")
        for name in names
    ]  # fmt: skip
    console = Console(record=True, width=300, color_system="truecolor", force_terminal=True)
    render_table(summarize([r.as_dict() for r in rows], "model"), console)
    shown = console.export_text(styles=True, clear=False)
    plain = console.export_text()
    for name in markup:
        assert name in plain
    assert "\\x1b[2Jgone" in plain and "a\\nb" in plain
    assert "\x1b[2J" not in shown and "\x1b]8;" not in shown  # no screen clear, no hyperlink


def test_summarize_by_client_key_reads_the_session_namespace() -> None:
    def row(session: str | None) -> LedgerRow:
        return make_row(
            book=BOOK, usage=Usage(10, 1), kind="generation", status=200, mode="state",
            model="m1", session=session,
        )  # fmt: skip

    rows = [row("alice:s1"), row("alice:s2"), row("bob:s1"), row("plain"), row(None)]
    assert [r.key for r in rows] == ["alice", "alice", "bob", None, None]
    by_key = summarize([r.as_dict() for r in rows], "key")
    assert [(g["key"], g["requests"]) for g in by_key["groups"]] == [
        ("alice", 2),
        ("bob", 1),
        (None, 2),
    ]
