"""The OpenAI Responses API (``POST /v1/responses``) as a dialect, and as the upstream
``kind: openai-responses``: request checks, the transcript layout for state mode, replies,
usage, errors and the stream relays. Chat-completions and Anthropic upstreams are reached
through the bridges in ``translate`` and ``stream`` (listed in the registry)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Final

from ...cost.usage import Usage
from ...engine.context import DialectContext, Split, correction_text, observation, state_text
from ...engine.stripper import NOTHING, Known, Stripped, strip_request_transcript, strip_texts
from ...errors import ProxyError
from .. import models
from ..base import JSON, BadReply, StreamRelay, TokenCount, content_chars
from ..openai import OPENAI, usage_from_openai
from .failure import response_problem
from .items import call_chars, in_model_turn, is_call_output, is_client_call
from .items import item_type as _type
from .stream import ResponsesEventStripper, ResponsesRelay
from .validate import validate_responses_request

NAME: Final = "openai-responses"


def _last_tool_round(items: list[Any], split: Split) -> int:
    """Where the last tool round starts: the last run of the model's call items (parallel
    calls of any kind the client runs, with the reasoning items and hosted calls of that
    turn: encrypted_content must go back as it came) and the outputs after them, with the
    user messages among those outputs (the API takes a message between a call and its
    output). An output followed by a call starts a new round, as a model turn ends with its
    calls. ``len(items)`` when the transcript ends otherwise."""
    end = len(items)
    outputs = [k for k in range(split.observation, end) if is_call_output(items[k])]
    if not outputs:
        return end
    k = outputs[-1] + 1
    while k > split.system_end and _is_user_turn(items[k - 1]):
        k -= 1
    while k > split.system_end and in_model_turn(items[k - 1]):
        k -= 1
    return k


def _is_user_turn(item: Any) -> bool:
    """A user message or a call's output (``ResponsesContext.is_user_turn``)."""
    return (_type(item) == "message" and item.get("role") == "user") or is_call_output(item)


def _user_message(text: str) -> JSON:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def input_items(raw: Any) -> list[Any]:
    """A request's ``input`` as a list of items (a string is one user message)."""
    return [_user_message(raw)] if isinstance(raw, str) else list(raw or ())


class ResponsesContext:
    """The transcript is ``input`` (a list of items; the route turns a string into one user
    message). System text is ``instructions`` plus leading system/developer messages; tool
    results are the outputs of the calls the client runs (``items``: function, custom tool,
    shell, apply_patch, computer calls...)."""

    transcript_key = "input"

    def is_system(self, msg: dict[str, Any]) -> bool:
        return _type(msg) == "message" and msg.get("role") in ("system", "developer")

    def is_user_turn(self, msg: dict[str, Any]) -> bool:
        return _is_user_turn(msg)

    def is_tool_result(self, msg: dict[str, Any]) -> bool:
        return is_call_output(msg)

    def has_tool_calls(self, msg: dict[str, Any]) -> bool:
        return is_client_call(msg)

    def compact(
        self, body: dict[str, Any], split: Split, contract: str, state: dict[str, Any]
    ) -> dict[str, Any]:
        items = body["input"]
        start = min(split.observation, _last_tool_round(items, split))
        out = list(items[: split.system_end])
        if split.task is not None:
            out.extend(items[split.task : split.task_end])  # in the stable prefix from turn 1 on
        out.append(_user_message(contract + "\n\n" + state_text(state)))
        out.extend(observation(items, dataclasses.replace(split, observation=start)))
        return {**body, "input": out}

    def full(self, body: dict[str, Any], contract: str) -> dict[str, Any]:
        items = body["input"]
        end = 0
        while end < len(items) and self.is_system(items[end]):
            end += 1
        note = {"type": "message", "role": "developer", "content": contract}
        return {**body, "input": [*items[:end], note, *items[end:]]}

    def correction(
        self, body: dict[str, Any], reply_text: str, errors: Sequence[str]
    ) -> dict[str, Any]:
        extra = [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": reply_text, "annotations": []}],
            },
            _user_message(correction_text(errors)),
        ]
        return {**body, "input": [*body["input"], *extra]}

    def instruct(self, body: dict[str, Any], text: str) -> dict[str, Any]:
        return {**body, "input": [*body["input"], _user_message(text)]}


