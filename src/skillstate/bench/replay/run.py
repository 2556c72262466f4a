"""Replaying sessions: each session through a real in-process proxy once per arm (a proxy
mode) and cache regime, in front of :class:`~.upstream.ReplayUpstream`; what each arm billed
and kept, per call.

The proxy runs at its real defaults (or the ``--config`` file's settings) with its own
store in a temporary directory; one proxy per arm, regime and upstream kind serves all
sessions (each its own proxy session). The upstream's prompt cache is forgotten between
sessions, and its clock is the calls' recorded times.
"""

from __future__ import annotations

import contextlib
import http.client
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from skillstate.bench.arm import regime_prices
from skillstate.bench.reach import CallReach, ReachMeter, action_tokens, strings_of
from skillstate.cost.pricing import Prices, cost_from_prices
from skillstate.cost.tokens import BYTES_PER_TOKEN, estimate_text_tokens
from skillstate.cost.usage import Usage

from .forms import (
    RequestBuilder,
    as_anthropic,
    prefix_unlogged,
    standin_text,
    standin_tools,
    with_standin,
)
from .jsonstream import LogError
from .session import ENVELOPE_TOKENS, REGIMES, Session
from .sources import Problem, iter_sessions
from .upstream import CallScript, ReplayUpstream

__all__ = [
    "ARMS",
    "REGIMES",
    "ArmRun",
    "ReplayError",
    "ReplayOptions",
    "Replayer",
    "SessionRun",
    "available_arms",
]

ARMS = ("passthrough", "mask", "state", "window", "auto")  # in report order
Progress = Callable[[int, int], None]  # (calls done, calls in all)
COSTS = ("input", "cache_read", "cache_write", "output")
# The Claude Code reader's note for a log without api-request lines: the stand-in's note says
# it instead (with the stand-in's size).
UNLOGGED_NOTE = "no api-request lines: system prompt and tools not logged"
STANDIN_PROBE_BYTES = 64  # the stand-in the first call is measured with, to size the real one


class ReplayError(Exception):
    """A usage or setup problem, said in one line."""


@dataclass(frozen=True, slots=True)
class _Form:
    """A session as one cache regime's upstream is sent it (its own dialect, or translated):
    the session, its calls' scripts and its request bytes."""

    session: Session
    scripts: list[CallScript]
    builder: RequestBuilder


def available_arms() -> tuple[str, ...]:
    """The arms this proxy has a mode for, in report order."""
    from skillstate.choices import Mode

    modes = {m.value for m in Mode}
    return tuple(a for a in ARMS if a in modes)


@dataclass
class ReplayOptions:
    arms: tuple[str, ...] = ()  # () = every available arm
    regimes: tuple[str, ...] = ()  # () = each session's own provider's
    price_as: str | None = None  # () = the model the log names
    envelope_tokens: int = ENVELOPE_TOKENS
    config: str | None = None  # the proxy's config file
    include_text: bool = False


@dataclass
class ArmRun:
    """One session (or a total) in one arm and regime."""

    calls: int = 0
    errors: int = 0
    invalid: int = 0
    upstream_requests: int = 0
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys((*COSTS, "envelope"), 0))
    usd: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COSTS, 0.0))
    per_call_usd: list[float] = field(default_factory=list)
    reach: list[CallReach] = field(default_factory=list)
    first_error: str | None = None
    first_prompt: int | None = None  # the first call's input tokens (the truth check's)
    requests: list[list[dict[str, Any]]] = field(default_factory=list)  # keep_requests only
    seconds: float = 0.0  # wall time of the calls (client, proxy and upstream)

    @property
    def total_usd(self) -> float:
        return sum(self.usd.values())

    def add(self, other: ArmRun) -> None:
        self.calls += other.calls
        self.errors += other.errors
        self.invalid += other.invalid
        self.upstream_requests += other.upstream_requests
        for k in self.tokens:
            self.tokens[k] += other.tokens[k]
        for k in self.usd:
            self.usd[k] += other.usd[k]
        self.seconds += other.seconds
        self.per_call_usd.extend(other.per_call_usd)
        self.reach.extend(other.reach)
        self.first_error = self.first_error or other.first_error


