"""An Anthropic Messages request -> an OpenAI chat-completions request."""

from __future__ import annotations

import copy
from typing import Any

from ...errors import ProxyError
from ..checks import bad_request as _bad
from .common import (
    ASSISTANT_TEXT_JOIN,
    DOCUMENT_TEXT_JOIN,
    JSON,
    SYSTEM_JOIN,
    TOOL_ERROR_PREFIX,
    TOOL_RESULT_TEXT_JOIN,
    _dumps,
    tool_media_label,
)
from .effort import reasoning_effort


def anthropic_request_to_openai(body: JSON, *, max_tokens_field: str = "max_tokens") -> JSON:
    """An Anthropic Messages request -> an OpenAI chat-completions request.

    ``body`` has passed ``validate_anthropic_request``. Structured outputs
    (``output_config.format``) become a ``json_schema`` ``response_format``; the effort
    (``output_config.effort``, a mid-conversation system message's included) the
    ``reasoning_effort`` of a model that takes one (``effort.reasoning_effort``). Dropped:
    ``metadata``, ``top_k``,
    ``thinking``, ``cache_control`` markers, ``thinking``/``redacted_thinking`` blocks and
    any other top-level field OpenAI has no equivalent for. Raises ProxyError 400 for
    content an OpenAI upstream cannot take (server tools, ``mcp_servers``, a mid-conversation
    system message's tool changes, file/unknown image sources, ...).
    """
    if body.get("mcp_servers"):
        # Servers the Messages API connects to and whose tools it offers the model.
        raise _bad("mcp_servers cannot be sent to an OpenAI-format upstream", "mcp_servers")
    messages = _messages_to_openai(body)
    # max_tokens_field: OpenAI's reasoning models refuse "max_tokens"; servers such as Ollama
    # ignore "max_completion_tokens". The upstream's config picks (config.Upstream).
    out: JSON = {"model": body["model"], "messages": messages, max_tokens_field: body["max_tokens"]}
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("stop_sequences"):
        out["stop"] = list(body["stop_sequences"])
    if "stream" in body and body["stream"] is not None:
        out["stream"] = body["stream"]
        if body["stream"]:
            out["stream_options"] = {"include_usage": True}
    tools = body.get("tools")
    if tools:
        out["tools"] = [_tool_to_openai(t, f"tools[{i}]") for i, t in enumerate(tools)]
        tc = body.get("tool_choice")
        if tc:
            ttype = tc["type"]
            if ttype == "auto":
                out["tool_choice"] = "auto"
            elif ttype == "any":
                out["tool_choice"] = "required"
            elif ttype == "none":
                out["tool_choice"] = "none"
            else:
                out["tool_choice"] = {"type": "function", "function": {"name": tc["name"]}}
            if tc.get("disable_parallel_tool_use") and ttype != "none":
                out["parallel_tool_calls"] = False
    effort = reasoning_effort(body)
    if effort is not None:
        out["reasoning_effort"] = effort
    schema = _anthropic_output_schema(body)
    if schema is not None:
        # Anthropic guarantees the schema; OpenAI does only in strict mode, which refuses
        # schemas with optional or open-ended members. Strict whenever the schema allows it.
        spec: JSON = {"name": "output", "schema": schema}
        if _strict_compatible(schema):
            spec["strict"] = True
        out["response_format"] = {"type": "json_schema", "json_schema": spec}
    return out


def _messages_to_openai(body: JSON) -> list[JSON]:
    """The system prompt and the messages as chat messages, a mid-conversation system
    message (``role: "system"`` in ``messages``) as a system message in its place."""
    messages: list[JSON] = []
    system = body.get("system")
    if system:
        text = system if isinstance(system, str) else SYSTEM_JOIN.join(b["text"] for b in system)
        if text:
            messages.append({"role": "system", "content": text})
    roles = [msg["role"] for msg in body["messages"]]
    last_user = max((i for i, role in enumerate(roles) if role == "user"), default=-1)
    for i, msg in enumerate(body["messages"]):
        role, path = msg["role"], f"messages[{i}]"
        if role == "assistant":
            messages.append(_assistant_to_openai(msg["content"], path))
        elif role == "user":
            messages.extend(_user_to_openai(msg["content"], path))
        else:
            cleared = msg.get("clear_at") == "next_user_message" and i < last_user
            text = _system_message_text(msg, path)
            if text and not cleared:
                messages.append({"role": "system", "content": text})
    return messages


