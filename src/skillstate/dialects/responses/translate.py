"""Responses API <-> chat completions, both ways (requests and non-streamed replies).

An Anthropic upstream is reached through chat completions (see ``registry``): the Responses
request becomes a chat request, which the existing chat -> Anthropic bridge translates."""

from __future__ import annotations

import secrets
import string
import time
from typing import Any

from ...errors import ProxyError
from ..base import JSON

_ALNUM = string.ascii_letters + string.digits
# The input items a chat-completions (or, through it, Anthropic) upstream is sent. The other
# types the API takes (validate.INPUT_ITEM_TYPES) have no chat form: reasoning (its
# encrypted_content is only readable by the Responses API that made it), compaction (opaque),
# hosted tools' calls, and calls of tools that are not function tools (whose tools are not
# sent either: split_tools). They are left out, and named (untranslated_items).
TRANSLATED_ITEMS = frozenset({"message", "function_call", "function_call_output"})


def new_id(prefix: str) -> str:
    """An id in OpenAI's style (``resp_``, ``msg_``, ``fc_`` + 32 characters)."""
    return prefix + "".join(secrets.choice(_ALNUM) for _ in range(32))


# -- requests ---------------------------------------------------------------------------------


def split_tools(tools: Any) -> tuple[list[JSON], list[str]]:
    """(function tools in chat-completions form, names/types of the tools without one)."""
    kept: list[JSON] = []
    dropped: list[str] = []
    for tool in tools if isinstance(tools, list) else ():
        if tool.get("type") != "function":
            dropped.append(str(tool.get("name") or tool.get("type")))
            continue
        fn: JSON = {"name": tool["name"]}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                fn[key] = tool[key]
        kept.append({"type": "function", "function": fn})
    return kept, dropped


def _part_to_chat(part: JSON) -> JSON | None:
    ptype = part.get("type")
    if ptype in ("input_text", "output_text", "text"):
        return {"type": "text", "text": part.get("text") or ""}
    if ptype == "refusal":
        return {"type": "text", "text": part.get("refusal") or ""}
    if ptype == "input_image" and part.get("image_url"):
        image: JSON = {"url": part["image_url"]}
        if part.get("detail"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    return None  # input_file by file_id and the like: nothing a chat upstream can read


def _message_to_chat(item: JSON) -> JSON:
    role = item.get("role", "user")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    parts = [p for p in (_part_to_chat(x) for x in content or ()) if p is not None]
    if role in ("assistant", "system", "developer") or all(p["type"] == "text" for p in parts):
        return {"role": role, "content": "".join(p.get("text", "") for p in parts)}
    return {"role": role, "content": parts}


def _output_to_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "".join(p.get("text") or "" for p in output if isinstance(p, dict) and "text" in p)
    return "" if output is None else str(output)


def input_to_messages(body: JSON) -> list[JSON]:
    """``instructions`` and ``input`` as chat messages; consecutive function_call items are
    one assistant message's tool_calls, each function_call_output a tool message."""
    messages: list[JSON] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    raw = body.get("input")
    if isinstance(raw, str):
        return [*messages, {"role": "user", "content": raw}]
    for item in raw or ():
        itype = item.get("type", "message")
        if itype == "message":
            messages.append(_message_to_chat(item))
        elif itype == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item.get("arguments") or ""},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            elif last is not None and last["role"] == "assistant" and not last.get("content"):
                last["tool_calls"] = [call]
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif itype == "function_call_output":
            content = _output_to_text(item.get("output"))
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": content})
    return messages


def untranslated_items(items: list[Any]) -> list[str]:
    """The types of the (validated) input items a translation to chat leaves out, sorted."""
    types = {item.get("type", "message") for item in items if isinstance(item, dict)}
    return sorted(t for t in types if isinstance(t, str) and t not in TRANSLATED_ITEMS)


def _tool_choice_to_chat(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    return "auto"  # hosted-tool and allowed_tools choices: no chat equivalent


def _format_to_chat(fmt: JSON) -> JSON | None:
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    return None


def responses_request_to_chat(body: JSON, *, max_tokens_field: str = "max_tokens") -> JSON:
    """A validated Responses request as a chat-completions request. Tools without a chat
    form are dropped (``unsupported_tools: drop``); see ``dropped_tools``."""
    out: JSON = {"model": body["model"], "messages": input_to_messages(body)}
    tools, _ = split_tools(body.get("tools"))
    if tools:
        out["tools"] = tools
        if body.get("tool_choice") is not None:
            out["tool_choice"] = _tool_choice_to_chat(body["tool_choice"])
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
    for key in ("temperature", "top_p", "prompt_cache_key", "user", "stream"):
        if body.get(key) is not None:
            out[key] = body[key]
    return out


def reject_unsupported_tools(body: JSON) -> None:
    """``unsupported_tools: reject``: a 400 naming the tools a non-Responses upstream lacks."""
    _, dropped = split_tools(body.get("tools"))
    if dropped:
        raise ProxyError(
            "invalid_request",
            f"tools {', '.join(dropped)} need an upstream of kind openai-responses",
            param="tools",
            code="unsupported_tools",
        )


# -- replies ----------------------------------------------------------------------------------


def _object(value: Any) -> JSON:
    return value if isinstance(value, dict) else {}


def usage_to_responses(u: Any) -> JSON | None:
    """A chat-completions usage object in the Responses API's shape."""
    if not isinstance(u, dict):
        return None
    inp = int(u.get("prompt_tokens") or 0)
    out = int(u.get("completion_tokens") or 0)
    pdet = _object(u.get("prompt_tokens_details"))
    cdet = _object(u.get("completion_tokens_details"))
    return {
        "input_tokens": inp,
        "input_tokens_details": {
            "cached_tokens": int(pdet.get("cached_tokens") or 0),
            "cache_write_tokens": 0,
        },
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": int(cdet.get("reasoning_tokens") or 0)},
        "total_tokens": inp + out,
    }


def message_item(text: str, *, item_id: str | None = None, status: str = "completed") -> JSON:
    """An assistant message output item with one output_text part."""
    return {
        "id": item_id or new_id("msg_"),
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


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


_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


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
    reason = _INCOMPLETE.get(finish_reason or "")
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


def chat_response_to_responses(resp: JSON, request_model: str) -> JSON:
    """A chat-completions reply as a Responses ``response`` object (choice 0)."""
    choices = resp.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    msg = choice.get("message") if isinstance(choice, dict) else None
    msg = msg if isinstance(msg, dict) else {}
    output: list[JSON] = []
    content = msg.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    if isinstance(content, str) and content:
        output.append(message_item(content))
    for call in msg.get("tool_calls") or ():
        fn = call.get("function") or {}
        output.append(
            function_call_item(
                call.get("id") or new_id("call_"), fn.get("name") or "", fn.get("arguments") or ""
            )
        )
    model = resp["model"] if isinstance(resp.get("model"), str) else request_model
    return response_object(
        model=model,
        output=output,
        usage=usage_to_responses(resp.get("usage")),
        finish_reason=choice.get("finish_reason") if isinstance(choice, dict) else None,
    )
