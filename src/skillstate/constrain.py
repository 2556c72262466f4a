"""Constrained decoding for the skillstate reply envelope.

The proxy asks the model to end each reply with a JSON envelope::

    {"reasoning": "...", "state_patch": {...}, "action": "..."}

where ``state_patch`` is an RFC 7386 merge patch of the session state (``null`` deletes
a key, arrays are replaced whole). Small models mostly fail on *formatting*, so when the
upstream supports it we send an OpenAI ``response_format`` of type ``json_schema`` and
let the server's grammar engine (llama.cpp: ``json_schema_to_grammar``) enforce it.

Schema choices, checked against llama.cpp's converter (``common/json-schema.cpp`` and
``common/json-schema-to-grammar.cpp``):

* Nullable values use ``{"anyOf": [T, {"type": "null"}]}``. llama.cpp handles both
  ``anyOf`` and ``"type": [T, "null"]`` (it rewrites the latter into ``anyOf``), but
  ``anyOf`` also composes with ``enum``/``const``/``$ref`` schemas taken from a user
  ``state_schema``, which a type list cannot.
* llama.cpp's grammar emits **required properties first** (in schema order) and only then
  the optional ones. An optional ``reasoning`` would therefore be generated *after*
  ``state_patch``/``action``, defeating "think first". With the default
  ``reasoning="first"`` it is listed first in ``properties`` *and* in ``required``
  (an empty string is allowed), so the grammar forces it to come first.
* Object key order is preserved by llama.cpp (it uses an ordered JSON type).
* ``maxLength`` on strings is honoured (as a bounded repetition in the grammar).

Note for real OpenAI: its ``strict: true`` mode requires *every* property to be listed in
``required``. Our state keys are deliberately optional (an absent key means "unchanged",
``null`` means "delete"), so OpenAI proper will reject this schema with ``strict: true``;
use ``response_format_for(schema, strict=False)`` there.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Literal

__all__ = [
    "ENVELOPE_SCHEMA_NAME",
    "REASONING_MAX_LENGTH",
    "envelope_schema",
    "infer_schema",
    "nullable",
    "response_format_for",
    "should_constrain",
]

ENVELOPE_SCHEMA_NAME = "skillstate_envelope"
REASONING_MAX_LENGTH = 400

ReasoningMode = Literal["first", "optional", "off"]

_NULL: dict[str, Any] = {"type": "null"}


def infer_schema(value: Any) -> dict[str, Any]:
    """JSON schema for the type of ``value`` (not nullable).

    str→string, int→integer, float→number, bool→boolean, list→array (items typed from
    the first element, if any), dict→object (free-form: nested dicts are merge patches
    themselves, so their inner keys are not constrained). ``None`` or an unknown type
    gives ``{}`` (any value).
    """
    # bool before int: bool is a subclass of int
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if isinstance(value, str):
        return {"type": "string"}
    if isinstance(value, Mapping):
        return {"type": "object"}
    if isinstance(value, (list, tuple)):
        schema: dict[str, Any] = {"type": "array"}
        if value:
            items = infer_schema(value[0])
            if items:
                schema["items"] = items
        return schema
    return {}


def _accepts_null(schema: Mapping[str, Any]) -> bool:
    if not schema:  # {} accepts anything
        return True
    t = schema.get("type")
    if t == "null" or (isinstance(t, list) and "null" in t):
        return True
    if "const" in schema and schema["const"] is None:
        return True
    if "enum" in schema and None in (schema["enum"] or []):
        return True
    for key in ("anyOf", "oneOf"):
        alts = schema.get(key)
        if isinstance(alts, list) and any(
            isinstance(a, Mapping) and _accepts_null(a) for a in alts
        ):
            return True
    return False


def nullable(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``{"anyOf": [schema, {"type": "null"}]}`` unless ``schema`` already accepts null."""
    out: dict[str, Any] = copy.deepcopy(dict(schema))
    if _accepts_null(out):
        return out
    return {"anyOf": [out, dict(_NULL)]}