def _system_message_text(msg: JSON, path: str) -> str:
    """A mid-conversation system message's text. Its beta ``tool_addition`` and
    ``tool_removal`` blocks change the tools from that point of the conversation on, which
    chat completions cannot say (its tools are the request's): a 400 naming the block. A
    message that carries only a per-turn ``output_config`` has no text."""
    content = msg.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    for j, block in enumerate(content):
        if block["type"] != "text":
            raise _unsupported(block["type"], f"{path}.content[{j}]")
    return SYSTEM_JOIN.join(block["text"] for block in content)  # as the system prompt's


def _strict_compatible(schema: Any) -> bool:
    """Whether OpenAI's strict mode accepts the schema: every object closed
    (``additionalProperties: false``) with all its properties required."""
    if not isinstance(schema, dict):
        return True
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    if schema.get("type") == "object" or props:
        if schema.get("additionalProperties") is not False:
            return False
        if set(schema.get("required") or ()) != set(props):
            return False
    children = list(props.values())
    for key in ("items", "anyOf", "oneOf", "allOf", "prefixItems"):
        sub = schema.get(key)
        children.extend(sub if isinstance(sub, list) else [] if sub is None else [sub])
    for key in ("$defs", "definitions"):
        defs = schema.get(key)
        children.extend(defs.values() if isinstance(defs, dict) else ())
    return all(_strict_compatible(c) for c in children)


