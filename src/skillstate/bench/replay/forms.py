"""A session's requests as bytes on the wire, in the dialect the replay sends it in.

* Claude Code sessions go to ``/v1/messages`` as logged (their ``cache_control``
  breakpoints at the logged paths, or where the client puts them: the end of the system
  prompt and of the last message).
* Transcripts go to ``/v1/chat/completions``; under the ``anthropic`` cache regime they are
  first translated to Messages (:func:`as_anthropic`, the proxy's own translation) with the
  client's breakpoints, as an Anthropic client sends them.
* Codex rollouts go to ``/v1/responses``.

A session whose log does not hold its stable prefix (:func:`prefix_unlogged`: a Claude Code
log without ``api-request`` lines has no system prompt or tools, a Codex rollout never has
its tool definitions) is sent with a stand-in for it (:func:`with_standin`): filler text
where the real prefix sits (the Messages ``system``, the Responses ``instructions``; the part
the recorded first call read from the cache as a tool definition, which the cache counts
first), the same bytes in every call, so it is billed and cached as the real one was.

Each distinct message is serialized once per session; a request is their bytes joined, so
a call costs the client O(its request) and no re-encoding of the history.
"""

from __future__ import annotations

from typing import Any

import orjson

from ...cost.tokens import BYTES_PER_TOKEN
from ...dialects.translate.outputlimit import DEFAULT_MAX_TOKENS
from .jsonstream import LogError
from .session import Call, Session

__all__ = [
    "PATHS",
    "STANDIN_FILLER",
    "RequestBuilder",
    "as_anthropic",
    "prefix_unlogged",
    "standin_text",
    "standin_tools",
    "with_standin",
]

PATHS = {
    "anthropic": "/v1/messages",
    "openai": "/v1/chat/completions",
    "responses": "/v1/responses",
}
_EPHEMERAL = {"type": "ephemeral"}
# Words shorter than reach's identifiers (skillstate.bench.reach.MIN_TOKEN_CHARS): the
# stand-in holds no token an action could be said to reach.
STANDIN_FILLER = "system prompt and tools not logged; filler of their size. "


def prefix_unlogged(session: Session) -> bool:
    """Whether the session's log lacks its stable prefix: a Codex rollout never logs the tool
    definitions; a Claude Code log without ``api-request`` lines (the reader then found no
    system prompt or tools) has neither."""
    if session.source == "codex":
        return True
    return session.source == "claude-code" and session.system is None and not session.tools


