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
  ``state_patch``/``action``, defeating "think first". With
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
    "asks_for_no_output",
    "envelope_schema",
    "infer_schema",
    "nullable",
    "patch_schema",
    "response_format_for",
    "should_constrain",
]

ENVELOPE_SCHEMA_NAME = "skillstate_envelope"
REASONING_MAX_LENGTH = 400
BOUNDED_STRING_MAX_LENGTH = 200  # an unbounded string in a bounded patch schema
BOUNDED_ARRAY_GROWTH = 4  # items an array may gain in a bounded patch schema
_BOUNDED_SCALAR: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "maxLength": BOUNDED_STRING_MAX_LENGTH},
        {"type": "number"},
        {"type": "boolean"},
        {"type": "null"},
    ]
}

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
    reasoning: ReasoningMode = "off",
    reasoning_max_length: int = REASONING_MAX_LENGTH,
    state: Mapping[str, Any] | None = None,
    bounded: bool = False,
) -> dict[str, Any]:
    """JSON schema for the reply envelope ``{reasoning?, state_patch, action}``.

    ``state_patch`` is restricted to ``allowed_keys`` (``additionalProperties: false``),
    none of them required, each nullable (merge-patch deletion). A key's type comes from
    ``state_schema["properties"][key]`` when present, otherwise it is inferred from
    ``initial_state[key]``; a key found in neither accepts any value. Objects become merge
    patches (:func:`patch_schema`: nested members optional, existing ones nullable). With no
    ``allowed_keys`` ``state_patch`` is a free-form object.

    ``reasoning``:
      * ``"first"``: a ``reasoning`` string (``maxLength`` ``reasoning_max_length``,
        may be empty) listed first and *required*, so grammar engines that emit required
        keys first (llama.cpp) still generate it before ``state_patch``.
      * ``"optional"``: listed first but not required. Validators accept envelopes
        without it, but llama.cpp's grammar will place it *after* the required keys.
      * ``"off"`` (default, and what the proxy constrains with: small models run a free-text
        field to its ``maxLength`` under a grammar, docs/benchmarks.md): no ``reasoning``.

    ``state`` is the current state (default ``initial_state``): each key's schema is that of
    a merge patch of its current value (:func:`patch_schema`); ``bounded`` makes it finite,
    for a re-ask after a reply that ran away.

    ``$defs``/``definitions`` of ``state_schema`` are copied to the root so that local
    ``$ref``s like ``#/$defs/Item`` inside its properties still resolve.
    """
    if action_max_length < 1:
        raise ValueError("action_max_length must be >= 1")
    if reasoning not in ("first", "optional", "off"):
        raise ValueError(f"invalid reasoning mode: {reasoning!r}")

    current = initial_state if state is None else state
    state_patch = _state_patch_schema(allowed_keys, initial_state, state_schema, current, bounded)

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


def _state_patch_schema(
    allowed_keys: Sequence[str],
    initial_state: Mapping[str, Any],
    state_schema: Mapping[str, Any] | None,
    current: Mapping[str, Any],
    bounded: bool,
) -> dict[str, Any]:
    """The ``state_patch`` member of :func:`envelope_schema` (its docstring says how)."""
    declared: Mapping[str, Any] = {}
    if state_schema is not None:
        props = state_schema.get("properties")
        if isinstance(props, Mapping):
            declared = props

    state_patch: dict[str, Any] = {"type": "object"}
    keys = list(dict.fromkeys(allowed_keys))  # dedupe, keep order
    if not keys:
        if bounded:
            state_patch = patch_schema(state_patch, current, bounded=True)
    else:
        properties: dict[str, Any] = {}
        for key in keys:
            if key in declared:
                value_schema = dict(declared[key])
            elif key in initial_state:
                value_schema = infer_schema(initial_state[key])
            else:
                value_schema = {}
            value_schema = patch_schema(value_schema, current.get(key), bounded=bounded)
            properties[key] = nullable(value_schema)
        state_patch["properties"] = properties
        state_patch["additionalProperties"] = False
    return state_patch


