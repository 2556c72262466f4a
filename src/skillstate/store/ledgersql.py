"""The ledger summed in SQL (``Store.ledger_sums``), one text for every backend (each gives
its own GroupKeys): ``/cost`` and ``skillstate cost`` read one row per group and kind
instead of every ledger row of the window (see ``skillstate.cost.ledger.summarize_sums``
for what the sums become)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..cost.ledger import check_group_by, day_of
from ..sessions.ids import NAMESPACE_SEP
from .records import PENDING, LedgerSums
from .rows import namespace_where

# The namespace separator as an SQL literal, for a backend's GroupKeys.key.
SEPARATOR = f"'{NAMESPACE_SEP}'"


@dataclass(frozen=True, slots=True)
class GroupKeys:
    """A backend's SQL for the group key of a ledger row, as ``skillstate.cost.ledger._key``
    computes it in Python: ``day`` the day number since 1970 in UTC (turned into YYYY-MM-DD
    by sums_of), ``key`` the part of the session id before the namespace separator (None
    without one). Each backend writes its own (its SQL functions differ)."""

    day: str
    key: str

    def of(self, group_by: str) -> str:
        """The expression a ``group_by`` column groups on (``model``, ``mode``: itself)."""
        return {"day": self.day, "key": self.key}.get(group_by, group_by)


# B and C of the module docstring of skillstate.cost.ledger.
_B = "baseline_input_tokens IS NOT NULL AND input_tokens IS NOT NULL"
_C = "baseline_cost_usd IS NOT NULL AND cost_usd IS NOT NULL"

# In LedgerSums field order after key, kind, rows and first_ts.
_SUMS = (
    "coalesce(sum(input_tokens), 0)",
    "coalesce(sum(output_tokens), 0)",
    "coalesce(sum(cache_read_tokens), 0)",
    "coalesce(sum(cache_write_tokens), 0)",
    "coalesce(sum(cost_usd), 0)",
    "count(cost_usd)",
    "coalesce(sum(CASE WHEN pricing = 'unknown' THEN 1 ELSE 0 END), 0)",
    "coalesce(sum(CASE WHEN pricing = 'usage-unavailable' THEN 1 ELSE 0 END), 0)",
    f"count(CASE WHEN {_B} THEN 1 END)",
    f"coalesce(sum(CASE WHEN {_B} THEN baseline_input_tokens END), 0)",
    f"coalesce(sum(CASE WHEN {_B} THEN baseline_input_tokens - input_tokens END), 0)",
    f"coalesce(sum(CASE WHEN {_B} THEN coalesce(baseline_cached_tokens, 0) END), 0)",
    f"coalesce(sum(CASE WHEN {_B} THEN coalesce(baseline_output_tokens, output_tokens, 0) END), 0)",
    f"count(CASE WHEN {_C} THEN 1 END)",
    f"coalesce(sum(CASE WHEN {_C} THEN baseline_cost_usd END), 0)",
    f"coalesce(sum(CASE WHEN {_C} THEN cost_usd END), 0)",
    "count(estimated_cost_usd)",
    "coalesce(sum(estimated_cost_usd), 0)",
)
_FLOATS = {4, 14, 15, 17}  # positions in _SUMS of USD sums


def sums_select(keys: GroupKeys, group_by: str | None) -> str:
    """``SELECT ... FROM ledger`` of the sums per group and kind; the caller appends its
    ``WHERE`` (time window, session, prefix) and then ``GROUP_BY``."""
    check_group_by(group_by)
    key = "NULL" if group_by is None else keys.of(group_by)
    return f"SELECT {key}, kind, count(*), min(ts), {', '.join(_SUMS)} FROM ledger"


GROUP_BY = " GROUP BY 1, 2"


def sums_of(row: Sequence[Any], group_by: str | None) -> LedgerSums:
    """One result row of ``sums_select`` as LedgerSums (PostgreSQL's sums of integers are
    numerics: made ints here)."""
    key, kind, rows, first_ts, *sums = row
    if key is not None:
        key = day_of(int(key)) if group_by == "day" else str(key)
    values: list[Any] = [float(v) if i in _FLOATS else int(v) for i, v in enumerate(sums)]
    return LedgerSums(key, kind, int(rows), float(first_ts), *values)


def ledger_where(
    since: float, until: float, session: str | None, prefix: str | None, mark: str = "?"
) -> tuple[str, list[Any]]:
    """The WHERE clause (and its arguments) of the ledger rows in ``[since, until)``, of
    one session or of the sessions in ``prefix``'s namespace when given (``UNKEYED``: in
    none; ``rows.namespace_where``); ``mark``:
    the backend's placeholder, its ``N`` replaced by the argument's number."""
    args: list[Any] = [since, until]
    # A pending row is a call in flight, or one whose process died before it was marked
    # interrupted (``cost.pending``): not a call /cost can report yet.
    sql = f" WHERE ts >= {mark.replace('N', '1')} AND ts < {mark.replace('N', '2')}"
    sql += f" AND pricing <> '{PENDING}'"
    if session is not None:
        args.append(session)
        sql += f" AND session = {mark.replace('N', str(len(args)))}"
    if prefix:
        low, high = (mark.replace("N", str(n)) for n in (len(args) + 1, len(args) + 2))
        where, range_args = namespace_where("session", prefix, low, high)
        sql += where
        args += range_args
    return sql, args


def spend_select(
    whole: bool, unpriced: tuple[float, float] | None, mark: str = "?", in_flight: bool = False
) -> str:
    """``SELECT`` of what the rows of one session (``whole``: its id is the first argument)
    or one id range (the first two arguments: ``rows.prefix_range``) cost since the next
    argument. A row without usage counts at its estimate (``estimated_cost_usd``); a row
    without a price at ``unpriced`` (input, output USD per million tokens) when given
    (budgets: ``cost.budgets``), else as nothing. ``in_flight``: the pending rows of calls
    in flight are left out (``cost.pending``): those whose id is LIKE the next argument, and
    those from the one after it on."""
    cost = "coalesce(cost_usd, estimated_cost_usd)"
    if unpriced is not None:
        inp, out = (float(v) for v in unpriced)  # floats: safe to write into the SQL
        cost = (
            f"coalesce(cost_usd, estimated_cost_usd, (coalesce(input_tokens, 0) * {inp!r}"
            f" + coalesce(output_tokens, 0) * {out!r}) / 1000000.0)"
        )
    marks = [mark.replace("N", str(i)) for i in (1, 2, 3, 4, 5)]
    if whole:
        sessions, since, more = f"session = {marks[0]}", marks[1], marks[2:]
    else:
        sessions = f"session >= {marks[0]} AND session < {marks[1]}"
        since, more = marks[2], marks[3:]
    sql = f"SELECT coalesce(sum({cost}), 0) FROM ledger WHERE {sessions} AND ts >= {since}"
    if in_flight:
        mine, live = more[:2]
        sql += f" AND (pricing <> '{PENDING}' OR (row_id NOT LIKE {mine} AND ts < {live}))"
    return sql
