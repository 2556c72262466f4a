"""Chat completions -> the Responses API (a chat client in front of an upstream of kind
``openai-responses``: a Responses-only model such as gpt-5-codex or o3-pro), requests and
non-streamed replies; the stream relay is ``to_chat.ResponsesToChatRelay``. A Messages
client reaches such an upstream through chat completions (see ``registry``).

What has no Responses form (the openai SDK's ResponseCreateParams has no member for it):

* refused (a 400 in the client's dialect, naming the member): ``n`` > 1 (one output per
  response), a non-empty ``stop`` (no stop sequences: the reply would run past them; the
  reasoning models behind /v1/responses refuse ``stop`` on chat completions too), audio
  (``modalities`` with ``audio``, ``audio``, ``input_audio`` parts: no audio input or
  output parts), ``web_search_options`` (a hosted tool there, with output items chat has
  no form for), ``moderation`` (the reply's results would not come back) and the legacy
  ``functions`` / ``function_call`` and ``function`` role;
* dropped (sampling hints that change no contract): ``seed``, ``frequency_penalty``,
  ``presence_penalty``, ``logit_bias``, ``prediction``, a message's ``name``, a system or
  developer message's ``prompt_cache_breakpoint`` (their text is ``instructions``; a user
  part's breakpoint and ``prompt_cache_options`` cross as they are).

``logprobs`` / ``top_logprobs`` ask for the output text's log probabilities
(``include: ["message.output_text.logprobs"]`` and ``top_logprobs``); each token's entry has
the same members in both APIs, so the reply's (and each text delta's) come back as chat's
``logprobs.content`` (a reasoning model refuses them, as on chat completions).

``store`` is false unless the client asks for it (chat's own ``store: true``), so the
upstream keeps nothing; the transcript travels whole on every request, as chat sends it.
With nothing kept, a reasoning model's reasoning items do not reach the next turn: a chat
transcript has no place for them (as on chat completions itself)."""

from __future__ import annotations

import time
from typing import Any

from ..base import JSON
from ..checks import bad_request as _bad
from ..translate import anthropic_request_to_openai
from ..translate.common import SYSTEM_JOIN, TOOL_RESULT_TEXT_JOIN, _clean, refuse_moderation
from .translate import (
    OUTPUT_LOGPROBS,
    new_id,
    object_or_empty,
    token_logprobs,
    with_cache_breakpoint,
)

_KIND = "openai-responses"
# Chat request members copied to the Responses request as they are (same name, same values).
_SAME_MEMBERS = (
    "temperature", "top_p", "stream", "user", "metadata", "prompt_cache_key",
    "prompt_cache_retention", "prompt_cache_options", "safety_identifier", "service_tier",
    "parallel_tool_calls",
)  # fmt: skip


def chat_request_to_responses(body: JSON) -> JSON:
    """A validated chat-completions request as a Responses request: leading system and
    developer messages are ``instructions`` (joined by a blank line), the rest ``input``
    items; see the module docstring for what is refused or dropped."""
    _refuse_what_has_no_form(body)
    messages = body["messages"]
    lead = 0
    while lead < len(messages) and messages[lead].get("role") in ("system", "developer"):
        lead += 1
    out: JSON = {"model": body["model"]}
    instructions = SYSTEM_JOIN.join(_text_of(m.get("content")) for m in messages[:lead])
    if instructions:
        out["instructions"] = instructions
    out["input"] = messages_to_items(messages[lead:])
    for key in _SAME_MEMBERS:
        if body.get(key) is not None:
            out[key] = body[key]
    out["store"] = body.get("store") is True
    limit = body.get("max_completion_tokens")
    limit = body.get("max_tokens") if limit is None else limit
    if limit is not None:
        out["max_output_tokens"] = at_least_the_apis_minimum(limit)
    if body.get("logprobs") is True:
        out["include"] = [OUTPUT_LOGPROBS]
        if body.get("top_logprobs") is not None:
            out["top_logprobs"] = body["top_logprobs"]
    if body.get("reasoning_effort") is not None:
        out["reasoning"] = {"effort": body["reasoning_effort"]}
    text = _text_config(body)
    if text:
        out["text"] = text
    options = object_or_empty(body.get("stream_options"))
    if body.get("stream") and options.get("include_obfuscation") is not None:
        out["stream_options"] = {"include_obfuscation": options["include_obfuscation"]}
    if body.get("tools"):
        out["tools"] = [_tool(t) for t in body["tools"]]
    if body.get("tool_choice") is not None:
        out["tool_choice"] = _tool_choice(body["tool_choice"])
    return out


