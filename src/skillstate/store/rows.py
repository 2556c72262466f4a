"""What every store backend writes the same way: the ledger's columns and the clamping of
their values, the client keys' columns, how a transition, a stored response and an exported
session are read back, the counted tables, id-prefix ranges and the capacity message.

One definition each, so that SQLite and PostgreSQL hold exactly the same data."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from operator import attrgetter
from typing import Any

import orjson

from ..auth.record import KeyRecord
from ..cost.usage import MAX_TOKEN_COUNT
from ..sessions.ids import NAMESPACE_SEP, UNKEYED
from .records import KeptReply, LedgerRow, SessionRecord, StoredResponse, TransitionRecord

LEDGER_COLUMNS = [f.name for f in fields(LedgerRow)]
# What ends every INSERT INTO ledger (both backends): a row written again replaces itself
# (``LedgerRow.row_id``), so an attempt is in the ledger once however often it is written.
LEDGER_CONFLICT = " ON CONFLICT (row_id) DO UPDATE SET " + ", ".join(
    f"{c} = excluded.{c}" for c in LEDGER_COLUMNS if c != "row_id"
)

# Sane ranges for what goes into the store, whatever an upstream reported: SQLite and
# PostgreSQL integers stop at 2^63, and nothing real comes near these ceilings.
MAX_USD = 1e12
MAX_TIME = 253402300799.0  # 9999-12-31T23:59:59Z
MAX_LABEL_CHARS = 256  # model, upstream and other names in a ledger row


# Every ledger row goes through these, a dozen columns per turn: the first line of each is
# the usual case (a value of the exact type, already in range), answered without the
# general checks below it. ``type(x) is`` also keeps bool (an int subclass) off it.


def clamp_count(value: Any, ceiling: int = MAX_TOKEN_COUNT) -> int | None:
    """An int in [0, ceiling], or None for no number (None, NaN, not a number)."""
    if type(value) is int and 0 <= value <= ceiling:
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None
    return int(min(max(value, 0), ceiling))


def clamp_amount(value: Any, ceiling: float = MAX_USD) -> float | None:
    if type(value) is float and 0.0 <= value <= ceiling:  # NaN fails the comparison
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None
    return float(min(max(value, 0.0), ceiling))


def clamp_signed(value: Any, ceiling: float = MAX_USD) -> float | None:
    """A float in [-ceiling, ceiling] (a saving may be negative), None for no number."""
    if type(value) is float and -ceiling <= value <= ceiling:  # NaN fails the comparison
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None
    return float(min(max(value, -ceiling), ceiling))


def clamp_time(value: Any) -> float:
    return clamp_amount(value, MAX_TIME) or 0.0


def _label(value: Any) -> str | None:
    if type(value) is str and len(value) <= MAX_LABEL_CHARS and "\x00" not in value:
        return value  # the usual case (see the clamps above)
    # NUL: PostgreSQL text cannot hold it, so no backend keeps it.
    return None if value is None else str(value)[:MAX_LABEL_CHARS].replace("\x00", "")


def _status(value: Any) -> int:
    return clamp_count(value, 999) or 0


_COLUMN_CLAMPS: dict[str, Callable[[Any], Any]] = {
    "ts": clamp_time,
    "status": _status,
    "input_tokens": clamp_count,
    "output_tokens": clamp_count,
    "cache_read_tokens": clamp_count,
    "cache_write_tokens": clamp_count,
    "cost_usd": clamp_amount,
    "baseline_input_tokens": clamp_count,
    "baseline_cost_usd": clamp_amount,
    "baseline_cached_tokens": clamp_count,
    "baseline_output_tokens": clamp_count,
    "saved_cost_usd": clamp_signed,
    "saved_cost_pct": clamp_signed,
    "estimated_cost_usd": clamp_amount,
}
_LEDGER_CLAMPS = [_COLUMN_CLAMPS.get(name, _label) for name in LEDGER_COLUMNS]
_LEDGER_VALUES = attrgetter(*LEDGER_COLUMNS)  # every column's value in one call

_INTEGER_CLAMPS = (clamp_count, _status)
_REAL_CLAMPS = (clamp_time, clamp_amount, clamp_signed)


def ledger_column_kind(name: str) -> str:
    """``integer``, ``real`` or ``text``: what a ledger column holds (from its clamp)."""
    clamp = _COLUMN_CLAMPS.get(name, _label)
    if clamp in _INTEGER_CLAMPS:
        return "integer"
    return "real" if clamp in _REAL_CLAMPS else "text"


def ledger_tuple(row: LedgerRow) -> tuple[Any, ...]:
    """The row's values in LEDGER_COLUMNS order, clamped to what the store keeps."""
    # Much cheaper than dataclasses.astuple (no deep copy); this runs on every turn.
    values = _LEDGER_VALUES(row)
    return tuple([clamp(v) for clamp, v in zip(_LEDGER_CLAMPS, values, strict=True)])


KEY_COLUMNS = (
    "name, digest, admin, rpm, tpm, budget_usd_per_day, created, expires, revoked,"
    " max_session_budget_usd, allow_unpriced"
)


