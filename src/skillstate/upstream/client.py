"""The upstream pool and the dispatch loop: routing by model, local limits, circuit
breakers, retries with backoff and failover. One pooled aiohttp session per upstream.

Retries happen only here, before any byte has reached the client: dispatch returns once an
upstream has answered with headers (and, for a 2xx stream, its first chunk).
"""

from __future__ import annotations

import asyncio
import fnmatch
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn
from urllib.parse import urlsplit

import aiohttp
import orjson

from ..choices import CacheBreakpoints
from ..config import Settings, Upstream
from ..coordination.link import CoordinationLink
from ..cost.baseline import CacheRegime
from ..cost.cachehints import CacheHints, with_breakpoint, with_prompt_cache_key
from ..cost.usage import Usage
from ..cost.worstcase import MAX_TOKEN_FIELDS
from ..dialects.base import JSON, BadReply
from ..dialects.openai import OPENAI
from ..dialects.registry import get_dialect, request_for
from ..dialects.replystream import as_stream, is_json_reply
from ..dialects.responses import RESPONSES
from ..dialects.streaming import StreamCut
from ..errors import CLIENT_CLOSED, ProxyError
from ..headertext import RELAYED_HEADER_MAX_CHARS, header_safe
from ..observability.telemetry import Telemetry
from .breaker import Breaker, CircuitBreaker, Permit
from .limits import Admission, RateLimits, Ticket, UpstreamLimits
from .retry import Backoff, fails_over, is_key_rejected, retry_after_from_headers

# Never forwarded: hop-by-hop headers, our own, what aiohttp sets itself, what describes
# the client's body rather than the one the proxy sends (its own JSON, uncompressed), and the
# client's Idempotency-Key: it names the client's request to the proxy, which answers it; the
# proxy's upstream calls for it (re-asks, checkpoints) carry other bodies, which an upstream
# that keeps keys (another proxy) would refuse (422) or answer with the first one's reply.
_DROP_REQUEST_HEADERS = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
        "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length",
        "accept-encoding", "cookie", "content-encoding", "expect", "idempotency-key",
    }
)  # fmt: skip
_CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key"})
# Protocol headers a client sets for its own requests (the API version it was written
# against, the betas whose body fields it sends): when forwarded, the client's value wins over
# the upstream's configured default (anthropic_version, headers).
_CLIENT_WINS_HEADERS = frozenset({"anthropic-version", "anthropic-beta"})
# Client headers that pick which account, organisation or project a key bills, or that carry
# another provider's key. With the upstream's own api_key configured the operator pays, so
# these are dropped unless listed in forward_scoping_headers; without one, the client's key is
# forwarded and its scoping headers go with it.
SCOPING_HEADERS = frozenset(
    {
        "openai-organization", "openai-project",  # OpenAI: org and project billed
        "api-key",  # Azure OpenAI key
        "x-goog-api-key", "x-goog-user-project",  # Google: key, project billed
        "anthropic-organization-id", "anthropic-workspace-id",
        "ocp-apim-subscription-key",  # Azure API Management key
    }
)  # fmt: skip
# Upstream response headers worth passing to clients (SDKs read request ids and limits).
_PASS_RESPONSE_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-", "openai-", "x-request-id")
_PASS_RESPONSE_HEADERS = frozenset({"request-id", "retry-after", "retry-after-ms"})
# A shared breaker's probe claim outlives total_timeout by this much before it expires (the
# replica holding it died mid-probe).
PROBE_TTL_MARGIN = 5.0


def base_url(url: str) -> str:
    """`http://host` -> `http://host/v1`; a URL that already has a path is used as is, so
    `.../v1` is never doubled and `.../v1beta/openai` works too."""
    url = url.rstrip("/")
    return url + "/v1" if urlsplit(url).path == "" else url