# The least ``max_output_tokens`` the Responses API takes: below it, a 400 ("Invalid
# 'max_output_tokens': integer below minimum value. Expected a value >= 16, but got 1
# instead."). Chat completions and Messages take any positive limit.
MIN_OUTPUT_TOKENS = 16


def at_least_the_apis_minimum(limit: Any) -> Any:
    """A client's positive output limit under the Responses API's minimum is sent as that
    minimum: the call is served (a ``max_tokens: 1`` probe of the model is answered) and
    its answer may run to 16 tokens, which the usage reports and the ledger prices, and
    which a budget holds (``cost.worstcase``). 0 (a request for no output, which the API
    has no form for) goes as it came, to the API's own 400."""
    if isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < MIN_OUTPUT_TOKENS:
        return MIN_OUTPUT_TOKENS
    return limit


def anthropic_request_to_responses(body: JSON) -> JSON:
    """A validated Messages request as a Responses request, through chat completions
    (``anthropic_request_to_openai``, then :func:`chat_request_to_responses`). Thinking does
    not cross: ``thinking`` blocks carry a signature only Anthropic can check (and reasoning
    items an encrypted_content only OpenAI can read), so earlier turns' blocks are dropped,
    and the ``thinking`` option has no faithful ``reasoning.effort`` (a token budget is not
    an effort level). ``output_config.effort`` is one: chat's ``reasoning_effort``, so
    ``reasoning.effort`` (``translate.effort``)."""
    if body.get("stop_sequences"):
        raise _bad(
            "stop_sequences: the Responses API has no stop sequences (an upstream of kind "
            "openai-responses cannot end the reply at one)",
            "stop_sequences",
        )
    if "max_tokens" not in body:  # a count_tokens request: no limit to translate
        body = {**body, "max_tokens": None}
    return chat_request_to_responses(anthropic_request_to_openai(body))


def _refuse_what_has_no_form(body: JSON) -> None:
    if body.get("functions") or body.get("function_call"):
        raise _bad("functions/function_call are deprecated and not supported; use tools")
    n = body.get("n")
    if n is not None and n != 1:
        raise _bad("n: only 1 choice is supported with an upstream of kind openai-responses", "n")
    if body.get("stop"):
        raise _bad(
            "stop: the Responses API has no stop sequences (an upstream of kind "
            "openai-responses cannot end the reply at one)",
            "stop",
        )
    if "audio" in (body.get("modalities") or ()) or body.get("audio") is not None:
        raise _bad("audio output cannot be asked of an upstream of kind openai-responses", "audio")
    refuse_moderation(body, f"an upstream of kind {_KIND}")
    if body.get("web_search_options") is not None:
        raise _bad(
            "web_search_options cannot be sent to an upstream of kind openai-responses",
            "web_search_options",
        )


def _text_of(content: Any, join: str = SYSTEM_JOIN) -> str:
    """A system or developer message's text (its text parts apart by a blank line), or with
    ``TOOL_RESULT_TEXT_JOIN`` a tool message's (as ``translate.common`` joins them)."""
    if isinstance(content, str):
        return content
    return join.join(p.get("text") or "" for p in content or () if isinstance(p, dict))


def messages_to_items(messages: list[JSON]) -> list[JSON]:
    """Chat messages (system ones after the leading run included) as Responses input items:
    an assistant message is a message item (its text and refusal) and a function_call or
    custom_tool_call item per tool call; a tool message the output item of its call."""
    items: list[JSON] = []
    custom_ids: set[str] = set()
    for i, msg in enumerate(messages):
        role = msg["role"]
        if role == "assistant":
            items.extend(_assistant_items(msg))
            calls = msg.get("tool_calls") or ()
            custom_ids |= {c["id"] for c in calls if c.get("type") == "custom"}
        elif role == "tool":
            call_id = msg["tool_call_id"]
            kind = "custom_tool_call_output" if call_id in custom_ids else "function_call_output"
            output = _text_of(msg.get("content"), TOOL_RESULT_TEXT_JOIN)
            items.append({"type": kind, "call_id": call_id, "output": output})
        elif role == "user":
            items.append(_user_item(msg.get("content"), f"messages[{i}]"))
        elif role in ("system", "developer"):
            items.append({"type": "message", "role": role, "content": _text_of(msg.get("content"))})
        else:  # "function", the one role left after validation
            raise _bad(f"messages[{i}]: legacy function messages are not supported; use tools")
    return items


