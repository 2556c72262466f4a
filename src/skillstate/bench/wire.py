"""The HTTP side of a benchmark arm: one chat-completions call, by one of two clients.

* ``SdkChatClient``: the real ``openai`` Python client (the ``bench`` extra), what the
  benches use so that they measure what a real client sends, its own retries included.
* ``PlainChatClient``: the standard library's ``http.client``, JSON replies only. It is what
  ``skillstate demo`` uses, so that the demo runs from a plain ``pip install`` (no SDK).

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
    cached_tokens: int = 0


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
        try:
            status, headers, raw = http_request(
                "POST", self._url, orjson.dumps(kwargs), self._headers, self._timeout
            )
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
        message = None
        choices = data.get("choices") or []
        if choices:
            first = choices[0].get("message") if isinstance(choices[0], dict) else None
            if not isinstance(first, dict):
                raise ChatCallError(f"HTTP {status}: the first choice has no message")
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
