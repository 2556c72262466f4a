"""The HTTP side of a benchmark arm: one chat-completions call, by one of two clients.

* ``SdkChatClient``: the real ``openai`` Python client (the ``bench`` extra), what the
  benches use so that they measure what a real client sends, its own retries included.
* ``PlainChatClient``: the standard library's ``http.client``, JSON replies only. It is what
  ``skillstate demo`` uses, so that the demo runs from a plain ``pip install`` (no SDK).
* ``AnthropicChatClient``: the same workload loop spoken as the Anthropic Messages API (the
  ``anthropic`` cache regime), over ``http.client``, JSON replies only. It marks its own
  ``cache_control`` breakpoints as agents do (end of the system prompt and of the last
  message); requests and replies are mapped by the proxy's own translation
  (``skillstate.dialects.translate``), so the loop keeps working in chat-completions shapes.

Both return a ``ChatReply`` or raise ``ChatCallError`` with a one-line reason; the arm does
the bookkeeping around them. ``get_json`` reads the proxy's ``/state`` and ``/cost``.
"""

from __future__ import annotations

import http.client
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import orjson


class ChatCallError(Exception):
    """A call that got no usable reply (HTTP error status, connection error, bad body)."""


@dataclass
class ChatReply:
    """What one chat-completions call returned, whichever client made it."""

    message: dict[str, Any] | None  # the assistant message; None when there are no choices
    headers: Mapping[str, str]  # the response headers (the proxy's x-skillstate-* among them)
    model: str | None = None
    prompt_tokens: int | None = None  # None: the response carries no usage
    completion_tokens: int = 0
    cached_tokens: int = 0  # cache reads (included in prompt_tokens)
    cache_write_tokens: int = 0  # cache writes (included in prompt_tokens)


class ChatClient(Protocol):
    """One arm's client: ``complete`` one call; ``requests`` is how many HTTP requests the
    last call sent (a client's own retries included)."""

    requests: int

    def complete(self, kwargs: dict[str, Any]) -> ChatReply: ...
    def close(self) -> None: ...


def is_loopback(url: str) -> bool:
    return (urlsplit(url).hostname or "") in ("127.0.0.1", "localhost", "::1")