def _user_item(content: Any, path: str) -> JSON:
    if isinstance(content, str):
        return {"type": "message", "role": "user", "content": content}
    parts = [_user_part(p, f"{path}.content[{k}]") for k, p in enumerate(content or ())]
    return {"type": "message", "role": "user", "content": parts}


def _user_part(part: JSON, path: str) -> JSON:
    """A user message's part as a Responses input part, its ``prompt_cache_breakpoint``
    kept (the same object in both APIs)."""
    return with_cache_breakpoint(part, _user_part_body(part, path))


def _user_part_body(part: JSON, path: str) -> JSON:
    ptype = part["type"]
    if ptype == "text":
        return {"type": "input_text", "text": part["text"]}
    if ptype == "image_url":
        image = part["image_url"]
        detail = image.get("detail", "auto")  # required by the API; chat defaults it to auto
        return {"type": "input_image", "image_url": image["url"], "detail": detail}
    if ptype == "file":
        file = part["file"]
        out: JSON = {"type": "input_file"}
        for key in ("file_id", "file_data", "filename"):
            if isinstance(file.get(key), str):
                out[key] = file[key]
        return out
    raise _bad(f"{path}: {ptype} parts cannot be sent to an upstream of kind {_KIND}", path)


def _assistant_items(msg: JSON) -> list[JSON]:
    parts: list[JSON] = []
    content = msg.get("content")
    if isinstance(content, str) and content:
        parts.append({"type": "output_text", "text": content, "annotations": []})
    for part in content if isinstance(content, list) else ():
        if part["type"] == "refusal":
            parts.append({"type": "refusal", "refusal": part["refusal"]})
        elif part.get("text"):
            parts.append({"type": "output_text", "text": part["text"], "annotations": []})
    if isinstance(msg.get("refusal"), str) and msg["refusal"]:
        parts.append({"type": "refusal", "refusal": msg["refusal"]})
    items: list[JSON] = []
    if parts:
        items.append({"type": "message", "role": "assistant", "content": parts})
    for call in msg.get("tool_calls") or ():
        if call.get("type") == "custom":
            spec = call["custom"]
            item = {"type": "custom_tool_call", "call_id": call["id"], "name": spec["name"]}
            items.append({**item, "input": spec.get("input") or ""})
        else:
            fn = call["function"]
            item = {"type": "function_call", "call_id": call["id"], "name": fn["name"]}
            items.append({**item, "arguments": fn.get("arguments") or ""})
    return items


def _tool(tool: JSON) -> JSON:
    """A chat tool in the Responses API's flat shape. A function's ``strict`` is always
    written: the Responses API makes a function tool strict when it is absent (chat does
    not), and a strict schema refuses optional or open members a chat client may have."""
    ttype = tool.get("type", "function")
    if ttype == "function":
        fn = tool["function"]
        out: JSON = {"type": "function", "name": fn["name"]}
        if fn.get("description") is not None:
            out["description"] = fn["description"]
        params = fn.get("parameters")  # absent: no parameters (chat), as an empty schema
        out["parameters"] = {"type": "object", "properties": {}} if params is None else params
        out["strict"] = fn.get("strict") is True
        return out
    if ttype == "custom":
        spec = tool["custom"]
        out = {"type": "custom", "name": spec["name"]}
        if spec.get("description") is not None:
            out["description"] = spec["description"]
        fmt = spec.get("format")
        if isinstance(fmt, dict) and fmt.get("type") == "grammar":
            # Chat nests the grammar's members under ``grammar``; Responses puts them in format.
            out["format"] = {"type": "grammar", **object_or_empty(fmt.get("grammar"))}
        elif fmt is not None:
            out["format"] = fmt
        return out
    return tool  # another type is the upstream's to judge


def _named(ref: JSON) -> JSON:
    """A chat tool reference (``{"type": "function", "function": {"name"}}``) made flat."""
    kind = ref.get("type", "function")
    return {"type": kind, "name": object_or_empty(ref.get(kind)).get("name")}


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str) or not isinstance(choice, dict):
        return choice
    if choice.get("type") == "allowed_tools":
        allowed = object_or_empty(choice.get("allowed_tools"))
        tools = [_named(t) for t in allowed.get("tools") or () if isinstance(t, dict)]
        return {"type": "allowed_tools", "mode": allowed.get("mode", "auto"), "tools": tools}
    return _named(choice)