def passthrough_response_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The upstream response headers a client may see. Values are made header-safe: an
    upstream's non-ASCII or control bytes would make the reply unsendable (after the
    turn was committed)."""
    out: dict[str, str] = {}
    for k, v in headers.items():
        lk = k.lower()
        if lk in _PASS_RESPONSE_HEADERS or lk.startswith(_PASS_RESPONSE_PREFIXES):
            out[lk] = header_safe(v, RELAYED_HEADER_MAX_CHARS)
    return out


class UpstreamRuntime:
    """One configured upstream with its live breaker, limits and connection pool. With a
    configured coordination ``link``, the breaker and the limits are shared by replicas
    (kept in Redis); otherwise they are this process's."""

    def __init__(
        self,
        cfg: Upstream,
        settings: Settings,
        now: Callable[[], float],
        link: CoordinationLink | None = None,
    ) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.kind = cfg.kind
        self.dialect = get_dialect(cfg.kind)
        self.max_tokens_field = cfg.openai_max_tokens_field
        self.base = base_url(cfg.url)
        self.breaker, self.limits = _breaker_and_limits(cfg, settings, now, link)
        self.session: aiohttp.ClientSession | None = None
        allowed = {h.lower() for h in settings.forward_scoping_headers}
        self.dropped_scoping = SCOPING_HEADERS - allowed if cfg.api_key else frozenset()
        # Per-request header building is on the hot path: the constant parts, once.
        self._never_forwarded = _DROP_REQUEST_HEADERS | _CREDENTIAL_HEADERS | self.dropped_scoping
        self._configured_headers = {k.lower(): v for k, v in cfg.headers.items()}

    def serves(self, model: str | None) -> bool:
        if not self.cfg.models or model is None:
            return True
        return any(fnmatch.fnmatchcase(model, pat) for pat in self.cfg.models)

    def headers(self, client_headers: Mapping[str, str]) -> dict[str, str]:
        never, forwards = self._never_forwarded, self.dialect.forwards_header
        out = {
            k: v
            for k, v in client_headers.items()
            if k not in never and not k.startswith("x-skillstate-") and forwards(k)
        }
        key = self.cfg.api_key or _client_key(client_headers)
        defaults = self.dialect.upstream_headers(key, self.cfg.anthropic_version)
        defaults.update(self._configured_headers)
        out.update(
            {k: v for k, v in defaults.items() if k not in out or k not in _CLIENT_WINS_HEADERS}
        )
        out["content-type"] = "application/json"
        return out

    async def refresh(self) -> None:
        """Read the shared breaker and limits afresh (for /health and /metrics)."""
        await self.breaker.refresh()
        await self.limits.refresh()

    def health(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            **self.breaker.snapshot(time.time()),
            "limits": self.limits.snapshot(),
        }


def _breaker_and_limits(
    cfg: Upstream, settings: Settings, now: Callable[[], float], link: CoordinationLink | None
) -> tuple[Breaker, RateLimits]:
    """The upstream's breaker and rate limits: shared through Redis with a configured
    ``link`` (each with an in-process fallback for a Redis outage), else in-process."""
    local = UpstreamLimits(cfg.rpm, cfg.tpm, now)
    if link is None or not link.configured:
        return CircuitBreaker(settings.failure_threshold, settings.open_cooldown, now), local
    from ..coordination.breakers import SharedBreaker
    from ..coordination.windows import SharedWindows

    breaker = SharedBreaker(
        link,
        cfg.name,
        settings.failure_threshold,
        settings.open_cooldown,
        probe_ttl=settings.total_timeout + PROBE_TTL_MARGIN,
        sync=settings.breaker_sync,
        monotonic=now,
    )
    return breaker, SharedWindows(link, "upstream:" + cfg.name, cfg.rpm, cfg.tpm, local=local)


