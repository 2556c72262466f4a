"""What the stages of one turn hand each other: the parsed request (``Turn``), the replies
(``Reply``, ``StreamReply``), what the stages share (``TurnMeta``) and one upstream answer
(``Answer``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import InitVar, dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ..choices import ContextShape, Mode
from ..cost.auto import AutoEstimate
from ..cost.meter import TurnMeter
from ..dialects.base import Dialect as Wire
from ..dialects.registry import get_dialect
from ..engine import constrain
from ..engine.context import EnvelopeForm
from ..engine.patch import Envelope
from ..engine.stripper import Stripped
from ..engine.verdict import Outcome
from ..observability.telemetry import NO_TELEMETRY, TurnTelemetry
from ..sessions.locks import Hold
from ..upstream.client import Exchange

if TYPE_CHECKING:
    from ..cost.budgets import TurnBudgets
    from ..sessions.transcripts import TranscriptText
    from .idempotency import Idempotency
    from .stored import StoredLink
    from .window import WindowTurn


@dataclass(frozen=True, slots=True)
class ClientBytes:
    """The request body as the client sent it (decoded), and the dict it was parsed into.
    While the body to send upstream is still that dict (a body the proxy changes is another
    dict: every change makes a copy), it is sent as these bytes: not serialised again, and
    byte for byte what the client wrote. Made only for bytes shown to hold no key twice
    (``sessions.transcripts.TranscriptText.vouches_for_raw``): a parser that keeps a
    repeated key's first value, or refuses it, would read other bytes otherwise than the
    proxy (``jsonkeys``), which then sends its own serialisation of what it read."""

    body: dict[str, Any]
    raw: bytes

    def of(self, body: dict[str, Any]) -> bytes | None:
        """These bytes, if ``body`` is the dict they were parsed into."""
        return self.raw if body is self.body else None


@dataclass
class Turn:
    """A parsed client request."""

    dialect: str  # "openai" | "anthropic"
    body: dict[str, Any]
    headers: Mapping[str, str]  # lower-case names
    session: str  # the store's id (namespaced by the caller's key: skillstate.auth.tenancy)
    mode: Mode
    constrain: bool = False
    telemetry: TurnTelemetry = NO_TELEMETRY  # /metrics and traces (skillstate.telemetry)
    client_session: str | None = None  # the id the client sent, when it differs from session
    budgets: TurnBudgets | None = None  # the key's and the session's (cost/budgets.py)
    # A context form fixed by the caller instead of the mode's: a compaction's checkpoint
    # sends the whole transcript with the contract (skillstate.compaction).
    shape: ContextShape | None = None
    # The session's own mode, for a turn run in another on its behalf (a compaction's
    # checkpoint runs as a window or state turn): what the ledger and replies name.
    session_mode: Mode | None = None
    idempotency: Idempotency | None = None  # its Idempotency-Key (turn/idempotency.py)
    # A native endpoint of the client's API to call instead of its dialect's turn path (a
    # passthrough turn: ``POST /responses/compact`` to a Responses upstream).
    upstream_path: str | None = None
    # The client's transcript as compact JSON, made by the request checks: the planner's
    # transcript results reuse it (skillstate.sessions.transcripts).
    transcript: TranscriptText | None = None
    # A Responses turn's response to store (``store``): written with the turn's commit.
    stored: StoredLink | None = None
    # The store id the proxy made up for this request, which named no session (None when it
    # named one): see ``new_session``.
    minted_session: str | None = None
    # The body's bytes as they came (skillstate.upstream.client.Outbound sends them as is).
    client_bytes: ClientBytes | None = None
    # The client's dialect object, when whoever made the turn already looked it up (the
    # request checks use it): ``wire`` is then that object, not a second lookup.
    looked_up: InitVar[Wire | None] = None

    def __post_init__(self, looked_up: Wire | None) -> None:
        if looked_up is not None:
            assert looked_up.name == self.dialect, (looked_up.name, self.dialect)
            self.__dict__["wire"] = looked_up  # what the cached property would have stored

    @property
    def new_session(self) -> bool:
        """Whether the turn's session is the one the proxy made up for it (nothing resolved
        it to another: a compaction block, a previous response): a random id that nothing
        can be stored under yet, so there is nothing of it to read (its budget)."""
        return self.minted_session is not None and self.minted_session == self.session

    @property
    def shown_session(self) -> str:
        """The session id the client knows (what the session header answers)."""
        return self.client_session or self.session

    @property
    def stream(self) -> bool:
        """Whether the client asked for a streamed (SSE) reply. Not from a native endpoint
        (``upstream_path``): ``/responses/compact`` answers JSON, read whole (the body, a
        ``stream`` field included, still goes upstream as it came)."""
        return self.upstream_path is None and bool(self.body.get("stream"))

    @property
    def model(self) -> str:
        """The model the client asked for ("" when the body names none)."""
        m = self.body.get("model")
        return m if isinstance(m, str) else ""

    @property
    def recorded_mode(self) -> Mode:
        """The mode the turn is recorded under: the session's (see ``session_mode``)."""
        return self.session_mode or self.mode

    @property
    def keeps_state(self) -> bool:
        """Whether this turn's mode keeps the session's state (and so holds its lock)."""
        return self.mode in (Mode.STATE, Mode.AUTO, Mode.WINDOW)

    @cached_property
    def envelope_form(self) -> EnvelopeForm:
        """How the reply carries the envelope (see skillstate.engine.context.EnvelopeForm):
        not at all when the request brought its own output format, or asked for no output
        (a cache pre-warm); such a turn is recorded ``format-noop`` and its state kept."""
        if constrain.has_own_format(self.body) or constrain.asks_for_no_output(self.body):
            return "none"
        return "block"

    @cached_property
    def wire(self) -> Wire:
        """The client's dialect (looked up at most once per turn: see ``looked_up``)."""
        return get_dialect(self.dialect)