def _text_config(body: JSON) -> JSON:
    """``response_format`` as ``text.format`` (json_schema's spec made flat), and
    ``verbosity``."""
    text: JSON = {}
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        text["format"] = {"type": "json_schema", **object_or_empty(fmt.get("json_schema"))}
    elif isinstance(fmt, dict) and fmt.get("type") in ("json_object", "text"):
        text["format"] = {"type": fmt["type"]}
    if body.get("verbosity") is not None:
        text["verbosity"] = body["verbosity"]
    return text


# -- replies ----------------------------------------------------------------------------------


def responses_usage_to_chat(usage: Any) -> JSON | None:
    """A Responses usage object in chat's shape (both count cached tokens in the input)."""
    if not isinstance(usage, dict):
        return None
    inp = _count(usage.get("input_tokens"))
    out = _count(usage.get("output_tokens"))
    in_details = object_or_empty(usage.get("input_tokens_details"))
    out_details = object_or_empty(usage.get("output_tokens_details"))
    prompt_details: JSON = {"cached_tokens": _count(in_details.get("cached_tokens"))}
    if _count(in_details.get("cache_write_tokens")):
        prompt_details["cache_write_tokens"] = _count(in_details["cache_write_tokens"])
    return {
        "prompt_tokens": inp,
        "completion_tokens": out,
        "total_tokens": inp + out,
        "prompt_tokens_details": prompt_details,
        "completion_tokens_details": {
            "reasoning_tokens": _count(out_details.get("reasoning_tokens"))
        },
    }


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def chat_logprobs(entries: list[JSON]) -> JSON | None:
    """Chat's ``logprobs`` of a choice (or a chunk's choice): None when there are none."""
    return {"content": entries, "refusal": None} if entries else None


def chat_finish_reason(status: Any, incomplete_details: Any, has_tool_calls: bool) -> str:
    """A response's status (and why it is incomplete) as chat's ``finish_reason``."""
    if status == "incomplete":
        reason = object_or_empty(incomplete_details).get("reason")
        return "content_filter" if reason == "content_filter" else "length"
    return "tool_calls" if has_tool_calls else "stop"


def chat_tool_call(item: JSON) -> JSON | None:
    """A function_call or custom_tool_call output item as a chat ``tool_calls`` entry."""
    call_id = item.get("call_id") or item.get("id") or new_id("call_")
    if item.get("type") == "function_call":
        fn = {"name": item.get("name") or "", "arguments": item.get("arguments") or ""}
        return {"id": call_id, "type": "function", "function": fn}
    if item.get("type") == "custom_tool_call":
        custom = {"name": item.get("name") or "", "input": item.get("input") or ""}
        return {"id": call_id, "type": "custom", "custom": custom}
    return None


def chat_completion_id(response_id: Any) -> str:
    """The chat completion id of a response (its id, as the other bridges name theirs)."""
    return f"chatcmpl-{response_id}" if isinstance(response_id, str) and response_id else (
        new_id("chatcmpl-")
    )  # fmt: skip


def responses_response_to_chat(resp: JSON, request_model: str) -> JSON:
    """A Responses ``response`` object as a chat completion: its message items' output_text
    is ``content``, their refusal parts ``refusal``, its function and custom tool calls
    ``tool_calls``. Reasoning and hosted-tool items have no chat form and are left out
    (their tokens are in the usage: ``completion_tokens_details.reasoning_tokens``)."""
    texts: list[str] = []
    logprobs: list[JSON] = []
    refusals: list[str] = []
    calls: list[JSON] = []
    for item in resp.get("output") or ():
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            for part in item.get("content") or ():
                if not isinstance(part, dict):
                    continue
                if part.get("type") == "output_text" and isinstance(part.get("text"), str):
                    texts.append(part["text"])
                    logprobs += token_logprobs(part.get("logprobs"))
                elif part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
                    refusals.append(part["refusal"])
        elif (call := chat_tool_call(item)) is not None:
            calls.append(call)
    text = _clean("".join(texts))
    message: JSON = {
        "role": "assistant",
        "content": text if text or not (calls or refusals) else None,
        "refusal": "".join(refusals) or None,
        "annotations": [],
    }
    if calls:
        message["tool_calls"] = calls
    reason = chat_finish_reason(resp.get("status"), resp.get("incomplete_details"), bool(calls))
    created = resp.get("created_at")
    return {
        "id": chat_completion_id(resp.get("id")),
        "object": "chat.completion",
        "created": int(created) if isinstance(created, (int, float)) else int(time.time()),
        "model": resp["model"] if isinstance(resp.get("model"), str) else request_model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": chat_logprobs(logprobs),
                "finish_reason": reason,
            }
        ],
        "usage": responses_usage_to_chat(resp.get("usage")),
    }