def _client_key(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return headers.get("x-api-key") or None


@dataclass
class AttemptRecord:
    """One upstream attempt that did not produce the final answer (for the ledger)."""

    upstream: str
    status: int  # 0 = no HTTP response (connection error or timeout)
    error: str
    # The request may have reached the provider, which may then bill it though no answer
    # came back (the ledger charges such an attempt an estimate): see ``transport_failure``.
    billed: bool = False
    # The upstream answered a streamed request with a 2xx that is no stream (closed before
    # any data, or JSON that is no reply): ``_all_failed``'s 502 then says not to retry.
    unusable: bool = False

    @classmethod
    def transport_failure(cls, upstream: str, e: BaseException) -> AttemptRecord:
        """An attempt that failed without an HTTP answer. Only a failure to connect is
        known to have sent nothing; after that (a read timeout, a connection closed or a
        body cut mid-answer, a stream that ended before its first event) the provider had
        the request. A bare timeout (the attempt's total deadline) may strike either side:
        counted as sent, so that a budget never undercounts."""
        unusable = isinstance(e, _StreamStartError)
        return cls(upstream, 0, _describe(e), not isinstance(e, _NOT_SENT), unusable)


# A non-streamed 2xx body as its caller reads it (``dialects.registry.read_reply``): the
# reply, in the upstream's and the client's format, and the client's bytes; or what makes
# it no reply. The pool reads it before its breaker's verdict (``_record_answer``).
ReadReply = tuple[JSON, JSON, bytes] | BadReply
ReplyReader = Callable[["Exchange"], ReadReply]


@dataclass
class Exchange:
    """The upstream that answered, with its response still open for reading."""

    upstream: UpstreamRuntime
    response: aiohttp.ClientResponse
    ticket: Ticket | None
    first_chunk: bytes = b""
    failed_attempts: list[AttemptRecord] = field(default_factory=list)
    body: bytes | None = None  # a non-streamed answer, read whole (and bounded) by the pool
    # What dispatch's ``ReplyReader`` made of a non-streamed 2xx body (None: not read).
    reading: ReadReply | None = None

    @property
    def status(self) -> int:
        return self.response.status

    @property
    def ok(self) -> bool:
        return 200 <= self.response.status < 300

    # -- what a turn reads of the upstream that answered (not the upstream itself) -------

    @property
    def upstream_name(self) -> str:
        return self.upstream.name

    @property
    def kind(self) -> str:
        """The answering upstream's wire format (its dialect's name)."""
        return self.upstream.kind

    @property
    def provider_hint(self) -> str:
        """The answering upstream's URL (the price book's hint at its provider)."""
        return self.upstream.cfg.url

    def regime(self, model: str | None) -> CacheRegime:
        """How the answering upstream bills the prompt cache for ``model``."""
        return self.upstream.cfg.cache_regime(model)

    def usage_of(self, resp: Mapping[str, Any]) -> Usage | None:
        """The usage a non-streamed reply (in the upstream's format) reports."""
        return self.upstream.dialect.usage(resp.get("usage"), resp.get("service_tier"))

    async def settle(self, usage: Usage | None) -> None:
        """Correct the upstream's token-per-minute window with the real usage."""
        if self.ticket is not None and usage is not None:
            await self.upstream.limits.settle(self.ticket, usage.input_tokens + usage.output_tokens)

    async def read_chunk(self) -> bytes:
        """The next piece of a streamed body, as it arrives (b"" at its end). A failed
        connection or a timeout raises ``StreamCut``, saying which."""
        try:
            return await self.response.content.readany()
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            problem = "upstream timed out" if isinstance(e, asyncio.TimeoutError) else (
                f"upstream connection failed mid-stream ({type(e).__name__})"
            )  # fmt: skip
            raise StreamCut(problem) from e

    def relay_headers(self) -> dict[str, str]:
        """The response headers a client may see, plus which upstream answered."""
        out = passthrough_response_headers(self.headers())
        out["x-skillstate-upstream"] = self.upstream.name
        return out

    def headers(self) -> Mapping[str, str]:
        return self.response.headers

    async def read(self) -> bytes:
        if self.body is None:
            self.body = await read_bounded(self.response)
        return self.body

    def close(self) -> None:
        """Drop the connection: the upstream sees the request cancelled."""
        self.response.close()

    def release(self) -> None:
        self.response.release()


@dataclass
class Outbound:
    """What to send. The body is in the client's dialect; `payload_for` puts it in an
    upstream kind's format (through the dialects' bridges), once per kind."""

    client_dialect: str
    body: dict[str, Any]
    stream: bool
    est_tokens: int
    client_headers: Mapping[str, str]
    grammar: dict[str, Any] | None = None  # the envelope's constrained-decoding format
    cache_hints: CacheHints | None = None  # for the provider's prompt cache
    # Where to POST under the upstream's base URL when it is not its dialect's turn path: a
    # native endpoint of the client's own API (``/responses/compact``), which only upstreams
    # of the client's kind serve.
    path: str | None = None
    # ``body`` as the client's bytes (``turn.types.ClientBytes``): sent as they are when
    # ``body`` goes to an upstream unchanged (same format, nothing added).
    raw: bytes | None = None
    # The output limit the call goes with when its body sets none (``limit_output``).
    output_cap: int | None = None
    _cache: dict[tuple[str, str, bool, bool], bytes] = field(default_factory=dict)

    def limit_output(self, tokens: int | None) -> None:
        """Send the call with at most ``tokens`` of output when its body sets no limit: a
        budget held its worst case at that many (``cost.worstcase``), and a model left
        without one may write up to its own maximum. None: as the body says."""
        self.output_cap = tokens
        self._cache.clear()

    @property
    def model(self) -> str | None:
        m = self.body.get("model")
        return m if isinstance(m, str) else None

    def payload_for(
        self,
        kind: str,
        max_tokens_field: str = "max_tokens",
        *,
        cache_key: bool = False,
        breakpoint: bool = False,
    ) -> bytes:
        """The body as an upstream of ``kind`` gets it (serialised once per variant).
        ``cache_key``: add the hints' ``prompt_cache_key``; ``breakpoint``: mark the end of
        the stable prefix with a ``cache_control`` breakpoint (see skillstate.cost.cachehints)."""
        key = (kind, max_tokens_field, cache_key, breakpoint)
        if key not in self._cache:
            body = request_for(
                self.client_dialect,
                kind,
                self._capped(max_tokens_field),
                max_tokens_field=max_tokens_field,
                stream=self.stream,
                grammar=self.grammar,
            )
            hints = self.cache_hints
            if hints is not None and cache_key and hints.cache_key is not None:
                body = with_prompt_cache_key(body, hints.cache_key)
            if hints is not None and breakpoint and hints.prefix_end is not None:
                body = with_breakpoint(body, hints.prefix_end)
            self._cache[key] = self._serialised(body)
        return self._cache[key]

    @property
    def takes_output_limit(self) -> bool:
        """Whether the call can go with an output limit: a native endpoint
        (``/responses/compact``) takes none (the API refuses one as an unknown parameter)."""
        return self.path is None

    @property
    def capped(self) -> bool:
        """Whether the call goes with ``output_cap`` as a limit it did not set itself."""
        return self._capped("max_tokens") is not self.body

    def _capped(self, max_tokens_field: str) -> dict[str, Any]:
        """The body with ``output_cap`` as its output limit, in the client's format, when it
        sets none (chat completions: under the name the upstream reads)."""
        body, cap = self.body, self.output_cap
        if cap is None or not self.takes_output_limit:
            return body
        if any(body.get(name) is not None for name in MAX_TOKEN_FIELDS):
            return body
        name = {OPENAI.name: max_tokens_field, RESPONSES.name: "max_output_tokens"}
        return {**body, name.get(self.client_dialect, "max_tokens"): cap}

    def _serialised(self, body: dict[str, Any]) -> bytes:
        """``body`` as bytes. The client's body untouched is its own bytes; with members
        added (the prompt cache key, a stream's usage option) and every one of its own the
        same object, its own bytes with the added members written before the closing
        brace. Anything else is serialised."""
        mine, raw = self.body, self.raw
        if raw is None or len(body) < len(mine):
            return orjson.dumps(body)
        if body is mine:
            return raw
        if any(body.get(k, _ABSENT) is not v for k, v in mine.items()):
            return orjson.dumps(body)
        return _with_members(raw, {k: v for k, v in body.items() if k not in mine})

    def payload_for_upstream(self, cfg: Upstream, kind: str, max_tokens_field: str) -> bytes:
        """The body for one configured upstream: its kind, and its cache settings. The
        prompt cache key goes to upstreams billed like OpenAI's automatic caching; the
        breakpoint to upstreams billed like Anthropic's, when the stable prefix reaches the
        model's minimum cacheable length."""
        hints = self.cache_hints
        pricing = cfg.cache_pricing_in_effect
        breakpoint = (
            hints is not None
            and pricing == "anthropic"
            and cfg.cache_breakpoints == CacheBreakpoints.AUTO
            and hints.prefix_tokens >= cfg.cache_regime(self.model).min_tokens
        )
        return self.payload_for(
            kind, max_tokens_field, cache_key=pricing == "openai", breakpoint=breakpoint
        )


_ABSENT = object()


def _with_members(raw: bytes, members: dict[str, Any]) -> bytes:
    """``raw``, the text of a JSON object, with ``members`` written before its closing brace
    (``raw`` parsed as an object: after its whitespace, it ends with that brace)."""
    head = raw.rstrip()[:-1].rstrip()
    added = orjson.dumps(members)[1:-1]  # the members, without their own braces
    if not added:
        return raw
    return head + (b"" if head.endswith(b"{") else b",") + added + b"}"


# Awaited before each attempt of a dispatch with the number of earlier attempts the upstream
# may bill (``UpstreamPool.dispatch``).
BeforeAttempt = Callable[[int], Awaitable[None]]


class UpstreamPool:
    def __init__(
        self,
        settings: Settings,
        now: Callable[[], float] = time.monotonic,
        telemetry: Telemetry | None = None,
        link: CoordinationLink | None = None,
    ) -> None:
        self.settings = settings
        self._now = now
        # Counts attempts, retries, failovers and breaker changes (and traces attempts).
        self.telemetry = telemetry or Telemetry(settings)
        ordered = sorted(settings.upstreams, key=lambda u: u.priority)
        self.upstreams = [UpstreamRuntime(u, settings, now, link) for u in ordered]
        for up in self.upstreams:
            up.breaker.on_change = functools.partial(self.telemetry.breaker_changed, up.name)
        self.backoff = Backoff(
            base=settings.retry_base_delay,
            max_delay=settings.retry_max_delay,
            retry_after_cap=settings.retry_after_cap,
        )
        self.timeout = aiohttp.ClientTimeout(
            total=settings.total_timeout,
            sock_connect=settings.connect_timeout,
            sock_read=settings.first_byte_timeout,
        )

    async def open(self) -> None:
        for up in self.upstreams:
            up.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
                timeout=self.timeout,
                auto_decompress=True,
                skip_auto_headers=("User-Agent",),
                # No jar: a cookie a provider sets in one client's reply (a CDN's session
                # cookie) would go out on every other client's requests to that host.
                cookie_jar=aiohttp.DummyCookieJar(),
            )

    async def close(self) -> None:
        for up in self.upstreams:
            if up.session is not None:
                await up.session.close()

    async def refresh(self) -> None:
        """Read every upstream's shared breaker and limits afresh: before ``health`` or a
        metrics scrape (in-process ones are always current)."""
        await asyncio.gather(*(up.refresh() for up in self.upstreams))

    def health(self) -> list[dict[str, Any]]:
        return [up.health() for up in self.upstreams]

    def usable(self) -> bool:
        return any(up.breaker.state != "open" for up in self.upstreams)

    def candidates(self, model: str | None) -> list[UpstreamRuntime]:
        return [up for up in self.upstreams if up.serves(model)]

    async def fetch(
        self,
        path: str,
        client_headers: Mapping[str, str],
        *,
        post: bytes | None = None,
        upstreams: list[UpstreamRuntime] | None = None,
    ) -> Exchange:
        """A simple request (GET /models; with ``post``, a POST of that JSON): the first
        usable upstream (of ``upstreams``, default all) that answers without a server error;
        otherwise the last server error, or ProxyError if none answered. No retries and no
        rate limits: these are cheap, unmetered calls."""
        failures: list[AttemptRecord] = []
        last_error: Exchange | None = None
        for up in self.upstreams if upstreams is None else upstreams:
            permit = await up.breaker.acquire()
            if permit is None:
                failures.append(AttemptRecord(up.name, 0, CIRCUIT_OPEN))
                continue
            assert up.session is not None
            try:
                headers = up.headers(client_headers)
                if post is None:
                    resp = await up.session.get(up.base + path, headers=headers)
                else:
                    resp = await up.session.post(up.base + path, data=post, headers=headers)
                try:
                    body = await read_bounded(resp)
                except BaseException:
                    resp.close()
                    raise
            except _TRANSPORT_ERRORS as e:
                await up.breaker.record_failure()
                failures.append(AttemptRecord.transport_failure(up.name, e))
                continue
            except BaseException:
                if permit == "probe":
                    await _released(up)
                raise
            ex = Exchange(up, resp, None, body=body)
            if ex.status >= 500:
                await up.breaker.record_failure()
                failures.append(AttemptRecord(up.name, ex.status, f"HTTP {ex.status}"))
                last_error = ex
                continue
            await up.breaker.record_success()
            ex.failed_attempts = attempted(failures)
            return ex
        if last_error is not None:
            last_error.failed_attempts = attempted(failures)[:-1]
            return last_error
        raise _all_failed(failures)

    async def dispatch(
        self,
        out: Outbound,
        failures: list[AttemptRecord] | None = None,
        before_attempt: BeforeAttempt | None = None,
        read: ReplyReader | None = None,
    ) -> Exchange:
        """Send with retries and failover. Returns the final response (2xx, or the last
        upstream error to relay); raises ProxyError when no upstream gave an answer, with
        the failed attempts in its `attempts`. ``failures``: the caller's list, which the
        attempts are recorded in as they fail, so that a caller cancelled meanwhile still
        knows them (the attempt cut by the cancellation is one: ``CLIENT_CLOSED``).
        ``before_attempt``: awaited before each attempt with the number of earlier ones the
        upstream may bill (``AttemptRecord.billed``); what it raises ends the dispatch (a
        budget that cannot hold one more attempt's worst case). ``read``: how the caller reads a
        non-streamed 2xx (kept in ``Exchange.reading``), which the breaker's verdict on the
        upstream waits for: a 2xx that is no reply is the upstream failing."""
        failures = [] if failures is None else failures
        try:
            return await self._dispatch(out, failures, before_attempt, read)
        except ProxyError as e:
            e.attempts = attempted(failures)
            raise

    async def _admit(
        self,
        up: UpstreamRuntime,
        out: Outbound,
        failures: list[AttemptRecord],
        held: list[Admission],
        before_attempt: BeforeAttempt | None,
    ) -> tuple[Permit, Ticket] | None:
        """The breaker's permit and the local limits' ticket for one attempt on ``up``; None
        when either refuses (recorded in ``failures`` or ``held``, and in the telemetry)."""
        if before_attempt is not None:
            await before_attempt(sum(f.billed for f in failures))
        # Only a half-open breaker hands out a slot (a probe) that must be given back.
        permit = await up.breaker.acquire()
        if permit is None:
            failures.append(AttemptRecord(up.name, 0, CIRCUIT_OPEN))
            self.telemetry.skipped(up.name, "circuit_open")
            return None
        try:
            admission = await up.limits.reserve(out.est_tokens)
        except BaseException:
            if permit == "probe":
                await _released(up)
            raise
        if admission.ticket is None:
            self.telemetry.skipped(up.name, "local_limit")
            if permit == "probe":
                await _released(up)
            held.append(admission)
            return None
        return permit, admission.ticket

    def _serving(self, out: Outbound) -> list[UpstreamRuntime]:
        """The upstreams that serve the request's model, in order (for a native endpoint:
        those of the client's kind); a 404 when none does."""
        model = out.model
        candidates = self.candidates(model)
        if out.path is not None:
            candidates = [up for up in candidates if up.kind == out.client_dialect]
        if not candidates:
            raise ProxyError(
                "invalid_request",
                f"no configured upstream serves model {model!r}",
                code="model_not_found",
                status=404,
            )
        return candidates

    async def _dispatch(
        self,
        out: Outbound,
        failures: list[AttemptRecord],
        before_attempt: BeforeAttempt | None,
        read: ReplyReader | None,
    ) -> Exchange:
        candidates = self._serving(out)
        last_error: Exchange | None = None  # the last HTTP error answer, body already read
        last_record: AttemptRecord | None = None
        held: list[Admission] = []  # the local-limit verdicts of upstreams that could not admit
        # total_timeout bounds the whole request, retries and failover included: each attempt
        # gets what is left of it, and no attempt or backoff starts after it has passed.
        deadline = self._now() + self.settings.total_timeout
        expired = False
        tel = self.telemetry
        try:
            for i, up in enumerate(candidates):
                if expired:
                    break
                if i:
                    tel.failover(candidates[i - 1].name)
                for attempt in range(self.settings.retry_max_attempts):
                    remaining = deadline - self._now()
                    if remaining <= 0:
                        expired = True
                        break
                    admitted = await self._admit(up, out, failures, held, before_attempt)
                    if admitted is None:
                        break
                    permit, ticket = admitted
                    delay: float | None
                    try:
                        ex = await self._observed_send(up, out, ticket, remaining, attempt)
                    except _TRANSPORT_ERRORS as e:
                        await up.breaker.record_failure()
                        failures.append(AttemptRecord.transport_failure(up.name, e))
                        delay = self.backoff.delay(attempt)
                    except BaseException as e:
                        if isinstance(e, asyncio.CancelledError):
                            # The client went away with the request out: the upstream may
                            # bill it all the same.
                            failures.append(
                                AttemptRecord(up.name, CLIENT_CLOSED, "cancelled", billed=True)
                            )
                        if permit == "probe":
                            await _released(up)  # cancelled: no verdict on the upstream
                        raise
                    else:
                        if not ex.ok:
                            # An error answer generated nothing: it costs no tokens.
                            await up.limits.settle(ticket, 0)
                        if ex.ok or not fails_over(ex.status):
                            await _record_answer(up, permit, ex, None if out.stream else read)
                            ex.failed_attempts = attempted(failures)
                            return ex
                        if last_error is not None:
                            last_error.release()
                        last_error = ex
                        last_record = AttemptRecord(up.name, ex.status, f"HTTP {ex.status}")
                        failures.append(last_record)
                        await _record_error_answer(up, ex.status)
                        if is_key_rejected(ex.status):
                            break  # not retried on the same upstream: fail over
                        delay = self.backoff.delay(attempt, retry_after_from_headers(ex.headers()))
                    if delay is None or attempt + 1 >= self.settings.retry_max_attempts:
                        break  # None: Retry-After beyond the cap, fail over instead
                    if delay >= deadline - self._now():
                        expired = True  # the next attempt could only start too late
                        break
                    await asyncio.sleep(delay)
        except BaseException:
            if last_error is not None:
                last_error.close()
            raise
        real = attempted(failures)
        if last_error is not None:
            last_error.failed_attempts = [f for f in real if f is not last_record]
            return last_error
        self._raise_unanswered(out, len(candidates), failures, held, expired)

    def _raise_unanswered(
        self,
        out: Outbound,
        n_candidates: int,
        failures: list[AttemptRecord],
        held: list[Admission],
        expired: bool,
    ) -> NoReturn:
        """The error for a request that no upstream answered, most telling first: held back
        by local limits (429, or 413 when it can never fit), out of time (504), or the
        attempts' own failures."""
        real = attempted(failures)
        if held and not real:
            # Nothing was attempted: every candidate was held back by a local limit (or an
            # open circuit).
            fitting = [a.retry_after for a in held if not a.never_fits]
            if fitting:
                raise ProxyError(
                    "rate_limit",
                    "local rate limit reached for every upstream; retry after the given time",
                    retry_after=min(fitting),
                    code="local_rate_limit",
                )
            if len(held) == n_candidates:  # each said never_fits
                raise ProxyError(
                    "request_too_large",
                    f"this request (~{out.est_tokens} tokens estimated) is larger than the "
                    "tpm limit of every upstream that serves it; it can never fit by waiting",
                    code="tpm_exceeded",
                )
        if expired:
            raise ProxyError(
                "timeout",
                f"no upstream answered within total_timeout ({self.settings.total_timeout:g} s, "
                f"{len(real)} attempts)",
            )
        raise _all_failed(failures)

    async def _observed_send(
        self, up: UpstreamRuntime, out: Outbound, ticket: Ticket, remaining: float, attempt: int
    ) -> Exchange:
        """``_send``, counted (and traced) as one attempt; ``attempt`` > 0 is a retry."""
        tel = self.telemetry
        if attempt:
            tel.retry(up.name)
        span = tel.attempt_started(up.name, up.kind, out.model)
        try:
            ex = await self._send(up, out, ticket, remaining)
        except _TRANSPORT_ERRORS as e:
            tel.attempt_done(up.name, 0, _describe(e), span)
            raise
        except BaseException:
            tel.attempt_done(up.name, 0, "cancelled", span)
            raise
        tel.attempt_done(up.name, ex.status, "", span)
        return ex

    async def _send(
        self, up: UpstreamRuntime, out: Outbound, ticket: Ticket, remaining: float
    ) -> Exchange:
        """One attempt. Returns once everything needed before the client sees a byte has
        arrived: the whole body, or for a 2xx stream its first chunk. Anything that fails
        before then (the body read included) is a retryable transport error; the response
        is closed on any failure or cancellation so the upstream sees the request end."""
        assert up.session is not None
        url = up.base + (out.path or up.dialect.upstream_path)
        timeout = aiohttp.ClientTimeout(
            total=min(remaining, self.settings.total_timeout),
            sock_connect=self.settings.connect_timeout,
            sock_read=self.settings.first_byte_timeout,
        )
        resp = await up.session.post(
            url, data=out.payload_for_upstream(up.cfg, up.kind, up.max_tokens_field),
            headers=up.headers(out.client_headers),
            timeout=timeout,
        )  # fmt: skip
        ex = Exchange(up, resp, ticket)
        try:
            if out.stream and ex.ok:
                first = await resp.content.readany()
                if not first:
                    raise _StreamStartError("upstream closed the stream before any data")
                if is_json_reply(resp.headers.get("content-type"), first):
                    first = await _json_as_stream(resp, first, up)
                ex.first_chunk = first
            else:
                ex.body = await read_bounded(resp)
        except BaseException:
            resp.close()
            raise
        return ex


