"""An OpenAI chat-completions request -> an Anthropic Messages request."""

from __future__ import annotations

import copy
import re
from typing import Any

from ...jsondepth import JSONTooDeep
from ..checks import bad_request as _bad
from ..checks import is_int as _is_int
from .common import (
    ASSISTANT_TEXT_JOIN,
    JSON,
    SYSTEM_JOIN,
    refuse_moderation,
)
from .outputlimit import default_max_tokens
from .toolargs import parse_tool_arguments

_DATA_URL = re.compile(r"^data:(?P<mt>[^;,]+)(?:;[^,]*)?;base64,(?P<data>.*)$", re.DOTALL)


def _openai_text_of(content: Any, path: str, join: str = ASSISTANT_TEXT_JOIN) -> str:
    """A message's text: a string, or its text (and refusal) parts joined by ``join``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in ("text", "refusal"):
                raise _bad(f"{path}[{k}]: only text parts are allowed here", f"{path}[{k}]")
            value = part.get("text") if part["type"] == "text" else part.get("refusal")
            if not isinstance(value, str):
                raise _bad(f"{path}[{k}]: text must be a string", f"{path}[{k}]")
            texts.append(value)
        return join.join(texts)
    raise _bad(f"{path}: must be a string or an array of content parts", path)


def _openai_part_to_block(part: Any, path: str) -> JSON:
    if not isinstance(part, dict):
        raise _bad(f"{path}: a content part must be an object", path)
    ptype = part.get("type")
    if ptype == "text":
        if not isinstance(part.get("text"), str):
            raise _bad(f"{path}.text: must be a string", f"{path}.text")
        return {"type": "text", "text": part["text"]}
    if ptype == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str) or not url:
            raise _bad(f"{path}.image_url.url: must be a string", f"{path}.image_url.url")
        m = _DATA_URL.match(url)
        if m:
            source: JSON = {"type": "base64", "media_type": m["mt"], "data": m["data"]}
        elif url.startswith(("http://", "https://")):
            source = {"type": "url", "url": url}
        else:
            raise _bad(
                f"{path}.image_url.url: must be an http(s) URL or a base64 data URL",
                f"{path}.image_url.url",
            )
        return {"type": "image", "source": source}
    if ptype == "file":
        file = part.get("file") if isinstance(part.get("file"), dict) else {}
        assert isinstance(file, dict)
        data = file.get("file_data")
        m = _DATA_URL.match(data) if isinstance(data, str) else None
        if m and m["mt"] == "application/pdf":
            block: JSON = {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": m["data"]},
            }
            if isinstance(file.get("filename"), str):
                block["title"] = file["filename"]
            return block
        raise _bad(
            f"{path}: only inline PDF files (file_data as a base64 data URL) can be sent to "
            "an Anthropic upstream",
            path,
        )
    raise _bad(f"{path}: content part type {ptype!r} cannot be sent to an Anthropic upstream", path)


def openai_request_to_anthropic(body: JSON) -> JSON:
    """An OpenAI chat-completions request -> an Anthropic Messages request.

    ``system``/``developer`` messages (wherever they are) are joined into ``system``;
    ``tool`` messages become ``tool_result`` blocks in a user message; consecutive messages
    of the same resulting role are merged. ``temperature`` is clamped to Anthropic's [0, 1].
    A ``json_schema`` ``response_format`` becomes ``output_config.format`` (structured
    outputs). Dropped: ``stream_options`` (see :class:`AnthropicStreamToOpenAI`), a
    ``json_object`` ``response_format`` (no equivalent), ``seed``, penalties, ``logit_bias``,
    ``logprobs``, ``reasoning_effort`` and the like.
    ``body`` has passed ``validate_openai_request``; raises ProxyError 400 for what Anthropic
    cannot take (``n`` > 1, legacy ``functions``, audio, non-function tools,
    ``web_search_options``, ``moderation``).
    """
    if body.get("functions") or body.get("function_call"):
        raise _bad("functions/function_call are deprecated and not supported; use tools")
    n = body.get("n")
    if n is not None and n != 1:
        raise _bad("n: only 1 choice is supported with an Anthropic upstream", "n")
    refuse_moderation(body, "an Anthropic upstream")
    if body.get("web_search_options") is not None:
        # Chat's built-in web search: the reply would come from the model's memory instead.
        raise _bad(
            "web_search_options cannot be sent to an Anthropic upstream", "web_search_options"
        )
    system_parts, messages = _messages_to_anthropic(body["messages"])
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = default_max_tokens(body["model"], bool(body.get("stream")))
    out: JSON = {"model": body["model"], "messages": messages, "max_tokens": max_tokens}
    if system_parts:
        out["system"] = SYSTEM_JOIN.join(system_parts)
    out.update(_sampling_to_anthropic(body))
    tools = body.get("tools")
    if tools:
        tools, wanted = _allowed_tools(tools, body.get("tool_choice"))
        out["tools"] = [_openai_tool_to_anthropic(t, f"tools[{i}]") for i, t in enumerate(tools)]
        choice = _openai_tool_choice(wanted)
        if body.get("parallel_tool_calls") is False:
            choice = choice or {"type": "auto"}
            if choice["type"] != "none":
                choice["disable_parallel_tool_use"] = True
        if choice is not None:
            out["tool_choice"] = choice
    output_format = _openai_output_format(body.get("response_format"))
    if output_format is not None:
        out["output_config"] = {"format": output_format}
    return out


def _messages_to_anthropic(messages: list[JSON]) -> tuple[list[str], list[JSON]]:
    """(system texts, Anthropic messages): same-role neighbours merged, and a message that
    is one text block written as a plain string."""
    system_parts: list[str] = []
    out: list[JSON] = []
    for i, msg in enumerate(messages):
        path = f"messages[{i}]"
        role = msg.get("role")
        if role in ("system", "developer"):
            # Its parts joined as system texts are (a blank line), not run together.
            text = _openai_text_of(msg.get("content"), f"{path}.content", SYSTEM_JOIN)
            if text:
                system_parts.append(text)
            continue
        if role == "user":
            target, blocks = "user", _user_blocks(msg.get("content"), path)
        elif role == "assistant":
            target, blocks = "assistant", _assistant_blocks(msg, path)
        elif role == "tool":
            target, blocks = "user", [_tool_result_block(msg, path)]
        else:  # "function", the one role left after validation
            raise _bad(f"{path}: legacy function messages are not supported; use tools", path)
        if not blocks:
            continue
        if out and out[-1]["role"] == target:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": target, "content": blocks})
    if not out:
        raise _bad("messages: at least one non-system message is required", "messages")
    for m in out:
        blocks = m["content"]
        if len(blocks) == 1 and blocks[0]["type"] == "text":
            m["content"] = blocks[0]["text"]
    return system_parts, out


def _user_blocks(content: Any, path: str) -> list[JSON]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise _bad(f"{path}.content: must be a string or an array", f"{path}.content")
    blocks = [_openai_part_to_block(p, f"{path}.content[{k}]") for k, p in enumerate(content)]
    return [b for b in blocks if not (b["type"] == "text" and not b["text"])]


def _assistant_blocks(msg: JSON, path: str) -> list[JSON]:
    text = _openai_text_of(msg.get("content"), f"{path}.content")
    refusal = msg.get("refusal")
    if isinstance(refusal, str) and refusal and not text:
        text = refusal
    blocks: list[JSON] = [{"type": "text", "text": text}] if text else []
    for k, call in enumerate(msg.get("tool_calls") or []):
        blocks.append(_tool_call_to_block(call, f"{path}.tool_calls[{k}]"))
    return blocks


def _tool_result_block(msg: JSON, path: str) -> JSON:
    content = msg.get("content")
    result: JSON = {"type": "tool_result", "tool_use_id": msg["tool_call_id"]}
    if isinstance(content, list):
        _openai_text_of(content, f"{path}.content")  # Anthropic takes text parts only
        parts = [{"type": "text", "text": p.get("text") or p.get("refusal") or ""} for p in content]
        result["content"] = [b for b in parts if b["text"]] or ""
    else:
        result["content"] = _openai_text_of(content, f"{path}.content")
    return result


def _sampling_to_anthropic(body: JSON) -> JSON:
    """Sampling, stop, stream and user fields that have an Anthropic equivalent."""
    out: JSON = {}
    temperature = body.get("temperature")
    if temperature is not None:
        out["temperature"] = min(max(float(temperature), 0.0), 1.0)
    if body.get("top_p") is not None:
        out["top_p"] = body["top_p"]
    if _is_int(body.get("top_k")):
        out["top_k"] = body["top_k"]
    stop = body.get("stop")
    if isinstance(stop, str):
        out["stop_sequences"] = [stop]
    elif stop:
        out["stop_sequences"] = list(stop)
    if body.get("stream") is not None:
        out["stream"] = bool(body["stream"])
    if isinstance(body.get("user"), str) and body["user"]:
        out["metadata"] = {"user_id": body["user"]}
    return out


def _openai_output_format(response_format: Any) -> JSON | None:
    """OpenAI ``response_format`` -> Anthropic ``output_config.format``. Only a JSON schema
    has an equivalent; ``json_object`` (JSON mode) has none and is left to the prompt."""
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return None
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise _bad("response_format.json_schema.schema: must be an object", "response_format")
    return {"type": "json_schema", "schema": schema}


def _tool_call_to_block(call: JSON, path: str) -> JSON:
    if call.get("type", "function") != "function":
        raise _bad(f"{path}.type: only function tool calls are supported", f"{path}.type")
    fn = call["function"]
    try:
        tool_input = parse_tool_arguments(fn.get("arguments"))
    except JSONTooDeep as e:
        raise _bad(f"{path}.function.arguments: {e}", f"{path}.function.arguments") from None
    return {"type": "tool_use", "id": call["id"], "name": fn["name"], "input": tool_input}


def _openai_tool_to_anthropic(tool: JSON, path: str) -> JSON:
    if tool["type"] != "function":
        raise _bad(f'{path}: only {{"type": "function"}} tools are supported', path)
    fn = tool["function"]
    params = fn.get("parameters")
    if params is None:
        schema: JSON = {"type": "object", "properties": {}}
    else:
        schema = copy.deepcopy(params)
        if "type" not in schema:
            schema = {"type": "object", **schema}
            schema.setdefault("properties", {})
        elif schema["type"] != "object":
            raise _bad(
                f'{path}.function.parameters: must be a JSON Schema with "type": "object"',
                f"{path}.function.parameters",
            )
    out: JSON = {"name": fn["name"]}
    if isinstance(fn.get("description"), str) and fn["description"]:
        out["description"] = fn["description"]
    out["input_schema"] = schema
    if isinstance(fn.get("strict"), bool):
        out["strict"] = fn["strict"]
    return out


def _allowed_tools(tools: list[JSON], choice: Any) -> tuple[list[JSON], Any]:
    """(the tools to send, the tool_choice that says the rest). Messages has no
    ``allowed_tools`` choice: the model is sent only the allowed tools (it cannot call one it
    is not shown), under ``auto`` or ``any`` (``required``); any other choice as it is.
    Allowing none of the request's tools is a 400 (Messages needs a tool to choose)."""
    if not isinstance(choice, dict) or choice.get("type") != "allowed_tools":
        return tools, choice
    spec = choice["allowed_tools"]  # validated: a mode and an array of typed entries
    names = {
        e["function"].get("name")
        for e in spec["tools"]
        if e["type"] == "function" and isinstance(e.get("function"), dict)
    }
    kept = [t for t in tools if t.get("type") != "function" or t["function"]["name"] in names]
    if not any(t.get("type") == "function" for t in kept):
        raise _bad(
            "tool_choice.allowed_tools.tools: names none of the request's function tools",
            "tool_choice.allowed_tools.tools",
        )
    return kept, spec["mode"]


def _openai_tool_choice(choice: Any) -> JSON | None:
    if choice is None:
        return None
    if choice == "auto":
        return {"type": "auto"}
    if choice == "none":
        return {"type": "none"}
    if choice == "required":
        return {"type": "any"}
    if choice.get("type") == "function":
        return {"type": "tool", "name": choice["function"]["name"]}
    raise _bad(
        f"tool_choice: type {choice.get('type')!r} cannot be sent to an Anthropic upstream",
        "tool_choice",
    )
