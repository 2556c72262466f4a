"""The honest baseline: what a turn would have cost WITHOUT the proxy, caching included.

Pure logic; the caller (the turn's meter) supplies the client's transcript with the
proxy's envelopes removed (:func:`skillstate.engine.stripper.strip_transcript`), the baseline input
tokens (the upstream's reported input scaled by the estimated size ratio, or for a ``mask``
turn plus the estimated difference: :func:`skillstate.cost.ledger.baseline_input_tokens`),
the reply, the price book's rates and the clock.

Caching, per session (:class:`PrefixCache`, a few hashes per session)
-------------------------------------------------------------------
A request is cut at its piece boundaries: the tool definitions, the top-level system
(Anthropic), then each message. :func:`prefix_points` hashes the cumulative prefix at each
boundary, with every ``cache_control`` marker removed (markers are not part of the
prefix), and notes which pieces carry one (the client's breakpoints).
:meth:`PrefixCache.charge` splits the baseline input into cache reads, cache writes and
plain input under one of three regimes (:class:`CacheRegime`):

* ``openai`` (automatic caching): the longest boundary prefix that the previous baseline
  request also had is read from the cache, if that request was sent within ``ttl_s`` and
  the prefix holds at least ``min_tokens``, rounded down to a multiple of
  ``OPENAI_CACHE_STEP_TOKENS`` (OpenAI reports ``cached_tokens`` in 128-token increments
  from 1,024 on). No writes are billed.
* ``anthropic`` (explicit breakpoints): a prefix is read only if an earlier request WROTE
  it at one of its ``cache_control`` breakpoints (within ``ttl_s`` of its last use), at a
  boundary no later than this request's last breakpoint. The part from there to the last
  breakpoint is a cache write (if that prefix holds at least ``min_tokens``); the rest is
  plain input. A client that sets no breakpoints pays full input, as it would without the
  proxy.
* ``none``: everything is plain input.

Boundaries are message-granular: a breakpoint inside a message counts at the message's
end, and Anthropic's 20-block look-back limit is not modelled. A string content (or system)
is hashed as its one text block, so marking a message does not change its prefix. Tokens
are allocated to boundaries in proportion to the estimated size of each prefix
(``skillstate.cost.tokens``).

Output
------
The envelope's share of the output is estimated from its share of the whole reply: its
characters against the reply's text plus its tool calls (name and arguments)
(:func:`envelope_output_share`). The saving (:func:`saving`) is baseline cost minus
actual cost, and is NEGATIVE when the proxy cost more: it is never clamped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import orjson

from ..dialects.registry import get_dialect
from ..sessions.lru import SessionLRU
from .pricing import Prices, cost_from_prices
from .tokens import BYTES_PER_TOKEN, MESSAGE_OVERHEAD_TOKENS, json_size
from .usage import Usage

__all__ = [
    "ANTHROPIC_MIN_TOKENS",
    "OPENAI_CACHE_STEP_TOKENS",
    "Baseline",
    "CachePricing",
    "CacheRegime",
    "CacheSplit",
    "PrefixCache",
    "PrefixPoint",
    "PrefixPointList",
    "PrefixPointsMemo",
    "SessionPrefixCaches",
    "TurnBaseline",
    "baseline_output_tokens",
    "baseline_turn",
    "envelope_output_share",
    "openai_read",
    "prefix_points",
    "price_baseline",
    "round_ratio",
    "saving",
    "tool_call_chars",
]

CachePricing = Literal["none", "openai", "anthropic"]
CACHE_PRICING: tuple[CachePricing, ...] = ("none", "openai", "anthropic")
DEFAULT_TTL_S = 300.0
DEFAULT_MIN_TOKENS = 1024
# OpenAI serves a cached prefix in steps of this many tokens (its prompt-caching docs: "cache
# hits occurring in increments of 128 tokens"), so a read is rounded down to a multiple.
OPENAI_CACHE_STEP_TOKENS = 128
# Anthropic's minimum cacheable prefix where a model's is not DEFAULT_MIN_TOKENS (its
# prompt-caching docs; fnmatch patterns, the first match wins). OpenAI's is 1,024 for every
# model. A shorter prefix is neither written nor read, whatever its breakpoints.
ANTHROPIC_MIN_TOKENS: dict[str, int] = {
    "claude-opus-4-5*": 4096,
    "claude-opus-4-6*": 4096,
    "claude-haiku-4-5*": 4096,
    "claude-sonnet-4-6*": 2048,
    "claude-3-5-haiku*": 2048,
    "claude-3-haiku*": 2048,
}
MAX_WRITTEN = 32  # anthropic: cache entries remembered per session (oldest dropped first)
_DIGEST_SIZE = 16


@dataclass(frozen=True)
class CacheRegime:
    """How an upstream bills its prompt cache (see the module docstring)."""

    pricing: CachePricing = "openai"
    ttl_s: float = DEFAULT_TTL_S
    min_tokens: int = DEFAULT_MIN_TOKENS

    def __post_init__(self) -> None:
        if self.pricing not in CACHE_PRICING:
            raise ValueError(f"cache pricing must be one of {CACHE_PRICING}, not {self.pricing!r}")
        if not self.ttl_s >= 0:
            raise ValueError(f"cache ttl_s must be >= 0, not {self.ttl_s!r}")
        if self.min_tokens < 0:
            raise ValueError(f"cache min_tokens must be >= 0, not {self.min_tokens!r}")


def openai_read(shared_tokens: int, regime: CacheRegime) -> int:
    """What OpenAI reads from its cache of a shared prefix of ``shared_tokens``: nothing
    below the regime's minimum, else whole steps of ``OPENAI_CACHE_STEP_TOKENS``."""
    if shared_tokens < regime.min_tokens:
        return 0
    return shared_tokens - shared_tokens % OPENAI_CACHE_STEP_TOKENS


