"""A wire-faithful fake LLM provider (OpenAI chat completions + Anthropic Messages).

Written from the public API specs, independently of the proxy, so it can serve as the
reference that proves the proxy speaks both wire formats. It is a real HTTP server on
127.0.0.1 (aiohttp) that runs in a background thread with its own event loop::

    fp = FakeProvider().start()          # fp.url == "http://127.0.0.1:PORT"
    fp.enqueue(Reply(text="hi"), Reply(tool_calls=[("get_weather", {"city": "Oslo"})]))
    ...                                  # point a client (or the proxy) at fp.url
    fp.requests[-1].json                 # what arrived; .completed / .disconnected
    fp.stop()

Standalone: ``python tests/fakeprovider.py --port 0`` prints ``listening on http://...``
and serves until killed; script it over HTTP with ``POST /_fake/enqueue`` (a Reply as JSON,
or a list of them), ``GET /_fake/requests`` and ``POST /_fake/reset``.

Input tokens (:func:`prompt_tokens`) are everything the model reads, the tool definitions
included: every provider renders the tools into the prompt and bills them (chat completions:
the messages and tools; Messages: the system, messages and tools, also what
``/v1/messages/count_tokens`` answers; Responses: the instructions, input items and tools, also
what ``/v1/responses/input_tokens`` answers).

Prompt caching (``FakeProvider(cache="openai" | "anthropic")``): usage reports cache reads
and writes the way the real APIs bill them, unless a Reply scripts its own cache figures.
``openai`` (chat completions AND Responses, which OpenAI caches alike): automatic prefix
caching; the longest byte prefix (tools, then each message, or the instructions and each
input item, as compact JSON) shared with a request seen within ``cache_ttl`` seconds is read,
in steps of 128 tokens, when it is at least ``cache_min_tokens`` (1,024);
``cached_tokens`` (``prompt_tokens_details`` / ``input_tokens_details``) is part of the
input. ``anthropic``: explicit ``cache_control`` breakpoints on blocks, in Anthropic's
cache order: each tool, each system block, each message content block (the marker itself is
not part of the prefix; a top-level ``cache_control``, automatic caching, marks the last
block). The longest prefix ending at a block boundary at most ``CACHE_LOOKBACK_BLOCKS``
blocks before one of the breakpoints that an earlier request wrote is read; the prefix up to
the last breakpoint is written when it is longer and at least the model's minimum
(:meth:`FakeProvider.cache_minimum`: ``ANTHROPIC_CACHE_MINIMUMS``, else
``cache_min_tokens``); ``input_tokens`` EXCLUDES both (Anthropic's convention). Prefix
tokens use the fake tokenizer on those bytes, capped at the prompt's tokens. When a request's
markers set a ``ttl``, usage also carries the writes' split, ``cache_creation:
{"ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens"}`` (on the message and on
``message_start``; ``message_delta`` repeats only the sum, as the API's MessageDeltaUsage
does): the written tokens up to the last ``"ttl": "1h"`` breakpoint are one-hour writes
(Anthropic wants the one-hour breakpoints before the five-minute ones), the rest five-minute
ones. (The API sends the split on every reply; the fake only when asked, so that the usage
of requests without a ``ttl`` stays as it was.)

Fault injection (all on Reply): ``status``/``error_body``/``retry_after`` (an error in the
endpoint's dialect), ``delay`` (before headers), ``chunk_delay`` (between events),
``hold`` (a threading.Event: send nothing until the test sets it, e.g. to keep a turn in
flight while the test acts), ``stall_after=N`` (send N events, then hang until the client
goes away), ``drop`` (close
the connection without a response), ``drop_after=N`` (send N events, then close the
connection mid-body). For non-streaming replies N counts bytes of the JSON body.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import fnmatch
import json
import math
import secrets
import string
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

DEFAULT_TEXT = '```json\n{"state_patch": {}, "action": "noop"}\n```'
CHUNK_CHARS = 8  # text / argument fragment size when streaming
ANTHROPIC_CONTEXT_WINDOW = 200_000  # what the Anthropic models list says of every model
SYSTEM_FINGERPRINT = "fp_fake0001"
USAGE_KEYS = {
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "cache_read",
    "cache_write",
    "reasoning_tokens",
}
COMPACT_PATH = "/v1/responses/compact"
INPUT_TOKENS_PATH = "/v1/responses/input_tokens"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
# How a compatible server without the counting routes answers them (vLLM, a FastAPI app):
# a 405 where another method's route matches the path (its GET /v1/responses/{id}), else
# the bare 404.
NO_COUNT_ROUTES = {
    INPUT_TOKENS_PATH: (405, b'{"detail":"Method Not Allowed"}'),
    COUNT_TOKENS_PATH: (404, b'{"detail":"Not Found"}'),
}
# What ``POST /v1/responses/input_tokens`` takes (the openai SDK's InputTokenCountParams,
# 3.57); any other field is the API's "Unknown parameter" 400 (max_output_tokens, stream...).
INPUT_TOKENS_FIELDS = {
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
    "reasoning", "text", "truncation", "conversation", "previous_response_id", "personality",
}  # fmt: skip
# What ``POST /v1/responses`` refuses as the API's "Unknown parameter" 400: the members of
# chat completions' request (the openai SDK's CompletionCreateParams) that Responses has
# under another name or not at all (its ResponseCreateParams). Not every unknown field: the
# API takes some the SDK does not list (Codex's ``client_metadata``).
CHAT_ONLY_FIELDS = {
    "messages", "max_tokens", "max_completion_tokens", "n", "stop", "seed", "response_format",
    "reasoning_effort", "frequency_penalty", "presence_penalty", "logit_bias", "logprobs",
    "functions", "function_call", "modalities", "audio", "web_search_options", "prediction",
    "verbosity",
}  # fmt: skip
RESPONSES_STREAM_OPTIONS = {"include_obfuscation"}  # ResponseCreateParams' StreamOptions
# What ``POST /v1/responses/compact`` takes (the openai SDK's ResponseCompactParams); any
# other field is the API's "Unknown parameter" 400 (it does not stream, for one).
COMPACT_FIELDS = {
    "model", "input", "instructions", "previous_response_id", "prompt_cache_key",
    "prompt_cache_options", "prompt_cache_retention", "service_tier",
}  # fmt: skip
# Anthropic's minimum cacheable prefix per model (its prompt-caching docs; fnmatch patterns,
# the first match wins); any other model: ``FakeProvider.cache_min_tokens`` (1,024). OpenAI's
# minimum is 1,024 for every model.
ANTHROPIC_CACHE_MINIMUMS = {
    "claude-opus-4-5*": 4096, "claude-opus-4-6*": 4096, "claude-haiku-4-5*": 4096,
    "claude-sonnet-4-6*": 2048, "claude-3-5-haiku*": 2048, "claude-3-haiku*": 2048,
}  # fmt: skip
# Anthropic looks for a cache hit at most this many block boundaries before a breakpoint.
CACHE_LOOKBACK_BLOCKS = 20
CACHE_STEP_TOKENS = 128  # OpenAI reports cached tokens in 128-token increments
_OPENAI_FINISH = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length"}
_ANTHROPIC_STOP = {v: k for k, v in _OPENAI_FINISH.items()}
_ALNUM = string.ascii_letters + string.digits


def _rid(prefix: str, n: int = 24) -> str:
    return prefix + "".join(secrets.choice(_ALNUM) for _ in range(n))


def ntokens(text: str) -> int:
    """The fake tokenizer: one token per 4 characters, rounded up."""
    return math.ceil(len(text) / 4)


def estimate_tokens(obj: Any) -> int:
    """Token estimate of any JSON value: ``ceil(len(json.dumps(obj)) / 4)``."""
    return ntokens(json.dumps(obj))


def _unmarked(value: Any) -> Any:
    """``value`` without its ``cache_control`` keys (a marker is not part of the prompt)."""
    if isinstance(value, dict):
        return {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_unmarked(v) for v in value]
    return value


def prompt_tokens(req: dict[str, Any], dialect: str) -> int:
    """The input tokens a request is billed (``dialect``: openai, anthropic or responses):
    what the model reads, the tool definitions included (Anthropic's ``cache_control``
    markers are not)."""
    tools = req.get("tools")
    if dialect == "anthropic":
        tools, system = _unmarked(tools), _unmarked(req.get("system"))
        billed = (estimate_tokens(tools) if tools else 0) + (
            estimate_tokens(system) if system else 0
        )
        return billed + estimate_tokens(_unmarked(req.get("messages", [])))
    billed = estimate_tokens(tools) if tools else 0
    if dialect == "responses":
        return billed + estimate_tokens([req.get("instructions"), req.get("input")])
    return billed + estimate_tokens(req.get("messages", []))


def _common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings."""
    n = min(len(a), len(b))
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k