def standin_text(nbytes: int) -> str:
    """Filler of ``nbytes`` ASCII bytes (at least one)."""
    nbytes = max(1, nbytes)
    return (STANDIN_FILLER * (nbytes // len(STANDIN_FILLER) + 1))[:nbytes]


def standin_tools(tokens: int) -> list[dict[str, Any]]:
    """One Messages tool definition of ``tokens`` tokens as the simulated cache counts a
    piece (its compact JSON, 4 bytes a token): the part of an unlogged prefix the recorded
    first call read from the cache (tools come first in the cache's order)."""
    tools: list[dict[str, Any]] = [
        {"name": "standin", "description": "", "input_schema": {"type": "object"}}
    ]
    overhead = len(orjson.dumps(tools))
    tools[0]["description"] = standin_text(tokens * BYTES_PER_TOKEN - overhead)
    return tools


def with_standin(session: Session, text: str | None, tools: list[dict[str, Any]] | None) -> Session:
    """``session`` with a stand-in where its unlogged prefix sits: ``tools`` as its tool
    definitions (Messages only), ``text`` as the Messages system prompt (one block, the
    client's breakpoint at its end) or the Responses ``instructions``."""
    from dataclasses import replace

    if session.dialect == "anthropic":
        system = [{"type": "text", "text": text}] if text else None
        return replace(session, system=system, tools=tools or None)
    if not text:
        return session
    return replace(session, params={**session.params, "instructions": text})


def as_anthropic(session: Session) -> Session:
    """A chat-completions session as an Anthropic Messages client would send it: each call's
    request translated by the proxy's own translation, the messages pooled again. LogError
    when the translation refuses a request (as the proxy would answer it with a 400)."""
    from skillstate.dialects.translate import openai_request_to_anthropic
    from skillstate.errors import ProxyError

    out = Session(
        id=session.id,
        source=session.source,
        dialect="anthropic",
        provider=session.provider,
        model=session.model,
        notes=list(session.notes),
        skipped=list(session.skipped),
    )
    index: dict[bytes, int] = {}
    for call in session.calls:
        body: dict[str, Any] = {
            "model": session.model or "replay",
            "max_tokens": DEFAULT_MAX_TOKENS,
            "messages": [session.pool[i] for i in call.messages],
        }
        if session.tools:
            body["tools"] = session.tools
        try:
            translated = openai_request_to_anthropic(body)
        except ProxyError as e:
            raise LogError(f"the Anthropic translation refuses it ({e})") from None
        if out.system is None:
            out.system = translated.get("system")
            out.tools = translated.get("tools")
        ids = []
        for m in translated["messages"]:
            key = orjson.dumps(m)
            if key not in index:
                index[key] = out.add(m)
            ids.append(index[key])
        out.calls.append(Call(ids, call.reply, call.usage, call.at, None))
    out.params = {"max_tokens": DEFAULT_MAX_TOKENS}
    return out


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def _marked_message(message: dict[str, Any], block: int | None) -> dict[str, Any]:
    """``message`` with a breakpoint on content block ``block`` (None: the last one)."""
    blocks = _blocks(message.get("content"))
    if not blocks:
        return message
    k = len(blocks) - 1 if block is None else block
    if not 0 <= k < len(blocks) or not isinstance(blocks[k], dict):
        return message
    blocks[k] = {**blocks[k], "cache_control": _EPHEMERAL}
    return {**message, "content": blocks}


class RequestBuilder:
    """The request bytes of each call of one session (LogError when a message cannot be
    sent)."""

    def __init__(self, session: Session, model: str) -> None:
        self.session = session
        self.dialect = session.dialect
        self.path = PATHS[self.dialect]
        try:
            self._parts = [orjson.dumps(m) for m in session.pool]
            orjson.dumps([session.system, session.tools, session.params])
        except orjson.JSONEncodeError as e:
            # orjson writes at most 255 levels of nesting (and reads 1,024): such a message
            # cannot go on the wire, nor would the proxy write it back out.
            raise LogError(f"a message cannot be sent as JSON ({e})") from None
        head: dict[str, Any] = {"model": model}
        if self.dialect == "anthropic":
            head.update({k: v for k, v in session.params.items() if k != "stream"})
            head.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
        elif self.dialect == "responses":
            head["store"] = False
            head.update({k: v for k, v in session.params.items() if k != "stream"})
        if session.tools:
            head["tools"] = session.tools
        self._head = head
        self._key = b"input" if self.dialect == "responses" else b"messages"

    def body(self, call: Call) -> bytes:
        head = self._head
        parts = [self._parts[i] for i in call.messages]
        if self.dialect == "anthropic":
            head, parts = self._with_marks(call, head, parts)
        return b"".join(
            [orjson.dumps(head)[:-1], b',"', self._key, b'":[', b",".join(parts), b"]}"]
        )

    def _with_marks(
        self, call: Call, head: dict[str, Any], parts: list[bytes]
    ) -> tuple[dict[str, Any], list[bytes]]:
        """The call's breakpoints: as logged, or the client's defaults (None)."""
        system = self.session.system
        marks = call.marks
        if marks is None:
            marks = [("messages", len(parts) - 1, "content", None)] if parts else []
            if system:
                marks.append(("system", None))
        parts = list(parts)
        sys_blocks = _blocks(system) if system else None
        for path in marks:
            if path[0] == "messages" and len(path) >= 2 and isinstance(path[1], int):
                i = path[1]
                if 0 <= i < len(parts):
                    block = path[3] if len(path) > 3 and isinstance(path[3], int) else None
                    message = self.session.pool[call.messages[i]]
                    parts[i] = orjson.dumps(_marked_message(message, block))
            elif path[0] == "system" and sys_blocks:
                k = path[1] if len(path) > 1 and isinstance(path[1], int) else len(sys_blocks) - 1
                if 0 <= k < len(sys_blocks) and isinstance(sys_blocks[k], dict):
                    sys_blocks[k] = {**sys_blocks[k], "cache_control": _EPHEMERAL}
        if sys_blocks is not None:
            head = {**head, "system": sys_blocks}
        return head, parts
