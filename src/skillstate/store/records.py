"""The records a store keeps, as the rest of the proxy reads and writes them: sessions, their
transitions, stored Responses API responses and ledger rows (with the per-group sums a store
computes for ``/cost``). Plain data: no store, pricing or rendering logic here."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from ..sessions.ids import split_session

Kind = Literal["generation", "rollback-retry", "transport-retry", "stream"]


# ``LedgerRow.pricing`` of a budgeted call's row written before it is sent, and of such a
# row left by a process that died with the call out (``cost.pending``).
PENDING = "pending"
INTERRUPTED = "interrupted"


@dataclass(frozen=True, slots=True)
class SessionRecord:
    session: str
    state: dict[str, Any]
    schema: list[str]
    step: int
    created: float
    updated: float
    state_bytes: int = 0


@dataclass(frozen=True, slots=True)
class TransitionRecord:
    step: int
    status: str  # valid | invalid | tool-noop | format-noop | operator
    patch: Any
    action: str | None
    errors: list[str]
    ts: float
    context: str | None = None  # the context form the turn sent (ContextShape)
    estimate: dict[str, Any] | None = None  # auto's decision and estimates (AutoEstimate)


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A Responses API response kept for ``previous_response_id`` and ``GET /v1/responses``:
    the request's own input items (not its chain's: each link is stored once), the
    response it chained on, and the response object."""

    id: str
    session: str
    created: float
    previous: str | None
    input: list[Any]
    response: dict[str, Any]


@dataclass
class LedgerRow:
    """One upstream attempt. Token fields are None when the upstream reported no usage."""

    ts: float
    session: str | None
    upstream: str | None
    model: str | None
    kind: Kind
    status: int
    input_tokens: int | None
    output_tokens: int | None
    cache_read_tokens: int | None
    cache_write_tokens: int | None
    pricing: str
    cost_usd: float | None
    baseline_input_tokens: int | None
    baseline_cost_usd: float | None
    mode: str
    baseline_cached_tokens: int | None = None  # the baseline's cache reads (in its input)
    baseline_output_tokens: int | None = None  # the output without the envelope's share
    saved_cost_usd: float | None = None  # baseline_cost_usd - cost_usd; negative: cost more
    saved_cost_pct: float | None = None  # of baseline_cost_usd
    context: str | None = None  # the context shape sent (skillstate.choices.ContextShape)
    # The attempt's own id: a row written again (a re-ask's first answer, written before
    # the re-ask, then made the turn's answer again) replaces itself, so every attempt is in
    # the ledger once. None for rows from before it (never replaced).
    row_id: str | None = None
    # A call the provider may bill but whose usage the proxy never saw (``pricing`` is
    # ``usage-unavailable``: the client left with the call out, a stream cut before its usage
    # event, an answer without usage): what it is charged instead, its worst case
    # (``cost.worstcase``). Budgets count it; it is never a measured ``cost_usd``.
    estimated_cost_usd: float | None = None

    @property
    def key(self) -> str | None:
        """The name of the client key that spent this row (None without client keys)."""
        return split_session(self.session)[0] if self.session else None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> LedgerRow:
        """From a dict / sqlite3.Row-like mapping with these field names (extra keys ignored)."""
        return cls(**{f.name: m[f.name] for f in dataclasses.fields(cls)})


@dataclass(frozen=True, slots=True)
class LedgerSums:
    """The sums ``summarize`` needs over the rows of one group and one kind, as a store
    computes them in SQL (``Store.ledger_sums``) instead of handing over every row.

    ``b_*`` are over the rows with a baseline input and an input (B in the module
    docstring; ``b_output_tokens`` counts a row's output when it has no baseline output),
    ``c_*`` over the rows with a cost and a baseline cost (C); ``first_ts`` is the earliest
    row's time (an unexpected kind is listed in ``attempts`` in order of appearance)."""

    key: str | None
    kind: str
    rows: int
    first_ts: float
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    cost_rows: int = 0
    unknown_pricing_rows: int = 0
    usage_unavailable_rows: int = 0
    b_rows: int = 0
    b_input_tokens: int = 0
    b_saved_tokens: int = 0
    b_cached_tokens: int = 0
    b_output_tokens: int = 0
    c_rows: int = 0
    c_baseline_cost_usd: float = 0.0
    c_cost_usd: float = 0.0
    estimated_rows: int = 0  # rows with an estimated_cost_usd
    estimated_cost_usd: float = 0.0


@dataclass(frozen=True, slots=True)
class KeptReply:
    """A turn's reply kept under its ``Idempotency-Key`` (``skillstate.turn.idempotency``),
    written with the turn's commit: what a retry with the same key is answered with.

    ``scope`` is the caller's key namespace and the session id the client named ("" when
    it named none); ``fingerprint`` identifies the request (its route and body), so the
    same key sent with another body is refused. ``body`` is what the client got (a JSON
    body, or a stream's bytes); None when it was too big to keep. ``step``: the step the
    turn committed (None for a turn that keeps no state)."""

    scope: str
    key: str
    fingerprint: str
    session: str
    created: float
    status: int
    stream: bool
    headers: dict[str, str]
    body: bytes | None
    step: int | None = None


@dataclass(frozen=True, slots=True)
class SessionCommit:
    """What one commit of a session writes, atomically (``Store.commit``): the transition
    after ``expected_step`` (refused when the step moved meanwhile), the new ``state`` (None:
    unchanged, or the initial state for a new session), the turn's ledger rows and the reply
    kept under its Idempotency-Key, and the Responses API response the turn stores
    (``store``, for ``previous_response_id``). ``now``: the session's updated time."""

    session: str
    expected_step: int
    state: dict[str, Any] | None
    schema: list[str]
    transition: TransitionRecord
    now: float
    ledger: list[LedgerRow] | None = None
    kept: KeptReply | None = None
    response: StoredResponse | None = None
    # ``state`` as compact JSON, when the turn made it already (``Transition.new_state_json``)
    state_json: bytes | None = None

    def state_blob(self) -> bytes | None:
        """The new state as stored (orjson's compact JSON); None: unchanged. Raises
        ``orjson.JSONEncodeError`` (a TypeError) for a state orjson cannot write."""
        if self.state is None:
            return None
        return self.state_json if self.state_json is not None else orjson.dumps(self.state)