def _pieces(s: str, n: int = CHUNK_CHARS) -> list[str]:
    return [s[i : i + n] for i in range(0, len(s), n)]


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)  # str: sent verbatim
    id: str | None = None  # generated ("call_…" / "toolu_…") when None
    # A custom tool's call (free text, ``arguments`` its input): chat completions sends it as
    # ``{"type": "custom", "custom": {"name", "input"}}``, Responses as a custom_tool_call
    # item; Anthropic has no such call (a reply scripting one there is a test's mistake).
    custom: bool = False

    @property
    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, separators=(",", ":"), ensure_ascii=False)


@dataclass
class Reply:
    """One scripted response. With neither text nor tool calls it says DEFAULT_TEXT."""

    text: str | None = None
    tool_calls: list[Any] = field(default_factory=list)  # (name, args) | ToolCall | dict
    finish_reason: str | None = None  # either dialect's vocabulary; derived when None
    usage: dict[str, int] = field(default_factory=dict)  # keys: USAGE_KEYS
    model: str | None = None  # default: echo the request's model
    status: int = 200
    error_body: dict[str, Any] | str | bytes | None = None  # dict as-is; str = message; bytes raw
    raw_body: bytes | None = None  # sent as-is with `status`, instead of a well-formed reply
    retry_after: str | float | None = None
    delay: float = 0.0
    hold: threading.Event | None = field(default=None, repr=False)  # wait for it before headers
    chunk_delay: float = 0.0
    stall_after: int | None = None
    drop: bool = False
    drop_after: int | None = None
    # Anthropic only: blocks sent before the text and tool calls, as given
    # ({"type": "thinking", "thinking", "signature"} or {"type": "redacted_thinking", "data"});
    # streamed as thinking_delta + signature_delta, redacted_thinking whole in its start.
    thinking: list[dict[str, Any]] = field(default_factory=list)
    # Responses only: output items of the other types, as given (``id``/``status`` filled in
    # when missing): calls the client runs (custom_tool_call, local_shell_call, shell_call,
    # apply_patch_call, computer_call, mcp_approval_request), after the message and the
    # function calls; hosted calls the API ran (web_search_call, mcp_call, ...) and reasoning,
    # before the message. Streamed as the API streams each type (``_other_item_events``).
    items: list[dict[str, Any]] = field(default_factory=list)
    # Responses only: the model refuses (a refusal part instead of output_text; streamed as
    # response.refusal.delta / .done), and a response that fails (its status "failed" with
    # this error message and ``fail_code``, no output; streamed, it started: its last event
    # is response.failed).
    refusal: str | None = None
    fail: str | None = None
    fail_code: str = "server_error"

    def __post_init__(self) -> None:
        calls = []
        for tc in self.tool_calls:
            if isinstance(tc, dict):
                tc = ToolCall(**tc)
            elif not isinstance(tc, ToolCall):
                tc = ToolCall(*tc)
            calls.append(tc)
        self.tool_calls = calls
        unknown = set(self.usage) - USAGE_KEYS
        if unknown:
            raise ValueError(f"unknown usage keys {sorted(unknown)}; use {sorted(USAGE_KEYS)}")


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-case keys
    json: Any  # parsed body, None if absent or unparseable
    body: bytes = field(default=b"", repr=False)
    dialect: str = "openai"  # or "anthropic"
    query: str = ""  # the raw query string
    stream: bool = False
    reply: Reply | None = None  # the scripted reply used (None: rejected or /v1/models)
    status: int | None = None  # HTTP status sent, None if no headers were sent
    events_sent: int = 0  # SSE events (or body parts) written
    response_body: bytes = field(default=b"", repr=False)  # everything written after the headers
    completed: bool = False  # the whole response was written
    disconnected: bool = False  # the client went away before we finished
    dropped: bool = False  # we closed the connection on purpose (drop / drop_after)
    started_at: float = field(default_factory=time.monotonic)
    ended_at: float | None = None