def shorten(text: str, limit: int = 200) -> str:
    """``text`` on one line, at most ``limit`` characters (an ellipsis marks a cut)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


# -- the openai SDK --------------------------------------------------------------------------


class SdkChatClient:
    """``openai.OpenAI`` with a request counter (the SDK retries up to twice by itself)."""

    def __init__(
        self, base_url: str, api_key: str, headers: dict[str, str], timeout: float
    ) -> None:
        import openai

        self.requests = 0

        def count(request: Any) -> None:
            self.requests += 1

        # Loopback (the simulated model, the in-process proxy) never goes through an
        # environment-configured HTTP proxy.
        self._http = openai.DefaultHttpxClient(
            event_hooks={"request": [count]}, trust_env=not is_loopback(base_url)
        )
        self.client = openai.OpenAI(
            base_url=base_url,
            api_key=api_key,
            default_headers=headers,
            max_retries=2,
            timeout=timeout,
            http_client=self._http,
        )

    def close(self) -> None:
        self.client.close()

    def complete(self, kwargs: dict[str, Any]) -> ChatReply:
        import openai

        self.requests = 0
        message: dict[str, Any] | None
        try:
            raw = self.client.chat.completions.with_raw_response.create(**kwargs)
            if kwargs.get("stream"):
                message, usage, model = _accumulate_stream(raw.parse())
            else:
                completion = raw.parse()
                usage, model = completion.usage, completion.model
                first = completion.choices[0].message if completion.choices else None
                message = _message_dict(first) if first is not None else None
        except openai.APIStatusError as e:
            detail = e.body.get("message") if isinstance(e.body, dict) else None
            raise ChatCallError(f"HTTP {e.status_code}: {shorten(detail or e.message)}") from e
        except openai.APIError as e:  # connection errors, timeouts, bad responses
            raise ChatCallError(f"{type(e).__name__}: {shorten(str(e))}") from e
        reply = ChatReply(message, raw.headers, model)
        if usage is not None and getattr(usage, "prompt_tokens", None) is not None:
            reply.prompt_tokens = int(usage.prompt_tokens)
            reply.completion_tokens = int(usage.completion_tokens or 0)
            details = getattr(usage, "prompt_tokens_details", None)
            cached = getattr(details, "cached_tokens", None) if details else None
            reply.cached_tokens = int(cached) if cached is not None else 0
            written = getattr(details, "cache_write_tokens", None) if details else None
            reply.cache_write_tokens = int(written) if isinstance(written, int) else 0
        return reply


def _accumulate_stream(stream: Any) -> tuple[dict[str, Any], Any, str | None]:
    """Chunks -> (assistant message dict, usage object or None, model name)."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    usage = None
    model = None
    for chunk in stream:
        model = model or getattr(chunk, "model", None)
        if getattr(chunk, "usage", None) is not None:
            usage = chunk.usage
        for choice in chunk.choices or []:
            delta = choice.delta
            if delta is None:
                continue
            if delta.content:
                content.append(delta.content)
            for tc in delta.tool_calls or []:
                slot = calls.setdefault(
                    tc.index,
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if tc.id:
                    slot["id"] = tc.id
                if tc.function is not None:
                    if tc.function.name:
                        slot["function"]["name"] += tc.function.name
                    if tc.function.arguments:
                        slot["function"]["arguments"] += tc.function.arguments
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, usage, model


def _message_dict(msg: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
    if msg.tool_calls:
        out["tool_calls"] = [
            {
                "id": tc.id,
                "type": "function",
                "function": {"name": tc.function.name, "arguments": tc.function.arguments},
            }
            for tc in msg.tool_calls
        ]
    return out


# -- the standard library --------------------------------------------------------------------


def http_request(
    method: str,
    url: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 10.0,
) -> tuple[int, dict[str, str], bytes]:
    """One request with ``http.client`` (no environment proxy): (status, headers, body)."""
    parts = urlsplit(url)
    conn_class = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    conn = conn_class(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


class PlainChatClient:
    """Chat completions over ``http.client``: one request per call, JSON replies only."""

    def __init__(
        self, base_url: str, api_key: str, headers: dict[str, str], timeout: float
    ) -> None:
        self.requests = 0
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._headers = {
            **headers,
            "authorization": f"Bearer {api_key}",
            "content-type": "application/json",
        }
        self._timeout = timeout

    def close(self) -> None:
        pass

    def complete(self, kwargs: dict[str, Any]) -> ChatReply:
        if kwargs.get("stream"):
            raise ChatCallError("the plain client reads JSON replies only (no --stream)")
        self.requests = 1
        headers, data = _post_json(self._url, kwargs, self._headers, self._timeout)
        message = None
        choices = data.get("choices") or []
        if choices:
            first = choices[0].get("message") if isinstance(choices[0], dict) else None
            if not isinstance(first, dict):
                raise ChatCallError("the first choice has no message")
            message = {"role": "assistant", "content": first.get("content") or ""}
            if first.get("tool_calls"):
                message["tool_calls"] = first["tool_calls"]
        reply = ChatReply(message, headers, data.get("model"))
        usage = data.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            reply.prompt_tokens = usage["prompt_tokens"]
            reply.completion_tokens = int(usage.get("completion_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            reply.cached_tokens = int(details.get("cached_tokens") or 0)
            reply.cache_write_tokens = int(details.get("cache_write_tokens") or 0)
        return reply


def _post_json(
    url: str, body: Mapping[str, Any], headers: Mapping[str, str], timeout: float
) -> tuple[dict[str, str], dict[str, Any]]:
    """POST a JSON body; (response headers, JSON object) or ChatCallError with a one-line
    reason (either dialect's error object)."""
    try:
        status, resp_headers, raw = http_request("POST", url, orjson.dumps(body), headers, timeout)
    except OSError as e:
        raise ChatCallError(f"{type(e).__name__}: {shorten(str(e))}") from e
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if status >= 400:
        error = data.get("error") if isinstance(data, dict) else None
        detail = error.get("message") if isinstance(error, dict) else None
        raise ChatCallError(f"HTTP {status}: {shorten(detail or raw.decode(errors='replace'))}")
    if not isinstance(data, dict):
        raise ChatCallError(f"HTTP {status}: the body is not a JSON object")
    return resp_headers, data


ANTHROPIC_VERSION = "2023-06-01"
_EPHEMERAL = {"type": "ephemeral"}


def with_agent_breakpoints(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic request with ``cache_control`` breakpoints where agents put them: the end
    of the system prompt and the end of the last message (a copy; ``body`` is not changed)."""
    out = dict(body)
    system = out.get("system")
    if isinstance(system, str) and system:
        out["system"] = [{"type": "text", "text": system, "cache_control": _EPHEMERAL}]
    messages = list(out.get("messages") or [])
    if messages:
        last = dict(messages[-1])
        content = last.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if isinstance(blocks, list) and blocks:
            blocks = [*blocks[:-1], {**blocks[-1], "cache_control": _EPHEMERAL}]
            last["content"] = blocks
        messages[-1] = last
        out["messages"] = messages
    return out


class AnthropicChatClient:
    """The workload's chat-completions calls, sent as Anthropic Messages requests with the
    agent's own breakpoints (see the module docstring). JSON replies only."""

    def __init__(
        self, base_url: str, api_key: str, headers: dict[str, str], timeout: float
    ) -> None:
        self.requests = 0
        self._url = base_url.rstrip("/") + "/messages"
        self._headers = {
            **headers,
            "x-api-key": api_key,
            "anthropic-version": ANTHROPIC_VERSION,
            "content-type": "application/json",
        }
        self._timeout = timeout

    def close(self) -> None:
        pass

    def complete(self, kwargs: dict[str, Any]) -> ChatReply:
        from skillstate.dialects.translate import (
            anthropic_response_to_openai,
            openai_request_to_anthropic,
        )

        if kwargs.get("stream"):
            raise ChatCallError("the Anthropic client reads JSON replies only (no --stream)")
        self.requests = 1
        body = with_agent_breakpoints(openai_request_to_anthropic(kwargs))
        headers, data = _post_json(self._url, body, self._headers, self._timeout)
        completion = anthropic_response_to_openai(data, created=0)
        first = (completion.get("choices") or [{}])[0].get("message") or {}
        message: dict[str, Any] = {"role": "assistant", "content": first.get("content") or ""}
        if first.get("tool_calls"):
            message["tool_calls"] = first["tool_calls"]
        reply = ChatReply(message, headers, data.get("model"))
        usage = data.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("input_tokens"), int):
            read = int(usage.get("cache_read_input_tokens") or 0)
            written = int(usage.get("cache_creation_input_tokens") or 0)
            reply.prompt_tokens = usage["input_tokens"] + read + written
            reply.completion_tokens = int(usage.get("output_tokens") or 0)
            reply.cached_tokens = read
            reply.cache_write_tokens = written
        return reply


def get_json(url: str) -> Any:
    """GET ``url`` and decode the JSON body; a failure is ``{"error": ...}``, never raised."""
    try:
        status, _, raw = http_request("GET", url)
    except OSError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {"error": f"HTTP {status}: not JSON"}
    if status != 200:
        return {"error": f"HTTP {status}", "body": data}
    return data
