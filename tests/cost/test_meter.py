"""TurnMeter: the rows of one turn (unit tests; the pipeline's use is tested end to end)."""

from __future__ import annotations

from skillstate.cost.ledger import Usage
from skillstate.cost.meter import MeterContext, TurnMeter
from skillstate.cost.pricing import PriceBook, PriceOverride
from skillstate.upstream.client import AttemptRecord

BOOK = PriceBook(overrides_by_model={"m": PriceOverride(input_per_mtok=1.0, output_per_mtok=2.0)})
CTX = MeterContext(session="s", mode="state", model="m", est_client=400)


def answer(meter: TurnMeter, tokens: int) -> None:
    meter.answered(
        upstream="u",
        provider_hint=None,
        usage=Usage(tokens, 10),
        status=200,
        model="m",
        est_sent=100,
    )


def test_a_re_ask_relabels_the_discarded_answer_and_the_last_answer_is_the_generation() -> None:
    meter = TurnMeter(BOOK, CTX)
    meter.failed("u", 503)
    answer(meter, 100)
    meter.discard_last()
    answer(meter, 120)
    kinds = [r.kind for r in meter.rows]
    assert kinds == ["transport-retry", "rollback-retry", "generation"]
    assert meter.rows[1].baseline_input_tokens == 0 and meter.rows[1].input_tokens == 100
    assert meter.rows[2].baseline_input_tokens == 480  # 120 * 400 / 100


def test_restore_brings_back_the_discarded_answer_after_a_failed_re_ask() -> None:
    meter = TurnMeter(BOOK, CTX)
    answer(meter, 100)
    meter.discard_last()
    meter.failed("u", 502)
    meter.restore()
    assert [r.kind for r in meter.rows] == ["generation", "transport-retry"]
    assert meter.rows[0].baseline_input_tokens == 400
    assert meter.headers()["x-skillstate-saved-tokens"] == "300"


def test_a_call_no_attempt_answered_keeps_its_last_attempt_as_the_turns_row() -> None:
    lost = [AttemptRecord("u", 0, "cut", billed=True), AttemptRecord("v", 0, "cut", billed=True)]
    meter = TurnMeter(BOOK, CTX)
    meter.unanswered(lost)
    assert [(r.kind, r.upstream) for r in meter.rows] == [
        ("transport-retry", "u"),
        ("generation", "v"),
    ]
    assert meter.answered_yet
    # A re-ask that no attempt answered: the turn keeps the answer it had, so all retries.
    meter = TurnMeter(BOOK, CTX)
    answer(meter, 100)
    meter.discard_last()
    meter.unanswered(lost)
    meter.restore()
    assert [r.kind for r in meter.rows] == ["generation", "transport-retry", "transport-retry"]
    meter = TurnMeter(BOOK, CTX)
    meter.unanswered([])  # nothing was sent (every circuit open): no row, no answer
    assert meter.rows == [] and not meter.answered_yet


def test_rows_the_commit_took_are_not_flushed_again() -> None:
    meter = TurnMeter(BOOK, CTX)
    answer(meter, 100)
    assert len(meter.unwritten()) == 1
    meter.mark_written()
    assert meter.unwritten() == [] and len(meter.rows) == 1
    meter.failed("u", 500)
    assert [r.status for r in meter.unwritten()] == [500]


def test_a_call_without_usage_is_charged_what_its_budget_held_or_its_worst_case() -> None:
    from skillstate.cost.worstcase import WorstCase
    from skillstate.errors import CLIENT_CLOSED

    meter = TurnMeter(BOOK, CTX, WorstCase(BOOK, 1_000))
    meter.sending(100, {"max_tokens": 50}, None)  # no budget: its worst case at the price
    meter.failed("u", 503)  # refused: the provider bills nothing
    meter.cancelled([_Cut()])  # cut with the call out: it may bill it
    worst = (100 * 1.25 * 1.0 + 50 * 2.0) / 1e6
    assert [r.estimated_cost_usd for r in meter.rows] == [None, worst]
    assert meter.rows[1].status == CLIENT_CLOSED and meter.rows[1].cost_usd is None
    meter.sending(100, {"max_tokens": 50}, 0.75)  # a budget held 0.75
    meter.answered(upstream="u", provider_hint=None, usage=None, status=200, model="m", est_sent=1)
    assert meter.rows[2].estimated_cost_usd == 0.75
    assert meter.headers()["x-skillstate-estimated-cost-usd"] == f"{worst + 0.75:.8f}"
    answer(meter, 100)  # measured: no estimate
    assert meter.rows[3].estimated_cost_usd is None


def test_a_fold_set_aside_is_an_extra_attempt_and_a_new_meter_takes_the_rows_over() -> None:
    meter = TurnMeter(BOOK, CTX)
    answer(meter, 100)
    meter.set_aside()
    assert not meter.answered_yet and [r.kind for r in meter.rows] == ["rollback-retry"]
    meter.mark_written()
    later = TurnMeter(BOOK, CTX)
    later.take_over(meter)
    answer(later, 120)
    assert [r.kind for r in later.rows] == ["rollback-retry", "generation"]
    assert [r.input_tokens for r in later.unwritten()] == [120]  # the first was written


class _Cut:
    upstream = "u"
    status = 499
    billed = True


def test_row_ids_grow_with_time_and_differ_within_a_millisecond(monkeypatch) -> None:
    """Row ids lead with the time (the ledger's unique index is appended to, not written at
    random pages) and stay 32 hex digits, unique however close together they are made."""
    clock = iter([1_700_000_000_123_000_000, 1_700_000_000_123_400_000, 1_700_000_000_124_000_000])
    monkeypatch.setattr("time.time_ns", lambda: next(clock))
    meter = TurnMeter(BOOK, CTX)
    for tokens in (100, 110, 120):
        answer(meter, tokens)
    ids = [r.row_id for r in meter.rows]
    assert all(i is not None and len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert ids[0] != ids[1] and ids[0][:12] == ids[1][:12] == f"{1_700_000_000_123:012x}"
    assert ids[2] > ids[1] and ids[2] > ids[0]