class _Rejected(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: Any = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


class FakeProvider:
    def __init__(
        self, *, require_auth: bool = True, validate: bool = True, cache: str | None = None
    ) -> None:
        if cache not in (None, "openai", "anthropic"):
            raise ValueError(f"cache must be None, 'openai' or 'anthropic', not {cache!r}")
        self.cache = cache
        self.cache_ttl = 300.0
        self.cache_min_tokens = 1024
        self._cached: dict[str, float] = {}  # openai: prompt bytes; anthropic: prefixes
        self.require_auth = require_auth  # OpenAI: Bearer; Anthropic: x-api-key or Bearer
        # Responses created with ``background: true`` (answered ``queued``), by id: what
        # ``GET /v1/responses/{id}`` answers, finished.
        self.background: dict[str, dict[str, Any]] = {}
        self.validate = validate  # the 400 checks on message structure
        # A compatible server that takes ``stream`` on /v1/responses/compact and answers
        # JSON regardless (OpenAI's refuses the field: "Unknown parameter").
        self.compact_ignores_stream = False
        # A gateway that takes ``stream: true`` and answers the whole reply as JSON
        # (application/json), as it would without the field.
        self.stream_as_json = False
        # A fixed answer (status, JSON or raw bytes) per counting path, instead of the
        # count: a server without the route (NO_COUNT_ROUTES), a provider's error.
        self.count_answers: dict[str, tuple[int, Any]] = {}
        self.models = ["gpt-4o-mini", "gpt-4o", "claude-sonnet-4-5", "claude-haiku-4-5"]
        # Output maxima by model: a turn asking for more is refused, as the APIs refuse a
        # max_tokens above the model's (gpt-4o: 16,384; claude-3-5-haiku: 8,192).
        self.max_output_tokens: dict[str, int] = {}
        self.responder: Callable[[RecordedRequest], Reply | str | None] | None = None
        self.models_body: bytes | None = None  # a raw /v1/models answer instead of the list
        self.requests: list[RecordedRequest] = []
        self.url = ""
        self._queue: collections.deque[Reply] = collections.deque()
        self._cond = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._stopping = False

    # ---- test API -------------------------------------------------------------------
    def enqueue(self, *replies: Reply | str) -> None:
        with self._cond:
            self._queue.extend(Reply(text=r) if isinstance(r, str) else r for r in replies)

    def reset(self) -> None:
        with self._cond:
            self._queue.clear()
            self.requests.clear()
            self.responder = None
            self._cached.clear()
            self.background.clear()

    @property
    def pending(self) -> int:
        """Scripted replies not consumed yet."""
        return len(self._queue)

    @property
    def last(self) -> RecordedRequest:
        return self.requests[-1]

    def wait_for(
        self, predicate: Callable[[list[RecordedRequest]], Any], timeout: float = 5.0
    ) -> Any:
        """Block until predicate(requests) is truthy; return its value or raise TimeoutError."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not (result := predicate(list(self.requests))):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"wait_for timed out; requests: {self.requests!r}")
                self._cond.wait(remaining)
        return result

    async def wait_for_async(
        self, predicate: Callable[[list[RecordedRequest]], Any], timeout: float = 5.0
    ) -> Any:
        """Like wait_for, without blocking the caller's event loop."""
        deadline = time.monotonic() + timeout
        while not (result := predicate(list(self.requests))):
            if time.monotonic() > deadline:
                raise TimeoutError(f"wait_for_async timed out; requests: {self.requests!r}")
            await asyncio.sleep(0.01)
        return result

    def start(self, port: int = 0, host: str = "127.0.0.1") -> FakeProvider:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(self.serve(host, port))
            except BaseException as e:
                failure.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.close()

        self._stopping = False
        self._thread = threading.Thread(target=run, name="fakeprovider", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        if not (self._loop and self._thread):
            return
        self._stopping = True
        if self._runner:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = self._thread = self._runner = None

    def __enter__(self) -> FakeProvider:
        return self.start() if not self._thread else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def serve(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Start serving on the running loop; returns and sets self.url."""
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_post("/v1/messages", self._handle)
        app.router.add_post("/v1/responses", self._handle)
        app.router.add_post("/v1/responses/compact", self._handle)
        app.router.add_get("/v1/responses/{response_id}", self._get_response)
        app.router.add_post("/v1/messages/count_tokens", self._handle)
        app.router.add_post(INPUT_TOKENS_PATH, self._handle)
        app.router.add_get("/v1/models", self._handle)
        app.router.add_get("/v1/models/{model_id}", self._handle)
        app.router.add_post("/_fake/enqueue", self._ctl_enqueue)
        app.router.add_get("/_fake/requests", self._ctl_requests)
        app.router.add_post("/_fake/reset", self._ctl_reset)
        self._runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=0.5
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = self._runner.addresses[0][1]
        self.url = f"http://{host}:{bound}"
        return self.url

    # ---- plumbing ---------------------------------------------------------------------
    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _next_reply(self, rec: RecordedRequest) -> Reply:
        with self._cond:
            if self._queue:
                return self._queue.popleft()
        reply = self.responder(rec) if self.responder else None
        return Reply(text=reply) if isinstance(reply, str) else reply or Reply()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        rec = RecordedRequest(
            method=request.method,
            path=request.path,
            headers={k.lower(): v for k, v in request.headers.items()},
            json=parsed,
            body=body,
            stream=isinstance(parsed, dict) and parsed.get("stream") is True,
            query=request.query_string,
        )
        anthropic = request.path.startswith("/v1/messages") or (
            request.path.startswith("/v1/models") and "anthropic-version" in rec.headers
        )
        rec.dialect = "anthropic" if anthropic else "openai"
        if request.path in ("/v1/responses", COMPACT_PATH, INPUT_TOKENS_PATH):
            rec.dialect = "responses"
        with self._cond:
            self.requests.append(rec)
            self._cond.notify_all()
        try:
            try:
                self._check(rec, anthropic)
            except _Rejected as e:
                return await self._send(request, rec, Reply(), e.status, _error(anthropic, e))
            if request.path == "/v1/models":
                listed = self.models_body or self._models(anthropic)
                return await self._send(request, rec, Reply(), 200, listed)
            if request.path.startswith("/v1/models/"):
                listed = self._models(anthropic)["data"]
                found = [m for m in listed if m["id"] == request.match_info["model_id"]]
                if not found:
                    err = _Rejected(404, f"model {request.match_info['model_id']} not found")
                    return await self._send(request, rec, Reply(), 404, _error(anthropic, err))
                return await self._send(request, rec, Reply(), 200, found[0])
            if request.path in self.count_answers:
                return await self._send(request, rec, Reply(), *self.count_answers[request.path])
            if request.path == COUNT_TOKENS_PATH:
                return await self._send(request, rec, Reply(), 200, self._count(rec.json))
            if request.path == INPUT_TOKENS_PATH:
                counted = {
                    "object": "response.input_tokens",
                    "input_tokens": prompt_tokens(rec.json, "responses"),
                }
                return await self._send(request, rec, Reply(), 200, counted)
            rec.reply = reply = self._next_reply(rec)
            if reply.raw_body is not None:
                return await self._send(request, rec, reply, reply.status, reply.raw_body)
            if reply.status >= 400:
                eb = reply.error_body
                err = _Rejected(reply.status, eb if isinstance(eb, str) else "")
                payload = eb if isinstance(eb, dict | bytes) else _error(anthropic, err)
                return await self._send(request, rec, reply, reply.status, payload)
            build = self._anthropic if anthropic else self._openai
            if rec.dialect == "responses":
                build = self._compact if rec.path == COMPACT_PATH else self._responses
            stream = rec.stream and not self.stream_as_json
            return await self._send(request, rec, reply, 200, build(rec.json, reply, stream))
        except asyncio.CancelledError:
            rec.disconnected = not (rec.dropped or self._stopping)
            raise
        except ConnectionResetError:  # wrote to a socket the client already closed
            rec.disconnected = not rec.dropped
            raise asyncio.CancelledError from None  # aiohttp ends the request quietly
        finally:
            rec.ended_at = time.monotonic()
            self._notify()

    async def _send(
        self,
        request: web.Request,
        rec: RecordedRequest,
        reply: Reply,
        status: int,
        payload: Any,
    ) -> web.StreamResponse:
        """Write a JSON payload or a list of SSE events, applying the reply's faults."""
        if reply.delay:
            await asyncio.sleep(reply.delay)
        while reply.hold is not None and not reply.hold.is_set():
            await asyncio.sleep(0.01)  # polled: the server's loop keeps serving meanwhile
        if reply.drop:
            await self._drop(request, rec)
        headers = {"request-id" if rec.dialect == "anthropic" else "x-request-id": _rid("req_")}
        if reply.retry_after is not None:
            headers["retry-after"] = str(reply.retry_after)
        limit = reply.stall_after if reply.stall_after is not None else reply.drop_after
        resp = web.StreamResponse(status=status, headers=headers)
        if isinstance(payload, list):  # SSE events, already encoded
            resp.content_type, resp.charset = "text/event-stream", "utf-8"
            resp.headers["cache-control"] = "no-cache"
            chunks: list[bytes] = payload
        elif isinstance(payload, bytes):  # raw: an error page, a malformed reply
            kind = "application/json" if payload[:1] in (b"{", b"[", b"n") else "text/html"
            resp.content_type, resp.content_length = kind, len(payload)
            chunks = [payload]
        else:
            data = _dumps(payload)
            resp.content_type, resp.content_length = "application/json", len(data)
            chunks = [data] if limit is None else [data[:limit], data[limit:]]
            limit = None if limit is None else 1
        await resp.prepare(request)
        rec.status = status
        self._notify()
        for i, chunk in enumerate(chunks):
            if limit is not None and i >= limit:
                break
            if i and reply.chunk_delay:
                await asyncio.sleep(reply.chunk_delay)
            # Book-keep before writing: the client may act on these bytes before we resume.
            rec.events_sent += 1
            rec.response_body += chunk
            rec.completed = i == len(chunks) - 1
            try:
                await resp.write(chunk)
            except BaseException as e:
                rec.completed = False
                rec.events_sent -= isinstance(e, ConnectionResetError)  # it never left
                raise
            self._notify()
        else:
            await resp.write_eof()
            return resp
        if reply.stall_after is not None:
            await asyncio.Event().wait()  # until the client disconnects (handler cancelled)
        await self._drop(request, rec)
        return resp  # not reached

    async def _drop(self, request: web.Request, rec: RecordedRequest) -> None:
        rec.dropped = True
        if request.transport is not None:
            request.transport.close()  # flushes what was written, then FIN
        await asyncio.Event().wait()  # aiohttp cancels the handler on connection_lost

    # ---- validation -------------------------------------------------------------------
    def _check(self, rec: RecordedRequest, anthropic: bool) -> None:
        h = rec.headers
        if anthropic:
            if "anthropic-version" not in h:
                raise _Rejected(400, "anthropic-version: header is required")
            if self.require_auth and not (
                h.get("x-api-key") or h.get("authorization", "").startswith("Bearer ")
            ):
                raise _Rejected(401, "x-api-key header is required")
        elif self.require_auth and not h.get("authorization", "").startswith("Bearer "):
            raise _Rejected(
                401,
                "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                code="invalid_api_key",
            )
        if rec.method == "GET":
            return
        body = rec.json
        if not isinstance(body, dict):
            raise _Rejected(
                400,
                "There was an error parsing the body of your request"
                if anthropic
                else "We could not parse the JSON body of your request. (HINT: This likely "
                "means you aren't using your HTTP library correctly.)",
            )
        if rec.path == "/v1/messages/count_tokens":
            _check_count_tokens(body)
        elif rec.path == COMPACT_PATH:
            taken = {k: v for k, v in body.items() if k != "stream"}
            # unknown parameters are refused even with validate off
            _check_compact(taken if self.compact_ignores_stream else body)
            if self.validate:
                _check_responses(body)
        elif rec.path == INPUT_TOKENS_PATH:
            _check_fields(body, INPUT_TOKENS_FIELDS)
        elif rec.path == "/v1/responses":
            if self.validate:
                _check_not_chat(body)
                _check_responses(body)
        elif self.validate:
            (_check_anthropic if anthropic else _check_openai)(body)
        if rec.path not in (COUNT_TOKENS_PATH, INPUT_TOKENS_PATH, COMPACT_PATH):
            self._check_output_limit(body, anthropic)

    def _check_output_limit(self, body: dict[str, Any], anthropic: bool) -> None:
        """A limit above the model's output maximum is refused, in each API's words."""
        most = self.max_output_tokens.get(str(body.get("model")))
        for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            asked = body.get(name)
            if most is None or not isinstance(asked, int) or asked <= most:
                continue
            if anthropic:
                message = (
                    f"max_tokens: {asked} > {most}, which is the maximum allowed number of"
                    f" output tokens for {body['model']}"
                )
                raise _Rejected(400, message)
            raise _Rejected(
                400,
                f"{name} is too large: {asked}. This model supports at most {most} completion"
                f" tokens, whereas you provided {asked}.",
                name,
                "invalid_value",
            )

    # ---- response builders ------------------------------------------------------------
    @staticmethod
    def _count(req: dict[str, Any]) -> dict[str, Any]:
        """``input_tokens``; with ``context_management`` (beta) also the count before its
        edits, ``context_management.original_input_tokens`` (BetaMessageTokensCount). The fake
        applies no edits: both counts are the whole request's."""
        n = prompt_tokens(req, "anthropic")
        if req.get("context_management") is not None:
            return {"input_tokens": n, "context_management": {"original_input_tokens": n}}
        return {"input_tokens": n}

    def _models(self, anthropic: bool) -> dict[str, Any]:
        if anthropic:
            # max_input_tokens / max_tokens: the Models API's context window and output cap.
            data = [
                {"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z",
                 "max_input_tokens": ANTHROPIC_CONTEXT_WINDOW, "max_tokens": 64000}
                for m in self.models
            ]  # fmt: skip
            first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
            return {"data": data, "has_more": False, "first_id": first, "last_id": last}
        listed: list[dict[str, Any]] = [
            {"id": m, "object": "model", "created": 1700000000, "owned_by": "fakeprovider"}
            for m in self.models
        ]
        return {"object": "list", "data": listed}

    @staticmethod
    def _content(req: dict[str, Any], reply: Reply, limit_key: tuple[str, ...]) -> tuple:
        """(text, tool_calls, completion_tokens, truncated) after applying max_tokens."""
        calls = reply.tool_calls
        acts = calls or reply.items
        text = reply.text if reply.text is not None else ("" if acts else DEFAULT_TEXT)
        limit = next((req[k] for k in limit_key if isinstance(req.get(k), int)), None)
        truncated = False
        if limit is not None and not acts and not reply.finish_reason and ntokens(text) > limit:
            text, truncated = text[: limit * 4], True
        completion = ntokens(text) + sum(ntokens(c.name + c.arguments_json) for c in calls)
        completion += sum(ntokens(json.dumps(item)) for item in reply.items)
        return text, calls, reply.usage.get("completion_tokens", max(1, completion)), truncated

    def _openai(self, req: dict[str, Any], reply: Reply, stream: bool) -> Any:
        text, calls, completion, truncated = self._content(
            req, reply, ("max_completion_tokens", "max_tokens")
        )
        calls = [ToolCall(c.name, c.arguments, c.id or _rid("call_"), c.custom) for c in calls]
        finish = reply.finish_reason or ("tool_calls" if calls else "stop")
        finish = "length" if truncated else _OPENAI_FINISH.get(finish, finish)
        u = reply.usage
        # ``n`` choices, each the scripted answer; the usage bills the tokens of them all
        # (a scripted completion_tokens is the total).
        n = req.get("n") if isinstance(req.get("n"), int) else 1
        if "completion_tokens" not in u:
            completion *= n
        prompt = u.get("prompt_tokens", prompt_tokens(req, "openai"))
        cached = self._openai_cached(req, u, prompt, "messages")
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {
                "cached_tokens": cached,
                "audio_tokens": 0,
            },
            "completion_tokens_details": {
                "reasoning_tokens": u.get("reasoning_tokens", 0),
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }
        base = {
            "id": _rid("chatcmpl-", 29),
            "object": "chat.completion.chunk" if stream else "chat.completion",
            "created": int(time.time()),
            "model": reply.model or req.get("model", "unknown"),
            "service_tier": _served_tier(req),
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }
        wire_calls = [
            {"id": c.id, "type": "custom", "custom": {"name": c.name, "input": c.arguments_json}}
            if c.custom
            else {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments_json},
            }
            for c in calls
        ]
        if not stream:
            message: dict[str, Any] = {
                "role": "assistant",
                "content": text if text or not calls else None,
                "refusal": None,
                "annotations": [],
            }
            if calls:
                message["tool_calls"] = wire_calls
            choices = [
                {"index": k, "message": message, "logprobs": None, "finish_reason": finish}
                for k in range(n)
            ]
            return {**base, "choices": choices, "usage": usage}

        include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        out = [c for k in range(n) for c in self._openai_chunks(k, text, wire_calls, finish)]
        out = [{**base, "choices": [c], **({"usage": None} if include_usage else {})} for c in out]
        if include_usage:
            out.append({**base, "choices": [], "usage": usage})
        return [b"data: " + _dumps(c) + b"\n\n" for c in out] + [b"data: [DONE]\n\n"]

    @staticmethod
    def _openai_chunks(
        k: int, text: str, wire_calls: list[dict[str, Any]], finish: str
    ) -> list[dict[str, Any]]:
        """The stream's choice deltas of choice ``k``, in order."""

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {"index": k, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

        out = []
        if text or not wire_calls:
            out.append(chunk({"role": "assistant", "content": "", "refusal": None}))
            out += [chunk({"content": p}) for p in _pieces(text)]
        for i, c in enumerate(wire_calls):
            # A custom call streams as a function call does, under "custom" with its "input"
            # (openai-python #2530 and openai-openapi #576: the chunk schema has no custom
            # member yet; the API sends {"index", "id", "type": "custom", "custom": {"name",
            # "input"}}, then {"index", "custom": {"input": piece}}).
            kind = c["type"]
            said = "input" if kind == "custom" else "arguments"
            head = {"index": i, **c, kind: {"name": c[kind]["name"], said: ""}}
            delta: dict[str, Any] = {"tool_calls": [head]}
            if not out:  # a tool-call-only reply: OpenAI merges the role into the first call
                delta = {"role": "assistant", "content": None, **delta, "refusal": None}
            out.append(chunk(delta))
            for p in _pieces(c[kind][said]):
                out.append(chunk({"tool_calls": [{"index": i, kind: {said: p}}]}))
        out.append(chunk({}, finish))
        return out

    def _anthropic(self, req: dict[str, Any], reply: Reply, stream: bool) -> Any:
        text, calls, completion, truncated = self._content(req, reply, ("max_tokens",))
        stop = reply.finish_reason or ("tool_use" if calls else "end_turn")
        stop = "max_tokens" if truncated else _ANTHROPIC_STOP.get(stop, stop)
        u = reply.usage
        prompt = prompt_tokens(req, "anthropic")
        scripted = any(k in u for k in ("cache_write", "cache_read", "cached_tokens"))
        read = write = hour = 0
        if self.cache == "anthropic" and not scripted:
            read, write, hour = self._anthropic_cache(req, u.get("prompt_tokens", prompt))
        usage: dict[str, Any] = {
            "input_tokens": u.get("prompt_tokens", prompt) - read - write,
            "cache_creation_input_tokens": u.get("cache_write", write),
            "cache_read_input_tokens": u.get("cache_read", u.get("cached_tokens", read)),
            "output_tokens": completion,
        }
        if req.get("speed") == "fast":  # fast mode: the usage says so (billed at its rates)
            usage["speed"] = "fast"
        if self.cache == "anthropic" and not scripted and _marks_ttl(req):
            usage["cache_creation"] = {
                "ephemeral_5m_input_tokens": write - hour,
                "ephemeral_1h_input_tokens": hour,
            }
        blocks: list[dict[str, Any]] = [dict(b) for b in reply.thinking]
        if text:
            blocks.append({"type": "text", "text": text})
        raw_args: list[str] = [""] * len(blocks)  # the input JSON as streamed, per block
        for c in calls:
            if c.custom:
                raise ValueError(f"a custom tool call ({c.name}) has no Anthropic form")
            try:
                args = json.loads(c.arguments_json)
            except ValueError:
                args = {}  # malformed scripted arguments: only the stream carries them
            tid = c.id or _rid("toolu_01", 22)
            blocks.append({"type": "tool_use", "id": tid, "name": c.name, "input": args})
            raw_args.append(c.arguments_json)
        message = {
            "id": _rid("msg_01", 22),
            "type": "message",
            "role": "assistant",
            "model": reply.model or req.get("model", "unknown"),
            "content": blocks,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
        if not stream:
            return message

        start_usage = {**usage, "output_tokens": 1}
        events: list[tuple[str, dict[str, Any]]] = [
            (
                "message_start",
                {"message": {**message, "content": [], "stop_reason": None, "usage": start_usage}},
            )
        ]
        for i, b in enumerate(blocks):
            start: dict[str, Any] = {**b, "input": {}}
            if b["type"] == "text":
                start = {"type": "text", "text": ""}
                deltas = [{"type": "text_delta", "text": p} for p in _pieces(b["text"])]
            elif b["type"] == "thinking":
                start = {"type": "thinking", "thinking": "", "signature": ""}
                deltas = [{"type": "thinking_delta", "thinking": p} for p in _pieces(b["thinking"])]
                deltas.append({"type": "signature_delta", "signature": b["signature"]})
            elif b["type"] == "redacted_thinking":
                start, deltas = b, []
            else:
                parts = ["", *_pieces(raw_args[i])]
                deltas = [{"type": "input_json_delta", "partial_json": p} for p in parts]
            events.append(("content_block_start", {"index": i, "content_block": start}))
            events += [("content_block_delta", {"index": i, "delta": d}) for d in deltas]
            events.append(("content_block_stop", {"index": i}))
        events.insert(2 if blocks else 1, ("ping", {}))
        events.append(
            (
                "message_delta",
                {
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    # As the API sends it since 2025: the input and cache counts again
                    # (their sums: MessageDeltaUsage has no cache_creation).
                    "usage": {
                        **{k: v for k, v in usage.items() if k != "cache_creation"},
                        "output_tokens": completion,
                    },
                },
            )
        )
        events.append(("message_stop", {}))
        return [
            f"event: {name}\n".encode() + b"data: " + _dumps({"type": name, **data}) + b"\n\n"
            for name, data in events
        ]

    def _responses(self, req: dict[str, Any], reply: Reply, stream: bool) -> Any:
        """The Responses API (``POST /v1/responses``): a ``response`` object, or its event
        stream (created, in_progress, per item added/deltas/done, completed), as OpenAI sends
        them (shapes as in the openai SDK's types/responses)."""
        text, calls, completion, truncated = self._content(req, reply, ("max_output_tokens",))
        u = reply.usage
        prompt = u.get("prompt_tokens", prompt_tokens(req, "responses"))
        usage = {
            "input_tokens": prompt,
            "input_tokens_details": {
                "cached_tokens": self._openai_cached(req, u, prompt, "input"),
                "cache_write_tokens": 0,
            },
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": u.get("reasoning_tokens", 0)},
            "total_tokens": prompt + completion,
        }
        output: list[dict[str, Any]] = []
        given = [
            {"id": _rid(_ITEM_PREFIX.get(item["type"], "it_"), 32), "status": "completed", **item}
            for item in reply.items
        ]
        # What the API ran itself (and reasoning) comes before the answer; client calls after.
        output += [item for item in given if item["type"] in _BEFORE_THE_MESSAGE]
        if reply.refusal is not None or text or not (calls or reply.items):
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            if reply.refusal is not None:
                part = {"type": "refusal", "refusal": reply.refusal}
            output.append(
                {"id": _rid("msg_", 32), "type": "message", "status": "completed",
                 "role": "assistant", "content": [part]}
            )  # fmt: skip
        for c in calls:
            output.append(
                {"id": _rid("ctc_", 32), "type": "custom_tool_call", "status": "completed",
                 "call_id": c.id or _rid("call_"), "name": c.name, "input": c.arguments_json}
                if c.custom else
                {"id": _rid("fc_", 32), "type": "function_call", "status": "completed",
                 "call_id": c.id or _rid("call_"), "name": c.name, "arguments": c.arguments_json}
            )  # fmt: skip
        output += [item for item in given if item["type"] not in _BEFORE_THE_MESSAGE]
        status = "incomplete" if truncated else "completed"
        response = {
            "id": _rid("resp_", 32), "object": "response", "created_at": int(time.time()),
            "status": status, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
            "instructions": req.get("instructions"),
            "max_output_tokens": req.get("max_output_tokens"),
            "model": reply.model or req.get("model", "unknown"), "output": output,
            "parallel_tool_calls": req.get("parallel_tool_calls", True),
            "previous_response_id": req.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None}, "store": req.get("store", True),
            "temperature": req.get("temperature", 1.0),
            "text": req.get("text", {"format": {"type": "text"}}),
            "tool_choice": req.get("tool_choice", "auto"), "tools": req.get("tools", []),
            "top_p": req.get("top_p", 1.0), "truncation": "disabled", "usage": usage,
            "metadata": req.get("metadata", {}), "service_tier": _served_tier(req),
        }  # fmt: skip
        failure = {"code": reply.fail_code, "message": reply.fail}
        if req.get("background") is True:
            response["background"] = True
            if not stream and reply.fail is None:
                # The API answers at once, queued, and runs it; a GET finds it done here.
                self.background[response["id"]] = response
                return {**response, "status": "queued", "output": [], "usage": None}
        if not stream:
            if reply.fail is not None:
                return {**response, "status": "failed", "error": failure, "output": [],
                        "incomplete_details": None}  # fmt: skip
            return response
        events: list[dict[str, Any]] = []
        start = {**response, "status": "in_progress", "output": [], "usage": None}
        events += [{"type": "response.created", "response": start}]
        events += [{"type": "response.in_progress", "response": start}]
        if reply.fail is not None:  # it failed before any output (ResponseFailedEvent)
            failed = {**start, "status": "failed", "error": failure}
            events.append({"type": "response.failed", "response": failed})
            output = []
        for i, item in enumerate(output):
            events += self._responses_item_events(i, item)
        if reply.fail is None:
            events.append({"type": f"response.{status}", "response": response})
        return [
            f"event: {e['type']}\n".encode() + b"data: " + _dumps({**e, "sequence_number": n})
            + b"\n\n"
            for n, e in enumerate(events)
        ]  # fmt: skip

    def _compact(self, req: dict[str, Any], reply: Reply, stream: bool) -> Any:
        """``POST /v1/responses/compact``: a ``response.compaction`` object whose output is
        every user message of the input (as output items), then one ``compaction`` item
        with opaque ``encrypted_content`` (here: the reply's text, base64 after OpenAI's
        Fernet-like ``gAAAAA`` prefix). Shapes: the openai SDK's CompactedResponse and
        ResponseCompactionItem; the API reference's example."""
        items = req.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        users = []
        for item in items or ():
            if not isinstance(item, dict) or item.get("type", "message") != "message":
                continue
            if item.get("role") != "user":
                continue
            content = item.get("content")
            parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else (
                content or []
            )  # fmt: skip
            users.append(
                {"id": _rid("msg_", 32), "type": "message", "status": "completed",
                 "content": parts, "role": "user"}
            )  # fmt: skip
        summary = reply.text if reply.text is not None else DEFAULT_TEXT
        opaque = "gAAAAA" + base64.urlsafe_b64encode(summary.encode()).decode()
        u = reply.usage
        prompt = u.get("prompt_tokens", estimate_tokens([req.get("instructions"), items]))
        completion = u.get("completion_tokens", max(1, ntokens(summary)))
        return {
            "id": _rid("resp_", 32), "object": "response.compaction",
            "created_at": int(time.time()),
            "output": [*users, {"id": _rid("cmp_", 32), "type": "compaction",
                                "encrypted_content": opaque}],
            "usage": {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": u.get("cached_tokens", 0)},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": u.get("reasoning_tokens", 0)},
                "total_tokens": prompt + completion,
            },
        }  # fmt: skip

    @staticmethod
    def _responses_item_events(i: int, item: dict[str, Any]) -> list[dict[str, Any]]:
        ids = {"item_id": item["id"], "output_index": i}
        added = {**item, "status": "in_progress"}
        if item["type"] not in ("message", "function_call"):
            return _other_item_events(i, item)
        if item["type"] == "message" and item["content"][0]["type"] == "refusal":
            part = item["content"][0]
            return [
                {"type": "response.output_item.added", "output_index": i,
                 "item": {**added, "content": []}},
                {"type": "response.content_part.added", **ids, "content_index": 0,
                 "part": {**part, "refusal": ""}},
                *({"type": "response.refusal.delta", **ids, "content_index": 0, "delta": p}
                  for p in _pieces(part["refusal"])),
                {"type": "response.refusal.done", **ids, "content_index": 0,
                 "refusal": part["refusal"]},
                {"type": "response.content_part.done", **ids, "content_index": 0, "part": part},
                {"type": "response.output_item.done", "output_index": i, "item": item},
            ]  # fmt: skip
        if item["type"] == "message":
            part = item["content"][0]
            empty = {**part, "text": ""}
            return [
                {"type": "response.output_item.added", "output_index": i,
                 "item": {**added, "content": []}},
                {"type": "response.content_part.added", **ids, "content_index": 0, "part": empty},
                *({"type": "response.output_text.delta", **ids, "content_index": 0,
                   "delta": p, "logprobs": []} for p in _pieces(part["text"])),
                {"type": "response.output_text.done", **ids, "content_index": 0,
                 "text": part["text"], "logprobs": []},
                {"type": "response.content_part.done", **ids, "content_index": 0, "part": part},
                {"type": "response.output_item.done", "output_index": i, "item": item},
            ]  # fmt: skip
        return [
            {"type": "response.output_item.added", "output_index": i,
             "item": {**added, "arguments": ""}},
            *({"type": "response.function_call_arguments.delta", **ids, "delta": p}
              for p in _pieces(item["arguments"])),
            {"type": "response.function_call_arguments.done", **ids,
             "arguments": item["arguments"]},
            {"type": "response.output_item.done", "output_index": i, "item": item},
        ]  # fmt: skip

    # ---- prompt caching (see the module docstring) -----------------------------------------
    def _live_cache(self) -> dict[str, float]:
        now = time.monotonic()
        self._cached = {k: t for k, t in self._cached.items() if now - t <= self.cache_ttl}
        return self._cached

    def _openai_cached(
        self, req: dict[str, Any], u: dict[str, int], prompt: int, items: str
    ) -> int:
        """``cached_tokens`` of a chat-completions (``items="messages"``) or Responses
        (``"input"``) request: the Reply's scripted figure, else the cache's under
        ``cache="openai"``, else 0."""
        scripted = u.get("cached_tokens", u.get("cache_read"))
        if scripted is not None:
            return scripted
        return self._openai_cache(req, prompt, items) if self.cache == "openai" else 0

    def _openai_cache(self, req: dict[str, Any], prompt: int, items: str) -> int:
        """OpenAI's automatic prefix cache: the prefix is the tools, then (Responses) the
        instructions, then each message or input item."""
        pieces = [req["tools"]] if req.get("tools") else []
        if req.get("instructions"):
            pieces.append(req["instructions"])
        listed = req.get(items, [])
        pieces += listed if isinstance(listed, list) else [listed]
        text = "".join(_dumps(p).decode() for p in pieces)
        live = self._live_cache()
        common = max((_common_prefix(text, seen) for seen in live), default=0)
        live[text] = time.monotonic()
        tokens = min(common // 4, prompt)
        if tokens < self.cache_min_tokens:
            return 0
        return tokens // CACHE_STEP_TOKENS * CACHE_STEP_TOKENS

    def cache_minimum(self, model: Any) -> int:
        """The fewest tokens a prefix must hold to be cached (Anthropic's, per model)."""
        for pattern, tokens in ANTHROPIC_CACHE_MINIMUMS.items():
            if isinstance(model, str) and fnmatch.fnmatchcase(model, pattern):
                return tokens
        return self.cache_min_tokens

    def _anthropic_cache(self, req: dict[str, Any], prompt: int) -> tuple[int, int, int]:
        """(read, written, of those written the one-hour writes) of a Messages request."""
        blocks: list[Any] = list(req.get("tools") or [])
        system = req.get("system")
        blocks += [{"type": "text", "text": system}] if isinstance(system, str) else system or []
        for m in req.get("messages", []):
            content = m.get("content")
            items = [{"type": "text", "text": content}] if isinstance(content, str) else content
            blocks += [{"role": m.get("role"), **b} for b in items or []]
        prefixes, marks, hour_marks, text = [], [], [], ""
        for b in blocks:
            text += _dumps({k: v for k, v in b.items() if k != "cache_control"}).decode()
            prefixes.append(text)
            marks.append(isinstance(b, dict) and "cache_control" in b)
            hour_marks.append(isinstance(b, dict) and _ttl(b.get("cache_control")) == "1h")
        if marks and req.get("cache_control"):  # automatic caching: the last block
            marks[-1] = True
            hour_marks[-1] = hour_marks[-1] or _ttl(req["cache_control"]) == "1h"
        breakpoints = [i for i, marked in enumerate(marks) if marked]
        if not breakpoints:
            return 0, 0, 0
        last = breakpoints[-1]
        minimum = self.cache_minimum(req.get("model"))
        live = self._live_cache()
        now = time.monotonic()

        def tokens(i: int) -> int:
            return min(ntokens(prefixes[i]), prompt)

        def looked_up(i: int) -> bool:
            return any(0 <= b - i <= CACHE_LOOKBACK_BLOCKS for b in breakpoints)

        hit = next((i for i in range(last, -1, -1) if looked_up(i) and prefixes[i] in live), None)
        read = tokens(hit) if hit is not None else 0
        if hit is not None:
            live[prefixes[hit]] = now
        write = hour = 0
        if hit != last and tokens(last) >= minimum:
            write = tokens(last) - read
            for i in breakpoints:
                if tokens(i) >= minimum:
                    live[prefixes[i]] = now
            last_hour = max((i for i in breakpoints if hour_marks[i]), default=None)
            if last_hour is not None:
                hour = min(max(tokens(last_hour) - read, 0), write)
        return read, write, hour

    async def _get_response(self, request: web.Request) -> web.Response:
        """``GET /v1/responses/{id}``: a background response, finished (the API keeps every
        stored response; this fake only those it answered ``queued``)."""
        rid = request.match_info["response_id"]
        found = self.background.get(rid)
        if found is None:
            err = _Rejected(404, f"No response found with id '{rid}'.")
            return web.json_response(_error(False, err), status=404)
        return web.json_response(found)

    # ---- control endpoints (for the standalone server) -----------------------------------
    async def _ctl_enqueue(self, request: web.Request) -> web.Response:
        body = await request.json()
        items = body if isinstance(body, list) else [body]
        self.enqueue(*(Reply(**item) for item in items))
        return web.json_response({"pending": self.pending})

    async def _ctl_requests(self, request: web.Request) -> web.Response:
        keep = "method path headers json dialect stream status events_sent completed disconnected"
        keep += " dropped"
        return web.json_response([{k: getattr(r, k) for k in keep.split()} for r in self.requests])

    async def _ctl_reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"ok": True})


def _served_tier(req: dict[str, Any]) -> str:
    """The ``service_tier`` an OpenAI reply names: the one the request asked for when it is
    flex or priority (the tiers billed at their own rates), else ``default`` (``auto``
    serves a project without a priority default there)."""
    asked = req.get("service_tier")
    return asked if asked in ("flex", "priority") else "default"


def _ttl(cache_control: Any) -> Any:
    return cache_control.get("ttl") if isinstance(cache_control, dict) else None


def _marks_ttl(req: dict[str, Any]) -> bool:
    """Whether a Messages request sets a ``ttl`` on any ``cache_control`` marker."""
    found = False

    def visit(node: Any) -> None:
        nonlocal found
        if isinstance(node, dict):
            if _ttl(node.get("cache_control")) is not None:
                found = True
            for v in node.values():
                visit(v)
        elif isinstance(node, list):
            for v in node:
                visit(v)

    visit({k: req.get(k) for k in ("cache_control", "tools", "system", "messages")})
    return found


# ---- dialect-specific validation and error shapes --------------------------------------
_OPENAI_ERROR_TYPES = {429: ("requests", "rate_limit_exceeded")}
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


# The id prefixes OpenAI gives the output items a Reply's ``items`` hold.
_ITEM_PREFIX = {
    "custom_tool_call": "ctc_", "local_shell_call": "lsh_", "shell_call": "sh_",
    "apply_patch_call": "apc_", "computer_call": "cu_", "mcp_approval_request": "mcpr_",
    "mcp_call": "mcp_", "web_search_call": "ws_", "file_search_call": "fs_",
    "code_interpreter_call": "ci_", "image_generation_call": "ig_", "reasoning": "rs_",
}  # fmt: skip


_BEFORE_THE_MESSAGE = frozenset(
    {"reasoning", "web_search_call", "file_search_call", "code_interpreter_call",
     "image_generation_call", "mcp_call", "mcp_list_tools"}
)  # fmt: skip


def _other_item_events(i: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of an output item other than a message or a function call, as the API
    streams them (the openai SDK's ResponseStreamEvent types): a custom tool call's input in
    ``response.custom_tool_call_input.delta`` pieces, an MCP call's arguments in
    ``response.mcp_call_arguments.delta`` pieces, a web search's progress events, a shell
    call's commands; every item opens with ``output_item.added`` (its streamed member empty)
    and closes with ``output_item.done`` (the whole item)."""
    ids = {"item_id": item["id"], "output_index": i}
    kind = item["type"]
    added = {**item, "status": "in_progress"}
    middle: list[dict[str, Any]] = []
    if kind == "custom_tool_call":
        added["input"] = ""
        middle += [{"type": "response.custom_tool_call_input.delta", **ids, "delta": p}
                   for p in _pieces(item.get("input") or "")]  # fmt: skip
        middle.append({"type": "response.custom_tool_call_input.done", **ids,
                       "input": item.get("input") or ""})  # fmt: skip
    elif kind == "mcp_call":
        added["arguments"] = ""
        middle.append({"type": "response.mcp_call.in_progress", **ids})
        middle += [{"type": "response.mcp_call_arguments.delta", **ids, "delta": p}
                   for p in _pieces(item.get("arguments") or "")]  # fmt: skip
        middle.append({"type": "response.mcp_call_arguments.done", **ids,
                       "arguments": item.get("arguments") or ""})  # fmt: skip
        middle.append({"type": "response.mcp_call.completed", **ids})
    elif kind == "web_search_call":
        middle += [{"type": f"response.web_search_call.{step}", **ids}
                   for step in ("in_progress", "searching", "completed")]  # fmt: skip
    elif kind == "shell_call":
        commands = (item.get("action") or {}).get("commands") or []
        added["action"] = {**(item.get("action") or {}), "commands": []}
        for k, command in enumerate(commands):
            at = {"output_index": i, "command_index": k}
            middle.append({"type": "response.shell_call_command.added", **at, "command": ""})
            middle += [{"type": "response.shell_call_command.delta", **at, "delta": p}
                       for p in _pieces(command)]  # fmt: skip
            middle.append({"type": "response.shell_call_command.done", **at, "command": command})
    return [
        {"type": "response.output_item.added", "output_index": i, "item": added},
        *middle,
        {"type": "response.output_item.done", "output_index": i, "item": item},
    ]


def _error(anthropic: bool, e: _Rejected) -> dict[str, Any]:
    message = e.message or f"fake provider error (HTTP {e.status})"
    if anthropic:
        kind = _ANTHROPIC_ERROR_TYPES.get(e.status, "api_error" if e.status >= 500 else "")
        kind = kind or "invalid_request_error"
        return {
            "type": "error",
            "error": {"type": kind, "message": message},
            "request_id": _rid("req_"),
        }
    kind, code = _OPENAI_ERROR_TYPES.get(
        e.status, ("server_error" if e.status >= 500 else "invalid_request_error", e.code)
    )
    return {"error": {"message": message, "type": kind, "param": e.param, "code": code}}


def _check_openai(body: dict[str, Any]) -> None:
    if not body.get("model"):
        raise _Rejected(400, "you must provide a model parameter")
    msgs = body.get("messages")
    if msgs is None:
        raise _Rejected(
            400, "Missing required parameter: 'messages'.", "messages", "missing_required_parameter"
        )
    if not isinstance(msgs, list) or not msgs:
        raise _Rejected(
            400,
            "Invalid 'messages': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            "messages",
            "empty_array",
        )
    _check_openai_tools(body.get("tools"))
    roles = ("system", "developer", "user", "assistant", "tool", "function")
    open_ids: set[str] = set()  # ids the current run of tool messages may answer
    pending: dict[str, int] = {}  # unanswered tool_call id -> index of its assistant message
    for i, m in enumerate(msgs):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in roles:
            raise _Rejected(
                400,
                f"Invalid value: {role!r}. Supported values are: 'system', 'assistant', 'user', "
                "'function', 'tool', and 'developer'.",
                f"messages[{i}].role",
                "invalid_value",
            )
        if role == "tool":
            tcid = m.get("tool_call_id")
            if not tcid:
                p = f"messages[{i}].tool_call_id"
                raise _Rejected(
                    400, f"Missing required parameter: '{p}'.", p, "missing_required_parameter"
                )
            if tcid not in open_ids:
                raise _Rejected(
                    400,
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    f"messages.[{i}].role",
                )
            pending.pop(tcid, None)
            continue
        _openai_unanswered(pending)
        open_ids = set()
        if role == "assistant" and m.get("tool_calls"):
            _check_openai_calls(m["tool_calls"], f"messages[{i}].tool_calls")
            ids = [tc.get("id") for tc in m["tool_calls"] if isinstance(tc, dict)]
            open_ids = {x for x in ids if x}
            pending = {x: i for x in open_ids}
    _openai_unanswered(pending)


def _missing(param: str) -> _Rejected:
    return _Rejected(
        400, f"Missing required parameter: '{param}'.", param, "missing_required_parameter"
    )


def _check_openai_tools(tools: Any) -> None:
    """Function and custom tools' required members. A custom tool's grammar is nested
    (``format: {"type": "grammar", "grammar": {"definition", "syntax"}}``); the Responses
    API's flat spelling (``format.definition``) is refused as the API refuses it: "Missing
    required parameter: 'tools[N].custom.format.grammar'." (llm-rosetta #488, gpt-5.5)."""
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in ("function", "custom"):
            continue
        spec = tool.get(kind)
        if not isinstance(spec, dict):
            raise _missing(f"tools[{i}].{kind}")
        if not isinstance(spec.get("name"), str):
            raise _missing(f"tools[{i}].{kind}.name")
        fmt = spec.get("format") if kind == "custom" else None
        if isinstance(fmt, dict) and fmt.get("type") == "grammar":
            grammar = fmt.get("grammar")
            if not isinstance(grammar, dict):
                raise _missing(f"tools[{i}].custom.format.grammar")
            for key in ("definition", "syntax"):
                if not isinstance(grammar.get(key), str):
                    raise _missing(f"tools[{i}].custom.format.grammar.{key}")


def _check_openai_calls(calls: Any, path: str) -> None:
    """An assistant message's tool_calls: each a function (name, arguments) or custom
    (name, input) call, as ChatCompletionMessage{Function,Custom}ToolCallParam require."""
    for k, call in enumerate(calls if isinstance(calls, list) else ()):
        kind = call.get("type") if isinstance(call, dict) else None
        if kind not in ("function", "custom"):
            continue
        said = "input" if kind == "custom" else "arguments"
        spec = call.get(kind)
        for key in ("name", said):
            if not isinstance(spec, dict) or not isinstance(spec.get(key), str):
                raise _missing(f"{path}[{k}].{kind}.{key}")


def _openai_unanswered(pending: dict[str, int]) -> None:
    if pending:
        i = min(pending.values())
        raise _Rejected(
            400,
            "An assistant message with 'tool_calls' must be followed by tool messages responding "
            "to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
            + ", ".join(sorted(pending)),
            f"messages.[{i}].role",
        )


# What Anthropic's count_tokens accepts; anything else is "Extra inputs are not permitted".
_COUNT_TOKENS_FIELDS = {
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "mcp_servers",
    "context_management",  # beta: context-management-2025-06-27
}


# The Responses API's least max_output_tokens: below it, a 400 in these words.
RESPONSES_MIN_OUTPUT_TOKENS = 16


def _check_responses(body: dict[str, Any]) -> None:
    """What the Responses API refuses with a 400: no model, no input, an orphan tool output,
    ``max_output_tokens`` below 16."""
    if not isinstance(body.get("model"), str):
        raise _Rejected(
            400, "Missing required parameter: 'model'.", "model", "missing_required_parameter"
        )
    items = body.get("input")
    if not isinstance(items, (str, list)):
        raise _Rejected(
            400, "Missing required parameter: 'input'.", "input", "missing_required_parameter"
        )
    limit = body.get("max_output_tokens")
    if isinstance(limit, int) and limit < RESPONSES_MIN_OUTPUT_TOKENS:
        raise _Rejected(
            400,
            "Invalid 'max_output_tokens': integer below minimum value. Expected a value >="
            f" {RESPONSES_MIN_OUTPUT_TOKENS}, but got {limit} instead.",
            "max_output_tokens",
            "integer_below_min_value",
        )
    listed = items if isinstance(items, list) else []
    calls = {
        (i.get("type"), i.get("call_id")) for i in listed if isinstance(i, dict) and "call_id" in i
    }
    for i, item in enumerate(listed):
        kind = item.get("type") if isinstance(item, dict) else None
        call = _PAIRED_OUTPUTS.get(kind) if isinstance(kind, str) else None
        if (
            call is not None
            and (call, item.get("call_id")) not in calls
            and not body.get("previous_response_id")
        ):
            what = call.replace("_", " ")
            raise _Rejected(
                400,
                f"No tool call found for {what} output with call_id {item.get('call_id')}.",
                f"input[{i}]",
            )
    _responses_unanswered(listed)


def _responses_unanswered(items: list[Any]) -> None:
    """The API's refusal of a call item in ``input`` that no later item answers: "No tool
    output found for function call call_X." (param ``input``), as Codex and proxies met it
    when a tool output was dropped or reordered."""
    answered = {
        (_PAIRED_OUTPUTS[i["type"]], i.get("call_id"))
        for i in items
        if isinstance(i, dict) and i.get("type") in _PAIRED_OUTPUTS
    }
    calls = set(_PAIRED_OUTPUTS.values())
    for item in items:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind in calls and (kind, item.get("call_id")) not in answered:
            what = kind.replace("_", " ")
            raise _Rejected(400, f"No tool output found for {what} {item.get('call_id')}.", "input")


# An output item type -> the call it answers (by call_id), which the API wants before it.
_PAIRED_OUTPUTS = {
    "function_call_output": "function_call",
    "custom_tool_call_output": "custom_tool_call",
    "shell_call_output": "shell_call",
    "apply_patch_call_output": "apply_patch_call",
    "computer_call_output": "computer_call",
}


def _check_not_chat(body: dict[str, Any]) -> None:
    """The API's ``unknown_parameter`` 400 for a chat-completions member on /v1/responses
    (``CHAT_ONLY_FIELDS``), or in its ``stream_options`` (chat's ``include_usage``)."""
    for key in body:
        if key in CHAT_ONLY_FIELDS:
            raise _Rejected(400, f"Unknown parameter: '{key}'.", key, "unknown_parameter")
    options = body.get("stream_options")
    for key in options if isinstance(options, dict) else ():
        if key not in RESPONSES_STREAM_OPTIONS:
            param = f"stream_options.{key}"
            raise _Rejected(400, f"Unknown parameter: '{param}'.", param, "unknown_parameter")


def _check_compact(body: dict[str, Any]) -> None:
    """What ``/v1/responses/compact`` refuses before the input checks: a field it does not
    take (the API's ``unknown_parameter``)."""
    _check_fields(body, COMPACT_FIELDS)


def _check_fields(body: dict[str, Any], taken: set[str]) -> None:
    """The API's ``unknown_parameter`` 400 for the first field of ``body`` not in ``taken``."""
    for key in body:
        if key not in taken:
            raise _Rejected(400, f"Unknown parameter: '{key}'.", key, "unknown_parameter")


def _check_count_tokens(body: dict[str, Any]) -> None:
    for key in ("model", "messages"):
        if key not in body:
            raise _Rejected(400, f"{key}: Field required")
    for key in body:
        if key not in _COUNT_TOKENS_FIELDS:
            raise _Rejected(400, f"{key}: Extra inputs are not permitted")


def _check_anthropic(body: dict[str, Any]) -> None:
    for key in ("model", "max_tokens", "messages"):
        if key not in body:
            raise _Rejected(400, f"{key}: Field required")
    # 0 is taken: it pre-warms the prompt cache without generating (the anthropic SDK's
    # MessageCreateParams.max_tokens, 2.x).
    if not isinstance(body["max_tokens"], int) or body["max_tokens"] < 0:
        raise _Rejected(400, "max_tokens: Input should be greater than or equal to 0")
    msgs = body["messages"]
    if not isinstance(msgs, list):
        raise _Rejected(400, "messages: Input should be a valid list")
    if not msgs:
        raise _Rejected(400, "messages: at least one message is required")
    _check_anthropic_ttl_order(body)

    def blocks(m: dict[str, Any], kind: str) -> list[dict[str, Any]]:
        content = m.get("content")
        items = content if isinstance(content, list) else []
        return [b for b in items if isinstance(b, dict) and b.get("type") == kind]

    for i, m in enumerate(msgs):
        role = m.get("role") if isinstance(m, dict) else None
        if role == "system":  # mid-conversation system text (Claude Code 2.1.x sends it)
            _check_anthropic_system_message(m, i)
            continue
        if role not in ("user", "assistant"):
            raise _Rejected(400, f"messages.{i}.role: Input should be 'user' or 'assistant'")
        _check_anthropic_text(m, i, last=i == len(msgs) - 1)
        prev = msgs[i - 1] if i else None
        offered = (
            {b.get("id") for b in blocks(prev, "tool_use")}
            if prev and prev.get("role") == "assistant"
            else set()
        )
        results = blocks(m, "tool_result") if role == "user" else []
        for j, b in enumerate(m["content"] if results else []):
            if (
                isinstance(b, dict)
                and b.get("type") == "tool_result"
                and b.get("tool_use_id") not in offered
            ):
                raise _Rejected(
                    400,
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` "
                    f"blocks: {b.get('tool_use_id')}. Each `tool_result` block must have a "
                    "corresponding `tool_use` block in the previous message.",
                )
        if role == "assistant" and i + 1 < len(msgs):
            # only the results that open the next message answer (any text goes after them)
            answered = {b.get("tool_use_id") for b in _leading_results(msgs[i + 1])}
            missing = [b.get("id") for b in blocks(m, "tool_use") if b.get("id") not in answered]
            if missing:
                raise _Rejected(
                    400,
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(map(str, missing))}. Each `tool_use` block "
                    "must have a corresponding `tool_result` block in the next message.",
                )


# A mid-conversation system message's blocks (the anthropic SDK 2.16's
# BetaSystemMessageParam): text, and the beta's tool changes.
SYSTEM_MESSAGE_BLOCKS = {"text", "tool_addition", "tool_removal"}


def _check_anthropic_system_message(m: dict[str, Any], i: int) -> None:
    """A ``role: "system"`` message holds text or tool changes, or only an
    ``output_config`` (its content left out or empty: Claude Code 2.1.332 sends
    ``{"role": "system", "content": [], "output_config": {"effort": "medium"}}``)."""
    content = m.get("content")
    if content in (None, []) and isinstance(m.get("output_config"), dict):
        return
    if isinstance(content, str):
        return
    items = content if isinstance(content, list) and content else [None]
    kinds = {b.get("type") if isinstance(b, dict) else None for b in items}
    if not kinds <= SYSTEM_MESSAGE_BLOCKS:
        raise _Rejected(
            400,
            f"messages.{i}.content: a system message holds text, tool_addition and "
            "tool_removal blocks only",
        )


def _check_anthropic_ttl_order(body: dict[str, Any]) -> None:
    """The API refuses a one-hour breakpoint after a five-minute one, in the order tools,
    system, messages (a top-level marker, automatic caching, is the last block), in its own
    words (as Claude Code users met it)."""
    system = body.get("system")
    holders = [(f"tools.{i}", t) for i, t in enumerate(body.get("tools") or [])]
    holders += [
        (f"system.{i}", b) for i, b in enumerate(system if isinstance(system, list) else [])
    ]
    for i, m in enumerate(body["messages"]):
        content = m.get("content") if isinstance(m, dict) else None
        holders += [
            (f"messages.{i}.content.{j}", b)
            for j, b in enumerate(content if isinstance(content, list) else [])
        ]
    holders.append(("", body))
    five_minutes = False
    for path, holder in holders:
        marker = holder.get("cache_control") if isinstance(holder, dict) else None
        if not isinstance(marker, dict):
            continue
        if _ttl(marker) == "1h" and five_minutes:
            raise _Rejected(
                400,
                f"{path + '.' if path else ''}cache_control.ttl: a ttl='1h' cache_control block "
                "must not come after a ttl='5m' cache_control block. Note that blocks are "
                "processed in the following order: `tools`, `system`, `messages`.",
            )
        five_minutes = five_minutes or _ttl(marker) != "1h"


def _check_anthropic_text(m: dict[str, Any], i: int, last: bool) -> None:
    """What the API refuses of a message's text: an empty text block anywhere, and empty
    content except in a final assistant message (a prefill)."""
    content = m.get("content")
    if content in ("", []) and not (last and m.get("role") == "assistant"):
        raise _Rejected(
            400,
            f"messages.{i}: all messages must have non-empty content except for the optional "
            "final assistant message",
        )
    for b in content if isinstance(content, list) else []:
        if isinstance(b, dict) and b.get("type") == "text" and b.get("text") == "":
            raise _Rejected(400, "messages: text content blocks must be non-empty")


def _leading_results(m: Any) -> list[dict[str, Any]]:
    """The tool_result blocks at the start of a message's content."""
    content = m.get("content") if isinstance(m, dict) else None
    out: list[dict[str, Any]] = []
    for b in content if isinstance(content, list) else []:
        if not (isinstance(b, dict) and b.get("type") == "tool_result"):
            break
        out.append(b)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Fake OpenAI/Anthropic provider for tests")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--no-auth", action="store_true", help="do not require API keys")
    args = ap.parse_args(argv)

    async def run() -> None:
        fp = FakeProvider(require_auth=not args.no_auth)
        print(f"listening on {await fp.serve(args.host, args.port)}", flush=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())


if __name__ == "__main__":
    main()