def _is_object(schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type")
    return kind == "object" or (
        kind is None and ("properties" in schema or "additionalProperties" in schema)
    )


def patch_schema(
    schema: Mapping[str, Any], current: Any, *, bounded: bool = False
) -> dict[str, Any]:
    """The schema of an RFC 7386 merge patch, for a value of ``schema`` now at ``current``.

    A patch of an object names only what changes and ``null`` deletes a member, so at every
    object level nothing is required, declared members may be ``null``, and so may the keys
    ``current`` has in an open map; a *new* map key needs a value (deleting an absent key
    would be a no-op, and offering ``null`` there gives a small model a filler to loop on).
    Arrays are replaced whole: their items keep their schema.

    ``bounded`` makes every instance finite, for a re-ask after a reply that ran away.
    Grammar engines bound strings (``maxLength``) and arrays (``maxItems``) but not the
    number of keys of a map (llama.cpp has no ``maxProperties``), so a small model can add
    keys until ``max_tokens`` cuts the envelope off. Bounded:

    * open maps accept only the keys ``current`` has (and declared ``properties``): they
      can be updated or deleted, not extended;
    * arrays get ``maxItems`` of their current length + ``BOUNDED_ARRAY_GROWTH``;
    * strings without ``maxLength`` get ``BOUNDED_STRING_MAX_LENGTH``;
    * an untyped value (``{}``) follows ``current``'s shape, or becomes a bounded scalar.

    ``anyOf``/``oneOf`` alternatives are handled one by one; a ``$ref``, ``const`` or
    ``enum`` is left as is.
    """
    out: dict[str, Any] = copy.deepcopy(dict(schema))
    for key in ("anyOf", "oneOf"):
        alts = out.get(key)
        if isinstance(alts, list):
            out[key] = [
                patch_schema(a, current, bounded=bounded) if isinstance(a, Mapping) else a
                for a in alts
            ]
            return out
    if "$ref" in out or "const" in out or "enum" in out:
        return out
    kind = "object" if _is_object(out) else out.get("type")
    if isinstance(kind, list):
        if not bounded and "object" not in kind:
            return out
        return {"anyOf": [patch_schema({**out, "type": t}, current, bounded=bounded) for t in kind]}
    if kind is None and bounded:
        # untyped: the structural keywords decide (as in llama.cpp), then the current value
        if "items" in out:
            kind = "array"
        elif {"maxLength", "minLength", "pattern"} & out.keys():
            kind = "string"
        elif isinstance(current, Mapping):
            kind = out["type"] = "object"
        elif isinstance(current, list):
            kind = out["type"] = "array"
        else:
            return copy.deepcopy(_BOUNDED_SCALAR)
    if kind == "object":
        return _object_patch(out, current if isinstance(current, Mapping) else {}, bounded)
    if not bounded:
        return out
    if kind == "array":
        have = len(current) if isinstance(current, list) else 0
        limit = have + BOUNDED_ARRAY_GROWTH
        out["maxItems"] = min(out.get("maxItems", limit), limit)
        items = out.get("items")
        if isinstance(items, Mapping) and items:
            out["items"] = patch_schema(items, None, bounded=True)
        elif not isinstance(items, list):  # a tuple (list of schemas) is finite already
            out["items"] = _bounded_untyped_items(current if isinstance(current, list) else [])
        return out
    if kind == "string" and "maxLength" not in out and "pattern" not in out:
        out["maxLength"] = BOUNDED_STRING_MAX_LENGTH
    return out


def _object_patch(
    schema: dict[str, Any], current: Mapping[str, Any], bounded: bool
) -> dict[str, Any]:
    schema.pop("required", None)
    schema.pop("minProperties", None)
    declared = schema.get("properties")
    declared = declared if isinstance(declared, Mapping) else {}
    # JSON Schema: a missing "additionalProperties" allows any; llama.cpp closes an object
    # that lists properties, so that reading is kept for the grammar (it is the stricter).
    explicit = "additionalProperties" in schema
    extra = schema.get("additionalProperties", True)
    properties: dict[str, Any] = {
        name: nullable(patch_schema(sub, current.get(name), bounded=bounded))
        for name, sub in declared.items()
    }
    extra_schema = extra if isinstance(extra, Mapping) else {}
    # an untyped map value already accepts null: its existing keys need no listing
    if extra is not False and (bounded or not _accepts_null(extra_schema)):
        for name, value in current.items():
            if name not in properties:
                properties[name] = nullable(patch_schema(extra_schema, value, bounded=bounded))
        if bounded:
            schema["additionalProperties"] = False
        elif explicit or not declared:  # an open map stays open; new keys need a value
            schema["additionalProperties"] = patch_schema(extra_schema, None) or True
    if properties or bounded:
        schema["properties"] = properties
    return schema


def _bounded_untyped_items(current: list[Any]) -> dict[str, Any]:
    """Untyped array items: a bounded scalar, or the shape of a current object/array item."""
    alts = [copy.deepcopy(_BOUNDED_SCALAR)]
    for item in current:
        if isinstance(item, (Mapping, list)):
            alt = patch_schema({}, item, bounded=True)
            if alt not in alts:
                alts.append(alt)
    return alts[0] if len(alts) == 1 else {"anyOf": alts}


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


# The output caps of chat completions (both names), Messages and Responses.
_OUTPUT_CAP_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def asks_for_no_output(body: Mapping[str, Any]) -> bool:
    """Whether the request caps its output at 0 tokens: Anthropic documents ``max_tokens: 0``
    as the way to populate the prompt cache. No envelope can come back from such a call, so
    asking for one would only re-ask (and bill) the model again."""
    return any(type(body.get(f)) is int and body.get(f) == 0 for f in _OUTPUT_CAP_FIELDS)


def has_own_format(body: Mapping[str, Any]) -> bool:
    """Whether the request constrains its own output.

    An own format is any non-null ``response_format`` other than ``{"type": "text"}`` (the
    default, which constrains nothing), or llama.cpp's native ``json_schema``/``grammar``
    fields (which llama.cpp refuses to combine with a ``response_format``), or Anthropic's
    ``output_format`` / ``output_config.format``, or the Responses API's ``text.format``
    other than ``{"type": "text"}``.
    """
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
        return True
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, Mapping) else None
    if isinstance(fmt, Mapping) and fmt.get("type") not in (None, "text"):
        return True
    output_config = body.get("output_config")
    return isinstance(output_config, Mapping) and bool(output_config.get("format"))


def should_constrain(body: Mapping[str, Any]) -> bool:
    """True only when the request carries no tools (a non-empty ``tools`` or legacy
    ``functions`` list) and no output format of its own (:func:`has_own_format`)."""
    return (
        not any(body.get(field) for field in _TOOL_FIELDS)
        and not has_own_format(body)
        and not asks_for_no_output(body)
    )
