"""A deterministic, simulated OpenAI-compatible model for offline benchmarks.

``SimModel`` serves ``POST /v1/chat/completions`` (and ``/chat/completions``) and the Anthropic
Messages API ``POST /v1/messages`` on loopback in a background thread, as JSON or as SSE (with
``stream_options.include_usage`` for chat completions). Every reply is labelled simulated:
model id ``skillstate-sim``, a ``[sim]`` prefix on the text and the response
header ``x-skillstate-simulated: 1``.

What it does is a pure function of the messages it receives (``sim_reply``), so it measures
what a context *keeps*, not how good a model is:

* Conversation workload (no ``tools`` in the request): ``RECORD key=value`` lines in the
  latest user message are facts to keep; ``(aside: key=value)`` mentions are never recorded.
  ``RECALL key?`` lines are answered ``ANSWER key=value`` ONLY from the text of the other
  messages it received (the state JSON or the transcript), ``ANSWER key=UNKNOWN`` otherwise.
* Tools workload (``tools`` in the request): it triages an issue tracker. It folds every tool
  result visible in the context (plus the state, when there is one) into what it knows and
  deterministically emits the next ``tool_calls`` (several in parallel, as the task's
  ``BATCH n`` line allows), applying the task's ``RULE`` lines; ``DONE`` when nothing is left.
* When the proxy's state contract is present it ends every reply with the envelope
  ```` ```json {"state_patch": {...}, "action": "..."}``` ````, reading the current state from
  the ``CURRENT STATE (JSON)`` message.

Usage is ``skillstate.cost.tokens.estimate_tokens``: of the received messages (plus the tool
definitions and the system) for the prompt, of the reply for the completion. The prompt cache
is :class:`skillstate.bench.simcache.SimCache` under the regime the model was started with
(``none``, ``openai``: automatic prefix cache, ``anthropic``: ``cache_control`` breakpoints),
reported the way the real APIs report it: ``prompt_tokens_details.cached_tokens`` (plus
``cache_write_tokens`` when there are writes) on chat completions;
``cache_read_input_tokens`` / ``cache_creation_input_tokens`` on Messages, whose
``input_tokens`` then excludes both (in a stream: in ``message_start``, and again in
``message_delta`` with the output). A Messages request is answered by the same policy as its
chat-completions translation (``skillstate.dialects``' own mapping).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from skillstate.bench.simcache import CacheCount, SimCache
from skillstate.cost.baseline import CachePricing
from skillstate.cost.tokens import estimate_text_tokens, estimate_tokens
from skillstate.engine.context import CONTRACT_MARK, CORRECTION_MARK, STATE_MARK
from skillstate.engine.window import CHECKPOINT_MARK

SIM_MODEL_ID = "skillstate-sim"
SIM_HEADER = "x-skillstate-simulated"


class SimError(Exception):
    """A request the simulated model refuses to answer: the server replies HTTP 400."""


_RECORD = re.compile(r"^RECORD ([A-Za-z_][\w]*)=(\S+)\s*$", re.M)
_RECALL = re.compile(r"^RECALL ([A-Za-z_][\w]*)\?\s*$", re.M)
_BATCH = re.compile(r"^BATCH (\d+)\s*$", re.M)
_RULE = re.compile(r"^RULE (\S+) => (.+)$", re.M)
_VALUE = r"[A-Za-z0-9_.:/+-]+"


# -- reading the context ---------------------------------------------------------------------


def message_text(msg: dict[str, Any]) -> str:
    """The text of a chat message: string content, or the text parts of a content list."""
    content = msg.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def has_contract(messages: list[dict[str, Any]]) -> bool:
    return any(CONTRACT_MARK in message_text(m) for m in messages)


def without_corrections(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request as the proxy first asked it: the trailing (reply, CORRECTION) pairs it
    adds when it re-asks after an invalid envelope removed. The re-ask asks what the first
    request asked (a re-asked checkpoint is still a checkpoint), and its last message is the
    correction, not the checkpoint instruction or the observation."""
    while (
        len(messages) >= 2
        and messages[-1].get("role") == "user"
        and CORRECTION_MARK in message_text(messages[-1])
    ):
        messages = messages[:-2]
    return messages