@dataclass
class Reply:
    """A complete reply for the client: status, body in its dialect, and headers."""

    status: int
    body: bytes
    headers: dict[str, str]


@dataclass
class StreamReply:
    """A streamed reply: headers now, body chunks as the upstream sends them (the turn is
    judged and committed before the last chunk)."""

    headers: dict[str, str]
    chunks: AsyncIterator[bytes]
    # Idempotent: drops the upstream and releases the session. The response calls it when
    # it is done, so nothing leaks even if `chunks` was never started (early disconnect).
    abort: Callable[[], Awaitable[None]]


def with_envelope(shape: ContextShape) -> bool:
    """Whether a turn sent in this shape asks the model for the state envelope (and so is
    judged and committed)."""
    return shape in (ContextShape.COMPACT, ContextShape.FULL, ContextShape.CHECKPOINT)


def strips(turn: Turn) -> bool:
    """Whether the client's copy of this turn's reply is stripped of envelopes: never when
    the request brought its own output format (``format-noop``: the reply must parse as the
    client's format, and the model was not asked for an envelope)."""
    return turn.envelope_form != "none"


@dataclass
class TurnMeta:
    """What the stages of one turn share: the request, the session as loaded, the context
    shape sent and the turn's meter."""

    turn: Turn
    state: dict[str, Any]
    step: int
    schema: list[str]
    is_new: bool
    shape: ContextShape
    meter: TurnMeter
    decision: AutoEstimate | None = None  # auto's choice and its estimates
    hold: Hold | None = None  # the session's lock, in the modes that keep state
    streamed: bool = False  # the stream's relay started (it closes the ledger itself)
    window: WindowTurn | None = None  # the window form's turn (window, checkpoint)
    folded: bool = False  # the window was folded into ``state`` first (``turn.fold``)
    reasked: int = 0  # re-asks of the calls before the turn's own (its folds' judged answers)

    def figures(self, status: str) -> dict[str, Any] | None:
        """What the transition records of how the turn was decided: auto's estimates, and
        a window turn's decision and the window mark it leaves (read back after a restart)."""
        figures = self.decision.as_dict() if self.decision is not None else None
        if self.window is not None:
            figures = {**(figures or {}), **self.window.figures(status)}
        return figures


@dataclass
class Answer:
    """One upstream answer (already in the client's dialect) and, once judged, its verdict."""

    ex: Exchange
    raw: bytes
    resp: dict[str, Any]
    outcome: Outcome | None = None
    stripped: tuple[str, Stripped] | None = None  # its text and strip_envelope(text)
    has_tool_calls: bool = False  # read with its text (only when the turn has an envelope)

    @property
    def text(self) -> str:
        """The reply's text (read once, when the turn has an envelope; else "")."""
        return self.stripped[0] if self.stripped is not None else ""

    @property
    def sole_envelope(self) -> Envelope | None:
        """The reply's envelope when stripping found it as the only candidate (the one the
        verdict would extract: it need not read the text again), else None."""
        stripped = self.stripped[1] if self.stripped is not None else None
        return stripped.envelope if stripped is not None and stripped.sole else None
