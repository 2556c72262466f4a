"""BFCL function docs -> the OpenAI ``tools`` its chat-completions handler sends."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from skillstate.bench.bfcl.constants import GORILLA_TO_OPENAPI


def _cast_types(properties: dict[str, Any], mapping: Mapping[str, str]) -> dict[str, Any]:
    """BFCL's ``_cast_to_openai_type`` (model_handler/utils.py), same quirks."""
    for key, value in properties.items():
        if "type" not in value:
            value["type"] = "string"
        else:
            var_type = value["type"]
            if var_type == "float":
                value["format"] = "float"
                value["description"] = value.get("description", "") + " This is a float type value."
            value["type"] = mapping.get(var_type, "string")
        if value["type"] in ("array", "object"):
            if "properties" in value:
                value["properties"] = _cast_types(value["properties"], mapping)
            elif "items" in value:
                items = value["items"]
                items["type"] = mapping[items["type"]]
                if items["type"] == "array" and "items" in items:
                    items["items"]["type"] = mapping[items["items"]["type"]]
                elif items["type"] == "object" and "properties" in items:
                    items["properties"] = _cast_types(items["properties"], mapping)
        properties[key] = value
    return properties


def openai_tools(
    docs: Sequence[Mapping[str, Any]], mapping: Mapping[str, str] = GORILLA_TO_OPENAPI
) -> list[dict[str, Any]]:
    """BFCL function docs -> the ``tools`` BFCL's OpenAI chat-completions handler sends
    (``convert_to_tool`` with ``ModelStyle.OPENAI_COMPLETIONS``: ``response`` kept)."""
    out: list[dict[str, Any]] = []
    for doc in docs:
        item = copy.deepcopy(dict(doc))
        item["name"] = item["name"].replace(".", "_")
        params = item.setdefault("parameters", {})
        params["type"] = "object"
        params["properties"] = _cast_types(params.get("properties") or {}, mapping)
        out.append({"type": "function", "function": item})
    return out
