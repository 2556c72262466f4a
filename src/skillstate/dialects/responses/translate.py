"""Responses API <-> chat completions, both ways (requests and non-streamed replies).

An Anthropic upstream is reached through chat completions (see ``registry``): the Responses
request becomes a chat request, which the existing chat -> Anthropic bridge translates."""

from __future__ import annotations

import secrets
import string
import time
from typing import Any

from ...cost.usage import token_count
from ...errors import ProxyError
from ..base import JSON
from ..checks import bad_request as _bad
from ..translate.common import (
    ASSISTANT_TEXT_JOIN,
    SYSTEM_JOIN,
    TOOL_RESULT_TEXT_JOIN,
    refuse_moderation,
    tool_media_label,
)
from .items import CLIENT_CALLS

_ALNUM = string.ascii_letters + string.digits
# The input items a chat-completions (or, through it, Anthropic) upstream is sent. The other
# types the API takes (validate.INPUT_ITEM_TYPES) have no chat form: reasoning (its
# encrypted_content is only readable by the Responses API that made it), compaction (opaque),
# hosted tools' calls, and calls of tools that are neither function nor custom tools (whose
# tools are not sent either: split_tools). They are left out, and named (untranslated_items).
TRANSLATED_ITEMS = frozenset({"message", "function_call", "function_call_output"})
# Custom tools (free-text input, optionally under a grammar: Codex's apply_patch) and their
# calls and outputs: chat completions has them (tools ``{"type": "custom", "custom": ...}``,
# ``tool_calls`` entries ``{"type": "custom", "custom": {"name", "input"}}``), Anthropic's
# Messages has no tool whose input is free text, so an Anthropic upstream is sent neither.
CUSTOM_ITEMS = frozenset({"custom_tool_call", "custom_tool_call_output"})
# The ``include`` value that asks for the output text's log probabilities (chat's
# ``logprobs: true``; its ``top_logprobs`` is the request's, in both APIs).
OUTPUT_LOGPROBS = "message.output_text.logprobs"


def keeps_custom(kind: str) -> bool:
    """Whether an upstream of ``kind`` reached in chat-completions form takes custom tools:
    chat completions (``openai``) does; Anthropic, behind the chat bridge, does not."""
    return kind == "openai"


def new_id(prefix: str) -> str:
    """An id in OpenAI's style (``resp_``, ``msg_``, ``fc_`` + 32 characters)."""
    return prefix + "".join(secrets.choice(_ALNUM) for _ in range(32))


# -- requests ---------------------------------------------------------------------------------


def split_tools(tools: Any, *, custom: bool = True) -> tuple[list[JSON], list[str]]:
    """(function tools, and custom tools when ``custom``, in chat-completions form; the
    names/types of the tools without one). Chat's tools have no ``defer_loading`` (a
    deferred tool is sent as any other: the tool search that would load it is not) nor
    ``allowed_callers``: a tool the model may not call itself (``allowed_callers`` without
    ``"direct"``: only a program the Responses API runs may) has no chat form either."""
    kept: list[JSON] = []
    dropped: list[str] = []
    for tool in tools if isinstance(tools, list) else ():
        ttype = tool.get("type")
        if ttype in ("function", "custom") and not _called_directly(tool):
            dropped.append(str(tool.get("name") or ttype))
        elif ttype == "function":
            kept.append({"type": "function", "function": _spec(tool, "parameters", "strict")})
        elif ttype == "custom" and custom:
            spec = _spec(tool)
            fmt = tool.get("format")
            if isinstance(fmt, dict) and fmt.get("type") == "grammar":
                # Responses puts the grammar's members in ``format``; chat nests them.
                grammar = {k: fmt[k] for k in ("definition", "syntax") if k in fmt}
                spec["format"] = {"type": "grammar", "grammar": grammar}
            elif fmt is not None:
                spec["format"] = fmt
            kept.append({"type": "custom", "custom": spec})
        else:
            dropped.append(str(tool.get("name") or ttype))
    return kept, dropped