@dataclass
class SessionRun:
    """One session's replay: per regime, per arm."""

    file: str
    id: str
    source: str
    model: str | None
    calls: int
    arms: dict[str, dict[str, ArmRun]] = field(default_factory=dict)  # regime -> arm -> run
    recorded_usd: float | None = None  # the log's own usage, priced (its provider's regime)
    simulated_usd: float | None = None  # passthrough's tokens at the recorded bill's prices
    recorded_regime: str | None = None
    standin_tokens: int | None = None  # the stand-in for an unlogged prefix (None: none sent)
    recorded_first_prompt: int | None = None  # the recorded first call's input tokens
    simulated_first_prompt: int | None = None  # passthrough's first call, as simulated
    notes: list[str] = field(default_factory=list)
    texts: list[str] | None = None  # the recorded replies (--include-text only)


def _excluded(session: Session) -> list[str]:
    """The strings of the system prompt, the tool definitions and the first call's request
    (the system messages, the environment and the task): tokens found there are not the
    history's."""
    first = session.calls[0].messages if session.calls else []
    return list(strings_of([session.system, session.tools, [session.pool[i] for i in first]]))


def call_scripts(session: Session, envelope_tokens: int) -> list[CallScript]:
    """Per call: the recorded reply, the reach targets and the envelope's notes."""
    meter = ReachMeter()
    pool_strings: dict[int, tuple[str, ...]] = {}

    def strings(i: int) -> tuple[str, ...]:
        found = pool_strings.get(i)
        if found is None:
            found = pool_strings[i] = tuple(strings_of(session.pool[i]))
        return found

    excluded = meter.tokens_of(_excluded(session))
    scripts = []
    at = 0.0
    for step, call in enumerate(session.calls, 1):
        transcript = {s for i in call.messages for s in strings(i)}
        action = action_tokens(call.reply.tool_inputs())
        reachable = (action & meter.tokens_of(transcript)) - excluded if action else set()
        at = call.at if call.at is not None else at + 1.0
        scripts.append(
            CallScript(
                call.reply,
                step,
                at,
                _summary(meter, session, call.messages, strings, excluded, envelope_tokens),
                reachable,
                transcript,
            )
        )
    return scripts


def _summary(
    meter: ReachMeter,
    session: Session,
    messages: list[int],
    strings: Callable[[int], tuple[str, ...]],
    excluded: frozenset[str] | set[str],
    envelope_tokens: int,
) -> list[str]:
    """The envelope's notes: the transcript's distinctive tokens, newest message first."""
    budget = envelope_tokens * 4
    seen: set[str] = set()
    out: list[str] = []
    size = 0
    for i in reversed(messages):
        for s in strings(i):
            for token in sorted(meter.tokens(s) - excluded - seen):
                seen.add(token)
                out.append(token)
                size += len(token) + 1
                if size >= budget:
                    return out
    return out


class _Client:
    """A keep-alive HTTP/1.1 connection to one proxy."""

    def __init__(self, url: str) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self._host, self._port = host, int(port)
        self._conn: http.client.HTTPConnection | None = None

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any, bytes]:
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=300)
            try:
                self._conn.request("POST", path, body=body, headers=headers)
                resp = self._conn.getresponse()
                return resp.status, resp.headers, resp.read()
            except (OSError, http.client.HTTPException):
                self._conn.close()
                self._conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def _headers(session: Session, proxy_session: str) -> dict[str, str]:
    from skillstate.sessions.ids import SESSION_HEADER

    headers = {"content-type": "application/json", SESSION_HEADER: proxy_session}
    if session.dialect == "anthropic":
        headers.update({"x-api-key": "replay", "anthropic-version": "2023-06-01"})
        headers.update(session.headers)
    else:
        headers["authorization"] = "Bearer replay"
    return headers