@dataclass(frozen=True, slots=True)
class PrefixPoint:
    """One boundary of a request: the cumulative prefix up to and including one piece."""

    digest: bytes  # hash of the prefix, cache_control markers removed
    est_tokens: int  # estimated tokens of the prefix
    breakpoint: bool  # the client put a cache_control marker in this piece


@dataclass(frozen=True, slots=True)
class CacheSplit:
    """Input tokens of one request, split like ``Usage``: ``input_tokens`` includes the
    cache reads and writes."""

    input_tokens: int
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Baseline:
    """The baseline of one turn: token counts (input includes cache reads and writes) and
    their cost at the model's rates (None when the rates are unknown)."""

    input_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    output_tokens: int
    cost_usd: float | None


def round_ratio(numerator: int, denominator: int) -> int:
    """``round(Fraction(numerator, denominator))`` (exact, half to even) for a positive
    ``denominator``, in integer arithmetic: every answered turn rounds a few such ratios,
    and a Fraction costs microseconds to build, normalise and round."""
    q, r = divmod(numerator, denominator)  # floor division: 0 <= r < denominator
    twice = 2 * r
    if twice > denominator or (twice == denominator and q % 2 == 1):
        q += 1
    return q


# --- prefix hashing -----------------------------------------------------------------------


def _unmarked(value: Any) -> tuple[Any, bool]:
    """``value`` without ``cache_control`` keys (copied only where there was one), and
    whether it had one."""
    if isinstance(value, dict):
        items = {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
        if "cache_control" not in value and not any(m for _, m in items.values()):
            return value, False
        return {k: v for k, (v, _) in items.items()}, True
    if isinstance(value, list):
        elements = [_unmarked(v) for v in value]
        if not any(m for _, m in elements):
            return value, False
        return [v for v, _ in elements], True
    return value, False


def _text_block(text: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": text}]


def _head_pieces(body: Mapping[str, Any]) -> Iterable[Any]:
    """The pieces before the messages, in cache order: tools, then system.

    A string system (or message content) is hashed as its one text block: the same tokens
    to the provider, and how agents mark a message (its string becomes a block carrying
    ``cache_control``, sent as a string again the next turn) must not change the prefix."""
    tools = body.get("tools")
    if tools:
        yield tools
    system = body.get("system")
    if system:
        yield _text_block(system) if isinstance(system, str) else system


def _message_piece(message: Any) -> Any:
    if isinstance(message, dict) and isinstance(message.get("content"), str):
        return {**message, "content": _text_block(message["content"])}
    return message


class _Running:
    """The hash and the token estimate of a prefix, one piece at a time."""

    __slots__ = ("hash", "total")

    def __init__(self) -> None:
        self.hash = hashlib.sha256()  # of the prefix so far: each point's digest is a snapshot
        self.total = 0

    def point(self, piece: Any, is_message: bool) -> PrefixPoint:
        dumped = orjson.dumps(piece, default=str)
        marked = False
        if b'"cache_control"' in dumped:  # rare: only then rebuild the piece without markers
            clean, marked = _unmarked(piece)
            if marked:
                piece, dumped = clean, orjson.dumps(clean, default=str)
        self.hash.update(dumped)
        # skillstate.cost.tokens' estimate of the piece, from the bytes already at hand
        tokens = -(-json_size(piece, dumped) // BYTES_PER_TOKEN)
        self.total += tokens + (MESSAGE_OVERHEAD_TOKENS if is_message else 0)
        return PrefixPoint(self.hash.copy().digest()[:_DIGEST_SIZE], self.total, marked)


def _marked_at_end(points: list[PrefixPoint], body: Mapping[str, Any]) -> list[PrefixPoint]:
    """A top-level ``cache_control`` (Anthropic's automatic caching) is a breakpoint at the
    last piece."""
    if points and body.get("cache_control"):
        last = points[-1]
        points[-1] = PrefixPoint(last.digest, last.est_tokens, True)
    return points


def prefix_points(body: Mapping[str, Any]) -> list[PrefixPoint]:
    """The request's boundaries with their prefix hashes (see the module docstring).

    ``body`` is a chat-completions or Anthropic Messages request (``tools``, ``system``,
    ``messages``). A top-level ``cache_control`` (Anthropic's automatic caching) is a
    breakpoint at the last piece. O(size of the body).
    """
    running = _Running()
    points = [running.point(piece, False) for piece in _head_pieces(body)]
    messages = body.get("messages")
    if isinstance(messages, list):
        points += [running.point(_message_piece(m), True) for m in messages]
    return _marked_at_end(points, body)


class PrefixPointList(list[PrefixPoint]):
    """Prefix points with their digests concatenated (``digests``), made as the points
    were: the cache model keeps them for the next request without a pass over the points."""

    __slots__ = ("digests",)

    def __init__(self, points: list[PrefixPoint], digests: bytes) -> None:
        super().__init__(points)
        self.digests = digests


def _digests(points: Sequence[PrefixPoint]) -> bytes:
    """The digests of ``points``, concatenated."""
    if isinstance(points, PrefixPointList):
        return points.digests
    return b"".join([p.digest for p in points])


class PrefixPointsMemo:
    """:func:`prefix_points` of one session's requests, turn after turn, hashing only the
    messages that are new since the last call: the running hash after the last call's last
    piece is kept (a SHA-256 state), with that call's points and their digests."""

    __slots__ = ("_count", "_digests", "_points", "_running")

    def __init__(self) -> None:
        self._count = 0  # messages of the last call
        self._points: list[PrefixPoint] = []  # its points (without the top-level marker)
        self._digests = b""  # their digests, concatenated
        self._running = _Running()

    def points(self, body: Mapping[str, Any], kept: int) -> list[PrefixPoint]:
        """``prefix_points(body)``. ``kept``: 0, or the number of messages of the last
        call, when they and the pieces before them (tools, system) are equal to this
        body's."""
        if kept not in (0, self._count):
            raise ValueError(f"kept must be 0 or {self._count}, not {kept}")
        if not kept:
            self._running = _Running()
            self._points = [self._running.point(piece, False) for piece in _head_pieces(body)]
            self._digests = _digests(self._points)
        messages = body.get("messages")
        if isinstance(messages, list):
            running = self._running
            new = [running.point(_message_piece(m), True) for m in messages[kept:]]
            self._points += new
            self._digests += _digests(new)
            self._count = len(messages)
        else:
            self._count = 0
        points = PrefixPointList(self._points, self._digests)
        return _marked_at_end(points, body)  # the marker keeps the last digest


# --- the per-session cache model ------------------------------------------------------------


class PrefixCache:
    """What the baseline client would have in the provider's prompt cache, per session.

    Holds hashes and times only: the previous request's boundary hashes (``openai``) or
    the prefixes written at breakpoints (``anthropic``, at most ``MAX_WRITTEN``).
    """

    __slots__ = ("_previous", "_previous_at", "_written")

    def __init__(self) -> None:
        self._previous = b""  # the previous request's boundary digests, concatenated
        self._previous_at = float("-inf")
        self._written: dict[bytes, float] = {}  # digest -> last written or read

    def charge(
        self, points: Sequence[PrefixPoint], input_tokens: int, now: float, regime: CacheRegime
    ) -> CacheSplit:
        """Split this request's ``input_tokens`` into reads, writes and plain input, and
        remember the request for the next one. ``now`` in seconds (any monotonic clock)."""
        if regime.pricing == "openai":
            return self._openai(points, input_tokens, now, regime)
        if regime.pricing == "anthropic":
            return self._anthropic(points, input_tokens, now, regime)
        return CacheSplit(input_tokens)

    def _openai(
        self, points: Sequence[PrefixPoint], input_tokens: int, now: float, regime: CacheRegime
    ) -> CacheSplit:
        read = 0
        if now - self._previous_at <= regime.ttl_s:
            hit = _last_shared(points, self._previous)
            if hit is not None:
                at = _allocator(points, input_tokens)(hit)
                read = openai_read(at, regime)
        self._previous = _digests(points)
        self._previous_at = now
        return CacheSplit(input_tokens, read, 0)

    def _anthropic(
        self, points: Sequence[PrefixPoint], input_tokens: int, now: float, regime: CacheRegime
    ) -> CacheSplit:
        live = {d: t for d, t in self._written.items() if now - t <= regime.ttl_s}
        breakpoints = [k for k, p in enumerate(points) if p.breakpoint]
        if not breakpoints:
            self._written = live
            return CacheSplit(input_tokens)
        tokens = _allocator(points, input_tokens)
        last = breakpoints[-1]
        hit = next((k for k in range(last, -1, -1) if points[k].digest in live), None)
        read = tokens(hit) if hit is not None else 0
        if hit is not None:
            live[points[hit].digest] = now  # a read refreshes the entry
        write = 0
        if hit != last and tokens(last) >= regime.min_tokens:
            write = tokens(last) - read
            for k in breakpoints:
                if tokens(k) >= regime.min_tokens:
                    live[points[k].digest] = now
        if len(live) > MAX_WRITTEN:
            live = dict(sorted(live.items(), key=lambda kv: kv[1])[-MAX_WRITTEN:])
        self._written = live
        return CacheSplit(input_tokens, read, write)


class SessionPrefixCaches(SessionLRU[PrefixCache]):
    """One :class:`PrefixCache` per session, the least recently used dropped beyond
    ``max_sessions`` (a dropped session's next turn is priced as if its cache were cold)."""

    def __init__(self, max_sessions: int = 10_000) -> None:
        super().__init__(PrefixCache, max_sessions)


_FEW = 8  # digests looked up one by one before the whole previous request is indexed


def _last_shared(points: Sequence[PrefixPoint], previous: bytes) -> int | None:
    """The last of ``points`` whose digest is one of ``previous`` (digests concatenated).

    A transcript that grew since the previous request shares its prefix up to the previous
    last point, so the search from the end stops after the new points: those few are
    looked up in ``previous`` one by one (a scan at C speed), and only a longer search
    indexes all of it (a set, as many entries as the previous request has points)."""
    k = len(points) - 1
    stop = max(k - _FEW, -1)
    while k > stop:
        if _holds(previous, points[k].digest):
            return k
        k -= 1
    if k < 0:
        return None
    index = {previous[i : i + _DIGEST_SIZE] for i in range(0, len(previous), _DIGEST_SIZE)}
    return next((j for j in range(k, -1, -1) if points[j].digest in index), None)


def _holds(previous: bytes, digest: bytes) -> bool:
    """Whether ``digest`` is one of the digests concatenated in ``previous``."""
    if len(digest) != _DIGEST_SIZE:
        return False
    at = previous.find(digest)
    while at >= 0 and at % _DIGEST_SIZE:  # found across two digests: look further
        at = previous.find(digest, at + 1)
    return at >= 0


def _allocator(points: Sequence[PrefixPoint], input_tokens: int) -> Any:
    """tokens(k): the part of ``input_tokens`` that the prefix up to point k holds, in
    proportion to its estimated size (exact rationals, rounded half to even)."""
    total = points[-1].est_tokens if points else 0

    def tokens(k: int) -> int:
        if total <= 0:
            return 0
        return round_ratio(input_tokens * points[k].est_tokens, total)

    return tokens


# --- output, cost, saving -------------------------------------------------------------------


def envelope_output_share(
    reply_text: str, envelope_chars: int, tool_call_chars: int = 0
) -> Fraction:
    """The envelope's share of a reply: its characters against the reply text plus the
    reply's tool calls (name and arguments, :func:`tool_call_chars`). 0 for an empty
    reply; at most 1."""
    whole = len(reply_text) + max(tool_call_chars, 0)
    if whole <= 0 or envelope_chars <= 0:
        return _NONE
    # min(Fraction(envelope_chars, whole), 1), building one Fraction instead of three
    return _WHOLE if envelope_chars >= whole else Fraction(envelope_chars, whole)


def tool_call_chars(dialect: str, resp: dict[str, Any]) -> int:
    """Characters of the tool calls in a non-streamed reply in ``dialect`` (each name plus
    its arguments: OpenAI's arguments string, Anthropic's input as compact JSON;
    ``Dialect.tool_call_chars``)."""
    return get_dialect(dialect).tool_call_chars(resp)


_NONE, _WHOLE = Fraction(0), Fraction(1)  # immutable, so shared


def baseline_output_tokens(output_tokens: int, envelope_share: Fraction) -> int:
    """The output tokens without the envelope's share (rounded half to even)."""
    if isinstance(envelope_share, Fraction | int) and isinstance(output_tokens, int):
        # round(output_tokens * (1 - share)) in integers (Fraction arithmetic is slow)
        n, d = envelope_share.numerator, envelope_share.denominator
        return round_ratio(output_tokens * (d - n), d)
    return round(output_tokens * (1 - envelope_share))


def price_baseline(
    split: CacheSplit, output_tokens: int, prices: Prices | None, sent: Usage | None = None
) -> Baseline:
    """The baseline's tokens and cost at ``prices`` (cache reads and writes at their own
    rates, as ``skillstate.cost.pricing.cost_from_prices`` bills the sent side). The client's
    own ``cache_control`` markers say how long a write lives, so the baseline's writes are
    one-hour writes in the share the ``sent`` call's were."""
    cost = None
    if prices is not None:
        hour = 0
        if sent is not None and sent.cache_write_tokens > 0:
            share = split.cache_write_tokens * sent.cache_write_1h_tokens
            hour = round_ratio(share, sent.cache_write_tokens)
        usage = Usage(
            split.input_tokens,
            output_tokens,
            split.cache_read_tokens,
            split.cache_write_tokens,
            hour,
        )
        cost = cost_from_prices(usage, prices)
    return Baseline(
        split.input_tokens,
        split.cache_read_tokens,
        split.cache_write_tokens,
        output_tokens,
        cost,
    )


def saving(baseline_cost: float | None, cost: float | None) -> tuple[float | None, float | None]:
    """(saved USD, saved % of the baseline): negative when the proxy cost more, never
    clamped; None when a cost is unknown (the % also when the baseline is 0)."""
    if baseline_cost is None or cost is None:
        return None, None
    saved = baseline_cost - cost
    pct = round(100 * saved / baseline_cost, 2) if baseline_cost else None
    return round(saved, 9), pct


@dataclass(frozen=True, slots=True)
class TurnBaseline:
    """The baseline of one turn and the saving against what the turn cost."""

    baseline: Baseline
    saved_cost_usd: float | None  # negative when the proxy cost more
    saved_cost_pct: float | None


def baseline_turn(
    *,
    cache: PrefixCache,
    regime: CacheRegime,
    client_body: Mapping[str, Any],
    baseline_input: int,
    output_tokens: int,
    envelope_share: Fraction,
    prices: Prices | None,
    cost_usd: float | None,
    now: float,
) -> TurnBaseline:
    """Everything of the module for one answered turn, in one call.

    ``client_body``: the client's request with the proxy's envelopes removed
    (``strip.strip_transcript`` on its messages). ``baseline_input``: the reported input
    scaled by the estimated size of that body against what was sent
    (``ledger.baseline_input_tokens``). ``output_tokens``/``cost_usd``: what the sent turn
    used and cost. ``envelope_share``: :func:`envelope_output_share` of the reply. Updates
    ``cache`` (call once per turn, in turn order).
    """
    split = cache.charge(prefix_points(client_body), baseline_input, now, regime)
    baseline = price_baseline(split, baseline_output_tokens(output_tokens, envelope_share), prices)
    saved, pct = saving(baseline.cost_usd, cost_usd)
    return TurnBaseline(baseline, saved, pct)