def _anthropic_output_schema(body: JSON) -> JSON | None:
    """The JSON schema of Anthropic structured outputs (``output_config.format``, or the
    beta ``output_format``), if the request asks for one."""
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else body.get("output_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = fmt.get("schema")
        if isinstance(schema, dict):
            return schema
    return None


def _tool_to_openai(tool: JSON, path: str) -> JSON:
    ttype = tool.get("type")
    if ttype not in (None, "custom"):
        raise _bad(
            f"{path}: tool {tool['name']!r} has type {ttype!r}, an Anthropic built-in/server "
            "tool that an OpenAI-format upstream cannot run; define it as a custom tool "
            "with an input_schema",
            path,
        )
    fn: JSON = {"name": tool["name"]}
    if tool.get("description"):
        fn["description"] = tool["description"]
    fn["parameters"] = copy.deepcopy(tool["input_schema"])
    if isinstance(tool.get("strict"), bool):
        fn["strict"] = tool["strict"]
    return {"type": "function", "function": fn}


def _image_to_openai(block: JSON, path: str) -> JSON:
    source = block["source"]
    stype = source["type"]
    if stype == "base64":
        url = f"data:{source['media_type']};base64,{source['data']}"
    elif stype == "url":
        url = source["url"]
    else:
        raise _bad(
            f"{path}.source: image source type {stype!r} cannot be sent to an OpenAI-format "
            'upstream (use "base64" or "url")',
            f"{path}.source",
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _document_to_openai(block: JSON, path: str) -> JSON:
    source = block["source"]
    stype = source["type"]
    if stype == "text" and isinstance(source.get("data"), str):
        return {"type": "text", "text": source["data"]}
    if stype == "content":
        inner = source.get("content")
        if isinstance(inner, str):
            return {"type": "text", "text": inner}
        if isinstance(inner, list) and all(
            isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
            for b in inner
        ):
            return {"type": "text", "text": DOCUMENT_TEXT_JOIN.join(b["text"] for b in inner)}
    if stype == "base64" and source.get("media_type") == "application/pdf":
        name = block.get("title") if isinstance(block.get("title"), str) else "document.pdf"
        return {
            "type": "file",
            "file": {
                "filename": name,
                "file_data": f"data:application/pdf;base64,{source['data']}",
            },
        }
    raise _bad(
        f"{path}.source: document source type {stype!r} cannot be sent to an OpenAI-format "
        'upstream (use "text", "content" or a base64 PDF)',
        f"{path}.source",
    )


def _unsupported(btype: str, path: str) -> ProxyError:
    return _bad(
        f"{path}: {btype} blocks cannot be sent to an OpenAI-format upstream", f"{path}.type"
    )


def _tool_result_to_openai(block: JSON, path: str) -> tuple[str, list[JSON]]:
    """(tool message text, image parts that must travel in a following user message)."""
    content = block.get("content")
    images: list[JSON] = []
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        texts: list[str] = []
        for k, inner in enumerate(content):
            ipath = f"{path}.content[{k}]"
            itype = inner["type"]
            if itype == "text":
                texts.append(inner["text"])
            elif itype == "image":
                images.append(_image_to_openai(inner, ipath))
            elif itype == "document":
                part = _document_to_openai(inner, ipath)
                if part["type"] != "text":
                    raise _bad(f"{ipath}: only text documents can be sent in a tool result", ipath)
                texts.append(part["text"])
            else:
                raise _unsupported(itype, ipath)
        text = TOOL_RESULT_TEXT_JOIN.join(texts)
    if block.get("is_error"):
        text = TOOL_ERROR_PREFIX + text
    return text, images


def _user_to_openai(content: str | list[JSON], path: str) -> list[JSON]:
    """One Anthropic user message -> OpenAI messages: ``tool`` messages first (they must
    directly follow the assistant's tool_calls), then one user message with the remaining
    content in order. Images returned by tools cannot ride in an OpenAI ``tool`` message;
    they go, labelled, at the start of that user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tool_msgs: list[JSON] = []
    tool_images: list[JSON] = []
    parts: list[JSON] = []
    for j, block in enumerate(content):
        bpath = f"{path}.content[{j}]"
        btype = block["type"]
        if btype == "text":
            parts.append({"type": "text", "text": block["text"]})
        elif btype == "image":
            parts.append(_image_to_openai(block, bpath))
        elif btype == "document":
            parts.append(_document_to_openai(block, bpath))
        elif btype == "tool_result":
            text, images = _tool_result_to_openai(block, bpath)
            tool_msgs.append(
                {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}
            )
            if images:
                label = tool_media_label(block["tool_use_id"])
                tool_images.append({"type": "text", "text": label})
                tool_images.extend(images)
        else:
            raise _unsupported(btype, bpath)
    out = tool_msgs
    user_parts = tool_images + parts
    if user_parts:
        if len(user_parts) == 1 and user_parts[0]["type"] == "text":
            out.append({"role": "user", "content": user_parts[0]["text"]})
        else:
            out.append({"role": "user", "content": user_parts})
    elif not tool_msgs:
        out.append({"role": "user", "content": ""})
    return out


def _assistant_to_openai(content: str | list[JSON], path: str) -> JSON:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    calls: list[JSON] = []
    for j, block in enumerate(content):
        btype = block["type"]
        if btype == "text":
            texts.append(block["text"])
        elif btype == "tool_use":
            calls.append(
                {
                    "id": block["id"],
                    "type": "function",
                    "function": {"name": block["name"], "arguments": _dumps(block["input"])},
                }
            )
        elif btype in ("thinking", "redacted_thinking"):
            continue  # not representable in OpenAI chat completions
        else:
            raise _unsupported(btype, f"{path}.content[{j}]")
    text = ASSISTANT_TEXT_JOIN.join(texts)
    msg: JSON = {"role": "assistant", "content": text if (text or not calls) else None}
    if calls:
        msg["tool_calls"] = calls
    return msg