def _called_directly(tool: JSON) -> bool:
    """Whether the model may call ``tool`` itself: ``allowed_callers`` (the SDK's
    ``Optional[List[Literal["direct", "programmatic"]]]``) absent, null or naming
    ``"direct"``."""
    callers = tool.get("allowed_callers")
    return not isinstance(callers, list) or "direct" in callers


def _spec(tool: JSON, *keys: str) -> JSON:
    """A tool's name, description and ``keys``, as chat's ``function`` / ``custom`` hold them."""
    spec: JSON = {"name": tool["name"]}
    for key in ("description", *keys):
        if tool.get(key) is not None:
            spec[key] = tool[key]
    return spec


def _part_to_chat(part: JSON, path: str) -> JSON:
    """A content part as chat completions has it, its ``prompt_cache_breakpoint`` kept (the
    same object in both APIs); a 400 naming the part where chat has no form for it (an
    image by ``file_id`` only, a file by ``file_url``), never a part dropped."""
    return with_cache_breakpoint(part, _part_body_to_chat(part, path))


def with_cache_breakpoint(part: JSON, out: JSON) -> JSON:
    """``out``, ``part`` in the other API, with ``part``'s ``prompt_cache_breakpoint`` (the
    same object in chat completions and Responses), when it has one."""
    if isinstance(part.get("prompt_cache_breakpoint"), dict):
        out["prompt_cache_breakpoint"] = part["prompt_cache_breakpoint"]
    return out