class _StreamStartError(Exception):
    pass


async def _json_as_stream(resp: aiohttp.ClientResponse, first: bytes, up: UpstreamRuntime) -> bytes:
    """A whole JSON reply to a streamed request (an upstream or gateway that ignored
    ``stream: true``), as the stream its kind sends for it (``dialects.replystream``): the
    turn is then relayed, metered and committed as any stream. JSON that is no reply (an
    error object under a 200, a reply of a shape no provider sends) fails the attempt, as a
    stream that never started does."""
    raw = first + await read_bounded(resp)
    events = as_stream(up.kind, raw, up.dialect.reply_problem)
    if isinstance(events, str):
        raise _StreamStartError(
            f"upstream answered a streamed request with JSON that is no reply ({events})"
        )
    return events


# A non-streamed answer is read whole before it is judged; a hostile or broken upstream
# sending gigabytes must not take the proxy's memory with it.
MAX_REPLY_BYTES = 64 * 1024 * 1024


class ReplyTooLarge(aiohttp.ClientPayloadError):
    """An upstream's answer over ``MAX_REPLY_BYTES``: a transport failure of that attempt."""


async def read_bounded(resp: aiohttp.ClientResponse, limit: int | None = None) -> bytes:
    """The whole body of ``resp``, or ReplyTooLarge as soon as it is known to pass ``limit``
    (default ``MAX_REPLY_BYTES``) without buffering the rest."""
    limit = MAX_REPLY_BYTES if limit is None else limit
    too_large = ReplyTooLarge(f"the answer is over {limit} bytes")
    if resp.content_length is not None and resp.content_length > limit:
        raise too_large
    parts: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise too_large
        parts.append(chunk)
    return b"".join(parts)