def envelope_schema(
    allowed_keys: Sequence[str],
    initial_state: Mapping[str, Any],
    state_schema: Mapping[str, Any] | None = None,
    action_max_length: int = 200,
    *,
    reasoning: ReasoningMode = "first",
    reasoning_max_length: int = REASONING_MAX_LENGTH,
) -> dict[str, Any]:
    """JSON schema for the reply envelope ``{reasoning?, state_patch, action}``.

    ``state_patch`` is restricted to ``allowed_keys`` (``additionalProperties: false``),
    none of them required, each nullable (merge-patch deletion). A key's type comes from
    ``state_schema["properties"][key]`` when present, otherwise it is inferred from
    ``initial_state[key]``; a key found in neither accepts any value. With no
    ``allowed_keys`` ``state_patch`` is a free-form object.

    ``reasoning``:
      * ``"first"`` (default): a ``reasoning`` string (``maxLength`` ``reasoning_max_length``,
        may be empty) listed first and *required*, so grammar engines that emit required
        keys first (llama.cpp) still generate it before ``state_patch``.
      * ``"optional"``: listed first but not required. Validators accept envelopes
        without it, but llama.cpp's grammar will place it *after* the required keys.
      * ``"off"``: no ``reasoning`` property.

    ``$defs``/``definitions`` of ``state_schema`` are copied to the root so that local
    ``$ref``s like ``#/$defs/Item`` inside its properties still resolve.
    """
    if action_max_length < 1:
        raise ValueError("action_max_length must be >= 1")
    if reasoning not in ("first", "optional", "off"):
        raise ValueError(f"invalid reasoning mode: {reasoning!r}")

    declared: Mapping[str, Any] = {}
    if state_schema is not None:
        props = state_schema.get("properties")
        if isinstance(props, Mapping):
            declared = props

    state_patch: dict[str, Any] = {"type": "object"}
    keys = list(dict.fromkeys(allowed_keys))  # dedupe, keep order
    if keys:
        properties: dict[str, Any] = {}
        for key in keys:
            if key in declared:
                value_schema = dict(declared[key])
            elif key in initial_state:
                value_schema = infer_schema(initial_state[key])
            else:
                value_schema = {}
            properties[key] = nullable(value_schema)
        state_patch["properties"] = properties
        state_patch["additionalProperties"] = False

    properties_out: dict[str, Any] = {}
    required: list[str] = []
    if reasoning != "off":
        properties_out["reasoning"] = {"type": "string", "maxLength": reasoning_max_length}
        if reasoning == "first":
            required.append("reasoning")
    properties_out["state_patch"] = state_patch
    properties_out["action"] = {"type": "string", "maxLength": action_max_length}
    required += ["state_patch", "action"]

    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties_out,
        "required": required,
        "additionalProperties": False,
    }
    if state_schema is not None:
        for defs_key in ("$defs", "definitions"):
            if defs_key in state_schema:
                schema[defs_key] = copy.deepcopy(state_schema[defs_key])
    return schema


def response_format_for(
    schema: Mapping[str, Any], *, name: str = ENVELOPE_SCHEMA_NAME, strict: bool = True
) -> dict[str, Any]:
    """The OpenAI ``response_format`` value for ``schema``.

    ``{"type": "json_schema", "json_schema": {"name": ..., "strict": ..., "schema": ...}}``
    (llama.cpp reads ``response_format.json_schema.schema``).
    """
    return {
        "type": "json_schema",
        "json_schema": {"name": name, "strict": strict, "schema": copy.deepcopy(dict(schema))},
    }


# Request fields that already constrain the output (OpenAI, llama.cpp-native, Anthropic).
_OWN_FORMAT_FIELDS = ("response_format", "json_schema", "grammar", "output_format")
_TOOL_FIELDS = ("tools", "functions")


def should_constrain(body: Mapping[str, Any]) -> bool:
    """True only when the request carries no tools and no output format of its own.

    "Tools" are a non-empty ``tools`` (or legacy ``functions``) list. An own format is any
    non-null ``response_format`` other than ``{"type": "text"}`` (the default, which
    constrains nothing), or llama.cpp's native ``json_schema``/``grammar`` fields (which
    llama.cpp refuses to combine with a ``response_format``), or Anthropic's
    ``output_format`` / ``output_config.format``.
    """
    for field in _TOOL_FIELDS:
        if body.get(field):
            return False
    for field in _OWN_FORMAT_FIELDS:
        value = body.get(field)
        if value is None or value == "":
            continue
        if (
            field == "response_format"
            and isinstance(value, Mapping)
            and value.get("type") in (None, "text")
            and len(value) <= 1
        ):
            continue
        return False
    output_config = body.get("output_config")
    return not (isinstance(output_config, Mapping) and output_config.get("format"))