def output_text(resp: JSON) -> str:
    """All output_text of a ``response`` object's message items (the SDK's ``output_text``)."""
    texts = []
    for item in resp.get("output") or ():
        if isinstance(item, dict) and item.get("type") == "message":
            for part in item.get("content") or ():
                if isinstance(part, dict) and part.get("type") == "output_text":
                    texts.append(part.get("text") or "")
    return "".join(texts)


def _text_parts(output: list[Any]) -> list[tuple[int, int]]:
    """(item, part) positions of the output_text parts of a reply's message items."""
    return [
        (i, k)
        for i, item in enumerate(output)
        if isinstance(item, dict)
        and _type(item) == "message"
        and isinstance(item.get("content"), list)
        for k, part in enumerate(item["content"])
        if isinstance(part, dict)
        and part.get("type") == "output_text"
        and isinstance(part.get("text"), str)
    ]


def _all_blank(item: JSON) -> bool:
    """A message item whose every part is an output_text part left empty."""
    parts = item.get("content")
    return isinstance(parts, list) and all(
        isinstance(p, dict) and p.get("type") == "output_text" and not p.get("text") for p in parts
    )


def strip_response(resp: JSON, known: Known = None) -> tuple[JSON, Stripped]:
    """A ``response`` object without envelopes: the output_text parts of its message items,
    stripped together as one message (:func:`~skillstate.engine.stripper.strip_texts`: a reply that
    was only the envelope shows its action, unless the reply calls a tool: then a message
    item left empty goes, as the stream drops it); reasoning and tool-call items untouched,
    and a part left empty kept otherwise (its indexes are the stream's). ``resp`` itself
    when it had none.
    ``known``: the reply's text already through ``strip_envelope``, and its result."""
    output = resp.get("output")
    if not isinstance(output, list):
        return resp, NOTHING
    at = _text_parts(output)
    texts = [output[i]["content"][k]["text"] for i, k in at]
    if not any("{" in t for t in texts):  # every envelope is a JSON object (fast path)
        return resp, NOTHING
    calls = any(is_client_call(item) for item in output)
    if len(texts) == 1 and known is not None and known[0] is texts[0] and not calls:
        # One part: strip_texts' message-wide fallback is strip_envelope's own.
        summary = known[1]
        parts = [summary.text]
    else:
        parts, summary = strip_texts(texts, fallback=not calls)
    if summary.envelope is None:
        return resp, summary
    out: list[Any] = list(output)
    for (i, k), old, new in zip(at, texts, parts, strict=True):
        if new != old:
            if out[i] is output[i]:
                out[i] = {**output[i], "content": list(output[i]["content"])}
            out[i]["content"][k] = {**output[i]["content"][k], "text": new}
    if calls:  # a message item the envelope was all of goes, as in the stream
        emptied = {i for i, _ in at if _all_blank(out[i])}
        out = [item for i, item in enumerate(out) if i not in emptied]
    clean = {**resp, "output": out}
    if isinstance(resp.get("output_text"), str):
        clean["output_text"] = summary.text
    return clean, summary


# What ``POST /responses/input_tokens`` takes (the openai SDK's InputTokenCountParams, 3.57):
# the request as ``/responses`` would get it, less what does not change the input's count
# (``max_output_tokens``, ``stream``, ``store``, ``metadata``, ...).
INPUT_TOKENS_FIELDS = frozenset(
    {
        "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
        "reasoning", "text", "truncation", "conversation", "previous_response_id",
        "personality",
    }
)  # fmt: skip