CIRCUIT_OPEN = "circuit open"  # an upstream skipped without being called
# Everything that means "this attempt got no usable answer"; aiohttp's timeouts are both
# ClientError and TimeoutError, the total-timeout timer raises a bare TimeoutError.
_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, _StreamStartError)
# The transport errors of an attempt that never sent its request: it could not connect
# (refused, DNS, TLS, the connect timeout) or its URL is wrong. aiohttp raises
# ConnectionTimeoutError for a timeout while connecting, SocketTimeoutError (sock_read)
# once the request is out.
_NOT_SENT = (
    aiohttp.ClientConnectorError,
    aiohttp.ConnectionTimeoutError,
    aiohttp.ServerFingerprintMismatch,
    aiohttp.InvalidURL,
)


async def _record_answer(
    up: UpstreamRuntime, permit: Permit, ex: Exchange, read: ReplyReader | None
) -> None:
    """What an answer that ends the dispatch says about the upstream's health. A 4xx is the
    request's fault: it answered. A non-streamed 2xx is read first (``read``): one that is
    no reply counts against the breaker, as a 2xx stream that never started does (a
    transport failure), and one that reports an error as that error's status would."""
    if ex.ok and read is not None:
        try:
            ex.reading = read(ex)
        except BaseException:
            ex.close()
            if permit == "probe":
                await _released(up)  # the proxy's own failure: no verdict on the upstream
            raise
        if isinstance(ex.reading, BadReply):
            await _record_error_answer(up, ex.reading.status)
            return
    await up.breaker.record_success()