def _error_text(status: int, raw: bytes) -> str:
    import orjson

    try:
        data = orjson.loads(raw)
        error = data.get("error") if isinstance(data, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
    except orjson.JSONDecodeError:
        message = None
    text = " ".join(str(message or raw[:200].decode(errors="replace")).split())
    return f"HTTP {status}: {text[:200]}"


def parse_regime(label: str) -> tuple[str, float | None]:
    """A regime label: ``openai``, ``anthropic``, ``none``, or one of them with its cache
    read priced at another fraction of the input price (``openai@0.1``)."""
    from skillstate.bench.arm import BenchError, split_regime

    try:
        return split_regime(label)
    except BenchError as e:
        raise ReplayError(str(e)) from None


class Replayer:
    """Runs sessions through the arms; holds the servers (close it, or use ``with``)."""

    def __init__(self, options: ReplayOptions, *, keep_requests: bool = False) -> None:
        self.options = options
        self.keep_requests = keep_requests  # keep what the upstream received, per call
        self.arms = options.arms or available_arms()
        unknown = [a for a in self.arms if a not in available_arms()]
        if unknown:
            have = ", ".join(available_arms())
            raise ReplayError(
                f"--arms: this proxy has no mode {', '.join(unknown)} (it has {have})"
            )
        for label in options.regimes:
            parse_regime(label)
        self._prices: dict[tuple[str, str, bool], Prices] = {}
        if options.price_as:
            # Refused before any log is read, not once per session.
            for regime in options.regimes or REGIMES:
                try:
                    self.prices(None, regime)
                except LogError as e:
                    raise ReplayError(str(e)) from None
        self._stack = contextlib.ExitStack()
        self._upstreams: dict[str, ReplayUpstream] = {}
        self._proxies: dict[tuple[str, str, str], Any] = {}
        self._clients: dict[tuple[str, str, str], _Client] = {}
        self._tmp = Path(
            self._stack.enter_context(tempfile.TemporaryDirectory(prefix="skillstate-replay-"))
        )
        self._base = self._base_settings()

    def __enter__(self) -> Replayer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._stack.close()

    # -- servers --------------------------------------------------------------------------
    def _base_settings(self) -> dict[str, Any]:
        from skillstate.config import ConfigError, file_settings

        try:
            return file_settings(self.options.config or None)
        except ConfigError as e:
            raise ReplayError(f"--config: {e}") from None

    def _upstream(self, regime: str) -> ReplayUpstream:
        base, _ = parse_regime(regime)
        up = self._upstreams.get(base)
        if up is None:
            up = ReplayUpstream(
                base,
                envelope_tokens=self.options.envelope_tokens,
                keep_bodies=self.keep_requests,
            )
            self._stack.enter_context(up)
            self._upstreams[base] = up
        return up

    def prices(self, model: str | None, regime: str, *, own_read: bool | None = None) -> Prices:
        """The rates a session's calls are billed at (LogError: the session cannot be priced).
        ``own_read``: the cache read at the model's own price where the price book has one;
        by default so for the default regime (the log's provider's), never for a
        ``--cache-regime`` given (``openai`` keeps its 0.5x, ``openai@0.1`` its 0.1x)."""
        name = self.options.price_as or model
        own = not self.options.regimes if own_read is None else own_read
        key = (str(name), regime, own)
        if key not in self._prices:
            base, read = parse_regime(regime)
            prices = regime_prices(name, base, read, own_read=own) if name else None
            if prices is None:
                what = f"no bundled price for model {name!r}" if name else "the log names no model"
                raise LogError(f"{what}: price it as a known model with --price-as MODEL")
            self._prices[key] = prices
        return self._prices[key]

    def _prices_for_proxy(self, regime: str) -> Prices | None:
        """The rates the proxies of a regime are given (the --price-as model's; with no
        --price-as, the proxy's own price book per model)."""
        if self.options.price_as is None:
            return None
        return self.prices(None, regime)

    def _proxy(self, arm: str, regime: str, kind: str) -> _Client:
        key = (arm, regime, kind)
        client = self._clients.get(key)
        if client is not None:
            return client
        from skillstate.app.server import ProxyServer
        from skillstate.config import Settings, Upstream

        up = self._upstream(regime)
        prices = self._prices_for_proxy(regime)
        upstream: dict[str, Any] = {
            "name": "replay",
            "url": up.url,
            "api_key": "replay",
            "kind": kind,
            "cache_pricing": parse_regime(regime)[0],
        }
        if prices is not None:  # the proxy's own estimates (auto) use the replay's rates
            upstream["prices"] = {
                "input_per_mtok": prices.input_per_mtok,
                "output_per_mtok": prices.output_per_mtok,
                "cache_read_per_mtok": prices.cache_read_per_mtok,
                "cache_write_per_mtok": prices.cache_write_per_mtok,
            }
        data_dir = self._tmp / f"{arm}-{regime.replace('@', '-')}-{kind}"
        data_dir.mkdir()
        settings = Settings.model_validate(
            {
                **self._base,
                "host": "127.0.0.1",
                "port": 0,
                "mode": arm,
                "data_dir": data_dir,
                "upstreams": [Upstream.model_validate(upstream)],
            }
        )
        proxy = self._stack.enter_context(ProxyServer(settings))
        self._proxies[key] = proxy
        client = self._clients[key] = _Client(proxy.url)
        return client

    # -- replaying --------------------------------------------------------------------------
    def regimes_for(self, session: Session) -> tuple[str, ...]:
        return self.options.regimes or (session.provider,)

    def replay_session(
        self, file: str, session: Session, progress: Callable[[int], None]
    ) -> SessionRun:
        """The session in every arm and regime. LogError: it cannot be replayed (it cannot be
        priced, translated or sent), said before any call is."""
        run = SessionRun(file, session.id, session.source, session.model, len(session.calls))
        run.notes = list(session.notes)
        if self.options.include_text:
            run.texts = [c.reply.text for c in session.calls]
        regimes = self.regimes_for(session)
        for regime in regimes:  # a session that cannot be priced is refused before any call
            self.prices(session.model, regime)
        session, warm = self._with_standin(session, run)
        forms: dict[str, _Form] = {}
        plan = [
            (regime, self._form(session, regime, forms), self.prices(session.model, regime))
            for regime in regimes
        ]
        for regime, form, prices in plan:
            run.arms[regime] = {
                arm: self._replay_arm(arm, regime, form, prices, progress, warm)
                for arm in self.arms
            }
        self._truth(run, session)
        return run

    def _with_standin(
        self, session: Session, run: SessionRun
    ) -> tuple[Session, list[dict[str, Any]] | None]:
        """The session with a stand-in for the prefix its log does not hold (see
        forms.with_standin), sized so that passthrough's first call holds the recorded
        first call's input tokens (cache reads and writes included), and the stand-in's
        part that call read from the cache (Anthropic; to prime each arm's cache with);
        the note says so."""
        first = session.calls[0].usage if session.calls else None
        if not prefix_unlogged(session) or first is None or "passthrough" not in available_arms():
            return session, None
        run.notes = [n for n in run.notes if n != UNLOGGED_NOTE]
        # What an earlier session left in the cache (Claude Code's system prompt and tools
        # are the same in every session): the part the recorded first call read.
        read = first.cache_read_tokens if session.provider == "anthropic" else 0
        warm = standin_tools(read) if read else None
        probe = with_standin(session, standin_text(STANDIN_PROBE_BYTES), warm)
        measured = self._first_prompt(probe, self._standin_regime(session), warm)
        nbytes = STANDIN_PROBE_BYTES + (first.input_tokens - (measured or 0)) * BYTES_PER_TOKEN
        if measured is None:
            run.notes.append(
                "system prompt and tools not logged: no stand-in sent (its first call failed)"
            )
            return session, None
        text = standin_text(nbytes) if nbytes > 0 else None
        if text is None and warm is None:
            run.notes.append(
                "system prompt and tools not logged: no stand-in sent (the replayed first call "
                "already holds the recorded input tokens)"
            )
            return session, None
        padded = with_standin(session, text, warm)
        run.standin_tokens = read + (estimate_text_tokens(text) if text else 0)
        cached = f" ({read:,} of them cached before the session, as recorded)" if warm else ""
        run.notes.append(
            f"system prompt and tools not logged: a stand-in of {run.standin_tokens:,} tokens "
            f"sent in their place{cached}"
        )
        return padded, warm

    def _standin_regime(self, session: Session) -> str:
        """The regime the stand-in is sized under: the truth check's (the log's provider's)
        if it is replayed, else the first one."""
        regimes = self.regimes_for(session)
        own = [r for r in regimes if parse_regime(r)[0] == session.provider]
        return (own or list(regimes))[0]

    def _first_prompt(
        self, session: Session, regime: str, warm: list[dict[str, Any]] | None
    ) -> int | None:
        """The input tokens of the session's first call as passthrough sends it (the call
        replayed alone; the upstream's cache is forgotten before the arms run); None when
        it fails (the arms then say how)."""
        one = replace(session, calls=session.calls[:1])
        form = _Form(one, call_scripts(one, 0), RequestBuilder(one, one.model or "replay-model"))
        prices = self.prices(session.model, regime)
        run = self._replay_arm("passthrough", regime, form, prices, lambda n: None, warm)
        return run.first_prompt if run.errors == 0 and run.first_prompt else None

    def _form(self, session: Session, regime: str, forms: dict[str, _Form]) -> _Form:
        """The session as ``regime``'s upstream is sent it (``forms``: those made, by
        dialect)."""
        translate = parse_regime(regime)[0] == "anthropic" and session.dialect == "openai"
        dialect = "anthropic" if translate else session.dialect
        if dialect not in forms:
            form = as_anthropic(session) if translate else session
            # The request bytes first: they refuse a message too deep to send, which the
            # scripts' (recursive) walk of the messages would not survive either.
            builder = RequestBuilder(form, form.model or "replay-model")
            scripts = call_scripts(form, self.options.envelope_tokens)
            forms[dialect] = _Form(form, scripts, builder)
        return forms[dialect]

    def _truth(self, run: SessionRun, session: Session) -> None:
        """The log's own bill (its model's own cache-read price where the price book has
        one, whatever --cache-regime says) and passthrough's tokens at the same prices,
        under the log's provider's regime (as given, or its first with ``@READ``)."""
        if not session.recorded_usage:
            return
        labels = [r for r in run.arms if parse_regime(r)[0] == session.provider]
        regime = session.provider if session.provider in run.arms else next(iter(labels), None)
        if regime is None:
            return
        prices = self.prices(session.model, regime, own_read=True)
        run.recorded_usd = sum(cost_from_prices(c.usage, prices) for c in session.calls if c.usage)
        run.recorded_regime = regime
        first = session.calls[0].usage
        run.recorded_first_prompt = first.input_tokens if first else None
        passthrough = run.arms[regime].get("passthrough")
        if passthrough is not None:
            tokens = passthrough.tokens
            run.simulated_usd = (
                tokens["input"] * prices.input_per_mtok
                + tokens["cache_read"] * prices.cache_read_per_mtok
                + tokens["cache_write"] * prices.cache_write_per_mtok
                + tokens["output"] * prices.output_per_mtok
            ) / 1e6

    def _replay_arm(
        self,
        arm: str,
        regime: str,
        form: _Form,
        prices: Prices,
        progress: Callable[[int], None],
        warm: list[dict[str, Any]] | None = None,
    ) -> ArmRun:
        session, builder = form.session, form.builder
        anthropic = session.dialect == "anthropic" or parse_regime(regime)[0] == "anthropic"
        kind = "anthropic" if anthropic else "openai"
        client = self._proxy(arm, regime, kind)
        upstream = self._upstream(regime)
        upstream.begin_session()
        if warm and form.scripts and parse_regime(regime)[0] == "anthropic":
            # The stand-in's cached part, as the session found it: its tools written.
            upstream.prime(
                {"tools": warm, "cache_control": {"type": "ephemeral"}}, form.scripts[0].at
            )
        headers = _headers(session, f"replay-{uuid.uuid4().hex[:16]}")
        out = ArmRun()
        started = time.perf_counter()
        for call, script in zip(session.calls, form.scripts, strict=True):
            upstream.play(script)
            status, resp_headers, raw = client.post(builder.path, builder.body(call), headers)
            answers = upstream.answers()
            out.calls += 1
            out.upstream_requests += len(answers)
            if self.keep_requests:
                out.requests.append([a.body for a in answers if a.body is not None])
            if status >= 400:
                out.errors += 1
                out.first_error = out.first_error or _error_text(status, raw)
            if (resp_headers.get("x-skillstate-transition") or "") == "invalid":
                out.invalid += 1
            usd = 0.0
            for a in answers:
                if a.status != 200:
                    continue
                usage = Usage(
                    a.prompt_tokens, a.output_tokens, a.cache_read_tokens, a.cache_write_tokens
                )
                plain = usage.uncached_input_tokens
                out.tokens["input"] += plain
                out.tokens["cache_read"] += a.cache_read_tokens
                out.tokens["cache_write"] += a.cache_write_tokens
                out.tokens["output"] += a.output_tokens
                out.tokens["envelope"] += a.envelope_tokens
                out.usd["input"] += plain * prices.input_per_mtok / 1e6
                out.usd["cache_read"] += a.cache_read_tokens * prices.cache_read_per_mtok / 1e6
                out.usd["cache_write"] += a.cache_write_tokens * prices.cache_write_per_mtok / 1e6
                out.usd["output"] += a.output_tokens * prices.output_per_mtok / 1e6
                usd += cost_from_prices(usage, prices)
            if out.first_prompt is None:
                out.first_prompt = sum(a.prompt_tokens for a in answers if a.status == 200)
            reach = next((a.reach for a in answers if a.reach is not None), None)
            if reach is not None:
                out.reach.append(reach)
            out.per_call_usd.append(usd)
            progress(1)
        out.seconds = time.perf_counter() - started
        return out


def count_calls(paths: Iterable[str]) -> int:
    """How many calls the logs hold (a first, reading-only pass, for the progress bar)."""
    return sum(len(s.calls) for _, s in iter_sessions(paths) if isinstance(s, Session))


def replay(
    paths: Iterable[str], options: ReplayOptions, progress: Progress | None = None
) -> Iterator[tuple[str, SessionRun | Problem]]:
    """Replay every session of the logs named; yields each session's run (or a file's
    problem) as soon as it is done. Sessions are read one at a time."""
    paths = list(paths)
    done = total = 0

    def tick(n: int) -> None:
        nonlocal done
        done += n
        if progress:
            progress(done, total)

    with Replayer(options) as replayer:  # a usage error is said before any log is read
        if progress:
            total = count_calls(paths) * len(replayer.arms) * max(1, len(options.regimes))
        replayed_calls: set[Any] = set()  # a copy of one in another file is counted once
        for file, item in iter_sessions(paths, replayed_calls):
            if isinstance(item, Problem):
                yield file, item
                continue
            try:
                run = replayer.replay_session(file, item, tick)
            except LogError as e:
                yield file, Problem(file, f"session {item.id}: {e}")
                continue
            except Exception as e:
                # A value of a shape no reader check foresaw, met while replaying: this
                # session is one problem line, not a traceback that ends the others.
                text = str(e).splitlines()[0][:200] if str(e) else ""
                why = f"{type(e).__name__}: {text}" if text else type(e).__name__
                yield file, Problem(file, f"session {item.id}: cannot be replayed ({why})")
                continue
            replayed_calls.update(k for k in item.call_keys if k is not None)
            yield file, run
