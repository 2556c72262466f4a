"""The usage / cost / savings ledger: pure logic (persistence and HTTP live elsewhere).

Token semantics
---------------
``Usage.input_tokens`` is ALL input tokens of a call, *including* cache reads and cache
writes; ``cache_read_tokens`` and ``cache_write_tokens`` are the parts of it that were read
from / written to the provider's prompt cache. Each dialect's usage parser
(``skillstate.dialects.openai.usage_from_openai``, ``...anthropic.usage_from_anthropic``)
normalises its provider's convention to this.

Rows
----
One ``LedgerRow`` per upstream attempt. Exactly one row per client turn has kind
``"generation"`` (non-streamed) or ``"stream"`` (streamed): the attempt whose answer went to the
client (when none answered, the last attempt: ``TurnMeter.unanswered``). Every other attempt
the proxy made is a ``"rollback-retry"`` (re-ask after an invalid state patch) or a
``"transport-retry"`` (re-send after a transport/5xx/429 failure) row.

Baseline (what the turn would have cost WITHOUT the proxy)
----------------------------------------------------------
Without making a second upstream call, the baseline input of a turn row is the upstream's
*reported* input scaled by the estimated size ratio of two request bodies, both measured
with the same estimator (``skillstate.cost.tokens.estimate_tokens``)::

    baseline_input_tokens = round(actual_input * est_transcript / est_sent)

(exact rational arithmetic, Python's round-half-to-even; ``est_sent <= 0`` -> ``actual_input``),
where ``est_transcript`` is the client's transcript with every envelope the proxy caused
removed (``skillstate.engine.stripper.strip_transcript``). A ``mask`` turn (context ``mask``)
instead adds the difference::

    baseline_input_tokens = actual_input + est_transcript - est_sent   (at least 0)

because its request IS the client's transcript with some observations' content replaced by
a placeholder: the tool definitions, the system, every message's framing and whatever the
provider counts that the estimator does not are in both requests, and ``actual_input``
already has them once. Scaling would multiply them by the compression ratio: on the demo's
30th turn the masked request was 2,964 tokens for 2,408 estimated, the transcript 13,225 for
12,647; scaled, its baseline was 15,567 tokens, by the difference 13,203, and the demo's /cost
said mask saved $0.0074 where it cost $0.0022 more. The masked text itself is counted at the
estimator's rate (a provider's tokenizer may count it differently, by its own bytes per
token on that text).

The turn's meter then models the provider's prompt cache for that transcript
(``skillstate.cost.baseline``: per session, the prefix the previous baseline request left
in the cache, under the upstream's ``cache_pricing``, ``cache_ttl_s`` and
``cache_min_tokens``) and removes the envelope's share from the output tokens;
``baseline_cached_tokens``, ``baseline_output_tokens`` and ``baseline_cost_usd`` are that
model's figures, priced with the model's cache read/write rates. When the turn sent the
client's body untouched (nothing added, nothing to strip),
the baseline IS the turn: the same tokens and cost, a zero saving.

``saved_cost_usd = baseline_cost_usd - cost_usd`` and ``saved_cost_pct`` (of the baseline
cost) are NEGATIVE when the proxy cost more: they are never clamped.

A row made without the cache model (``make_row`` alone) keeps the cache fields and output
of the call and prices the extra (or missing) input at the plain input rate::

    baseline_cost_usd = max(0, cost_usd + (baseline_input - actual_input) * input_per_mtok / 1e6)

Retry rows (both kinds) get ``baseline_input_tokens = 0`` and ``baseline_cost_usd = 0.0``: the
client talking to the upstream directly would not have made that attempt, so every extra
attempt counts in full AGAINST the savings.

Summary arithmetic (what ``summarize`` reports, for a set of rows)
------------------------------------------------------------------
* ``requests`` = number of rows of kind generation or stream; ``attempts`` = rows per kind.
* token sums are over rows with usage (``usage_unavailable_rows`` counts the others).
* ``cost_usd`` = sum of the non-null ``cost_usd``; null if no row has a cost. It is what
  the provider's reported usage measured: a call it may bill without reporting usage (a
  ``usage-unavailable`` row of a cut or answered call) is not in it but in
  ``estimated_cost_usd`` = sum of the non-null ``estimated_cost_usd`` (null if none), its
  worst case (``skillstate.cost.worstcase``). Budgets count both (``store.ledgersql``).
* B = rows with non-null ``baseline_input_tokens`` and ``input_tokens``::

      baseline_input_tokens = sum(row.baseline_input_tokens for row in B)
      saved_input_tokens    = sum(row.baseline_input_tokens - row.input_tokens for row in B)
      saved_pct             = round(100 * saved_input_tokens / baseline_input_tokens, 2)

  (null if B is empty or its baseline sum is 0; negative when the proxy cost more).
* C = rows with non-null ``cost_usd`` and ``baseline_cost_usd``::

      baseline_cost_usd = sum(row.baseline_cost_usd for row in C)
      saved_cost_usd    = baseline_cost_usd - sum(row.cost_usd for row in C)
      saved_cost_pct    = round(100 * saved_cost_usd / baseline_cost_usd, 2)

  (negative when the proxy cost more; the % null when the baseline cost is 0).
  ``baseline_cached_tokens`` and ``baseline_output_tokens`` are sums over B.

USD figures are rounded to 9 decimals to drop float noise.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Protocol

from skillstate.choices import GroupBy
from skillstate.cost.baseline import round_ratio
from skillstate.cost.pricing import PriceBook, Priced, Prices
from skillstate.cost.usage import Usage
from skillstate.store.records import Kind, LedgerRow, LedgerSums

if TYPE_CHECKING:
    from skillstate.cost.baseline import Baseline

__all__ = [
    "GROUP_BY",
    "KINDS",
    "NOTE",
    "Usage",
    "baseline_cost_usd",
    "baseline_input_tokens",
    "make_row",
    "parse_since",
    "parse_window",
    "summarize",
    "summarize_sums",
]

KINDS: tuple[Kind, ...] = ("generation", "stream", "rollback-retry", "transport-retry")
TURN_KINDS: frozenset[str] = frozenset({"generation", "stream"})
RETRY_KINDS: frozenset[str] = frozenset({"rollback-retry", "transport-retry"})
GROUP_BY: tuple[str, ...] = GroupBy.values()

NOTE = (
    "Local estimate from upstream-reported token usage and bundled (genai-prices) or "
    "configured list prices; not a provider invoice. Baseline = the client's transcript "
    "without the proxy's envelopes (input scaled from the reported usage), with the "
    "provider's prompt cache modelled per session (reads/writes at cache prices) and the "
    "envelope's share taken off the output; retries count as extra spend with a zero baseline. "
    "estimated_cost_usd: calls the provider reported no usage for (cut by the client, or "
    "answered without usage), at their worst case; not in cost_usd, counted by budgets."
)

BASELINE_MODEL_NOTE = (
    "Baseline: your transcript without the proxy's envelopes, prompt cache modelled per "
    "session as the provider bills it (TTL, minimum prefix, reads/writes at cache prices)."
)


# --- rows ---------------------------------------------------------------------------------


class BaselineModel(Protocol):
    """The cache-aware baseline of one answered attempt (``skillstate.cost.meter``):
    (scaled baseline input, the call's usage, the model's rates, the call's cost) ->
    the baseline's tokens and cost."""

    def __call__(
        self, baseline_input: int, usage: Usage, prices: Prices | None, cost_usd: float | None
    ) -> Baseline: ...


# The context shapes whose request is the client's transcript, message for message, with
# some contents replaced: their baseline adds the estimated difference (module docstring).
SAME_MESSAGES_SHAPES: frozenset[str] = frozenset({"mask"})


def baseline_input_tokens(
    actual_input: int, est_transcript: int, est_sent: int, context: str | None = None
) -> int:
    """``round(actual_input * est_transcript / est_sent)`` (``actual_input`` if est_sent
    <= 0); for a ``context`` in ``SAME_MESSAGES_SHAPES``, ``actual_input + est_transcript -
    est_sent``, at least 0 (see the module docstring)."""
    if context in SAME_MESSAGES_SHAPES:
        return max(actual_input + est_transcript - est_sent, 0)
    if est_sent <= 0:
        return actual_input
    return round_ratio(actual_input * max(est_transcript, 0), est_sent)


def baseline_cost_usd(
    cost_usd: float | None, prices: Prices | None, actual_input: int, baseline_input: int
) -> float | None:
    """This row's cost with input replaced by ``baseline_input``, the difference priced at the
    full plain input rate (see module docstring); None when the cost or rates are unknown.
    A cost is never below 0; the saving against it is never clamped (``saved_cost``)."""
    if cost_usd is None or prices is None:
        return None
    return max(0.0, cost_usd + (baseline_input - actual_input) * prices.input_per_mtok / 1e6)


def saved_cost(
    baseline_cost: float | None, cost: float | None
) -> tuple[float | None, float | None]:
    """(saved USD, saved % of the baseline cost): negative when the proxy cost more, never
    clamped; None when a cost is unknown (the % also when the baseline cost is 0)."""
    if baseline_cost is None or cost is None:
        return None, None
    saved = baseline_cost - cost
    pct = round(100 * saved / baseline_cost, 2) if baseline_cost else None
    return round(saved, 9), pct


def _baseline(
    kind: Kind,
    u: Usage | None,
    priced: Priced,
    est_transcript: int | None,
    est_sent: int | None,
    baseline_model: BaselineModel | None,
    context: str | None,
) -> tuple[int | None, int | None, int | None, float | None]:
    """A row's baseline: input, cached and output tokens, and USD (None: not computed)."""
    if u is None:
        return None, None, None, None
    if kind in RETRY_KINDS:
        return 0, 0, 0, (0.0 if priced.cost_usd is not None else None)
    if est_transcript is None or est_sent is None:
        return None, None, None, None
    b_in = baseline_input_tokens(u.input_tokens, est_transcript, est_sent, context)
    if baseline_model is not None:
        modelled = baseline_model(b_in, u, priced.prices, priced.cost_usd)
        return b_in, modelled.cache_read_tokens, modelled.output_tokens, modelled.cost_usd
    b_cost = baseline_cost_usd(priced.cost_usd, priced.prices, u.input_tokens, b_in)
    return b_in, u.cache_read_tokens, u.output_tokens, b_cost


def make_row(
    *,
    book: PriceBook,
    usage: Usage | None,
    kind: Kind,
    status: int,
    mode: str,
    session: str | None = None,
    upstream: str | None = None,
    model: str | None = None,
    est_transcript: int | None = None,
    est_sent: int | None = None,
    provider_hint: str | None = None,
    ts: float | None = None,
    baseline_model: BaselineModel | None = None,
    context: str | None = None,
    row_id: str | None = None,
    estimated_cost_usd: float | None = None,
) -> LedgerRow:
    """Price one attempt and compute its baseline.

    ``est_transcript`` / ``est_sent`` are ``estimate_tokens`` of the client's transcript
    (envelopes removed) and of the body actually sent upstream; leave them None when there is
    nothing to compare (the row then has no baseline). ``baseline_model``, when given, turns
    the scaled baseline input into the cache-aware baseline (see module docstring). Retry
    kinds always get a zero baseline. ``estimated_cost_usd``: what a call the provider may
    bill is charged when it reported no usage (kept only on such a row).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown ledger row kind {kind!r}; expected one of {KINDS}")
    ts = time.time() if ts is None else ts
    priced = book.price(
        usage,
        model=model,
        upstream=upstream,
        provider_hint=provider_hint,
        at=datetime.fromtimestamp(ts, tz=timezone.utc),
    )
    u = usage if priced.status != "usage-unavailable" else None
    b_in, b_cached, b_out, b_cost = _baseline(
        kind, u, priced, est_transcript, est_sent, baseline_model, context
    )
    saved, saved_pct = saved_cost(b_cost, priced.cost_usd)
    return LedgerRow(
        ts=ts,
        session=session,
        upstream=upstream,
        model=model,
        kind=kind,
        status=status,
        input_tokens=None if u is None else u.input_tokens,
        output_tokens=None if u is None else u.output_tokens,
        cache_read_tokens=None if u is None else u.cache_read_tokens,
        cache_write_tokens=None if u is None else u.cache_write_tokens,
        pricing=priced.status,
        cost_usd=priced.cost_usd,
        baseline_input_tokens=b_in,
        baseline_cost_usd=b_cost,
        mode=mode,
        baseline_cached_tokens=b_cached,
        baseline_output_tokens=b_out,
        saved_cost_usd=saved,
        saved_cost_pct=saved_pct,
        context=context,
        row_id=row_id,
        estimated_cost_usd=estimated_cost_usd if priced.status == "usage-unavailable" else None,
    )


# --- summary ------------------------------------------------------------------------------


def _usd(v: float) -> float:
    return round(v, 9)


class _Acc:
    __slots__ = (
        "attempts",
        "b_cached",
        "b_cost",
        "b_cost_actual",
        "b_in",
        "b_out",
        "b_saved",
        "c_rows",
        "cache_read",
        "cache_write",
        "cost",
        "cost_rows",
        "estimated",
        "estimated_rows",
        "inp",
        "out",
        "requests",
        "unavailable",
        "unknown",
    )

    def __init__(self) -> None:
        self.requests = 0
        self.attempts: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.inp = self.out = self.cache_read = self.cache_write = 0
        self.cost = 0.0
        self.cost_rows = 0
        self.unknown = self.unavailable = 0
        self.b_in: int | None = None
        self.b_saved = 0
        self.b_cached = self.b_out = 0
        self.b_cost = self.b_cost_actual = 0.0
        self.c_rows = 0
        self.estimated = 0.0
        self.estimated_rows = 0

    def add(self, r: LedgerRow) -> None:
        if r.kind in TURN_KINDS:
            self.requests += 1
        self.attempts[r.kind] = self.attempts.get(r.kind, 0) + 1
        self.inp += r.input_tokens or 0
        self.out += r.output_tokens or 0
        self.cache_read += r.cache_read_tokens or 0
        self.cache_write += r.cache_write_tokens or 0
        if r.cost_usd is not None:
            self.cost += r.cost_usd
            self.cost_rows += 1
        if r.pricing == "unknown":
            self.unknown += 1
        elif r.pricing == "usage-unavailable":
            self.unavailable += 1
        if r.estimated_cost_usd is not None:
            self.estimated += r.estimated_cost_usd
            self.estimated_rows += 1
        if r.baseline_input_tokens is not None and r.input_tokens is not None:
            self.b_in = (self.b_in or 0) + r.baseline_input_tokens
            self.b_saved += r.baseline_input_tokens - r.input_tokens
            self.b_cached += r.baseline_cached_tokens or 0
            self.b_out += (
                r.baseline_output_tokens
                if r.baseline_output_tokens is not None
                else r.output_tokens or 0
            )
        if r.baseline_cost_usd is not None and r.cost_usd is not None:
            self.b_cost += r.baseline_cost_usd
            self.b_cost_actual += r.cost_usd
            self.c_rows += 1

    def add_sums(self, s: LedgerSums) -> None:
        """What ``add`` would have done for each of the ``s.rows`` rows ``s`` sums up."""
        if s.kind in TURN_KINDS:
            self.requests += s.rows
        self.attempts[s.kind] = self.attempts.get(s.kind, 0) + s.rows
        self.inp += s.input_tokens
        self.out += s.output_tokens
        self.cache_read += s.cache_read_tokens
        self.cache_write += s.cache_write_tokens
        self.cost += s.cost_usd
        self.cost_rows += s.cost_rows
        self.unknown += s.unknown_pricing_rows
        self.unavailable += s.usage_unavailable_rows
        if s.b_rows:
            self.b_in = (self.b_in or 0) + s.b_input_tokens
            self.b_saved += s.b_saved_tokens
            self.b_cached += s.b_cached_tokens
            self.b_out += s.b_output_tokens
        self.b_cost += s.c_baseline_cost_usd
        self.b_cost_actual += s.c_cost_usd
        self.c_rows += s.c_rows
        self.estimated += s.estimated_cost_usd
        self.estimated_rows += s.estimated_rows

    def result(self) -> dict[str, Any]:
        has_b = self.b_in is not None
        saved, saved_pct = saved_cost(self.b_cost, self.b_cost_actual)
        return {
            "requests": self.requests,
            "attempts": dict(self.attempts),
            "input_tokens": self.inp,
            "output_tokens": self.out,
            "cache_read_tokens": self.cache_read,
            "cache_write_tokens": self.cache_write,
            "cost_usd": _usd(self.cost) if self.cost_rows else None,
            "unknown_pricing_rows": self.unknown,
            "usage_unavailable_rows": self.unavailable,
            "estimated_cost_usd": _usd(self.estimated) if self.estimated_rows else None,
            "baseline_input_tokens": self.b_in,
            "saved_input_tokens": self.b_saved if has_b else None,
            "saved_pct": (round(100 * self.b_saved / self.b_in, 2) if self.b_in else None),
            "baseline_cached_tokens": self.b_cached if has_b else None,
            "baseline_output_tokens": self.b_out if has_b else None,
            "baseline_cost_usd": _usd(self.b_cost) if self.c_rows else None,
            "saved_cost_usd": saved if self.c_rows else None,
            "saved_cost_pct": saved_pct if self.c_rows else None,
        }


def _day(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).date().isoformat()


def _key(r: LedgerRow, group_by: str) -> str | None:
    if group_by == "day":
        return _day(r.ts)
    v = getattr(r, group_by)
    return None if v is None else str(v)


def summarize(
    rows: Iterable[LedgerRow | Mapping[str, Any]], group_by: str | None = None
) -> dict[str, Any]:
    """Totals (and groups) of ledger rows; see the module docstring for every formula.

    Returns ``{"group_by", "totals": {...}, "groups": [{"key": ..., **metrics}, ...], "note"}``
    with groups sorted by key (null key last). ``group_by`` is None or one of ``GROUP_BY``
    (``day`` = UTC date, ``YYYY-MM-DD``). Rows may also be mappings with the field names.
    """
    check_group_by(group_by)
    total = _Acc()
    groups: dict[str | None, _Acc] = {}
    for raw in rows:
        r = raw if isinstance(raw, LedgerRow) else LedgerRow.from_mapping(raw)
        total.add(r)
        if group_by is not None:
            k = _key(r, group_by)
            acc = groups.get(k)
            if acc is None:
                acc = groups[k] = _Acc()
            acc.add(r)
    return _summary(group_by, total, groups)


def _summary(group_by: str | None, total: _Acc, groups: dict[str | None, _Acc]) -> dict[str, Any]:
    ordered = sorted(groups.items(), key=lambda kv: (kv[0] is None, kv[0] or ""))
    return {
        "group_by": group_by,
        "totals": total.result(),
        "groups": [{"key": k, **acc.result()} for k, acc in ordered],
        "note": NOTE,
    }


def check_group_by(group_by: str | None) -> None:
    """Raise ValueError unless ``group_by`` is None or one of ``GROUP_BY``."""
    if group_by is not None and group_by not in GROUP_BY:
        raise ValueError(f"group_by must be one of {', '.join(GROUP_BY)}, got {group_by!r}")


def summarize_sums(sums: Iterable[LedgerSums], group_by: str | None = None) -> dict[str, Any]:
    """``summarize`` of the rows whose per-group, per-kind sums are ``sums``: the same
    output, the same figures (USD sums may differ in the last bits of a float before
    rounding to 9 decimals: SQL adds them in another order)."""
    check_group_by(group_by)
    total = _Acc()
    groups: dict[str | None, _Acc] = {}
    for s in sorted(sums, key=lambda s: s.first_ts):
        total.add_sums(s)
        if group_by is not None:
            acc = groups.get(s.key)
            if acc is None:
                acc = groups[s.key] = _Acc()
            acc.add_sums(s)
    return _summary(group_by, total, groups)


def day_of(epoch_day: int) -> str:
    """The ``day`` group key (UTC ``YYYY-MM-DD``) of day number ``epoch_day`` since 1970."""
    return (
        (datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(days=epoch_day)).date().isoformat()
    )


# --- --since --------------------------------------------------------------------------------

# Digits 0-9 only (``\d`` is every script's, and float() takes them all).
_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*([smhdw])$", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(
    value: str | None, now: float, default: str = "24h", *, name: str = "--since"
) -> float:
    """Start (or, for ``--until``, end) of a time window as a unix timestamp.

    Accepts a duration back from ``now`` (``90s``, ``30m`` = minutes, ``24h``, ``7d``, ``2w``;
    decimals allowed), an ISO 8601 date or time (``2025-01-31``, ``2025-01-31T12:00:00Z``,
    ``...+02:00``; naive values are UTC), or ``all`` (0.0). None uses ``default``.
    Raises ``ValueError`` naming the option (``name``), the bad value and the accepted forms.
    """
    text = (default if value is None else value).strip()
    if text.lower() == "all":
        return 0.0
    m = _DURATION.match(text)
    if m:
        return now - float(m[1]) * _UNIT_SECONDS[m[2].lower()]
    iso = text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text
    try:
        if not text or text[0] in "+-":
            raise ValueError(text)
        dt = datetime.fromisoformat(iso)
    except ValueError:
        raise ValueError(
            f"invalid {name} value {text!r}: use a duration such as 90s, 30m, 24h, 7d or 2w, "
            "an ISO time such as 2025-01-31 or 2025-01-31T12:00:00Z, or 'all'"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def parse_window(
    since: str | None, until: str | None, now: float, names: tuple[str, str] = ("since", "until")
) -> tuple[float, float]:
    """The ``[since, until)`` window of a ledger read (``parse_since``'s forms; no ``until``:
    ``now``). ValueError naming the option (``names``) when a value is not one of those
    forms, or when the window ends before it starts (an empty report would hide the slip)."""
    start = parse_since(since, now, name=names[0])
    end = parse_since(until, now, name=names[1]) if until else now
    if start > end:
        began = "24h (the default)" if since is None else repr(since)
        raise ValueError(f"{names[0]} {began} is after {names[1]} {until!r}: the window is empty")
    return start, end