async def _record_error_answer(up: UpstreamRuntime, status: int) -> None:
    """What an error answer that fails over says about the upstream's health: only a 5xx
    counts against its breaker (401/403 is the key, 408/429 a busy but live upstream)."""
    if status >= 500:
        await up.breaker.record_failure()
    else:
        await up.breaker.record_success()


async def _released(up: UpstreamRuntime) -> None:
    """Give a probe back, even while the task is being cancelled (a probe slot that is
    never given back would keep the upstream half_open with no probe until it expires)."""
    await asyncio.shield(up.breaker.release())


def attempted(failures: list[AttemptRecord]) -> list[AttemptRecord]:
    """The attempts that actually reached out to an upstream."""
    return [f for f in failures if f.error != CIRCUIT_OPEN]


def _describe(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "timeout"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _all_failed(failures: list[AttemptRecord]) -> ProxyError:
    real = attempted(failures)
    if not real:
        return ProxyError(
            "overloaded", "every upstream is unavailable (circuit open); try again later"
        )
    last = real[-1]
    if last.error == "timeout":
        return ProxyError("timeout", f"upstream {last.upstream} timed out")
    if last.unusable:
        # As a non-streamed 2xx that is no reply (``BadReply.error``): the upstream answered
        # and may bill each call, so the SDKs' own two retries of a 5xx are told not to.
        return ProxyError(
            "upstream_unreachable",
            f"upstream {last.upstream} returned no usable stream: {last.error}",
            should_retry=False,
        )
    if last.billed:
        # No whole answer came back after the request went out (the connection closed or
        # reset, a body cut mid-answer or over the size bound): the provider had it and may
        # bill it. The proxy already tried ``retry_max_attempts`` times; the SDKs' own
        # retries (two each) would multiply what is billed and held against budgets.
        tried = len(real)
        return ProxyError(
            "upstream_unreachable",
            f"the upstream took the request but no whole answer came back: {last.upstream}:"
            f" {last.error}; it may bill the call; tried {tried} time{'s' if tried != 1 else ''}",
            code="upstream_answer_lost",
            should_retry=False,
        )
    return ProxyError(
        "upstream_unreachable", f"no upstream could be reached: {last.upstream}: {last.error}"
    )