def asks_for_envelope(messages: list[dict[str, Any]]) -> bool:
    """Whether a request (chat-completions messages) asks the model for the envelope: the
    state contract is in the context and, when it is the window form's (it speaks of
    checkpoints), the request as first asked ends with a checkpoint instruction."""
    if not has_contract(messages):
        return False
    contract = next(message_text(m) for m in messages if CONTRACT_MARK in message_text(m))
    if "checkpoint" not in contract.lower():
        return True
    return at_checkpoint(messages)


def at_checkpoint(messages: list[dict[str, Any]]) -> bool:
    """Whether the request, as first asked (re-asks included), ends with the window form's
    checkpoint instruction."""
    asked = without_corrections(messages)
    return bool(asked) and CHECKPOINT_MARK in message_text(asked[-1])


def read_state(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The state the proxy put into the context (last occurrence), or None when absent."""
    found: dict[str, Any] | None = None
    for msg in messages:
        text = message_text(msg)
        pos = text.find(STATE_MARK)
        while pos >= 0:
            start = pos + len(STATE_MARK)
            try:
                value, _ = _raw_decode(text[start:].lstrip())
            except ValueError:
                value = None
            if isinstance(value, dict):
                found = value
            pos = text.find(STATE_MARK, start)
    return found


def _raw_decode(text: str) -> tuple[Any, int]:
    import json

    return json.JSONDecoder().raw_decode(text)


def _marked(msg: dict[str, Any]) -> bool:
    text = message_text(msg)
    return CONTRACT_MARK in text or STATE_MARK in text or CHECKPOINT_MARK in text


def _last_user_index(messages: list[dict[str, Any]]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user" and not _marked(messages[i]):
            return i
    return None


def recall(key: str, texts: list[str]) -> str | None:
    """The last value of ``key`` in the given texts (``key=value`` or JSON ``"key": "value"``).

    ``UNKNOWN`` (an earlier failed answer) never counts as a value."""
    pat = re.compile(
        rf"(?<![\w]){re.escape(key)}=({_VALUE})|\"{re.escape(key)}\"\s*:\s*\"({_VALUE})\""
    )
    value: str | None = None
    for text in texts:
        for m in pat.finditer(text):
            v = m.group(1) or m.group(2)
            if v and v != "UNKNOWN":
                value = v
    return value


# -- the two policies ------------------------------------------------------------------------


@dataclass
class SimReply:
    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    action: str = "continue"
    patch: dict[str, Any] | None = None  # None: no contract in the context, no envelope


def _envelope(patch: dict[str, Any], action: str) -> str:
    body = orjson.dumps({"state_patch": patch, "action": action}).decode()
    return f"\n\n```json\n{body}\n```"


def conversation_reply(messages: list[dict[str, Any]]) -> SimReply:
    contract = asks_for_envelope(messages)
    state = read_state(messages) or {}
    last = _last_user_index(messages)
    latest = message_text(messages[last]) if last is not None else ""
    others = [message_text(m) for i, m in enumerate(messages) if i != last]

    records = dict(_RECORD.findall(latest))
    probes = _RECALL.findall(latest)
    lines: list[str] = []
    if records:
        lines.append("Noted: " + ", ".join(sorted(records)) + ".")
    for key in probes:
        value = recall(key, others)
        lines.append(f"ANSWER {key}={value if value is not None else 'UNKNOWN'}")
    if not lines:
        lines.append("Observed; nothing to record.")
    action = "answer" if probes else ("record" if records else "continue")

    patch: dict[str, Any] | None = None
    if contract:
        prev = state.get("step")
        if not isinstance(prev, int):
            prev = sum(1 for m in messages if m.get("role") == "user" and not _marked(m)) - 1
        patch = {"step": prev + 1}
        if at_checkpoint(messages):
            # The window form: fold every record still in the window into the state before
            # the older messages leave it.
            seen = [message_text(m) for m in messages if m.get("role") == "user" and not _marked(m)]
            records = {k: v for text in seen for k, v in _RECORD.findall(text)}
        if records:
            patch["facts"] = records
    return SimReply("[sim] " + "\n".join(lines), action=action, patch=patch)


def parse_rules(text: str) -> list[tuple[str, dict[str, Any]]]:
    """``RULE keyword => labels+=bug; priority=P1`` lines -> [(keyword, changes)]."""
    rules: list[tuple[str, dict[str, Any]]] = []
    for keyword, spec in _RULE.findall(text):
        changes: dict[str, Any] = {}
        for part in spec.split(";"):
            part = part.strip()
            if "+=" in part:
                k, v = part.split("+=", 1)
                changes.setdefault(k.strip() + "_add", []).append(v.strip())
            elif "=" in part:
                k, v = part.split("=", 1)
                changes[k.strip()] = v.strip()
        rules.append((keyword.lower(), changes))
    return rules


def apply_rules(issue: dict[str, Any], rules: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The update_issue arguments the first matching rule asks for (``*`` matches all)."""
    haystack = (str(issue.get("title", "")) + "\n" + str(issue.get("description", ""))).lower()
    for keyword, changes in rules:
        if keyword == "*" or keyword in haystack:
            return {"id": issue["id"], **changes}
    return {"id": issue["id"]}


def _loads(text: Any) -> Any:
    try:
        return orjson.loads(text) if isinstance(text, (str, bytes)) else None
    except orjson.JSONDecodeError:
        return None


@dataclass
class _Triage:
    """What the simulated triage agent knows of the tracker: its state, then every tool
    result it can see (the whole transcript, or the latest observation)."""

    listed: bool
    next_cursor: int | None
    queue: list[int]
    done: list[int]
    fetched: dict[int, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> _Triage:
        listed = bool(state.get("listed", False))
        return cls(
            listed,
            state.get("next_cursor") if listed else None,
            [int(i) for i in state.get("queue", []) if isinstance(i, int)],
            [int(i) for i in state.get("done", []) if isinstance(i, int)],
        )

    def fold(self, messages: list[dict[str, Any]]) -> None:
        calls: dict[str, tuple[str, dict[str, Any]]] = {}
        for msg in messages:
            for call in msg.get("tool_calls") or []:
                fn = call.get("function") or {}
                args = _loads(fn.get("arguments")) or {}
                calls[str(call.get("id"))] = (str(fn.get("name")), args)
            if msg.get("role") != "tool":
                continue
            name, args = calls.get(str(msg.get("tool_call_id")), ("", {}))
            result = _loads(message_text(msg))
            if isinstance(result, dict) and "error" not in result:
                self._fold_result(name, args, result)

    def _fold_result(self, name: str, args: dict[str, Any], result: dict[str, Any]) -> None:
        if name == "list_issues":
            self.listed = True
            self.next_cursor = result.get("next_cursor")
            for item in result.get("issues", []):
                iid = item.get("id")
                known = iid in self.queue or iid in self.done or iid in self.fetched
                if isinstance(iid, int) and not known:
                    self.queue.append(iid)
        elif name == "get_issue" and isinstance(result.get("id"), int):
            self.fetched[result["id"]] = result
            self.queue = [i for i in self.queue if i != result["id"]]
        elif name == "update_issue" and result.get("ok"):
            iid = (result.get("issue") or {}).get("id", args.get("id"))
            if isinstance(iid, int) and iid not in self.done:
                self.done.append(iid)

    def plan(
        self, rules: list[tuple[str, dict[str, Any]]], batch: int
    ) -> list[tuple[str, dict[str, Any]]]:
        """The next calls: update what was fetched, list (the next page), fetch a batch."""
        planned: list[tuple[str, dict[str, Any]]] = []
        for iid in sorted(self.fetched):
            if iid not in self.done:
                planned.append(("update_issue", apply_rules(self.fetched[iid], rules)))
        if not self.listed:
            planned.append(("list_issues", {"status": "open", "cursor": 0}))
        elif self.next_cursor is not None:
            planned.append(("list_issues", {"status": "open", "cursor": self.next_cursor}))
        fetch_now = self.queue[:batch]
        planned.extend(("get_issue", {"id": iid}) for iid in fetch_now)
        self.queue = self.queue[batch:] if fetch_now else self.queue
        return planned


_CALL_ID = re.compile(r"call_(\d+)_\d+")


def _latest_call_step(messages: list[dict[str, Any]]) -> int:
    """The highest step in the ids of the tool calls and results ``messages`` show (0: none)."""
    ids = [str(m.get("tool_call_id")) for m in messages if m.get("role") == "tool"]
    ids += [str(c.get("id")) for m in messages for c in m.get("tool_calls") or ()]
    steps = [int(m.group(1)) for i in ids if (m := _CALL_ID.fullmatch(i))]
    return max(steps, default=0)


def tools_reply(messages: list[dict[str, Any]]) -> SimReply:
    contract = asks_for_envelope(messages)
    state = read_state(messages) or {}
    task = next(
        (message_text(m) for m in messages if m.get("role") == "user" and not _marked(m)), ""
    )
    batch_m = _BATCH.search(task)
    batch = max(1, int(batch_m.group(1))) if batch_m else 1
    triage = _Triage.from_state(state)
    triage.fold(messages)

    step = state.get("step")
    if not isinstance(step, int):
        step = sum(1 for m in messages if m.get("role") == "assistant")
    # Tool call ids are unique in the client's transcript, as a model's are (Anthropic
    # refuses a request with one twice): a context that shows only the recent messages (the
    # window form, whose state has the step of its last checkpoint) still shows the latest
    # call, and this turn's follows it.
    step = max(step, _latest_call_step(messages)) + 1
    planned = triage.plan(parse_rules(task), batch)

    tool_calls = [
        {
            "id": f"call_{step}_{i}",
            "type": "function",
            "function": {"name": name, "arguments": orjson.dumps(args).decode()},
        }
        for i, (name, args) in enumerate(planned)
    ]
    if tool_calls:
        names = ", ".join(f"{n}({a.get('id', a.get('cursor', ''))})" for n, a in planned)
        text, action = f"[sim] Calling {names}.", "call_tools"
    else:
        text, action = f"[sim] DONE: triaged {len(triage.done)} issues.", "done"

    patch: dict[str, Any] | None = None
    if contract:
        patch = {
            "listed": triage.listed or any(n == "list_issues" for n, _ in planned),
            "next_cursor": triage.next_cursor,
            "queue": triage.queue,
            "done": sorted(triage.done),
            "step": step,
        }
    return SimReply(text, tool_calls=tool_calls, action=action, patch=patch)


def sim_reply(body: dict[str, Any]) -> SimReply:
    """The simulated model's deterministic reply to a chat completions request body."""
    # A re-ask is answered as the request it repeats (the envelope it lacked included).
    messages = without_corrections([m for m in body.get("messages") or [] if isinstance(m, dict)])
    reply = tools_reply(messages) if body.get("tools") else conversation_reply(messages)
    if reply.patch is not None:
        reply.content += _envelope(reply.patch, reply.action)
    return reply


# -- usage -----------------------------------------------------------------------------------


def completion_tokens_of(reply: SimReply) -> int:
    calls = estimate_tokens(reply.tool_calls) if reply.tool_calls else 0
    return estimate_text_tokens(reply.content) + calls


# -- the server ------------------------------------------------------------------------------


@dataclass
class SimRequest:
    """One request the simulated model answered (or refused)."""

    status: int
    n_messages: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    contract: bool  # the proxy's state contract was in the context
    compact: bool  # the proxy's state message was in the context
    injected_tokens: int  # tokens of the messages that carry the proxy's markers
    stream: bool
    cache_write_tokens: int = 0
    dialect: str = "openai"  # the API the request came in on: openai | anthropic


class SimModel:
    """``with SimModel() as sim: sim.base_url`` -> ``http://127.0.0.1:PORT/v1``."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        cache: bool = True,
        usage: bool = True,
        regime: CachePricing = "openai",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = host
        self.port = port
        self.usage = usage  # False: answers without usage (to test "refusing silent 0")
        self.requests: list[SimRequest] = []
        self._lock = threading.Lock()
        self._fail: list[int] = []
        # cache=False: no prompt cache at all (the regime ``none``)
        self.cache = SimCache(regime if cache else "none", clock=clock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # lifecycle
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def __enter__(self) -> SimModel:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="skillstate-sim", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("simulated model did not start within 10 s")
        if self._error is not None:
            raise RuntimeError(f"simulated model failed to start: {self._error}")

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._loop = self._thread = None

    def fail_next(self, count: int = 1, status: int = 400) -> None:
        """Answer the next ``count`` requests with an error of ``status`` (failure injection)."""
        with self._lock:
            self._fail.extend([status] * count)

    def reply(self, body: dict[str, Any]) -> SimReply:
        """The reply to one request body; subclasses replace the policy (raise SimError to
        refuse with HTTP 400)."""
        return sim_reply(body)

    def reset_cache(self) -> None:
        """Forget the simulated prefix cache (between benchmark arms)."""
        self.cache.reset()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            app = web.Application(client_max_size=64 * 1024 * 1024)
            for path in ("/v1/chat/completions", "/chat/completions"):
                app.router.add_post(path, self._chat)
            app.router.add_post("/v1/messages", self._messages)
            app.router.add_get("/v1/models", self._models)
            app.router.add_get("/health", self._health)
            runner = web.AppRunner(app, access_log=None)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self.host, self.port)
            loop.run_until_complete(site.start())
            server = getattr(site, "_server", None)
            sockets = getattr(server, "sockets", None) or []
            if sockets:
                self.port = int(sockets[0].getsockname()[1])
            self._runner = runner
        except BaseException as e:  # reported by start()
            self._error = e
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    # handlers
    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "simulated": True})

    async def _models(self, request: web.Request) -> web.Response:
        data = [{"id": SIM_MODEL_ID, "object": "model", "owned_by": "skillstate (simulated)"}]
        return web.json_response({"object": "list", "data": data}, headers={SIM_HEADER: "1"})

    async def _read_body(
        self, request: web.Request, dialect: str = "openai"
    ) -> dict[str, Any] | web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _error(400, "request body is not valid JSON", dialect)
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "messages must be a list", dialect)
        return body

    def _answer(
        self, received: dict[str, Any], chat_body: dict[str, Any], dialect: str
    ) -> tuple[SimRequest, SimReply | None, web.Response | None]:
        """Bill and answer one request: ``received`` is what came over the wire (what the
        cache counts), ``chat_body`` its chat-completions form (what the policy reads)."""
        messages = [m for m in chat_body.get("messages") or [] if isinstance(m, dict)]
        with self._lock:
            fail = self._fail.pop(0) if self._fail else None
        marked = [m for m in messages if _marked(m)]
        rec = SimRequest(
            status=fail or 200,
            n_messages=len(received.get("messages") or []),
            prompt_tokens=0,
            completion_tokens=0,
            cached_tokens=0,
            contract=has_contract(messages),
            compact=read_state(messages) is not None,
            injected_tokens=estimate_tokens(marked) if marked else 0,
            stream=bool(received.get("stream")),
            dialect=dialect,
        )
        error: web.Response | None = None
        reply: SimReply | None = None
        if fail is not None:
            error = _error(fail, "simulated failure (injected)", dialect)
        else:
            try:
                reply = self.reply(chat_body)
            except SimError as e:
                rec.status = 400
                error = _error(400, str(e), dialect)
        if reply is not None:
            count: CacheCount = self.cache.count(received)
            rec.prompt_tokens = count.prompt_tokens
            rec.cached_tokens = count.cache_read_tokens
            rec.cache_write_tokens = count.cache_write_tokens
            rec.completion_tokens = self.completion_tokens(reply)
        with self._lock:
            self.requests.append(rec)
        self.answered(received, rec)
        return rec, reply, error

    def completion_tokens(self, reply: SimReply) -> int:
        """The output tokens billed for ``reply`` (a subclass may bill what a log recorded)."""
        return completion_tokens_of(reply)

    def answered(self, received: dict[str, Any], rec: SimRequest) -> None:
        """Called once per request answered or refused, with its body as received (a
        subclass measures what reached the model)."""

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._read_body(request)
        if isinstance(body, web.Response):
            return body
        rec, reply, error = self._answer(body, body, "openai")
        if error is not None or reply is None:
            return error or _error(500, "no reply")
        cid = f"chatcmpl-sim-{len(self.requests)}"
        finish = "tool_calls" if reply.tool_calls else "stop"
        usage = _openai_usage(rec)
        if not rec.stream:
            payload = _completion(cid, reply, finish)
            if self.usage:
                payload["usage"] = usage
            return web.Response(
                body=orjson.dumps(payload),
                content_type="application/json",
                headers={SIM_HEADER: "1"},
            )
        include_usage = self.usage and bool((body.get("stream_options") or {}).get("include_usage"))
        resp = await _open_stream(request)
        for chunk in _chunks(cid, reply, finish, usage if include_usage else None):
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        """The Anthropic Messages API: the same policy, Anthropic's wire format and usage."""
        from skillstate.dialects.translate import (
            OpenAIStreamToAnthropic,
            anthropic_request_to_openai,
            openai_response_to_anthropic,
        )
        from skillstate.errors import ProxyError

        body = await self._read_body(request, "anthropic")
        if isinstance(body, web.Response):
            return body
        try:
            chat_body = anthropic_request_to_openai(body)
        except ProxyError as e:
            return _error(400, str(e), "anthropic")
        rec, reply, error = self._answer(body, _split_user_parts(chat_body), "anthropic")
        if error is not None or reply is None:
            return error or _error(500, "no reply", "anthropic")
        cid = f"sim-{len(self.requests)}"
        finish = "tool_calls" if reply.tool_calls else "stop"
        model = str(body.get("model") or SIM_MODEL_ID)
        usage = _openai_usage(rec) if self.usage else None
        if not rec.stream:
            payload = openai_response_to_anthropic(
                {**_completion(cid, reply, finish), "usage": usage}, request_model=model
            )
            if not self.usage:
                payload.pop("usage", None)
            return web.Response(
                body=orjson.dumps(payload),
                content_type="application/json",
                headers={SIM_HEADER: "1"},
            )
        translator = OpenAIStreamToAnthropic(model, f"msg_{cid}")
        resp = await _open_stream(request)
        for chunk in _chunks(cid, reply, finish, usage):
            for event in translator.feed(chunk):
                await resp.write(_start_usage(event, usage))
        for event in translator.finish():
            await resp.write(event)
        await resp.write_eof()
        return resp


def _start_usage(event: bytes, usage: dict[str, Any] | None) -> bytes:
    """``event`` with, when it is ``message_start``, the request's input and cache counts in
    its usage, as Anthropic sends them there (the translator, which relays a chat stream
    whose usage comes last, leaves them 0 until ``message_delta``); output 1, as the API's."""
    if usage is None or not event.startswith(b"event: message_start\n"):
        return event
    from skillstate.dialects.translate.common import openai_usage_to_anthropic

    head, _, data = event.partition(b"data: ")
    start = orjson.loads(data)
    start["message"]["usage"] = {**openai_usage_to_anthropic(usage), "output_tokens": 1}
    return head + b"data: " + orjson.dumps(start) + b"\n\n"


def _split_user_parts(body: dict[str, Any]) -> dict[str, Any]:
    """The policy's view of a translated Messages request: a user message of several text
    parts (Anthropic merges consecutive user turns, e.g. the proxy's state and the latest
    observation) becomes one user message per part, as it would be in chat completions."""
    messages: list[Any] = []
    for m in body.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else None
        texts = [p for p in content if isinstance(p, dict)] if isinstance(content, list) else []
        if (
            m.get("role") == "user"
            and len(texts) > 1
            and all(p.get("type") == "text" for p in texts)
        ):
            messages.extend({"role": "user", "content": str(p.get("text", ""))} for p in texts)
        else:
            messages.append(m)
    return {**body, "messages": messages}


def _openai_usage(rec: SimRequest) -> dict[str, Any]:
    details: dict[str, int] = {"cached_tokens": rec.cached_tokens}
    if rec.cache_write_tokens:
        details["cache_write_tokens"] = rec.cache_write_tokens
    return {
        "prompt_tokens": rec.prompt_tokens,
        "completion_tokens": rec.completion_tokens,
        "total_tokens": rec.prompt_tokens + rec.completion_tokens,
        "prompt_tokens_details": details,
    }


def _completion(cid: str, reply: SimReply, finish: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return {
        "id": cid,
        "object": "chat.completion",
        "created": 0,
        "model": SIM_MODEL_ID,
        "system_fingerprint": "simulated",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


async def _open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", SIM_HEADER: "1"}
    )
    await resp.prepare(request)
    return resp


def _error(status: int, message: str, dialect: str = "openai") -> web.Response:
    kind = "invalid_request_error" if status < 500 else "api_error"
    body: dict[str, Any]
    if dialect == "anthropic":
        body = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        body = {"error": {"message": message, "type": kind, "code": "simulated"}}
    return web.json_response(body, status=status, headers={SIM_HEADER: "1"})


def _pieces(text: str, n: int = 3) -> Iterator[str]:
    size = max(1, -(-len(text) // n))
    for i in range(0, len(text), size):
        yield text[i : i + size]


def _chunks(
    cid: str, reply: SimReply, finish: str, usage: dict[str, Any] | None
) -> Iterator[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": 0,
            "model": SIM_MODEL_ID,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }

    yield chunk({"role": "assistant", "content": ""})
    for piece in _pieces(reply.content):
        yield chunk({"content": piece})
    for index, call in enumerate(reply.tool_calls):
        fn = call["function"]
        head = {"index": index, "id": call["id"], "type": "function"}
        yield chunk({"tool_calls": [{**head, "function": {"name": fn["name"], "arguments": ""}}]})
        for piece in _pieces(fn["arguments"], 2):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, finish)
    if usage is not None:
        yield {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": 0,
            "model": SIM_MODEL_ID,
            "choices": [],
            "usage": usage,
        }