def _part_body_to_chat(part: JSON, path: str) -> JSON:
    ptype = part.get("type")
    if ptype in ("input_text", "output_text", "text"):
        return {"type": "text", "text": part.get("text") or ""}
    if ptype == "refusal":
        return {"type": "text", "text": part.get("refusal") or ""}
    if ptype == "input_image" and isinstance(part.get("image_url"), str) and part["image_url"]:
        image: JSON = {"url": part["image_url"]}
        if part.get("detail"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if ptype == "input_file" and (part.get("file_data") or part.get("file_id")):
        keys = ("file_data", "file_id", "filename")
        return {"type": "file", "file": {k: part[k] for k in keys if part.get(k)}}
    raise _bad(
        f"{path}: a {str(ptype)[:64]!r} part without image_url (or, for a file, file_data or "
        "file_id) cannot be sent to a chat-completions or Anthropic upstream",
        path,
    )


def _message_to_chat(item: JSON, path: str) -> JSON:
    """A message item as a chat message: a user message's parts as chat's parts (one text
    part as a string); a system, developer or assistant message's text parts as one string,
    joined as ``translate.common`` joins such texts (a blank line between system texts, an
    assistant's run together), unless a part carries a cache breakpoint."""
    role = item.get("role", "user")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    parts = [_part_to_chat(x, f"{path}.content[{k}]") for k, x in enumerate(content or ())]
    if role != "user" and any(p["type"] != "text" for p in parts):
        k = next(k for k, p in enumerate(parts) if p["type"] != "text")
        raise _bad(
            f"{path}.content[{k}]: a {role} message takes text only in chat completions;"
            " send images and files in a user message",
            f"{path}.content[{k}]",
        )
    plain = all(p["type"] == "text" and "prompt_cache_breakpoint" not in p for p in parts)
    if plain and (role != "user" or len(parts) <= 1):  # a breakpoint marks a part's end
        join = SYSTEM_JOIN if role in ("system", "developer") else ASSISTANT_TEXT_JOIN
        return {"role": role, "content": join.join(p["text"] for p in parts)}
    return {"role": role, "content": parts}


def _tool_message(item: JSON, path: str) -> tuple[JSON, list[JSON]]:
    """A call output as (the chat ``tool`` message answering its call, the image and file
    parts a tool message cannot carry: they go in a user message after the round's tool
    messages). A function call output may come without ``call_id`` (the API's is optional);
    a tool message must name its call: a 400 in the API's words for a missing member."""
    call_id = item.get("call_id")
    if not call_id:
        raise _no_call_id(item, path)
    output = item.get("output")
    if not isinstance(output, list):
        text = "" if output is None else str(output)
        return {"role": "tool", "tool_call_id": call_id, "content": text}, []
    parts = [_part_to_chat(x, f"{path}.output[{k}]") for k, x in enumerate(output)]
    text = TOOL_RESULT_TEXT_JOIN.join(p["text"] for p in parts if p["type"] == "text")
    tool = {"role": "tool", "tool_call_id": call_id, "content": text}
    return tool, [p for p in parts if p["type"] != "text"]


def _call_to_chat(item: JSON) -> JSON:
    """A function_call or custom_tool_call item as a chat ``tool_calls`` entry."""
    if item["type"] == "custom_tool_call":
        custom = {"name": item["name"], "input": item.get("input") or ""}
        return {"id": item["call_id"], "type": "custom", "custom": custom}
    function = {"name": item["name"], "arguments": item.get("arguments") or ""}
    return {"id": item["call_id"], "type": "function", "function": function}


def _append_call(messages: list[JSON], call: JSON) -> None:
    """Consecutive calls are one assistant message's tool_calls (after its text, if any)."""
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and "tool_calls" in last:
        last["tool_calls"].append(call)
    elif last is not None and last["role"] == "assistant" and not last.get("content"):
        last["tool_calls"] = [call]
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


# A call's name in the API's words for a call without its output ("No tool output found for
# function call call_1."), by the call item's type.
_CALL_WORDS = {"function_call": "function call", "custom_tool_call": "custom tool call"}


def _refuse_unanswered(raw: list[Any], calls: set[str], outputs: set[str]) -> None:
    """A 400 in the API's words for the first call (of the types in ``calls``) that no
    output (of the types in ``outputs``) answers by its call_id: the Responses API refuses
    such an input ("No tool output found for function call call_1.", ``param: input``), and
    translated it would be an assistant's tool call left unanswered, which chat completions
    and Messages refuse in their own words (Messages: "tool_use ids were found without
    tool_result blocks")."""
    answered = {
        item.get("call_id")
        for item in raw
        if item.get("type") in outputs and isinstance(item.get("call_id"), str)
    }
    for item in raw:
        if item.get("type") in calls and item["call_id"] not in answered:
            raise _bad(
                f"No tool output found for {_CALL_WORDS[item['type']]} {item['call_id']}.",
                "input",
            )


def input_to_messages(body: JSON, *, custom: bool = True) -> list[JSON]:
    """``instructions`` and ``input`` as chat messages; consecutive function_call items (and
    custom_tool_call items, when ``custom``) are one assistant message's tool_calls, each of
    their outputs a tool message. The images and files an output returns follow the round's
    tool messages in one user message, each output's labelled with its call (chat's tool
    messages take text only; ``common.tool_media_label``). A message between calls and
    their outputs (the API takes one: a user typing while a tool runs) follows the round's
    outputs: chat completions and Messages take an answer only right after its call. A call
    no output answers is a 400, as the API has it (``_refuse_unanswered``)."""
    messages: list[JSON] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    raw = body.get("input")
    if isinstance(raw, str):
        return [*messages, {"role": "user", "content": raw}]
    calls = {"function_call", "custom_tool_call"} if custom else {"function_call"}
    outputs = {CLIENT_CALLS[c] for c in calls}
    media: list[JSON] = []  # what this round's outputs returned that a tool message cannot hold
    waiting: set[str] = set()  # the call_ids of the calls sent that no output answered yet
    held: list[JSON] = []  # messages that came while they waited: after the round's outputs
    for i, item in enumerate(raw or ()):
        itype = item.get("type", "message")
        if itype in outputs:
            tool, parts = _tool_message(item, f"input[{i}]")
            messages.append(tool)
            waiting.discard(tool["tool_call_id"])
            if parts:
                media += [{"type": "text", "text": tool_media_label(tool["tool_call_id"])}, *parts]
            if held and not waiting:
                messages += _round_media(media) + held
                media, held = [], []
            continue
        if itype == "message" and waiting:
            held.append(_message_to_chat(item, f"input[{i}]"))
            continue
        if itype == "message" or itype in calls:
            messages += _round_media(media)
            media = []
        if itype == "message":
            messages.append(_message_to_chat(item, f"input[{i}]"))
        elif itype in calls:
            _append_call(messages, _call_to_chat(item))
            waiting.add(item["call_id"])
    messages += _round_media(media) + held
    _refuse_unanswered(raw or [], calls, outputs)
    return messages


def _round_media(media: list[JSON]) -> list[JSON]:
    """The user message of a round's returned images and files, when it returned any."""
    return [{"role": "user", "content": media}] if media else []


def untranslated_items(items: list[Any], *, custom: bool = True) -> list[str]:
    """The types of the (validated) input items a translation to chat leaves out, sorted
    (custom tool calls and outputs among them unless ``custom``)."""
    sent = TRANSLATED_ITEMS | CUSTOM_ITEMS if custom else TRANSLATED_ITEMS
    types = {item.get("type", "message") for item in items if isinstance(item, dict)}
    return sorted(t for t in types if isinstance(t, str) and t not in sent)


def _tool_choice_to_chat(choice: Any, custom: bool, sent: list[JSON]) -> Any:
    """``sent``: the tools the chat request carries (``split_tools``)."""
    if isinstance(choice, str):
        return choice
    kinds = ("function", "custom") if custom else ("function",)
    if isinstance(choice, dict) and choice.get("type") in kinds and choice.get("name"):
        kind = choice["type"]  # chat nests the name: {"type": "custom", "custom": {"name"}}
        return {"type": kind, kind: {"name": choice["name"]}}
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        return _allowed_tools_to_chat(choice, {(t["type"], t[t["type"]]["name"]) for t in sent})
    return "auto"  # a hosted tool's choice: that tool is not sent (split_tools)


def _allowed_tools_to_chat(choice: JSON, sent: set[tuple[str, str]]) -> Any:
    """Responses' ``{"type": "allowed_tools", "mode", "tools": [{"type", "name"}]}`` as chat's
    ``{"type": "allowed_tools", "allowed_tools": {"mode", "tools": [{"type": "function",
    "function": {"name"}}]}}`` (a custom tool's entry ``{"type": "custom", "custom":
    {"name"}}``). Entries for tools the upstream is not sent (``sent``: (type, name) of those
    it is; not hosted tools, custom ones on Anthropic, nor tools only a program may call) go
    with them: none left is ``"none"`` under ``auto`` and a 400 under ``required`` (the model
    could call none of them)."""
    entries = [
        {"type": e["type"], e["type"]: {"name": e["name"]}}
        for e in choice["tools"]
        if (e["type"], e.get("name")) in sent
    ]
    if entries:
        return {
            "type": "allowed_tools",
            "allowed_tools": {"mode": choice["mode"], "tools": entries},
        }
    if choice["mode"] == "auto":
        return "none"
    raise _bad(
        "tool_choice.tools: none of the allowed tools can be sent to this upstream (it is not"
        " of kind openai-responses); the model could call none of them",
        "tool_choice.tools",
    )


def _format_to_chat(fmt: JSON) -> JSON | None:
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    return None


# What a request names that only the Responses API holds: the model would answer without
# the conversation's items, or the stored prompt's instructions (previous_response_id
# crosses: the proxy keeps stored responses itself).
_KEPT_UPSTREAM = {"conversation": "a conversation", "prompt": "a stored prompt"}
# The members chat completions has under the same name and meaning.
_SAME_IN_CHAT = (
    "temperature", "top_p", "prompt_cache_key", "prompt_cache_retention", "safety_identifier",
    "service_tier", "user", "stream",
)  # fmt: skip


def responses_request_to_chat(
    body: JSON, *, max_tokens_field: str = "max_tokens", custom: bool = True, logprobs: bool = True
) -> JSON:
    """A validated Responses request as a chat-completions request. Tools without a chat
    form are dropped (``unsupported_tools: drop``; see ``split_tools``), custom tools and
    their items too unless ``custom`` (``keeps_custom``). The output text's log
    probabilities (``include``, ``top_logprobs``) are chat's ``logprobs`` and
    ``top_logprobs``; without ``logprobs`` (an Anthropic upstream's models give none) asking
    for them is a 400, not a reply whose ``logprobs`` are silently empty."""
    for key in _KEPT_UPSTREAM:
        if body.get(key) is not None:
            raise _bad(
                f"{key}: {_KEPT_UPSTREAM[key]} is kept by the Responses API, so it cannot be"
                " sent to an upstream of another kind than openai-responses",
                key,
            )
    refuse_moderation(body, "a chat-completions or Anthropic upstream")
    messages = input_to_messages(body, custom=custom)
    out: JSON = {"model": body["model"], "messages": messages}
    tools, _ = split_tools(body.get("tools"), custom=custom)
    if tools:
        out["tools"] = tools
        if body.get("tool_choice") is not None:
            out["tool_choice"] = _tool_choice_to_chat(body["tool_choice"], custom, tools)
        if body.get("parallel_tool_calls") is not None:
            out["parallel_tool_calls"] = body["parallel_tool_calls"]
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and (rf := _format_to_chat(fmt)) is not None:
        out["response_format"] = rf
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort"):
        out["reasoning_effort"] = reasoning["effort"]
    if body.get("max_output_tokens") is not None:
        out[max_tokens_field] = body["max_output_tokens"]
    if isinstance(text, dict) and text.get("verbosity") is not None:
        out["verbosity"] = text["verbosity"]
    out.update(_logprobs_to_chat(body, logprobs))
    cache_options = _cache_options_to_chat(body.get("prompt_cache_options"))
    if cache_options:
        out["prompt_cache_options"] = cache_options
    for key in _SAME_IN_CHAT:
        if body.get(key) is not None:
            out[key] = body[key]
    return out


def _cache_options_to_chat(options: Any) -> JSON:
    """``prompt_cache_options`` as chat completions takes them: ``mode`` as it is, ``ttl``
    when chat has it (``30m``; a ``12h`` minimum lifetime is the cache's, not the answer's:
    chat's 30 minutes apply), ``comparison_response_id`` (diagnostics of a response chat
    does not know) left out. ``prewarm`` would answer with no output: a 400."""
    if not isinstance(options, dict):
        return {}
    if options.get("prewarm") is True:
        raise _bad(
            "prompt_cache_options.prewarm cannot be sent to a chat-completions or Anthropic"
            " upstream: it has no request that prepares the cache without answering",
            "prompt_cache_options.prewarm",
        )
    out: JSON = {}
    if options.get("mode") is not None:
        out["mode"] = options["mode"]
    if options.get("ttl") == "30m":
        out["ttl"] = "30m"
    return out


def _logprobs_to_chat(body: JSON, kept: bool) -> JSON:
    """Chat's ``logprobs`` and ``top_logprobs`` for a request whose ``include`` asks for the
    output text's (``top_logprobs`` alone asks for none, as in the Responses API: chat would
    refuse it without ``logprobs``); a 400 where the upstream has none (``kept`` False)."""
    include = body.get("include")
    if not isinstance(include, list) or OUTPUT_LOGPROBS not in include:
        return {}
    if not kept:
        raise _bad(
            f"include: {OUTPUT_LOGPROBS} cannot be sent to an Anthropic upstream: its models"
            " give no log probabilities",
            "include",
        )
    out: JSON = {"logprobs": True}
    if body.get("top_logprobs") is not None:
        out["top_logprobs"] = body["top_logprobs"]
    return out


def _no_call_id(item: JSON, path: str) -> ProxyError:
    return _bad(
        f"Missing required parameter: '{path}.call_id'. A {item['type']} item is sent to a"
        " chat-completions or Anthropic upstream as the answer to its call, by call_id.",
        f"{path}.call_id",
        "missing_required_parameter",
    )


def require_call_ids(body: JSON) -> None:
    """A 400 naming the first function call output without ``call_id`` in the client's
    ``input`` (the API's is optional, but a translation pairs each output with its call by
    it), before the turn is planned: the path is the client's own."""
    raw = body.get("input")
    for i, item in enumerate(raw if isinstance(raw, list) else ()):
        if item.get("type") == "function_call_output" and not item.get("call_id"):
            raise _no_call_id(item, f"input[{i}]")


def reject_unsupported_tools(body: JSON, *, custom: bool = True) -> None:
    """``unsupported_tools: reject``: a 400 naming the tools a non-Responses upstream lacks
    (custom tools among them unless ``custom``)."""
    _, dropped = split_tools(body.get("tools"), custom=custom)
    if dropped:
        raise ProxyError(
            "invalid_request",
            f"tools {', '.join(dropped)} need an upstream of kind openai-responses",
            param="tools",
            code="unsupported_tools",
        )


# -- replies ----------------------------------------------------------------------------------


def object_or_empty(value: Any) -> JSON:
    """``value`` when it is an object, else an empty one (upstream replies are hostile)."""
    return value if isinstance(value, dict) else {}


def usage_to_responses(u: Any) -> JSON | None:
    """A chat-completions usage object in the Responses API's shape; a count that is not a
    sane one (a string, a negative, past 2**53: upstream replies are hostile) is 0."""
    if not isinstance(u, dict):
        return None
    inp = token_count(u.get("prompt_tokens")) or 0
    out = token_count(u.get("completion_tokens")) or 0
    pdet = object_or_empty(u.get("prompt_tokens_details"))
    cdet = object_or_empty(u.get("completion_tokens_details"))
    return {
        "input_tokens": inp,
        "input_tokens_details": {
            "cached_tokens": token_count(pdet.get("cached_tokens")) or 0,
            "cache_write_tokens": 0,
        },
        "output_tokens": out,
        "output_tokens_details": {
            "reasoning_tokens": token_count(cdet.get("reasoning_tokens")) or 0
        },
        "total_tokens": inp + out,
    }


def message_item(
    text: str,
    *,
    item_id: str | None = None,
    status: str = "completed",
    logprobs: list[JSON] | None = None,
) -> JSON:
    """An assistant message output item with one output_text part (and its tokens'
    ``logprobs``, when asked for)."""
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}
    return {
        "id": item_id or new_id("msg_"),
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [part],
    }