class ResponsesDialect:
    """The OpenAI Responses API (``POST /v1/responses``)."""

    name = NAME
    client_path = "/responses"
    upstream_path = "/responses"
    token_count: TokenCount | None = TokenCount(
        "/responses/input_tokens", INPUT_TOKENS_FIELDS, "response.input_tokens"
    )
    marker_header: str | None = None  # its clients are told apart by the path alone
    transcript = ("input", "output_text")
    context: DialectContext = ResponsesContext()

    def validate(self, body: JSON, checked: int = 0) -> None:
        validate_responses_request(body, checked)

    def stream_usage_requested(self, body: JSON) -> bool:
        return True  # response.completed always carries usage

    def reply_text(self, resp: JSON) -> tuple[str, bool]:
        calls = any(is_client_call(i) for i in resp.get("output") or ())
        return output_text(resp), calls

    def reply_cut_off(self, resp: JSON) -> bool:
        details = resp.get("incomplete_details")
        return isinstance(details, dict) and details.get("reason") == "max_output_tokens"

    def reply_problem(self, resp: JSON) -> BadReply | None:
        return response_problem(resp)

    def usage(self, raw: Any, tier: Any = None) -> Usage | None:
        return usage_from_openai(raw, tier)

    def error_body(self, err: ProxyError) -> JSON:
        return OPENAI.error_body(err)

    def error_status(self, err: ProxyError) -> int:
        return OPENAI.error_status(err)

    def relayed_error(self, raw: bytes, status: int) -> tuple[int, bytes] | None:
        return OPENAI.relayed_error(raw, status)

    def upstream_headers(self, key: str | None, version: str) -> dict[str, str]:
        return OPENAI.upstream_headers(key, version)

    def forwards_header(self, name: str) -> bool:
        return OPENAI.forwards_header(name)

    def upstream_body(self, body: JSON, *, stream: bool, grammar: JSON | None) -> JSON:
        if grammar is None:
            return body
        # The envelope's schema as structured outputs (chat's response_format -> text.format).
        spec = grammar.get("json_schema")
        text = body.get("text")
        spec = spec if isinstance(spec, dict) else {}
        text = text if isinstance(text, dict) else {}
        return {**body, "text": {**text, "format": {"type": "json_schema", **spec}}}

    def relay(
        self, *, request_model: str, client_wants_usage: bool, capture_limit: int
    ) -> StreamRelay:
        return ResponsesRelay(request_model=request_model, capture_limit=capture_limit)

    def model_list(self, body: JSON, *, single: bool) -> JSON:
        return models.model_to_openai(body) if single else models.models_to_openai(body)

    def strip_reply(self, resp: JSON, known: Known = None) -> tuple[JSON, Stripped]:
        return strip_response(resp, known)

    def strip_request(self, body: JSON) -> JSON:
        # Assistant message items of ``input`` (content a string or output_text parts).
        return strip_request_transcript(body, *self.transcript)

    def stream_stripper(self) -> ResponsesEventStripper:
        return ResponsesEventStripper()

    def tool_call_chars(self, resp: JSON) -> int:
        return sum(call_chars(item) for item in resp.get("output") or ())

    def mask_observation(self, msg: JSON, min_chars: int, stand_in: Callable[[Any], str]) -> JSON:
        kind = _type(msg)
        output = msg.get("output")
        if kind != "message" and content_chars(output) < min_chars:
            return msg  # a short result ("ok") is kept whole, as a short user message is
        if kind in _TEXT_OUTPUTS and isinstance(output, (str, list)):
            return {**msg, "output": stand_in(output)}
        if kind == "shell_call_output" and isinstance(output, list):
            # Each command's result is an object the API checks: its texts stand in.
            return {**msg, "output": [_masked_streams(o, stand_in) for o in output]}
        if kind == "message" and msg.get("role") == "user":
            content = msg.get("content")
            if content_chars(content) >= min_chars:
                return {**msg, "content": stand_in(content)}
        return msg


# Outputs of client calls whose ``output`` the API takes as a string (a placeholder fits);
# a computer call's screenshot and an approval have no text to mask.
_TEXT_OUTPUTS = frozenset(
    {
        "function_call_output",
        "custom_tool_call_output",
        "local_shell_call_output",
        "apply_patch_call_output",
    }
)


def _masked_streams(result: Any, stand_in: Callable[[Any], str]) -> Any:
    """A shell command's result with its stdout and stderr (when not empty) stood in for."""
    if not isinstance(result, dict):
        return result
    masked = {k: stand_in(result[k]) for k in ("stdout", "stderr") if result.get(k)}
    return {**result, **masked}


RESPONSES = ResponsesDialect()