def key_values(record: KeyRecord) -> tuple[Any, ...]:
    """The key's values in KEY_COLUMNS order."""
    return tuple(getattr(record, c.strip()) for c in KEY_COLUMNS.split(","))


def key_record(row: Any) -> KeyRecord:
    """A KeyRecord from a row of KEY_COLUMNS (a tuple or a database record)."""
    name, digest, admin, rpm, tpm, budget, created, expires, revoked, session_cap, unpriced = row
    return KeyRecord(
        name,
        digest,
        bool(admin),
        rpm,
        tpm,
        budget,
        created,
        expires,
        revoked,
        session_cap,
        bool(unpriced),
    )


# The tables behind ``Store.counts`` (base.COUNTED names them), in that order.
COUNTED_TABLES = (
    "sessions",
    "transitions",
    "ledger",
    "api_keys",
    "responses",
    "session_budgets",
    "idempotency_keys",
)

TRANSITION_COLUMNS = "step, status, patch, action, errors, ts, context, estimate"


def transition_record(r: Any) -> TransitionRecord:
    """A TransitionRecord from a row of TRANSITION_COLUMNS."""
    return TransitionRecord(
        step=r[0],
        status=r[1],
        patch=orjson.loads(r[2]) if r[2] else None,
        action=r[3],
        errors=orjson.loads(r[4]),
        ts=r[5],
        context=r[6],
        estimate=orjson.loads(r[7]) if r[7] else None,
    )


RESPONSE_COLUMNS = "id, session, created, previous, input, response"


def response_values(record: StoredResponse) -> tuple[Any, ...]:
    """The response's values in RESPONSE_COLUMNS order."""
    return (
        record.id,
        record.session,
        record.created,
        record.previous,
        orjson.dumps(record.input),
        orjson.dumps(record.response),
    )


def stored_response(r: Any) -> StoredResponse:
    """A StoredResponse from a row of RESPONSE_COLUMNS."""
    return StoredResponse(r[0], r[1], r[2], r[3], orjson.loads(r[4]), orjson.loads(r[5]))


KEPT_COLUMNS = "scope, key, fingerprint, session, created, status, stream, headers, body, step"


def kept_values(kept: KeptReply) -> tuple[Any, ...]:
    """The kept reply's values in KEPT_COLUMNS order."""
    return (
        kept.scope,
        kept.key,
        kept.fingerprint,
        kept.session,
        clamp_time(kept.created),
        kept.status,
        kept.stream,
        orjson.dumps(kept.headers),
        kept.body,
        kept.step,
    )


def kept_reply(r: Any) -> KeptReply:
    """A KeptReply from a row of KEPT_COLUMNS."""
    body = None if r[8] is None else bytes(r[8])
    return KeptReply(r[0], r[1], r[2], r[3], r[4], r[5], bool(r[6]), orjson.loads(r[7]), body, r[9])


EXPORTED_SESSION_COLUMNS = "id, state, schema, step, created, updated"


def exported_session(r: Any) -> SessionRecord:
    """A SessionRecord (with its state's size) from a row of EXPORTED_SESSION_COLUMNS."""
    return SessionRecord(r[0], orjson.loads(r[1]), orjson.loads(r[2]), r[3], r[4], r[5], len(r[1]))


def namespace_where(column: str, prefix: str, low: str, high: str) -> tuple[str, tuple[str, ...]]:
    """`` AND`` the condition that ``column`` is an id in ``prefix``'s namespace, and its
    arguments (for the placeholders ``low`` and ``high``): the ids that start with it
    (``prefix_range``), or for ``UNKEYED`` the ids (or ledger rows) in no namespace: no
    separator, as ``split_session`` and the backends' ``GroupKeys.key`` read them (a scan;
    ``:`` is no LIKE wildcard)."""
    if prefix == UNKEYED:
        return f" AND ({column} IS NULL OR {column} NOT LIKE '%{NAMESPACE_SEP}%')", ()
    return f" AND {column} >= {low} AND {column} < {high}", prefix_range(prefix)


def prefix_range(prefix: str) -> tuple[str, str]:
    """The id range ``[low, high)`` of the strings that start with ``prefix`` (an index
    range scan, unlike LIKE)."""
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)


def full_message(limit: int) -> str:
    return (
        f"the store holds its maximum of {limit} sessions (max_sessions); delete some"
        " (DELETE /state?session=ID), wait for session_ttl to expire them, or raise max_sessions"
    )


def response_chain_sql(id_param: str, limit_param: str) -> str:
    """A response and the ones it chains on, oldest first, in one query (the backends'
    own placeholders for the id and the limit)."""
    return f"""
WITH RECURSIVE chain(id, session, created, previous, input, response, depth) AS (
    SELECT id, session, created, previous, input, response, 1 FROM responses
    WHERE id = {id_param}
    UNION ALL
    SELECT r.id, r.session, r.created, r.previous, r.input, r.response, chain.depth + 1
    FROM responses r JOIN chain ON r.id = chain.previous
    WHERE chain.depth < {limit_param}
)
SELECT id, session, created, previous, input, response FROM chain ORDER BY depth DESC
"""