def token_logprobs(raw: Any) -> list[JSON]:
    """An output_text part's (or text delta's) ``logprobs`` entries: the token's
    ``token``, ``logprob``, ``bytes`` and ``top_logprobs``, as chat's entries have them."""
    return [e for e in raw if isinstance(e, dict)] if isinstance(raw, list) else []


def choice_logprobs(choice: Any) -> list[JSON]:
    """A chat choice's (or chunk choice's) content tokens' ``logprobs`` entries, which an
    output_text part takes as they are."""
    return token_logprobs(object_or_empty(object_or_empty(choice).get("logprobs")).get("content"))


def function_call_item(
    call_id: str,
    name: str,
    arguments: str,
    *,
    item_id: str | None = None,
    status: str = "completed",
) -> JSON:
    """A function_call output item."""
    return {
        "id": item_id or new_id("fc_"),
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def custom_tool_call_item(
    call_id: str,
    name: str,
    input_text: str,
    *,
    item_id: str | None = None,
    status: str = "completed",
) -> JSON:
    """A custom_tool_call output item (``status`` as the API sends it, though the openai
    SDK's ResponseCustomToolCall does not name it)."""
    return {
        "id": item_id or new_id("ctc_"),
        "type": "custom_tool_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "input": input_text,
    }


def is_custom_call(call: JSON) -> bool:
    """A chat ``tool_calls`` entry (or a streamed piece of one) that calls a custom tool:
    ``type: "custom"``, or, on a piece without a type, a ``custom`` object that says
    something (some gateways echo an empty ``custom: {}`` on function calls' pieces)."""
    if call.get("type") is not None:
        return call["type"] == "custom"
    custom = call.get("custom")
    return (
        isinstance(custom, dict)
        and any(isinstance(custom.get(k), str) for k in ("name", "input"))
        and not isinstance(call.get("function"), dict)
    )


def _call_item(call: JSON) -> JSON:
    """A chat reply's ``tool_calls`` entry as a Responses output item."""
    call_id = call.get("id") or new_id("call_")
    if is_custom_call(call):
        custom = object_or_empty(call.get("custom"))
        return custom_tool_call_item(call_id, custom.get("name") or "", custom.get("input") or "")
    fn = object_or_empty(call.get("function"))
    return function_call_item(call_id, fn.get("name") or "", fn.get("arguments") or "")


_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def incomplete_reason(finish_reason: Any) -> str | None:
    """Why a response whose chat reply ended with ``finish_reason`` is ``incomplete``
    (``incomplete_details.reason``): ``max_output_tokens`` for ``length``, ``content_filter``
    for ``content_filter``; None for a reply that ended by itself."""
    return _INCOMPLETE.get(finish_reason) if isinstance(finish_reason, str) else None


def refusal_part(text: str) -> JSON:
    """A message output item's ``refusal`` content part (the SDK's ResponseOutputRefusal)."""
    return {"type": "refusal", "refusal": text}


def response_object(
    *,
    model: str,
    output: list[JSON],
    usage: JSON | None,
    finish_reason: str | None,
    response_id: str | None = None,
    status: str | None = None,
) -> JSON:
    """A Responses API ``response`` object (the fields the SDK's ``Response`` type reads)."""
    reason = incomplete_reason(finish_reason)
    if status is None:
        status = "incomplete" if reason else "completed"
    return {
        "id": response_id or new_id("resp_"),
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": {"reason": reason} if reason and status == "incomplete" else None,
        "instructions": None,
        "max_output_tokens": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": True,
        "temperature": None,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": None,
        "truncation": "disabled",
        "usage": usage,
        "metadata": {},
    }


def _chat_message_parts(msg: JSON) -> tuple[str, str]:
    """(the text, the refusal) of a chat reply's message: ``content`` (a string, or its
    ``text`` parts joined, as an assistant's output is one text) and ``refusal`` (the
    member, or ``refusal`` parts)."""
    content = msg.get("content")
    refusals: list[str] = []
    if isinstance(content, list):
        parts = [p for p in content if isinstance(p, dict)]
        refusals = [p["refusal"] for p in parts if isinstance(p.get("refusal"), str)]
        content = "".join(p.get("text") or "" for p in parts if p.get("type") != "refusal")
    if isinstance(msg.get("refusal"), str):
        refusals.append(msg["refusal"])
    return (content if isinstance(content, str) else ""), "".join(refusals)


def chat_response_to_responses(resp: JSON, request_model: str) -> JSON:
    """A chat-completions reply as a Responses ``response`` object (choice 0): its text an
    ``output_text`` part and its ``refusal`` a ``refusal`` part of one message item, its
    tool calls call items. A reply cut off (``finish_reason`` ``length``, or
    ``content_filter``) is a response ``incomplete`` for ``max_output_tokens`` (or
    ``content_filter``), and the item it was writing, the last, is ``incomplete`` too, as
    the API marks them."""
    choices = resp.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    choice = choice if isinstance(choice, dict) else {}
    msg = choice.get("message")
    msg = msg if isinstance(msg, dict) else {}
    output: list[JSON] = []
    text, refusal = _chat_message_parts(msg)
    if text or refusal:
        item = message_item(text, logprobs=choice_logprobs(choice))
        if refusal:
            item["content"] = [*(item["content"] if text else ()), refusal_part(refusal)]
        output.append(item)
    for call in msg.get("tool_calls") or ():
        if isinstance(call, dict):
            output.append(_call_item(call))
    finish_reason = choice.get("finish_reason")
    if output and incomplete_reason(finish_reason) is not None:
        output[-1]["status"] = "incomplete"
    model = resp["model"] if isinstance(resp.get("model"), str) else request_model
    return response_object(
        model=model,
        output=output,
        usage=usage_to_responses(resp.get("usage")),
        finish_reason=finish_reason,
    )
