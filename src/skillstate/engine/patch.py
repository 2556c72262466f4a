"""The reply envelope: extract it, validate it, merge it. Pure functions, no I/O.

Each turn the model ends its reply with one JSON envelope::

    {"state_patch": {...}, "action": "..."}

usually in a fenced ```json block after some free-text reasoning, or, under constrained
decoding, as the whole reply (optionally with a ``"reasoning"`` field).

* :func:`extract_envelope` finds it. Candidates are ```json blocks, untagged ``` blocks,
  the whole reply when it is a bare JSON object, and (as a fallback) a JSON object that
  starts at the beginning of a line outside any fence. The **last** valid envelope wins.
  The scan is linear in the reply length (one non-backtracking regex pass over fence
  runs plus a bounded number of ``orjson`` parses) and never uses the stdlib ``json``,
  so ``NaN``/``Infinity`` are always rejected.
* :func:`validate_and_merge` checks a patch against a :class:`PatchPolicy` and returns a
  :class:`Transition`: the new state on success, short model-actionable errors otherwise.
  Inputs are never mutated. An integer beyond 64 bits, which orjson reads as the nearest
  float, makes the patch invalid (the state would silently hold another number): the JSON
  text the patch came from is read again to tell it from a float written as one.
* :func:`merge_patch` is RFC 7386 JSON Merge Patch. The result shares no mutable
  container with the patch, and with the target only the values the patch leaves
  untouched: states are never changed in place (a session's cached state is shared).
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import relevance

from ..jsontext import LARGE_FLOAT, integers_beyond_64_bits

__all__ = [
    "JSON_TYPES",
    "NO_ENVELOPE_ERROR",
    "Envelope",
    "Extraction",
    "PatchPolicy",
    "Transition",
    "extract_envelope",
    "infer_key_types",
    "merge_patch",
    "validate_and_merge",
]

JSON_TYPES = frozenset({"string", "integer", "number", "boolean", "array", "object"})

NO_ENVELOPE_ERROR = "no ```json block with a state_patch object found"

_MAX_ERRORS = 5  # extraction errors kept (the last ones: the last envelope is the one that counts)
_MAX_LINE_OBJECTS = 8  # unfenced line-start `{` candidates tried (the last ones)
_MAX_SCHEMA_ERRORS = 5
_MAX_NUMBER_ERRORS = 5  # integers beyond 64 bits named (each one the model must rewrite)
_MAX_MESSAGE_CHARS = 200
_MAX_LISTED_KEYS = 20

# Linear-time patterns: no nested quantifiers, nothing to backtrack into.
# A run of three or more of one fence character: `{3,}|~{3,}, spelled to start with a
# character class, which lets the regex engine skip to the candidates (5x faster on every
# reply the extractor and the stripper read).
_FENCE_RUN = re.compile(r"[`~](?:(?<=`)`{2,}|(?<=~)~{2,})")
_BLANK = re.compile(r"[ \t\r\f\v]*")
_INFO_TAG = re.compile(r"[ \t]*([\w.+#-]*)[ \t]*")
_LEADING_WS = re.compile(r"\s*")

_JSON_TAGS = frozenset({"json", "jsonc", "json5"})


# --------------------------------------------------------------------------- data types


@dataclass(frozen=True)
class Envelope:
    """A valid reply envelope."""

    state_patch: dict[str, Any]
    action: str | None
    reasoning: str | None
    # The JSON text the envelope was read from (text after its object may follow), for
    # validate_and_merge's ``source``; not part of the envelope's value.
    source: str | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Extraction:
    """Result of :func:`extract_envelope`: an envelope, or errors saying why there is none."""

    envelope: Envelope | None
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PatchPolicy:
    """What a state patch may do.

    ``allowed_keys``: permitted top-level state keys (empty = any key).
    ``key_types``: expected JSON type per top-level key (see :func:`infer_key_types`).
    ``schema_violation``: what an out-of-schema key does: ``"reject"`` the whole
    transition, or ``"drop"`` the key with a warning.
    ``max_depth``: maximum nesting of the patch; the patch object itself is level 1.
    ``state_schema``: optional JSON Schema (Draft 2020-12) the merged state must satisfy;
    it is checked and compiled once, when the policy is built.
    """

    allowed_keys: frozenset[str] = frozenset()
    key_types: dict[str, str] = field(default_factory=dict)
    schema_violation: Literal["reject", "drop"] = "reject"
    max_patch_bytes: int = 32768
    max_state_bytes: int = 65536
    max_depth: int = 64
    state_schema: dict[str, Any] | None = None
    # The compiled state_schema validator: set once in __post_init__, not a dataclass field
    # (so it stays out of repr/eq/asdict/replace; replace() compiles afresh).
    _validator: ClassVar[Any] = None

    def __post_init__(self) -> None:
        # Own copies: a caller mutating its set/dict afterwards must not change the policy.
        object.__setattr__(self, "allowed_keys", frozenset(self.allowed_keys))
        object.__setattr__(self, "key_types", dict(self.key_types))
        for key, type_name in self.key_types.items():
            if type_name not in JSON_TYPES:
                raise ValueError(f"key_types[{key!r}]: unknown JSON type {type_name!r}")
        if self.schema_violation not in ("reject", "drop"):
            raise ValueError(
                f"schema_violation must be 'reject' or 'drop', not {self.schema_violation!r}"
            )
        for name in ("max_patch_bytes", "max_state_bytes", "max_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        if self.state_schema is not None:
            schema = _copy_json(self.state_schema)
            Draft202012Validator.check_schema(schema)  # raises SchemaError
            object.__setattr__(self, "state_schema", schema)
            object.__setattr__(self, "_validator", Draft202012Validator(schema))


@dataclass(frozen=True)
class Transition:
    """Result of :func:`validate_and_merge`.

    On success ``ok`` is true, ``applied_patch`` is a fresh object (the input patch minus
    any dropped keys) and ``new_state`` a new state that shares with the old one the values
    the patch leaves untouched (:func:`merge_patch`). On failure both are None and
    ``errors`` says why; the caller's state is untouched either way.
    """

    ok: bool
    new_state: dict[str, Any] | None
    applied_patch: dict[str, Any] | None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # ``new_state`` as compact JSON (``orjson.dumps``), made for its size check: the commit
    # stores these bytes rather than serialising the state again.
    new_state_json: bytes | None = None


# --------------------------------------------------------------------------- helpers


def _json_type(value: Any) -> str:
    """JSON type name of a Python value (bool before int: bool is a subclass of int)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _type_matches(expected: str, value: Any) -> bool:
    actual = _json_type(value)
    return actual == expected or (expected == "number" and actual == "integer")


def _copy_json(value: Any) -> Any:
    """Deep copy of dicts and lists; scalars are immutable and shared.

    Containers recurse, scalars are taken inline: most of a patch's values are scalars (a
    call per scalar doubled the cost)."""
    if isinstance(value, dict):
        return {k: _copy_json(v) if isinstance(v, _CONTAINERS) else v for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_json(v) if isinstance(v, _CONTAINERS) else v for v in value]
    return value


_CONTAINERS = (dict, list)


def _at(parts: tuple[Any, ...]) -> str:
    """Where in a JSON document: "at 'plan.steps[0]'" or "at top level"."""
    out: list[str] = []
    for part in parts:
        if isinstance(part, int):
            out.append(f"[{part}]")
        else:
            out.append(f".{part}" if out else str(part))
    return f"at '{_clip(''.join(out), 80)}'" if out else "at top level"


def _clip(text: str, limit: int = _MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- extraction


# A fenced block: (span_start, span_end, content_start, content_end, tag). The span runs
# from the start of the opening fence line to the end of the closing fence (exclusive of
# its newline); tag is the lower-cased first word of the info string ("" = untagged).
_Block = tuple[int, int, int, int, str]


def _scan_fences(text: str) -> list[_Block]:
    """Fenced blocks, in order. Linear: one regex pass over runs of ``` / ~~~.

    A run opens a block when it starts a line (after optional indentation). Inside a
    block, a run of the same character, at least as long as the opener, closes it when it
    is alone on its line or ends a content line (``{...}```). A fence line carrying an info
    string inside a block closes it and opens a new one (the model forgot to close the
    previous block). An unterminated block runs to the end of the text. ``{`` right after
    the info string starts the content on the fence line itself (```json {...} ```).
    """
    n = len(text)
    blank = _BLANK.match
    blocks: list[_Block] = []
    line_start = 0
    line_end = -1
    is_open = False  # and if so:
    o_char, o_len, o_span, o_tag, o_start = "", 0, 0, "", 0
    for m in _FENCE_RUN.finditer(text):
        s, e = m.span()
        if s > line_end:  # first run on a new line
            line_start = text.rfind("\n", line_end if line_end > 0 else 0, s) + 1
            line_end = text.find("\n", e)
            if line_end < 0:
                line_end = n
            at_start = s == line_start or blank(text, line_start, s).end() == s  # type: ignore[union-attr]
        else:
            at_start = False
        at_end = e == line_end or blank(text, e, line_end).end() == line_end  # type: ignore[union-attr]
        if not (at_start or at_end):
            continue  # inline code such as ```x``` in prose
        char = text[s]
        if is_open:
            if char != o_char or e - s < o_len or s < o_start:
                continue  # block content
            is_open = False
            if at_end:
                blocks.append((o_span, line_end, o_start, s, o_tag))
                continue
            blocks.append((o_span, line_start, o_start, s, o_tag))  # ...and reopen below
        if at_start:
            info = _INFO_TAG.match(text, e, line_end)
            assert info is not None  # the pattern matches the empty string
            after = info.end()
            if after < line_end and text[after] == "{":
                o_start = after  # ```json {"state_patch": ...}
            else:
                o_start = line_end + 1 if line_end < n else n
            is_open = True
            o_char, o_len, o_span, o_tag = char, e - s, line_start, info.group(1).lower()
    if is_open:
        blocks.append((o_span, n, o_start, n, o_tag))
    return blocks


def _loads_prefix(segment: str) -> tuple[Any, int, str | None]:
    """Parse the JSON value at the start of ``segment``, tolerating trailing text.

    Returns (value, end of the value within segment, None) or (None, 0, error message).
    """
    try:
        return orjson.loads(segment), len(segment.rstrip()), None
    except orjson.JSONDecodeError as exc:
        pos = exc.pos
        if 0 < pos < len(segment):
            # If everything before the error position is a complete document, the error
            # was trailing text after it (e.g. a closing fence glued to the JSON).
            head = segment[:pos]
            try:
                return orjson.loads(head), len(head.rstrip()), None
            except orjson.JSONDecodeError:
                pass
        return None, 0, f"{exc.msg} at line {exc.lineno} col {exc.colno}"


def _envelope_problem(value: Any, where: str) -> str | None:
    if not isinstance(value, dict):
        return f"{where} must be a JSON object, got {_json_type(value)}"
    if "state_patch" not in value:
        return f"{where} has no state_patch key"
    patch = value["state_patch"]
    if not isinstance(patch, dict):
        return f"state_patch must be an object, got {_json_type(patch)}"
    action = value.get("action")
    if action is not None and not isinstance(action, str):
        return f"action must be a string, got {_json_type(action)}"
    return None


# Candidate kinds, and how errors name them.
_JSON, _PLAIN, _WHOLE, _LINE = 0, 1, 2, 3
_WHERE = ("```json block", "``` block", "reply", "unfenced JSON object")


def _line_objects(text: str, blocks: list[_Block], limit: int) -> list[tuple[int, int]]:
    """(position, end of its unfenced region) of the last ``limit`` line-start ``{``
    outside fences. Column 0 only, so inner lines of a pretty-printed object don't count.
    """
    found: list[tuple[int, int]] = []
    hi = len(text)
    for i in range(len(blocks), -1, -1):
        lo = blocks[i - 1][1] if i > 0 else 0
        end = hi
        while len(found) < limit:
            j = text.rfind("\n{", lo, end)
            if j < 0:
                break
            found.append((j + 1, hi))
            end = j + 1  # the next match must lie wholly before this one
        if len(found) >= limit or i == 0:
            break
        hi = blocks[i - 1][0]
    return found


def extract_envelope(text: str) -> Extraction:
    """Find the reply envelope in a model's reply text. The last valid envelope wins.

    ``reasoning`` is the envelope's own ``"reasoning"`` string field if it has one, else
    the reply text outside the winning envelope (stripped), or None if there is none.
    """
    n = len(text)
    leading_ws = _LEADING_WS.match
    blocks = _scan_fences(text)
    # (position, kind, segment start, segment end, span start, span end)
    candidates: list[tuple[int, int, int, int, int, int]] = []
    for span_start, span_end, start, end, tag in blocks:
        if tag in _JSON_TAGS:
            candidates.append((start, _JSON, start, end, span_start, span_end))
        elif tag == "":
            first = leading_ws(text, start, end).end()  # type: ignore[union-attr]
            if first < end and text[first] == "{":  # else not an attempt at an envelope
                candidates.append((start, _PLAIN, start, end, span_start, span_end))
        # ```python etc. are never envelopes
    seen: set[int] = set()
    first_region_end = blocks[0][0] if blocks else n
    first = leading_ws(text).end()  # type: ignore[union-attr]
    if first < first_region_end and text[first] == "{":
        seen.add(first)
        candidates.append((first, _WHOLE, first, first_region_end, first, n))
    for pos, region_end in _line_objects(text, blocks, _MAX_LINE_OBJECTS):
        if pos not in seen:
            seen.add(pos)
            candidates.append((pos, _LINE, pos, region_end, pos, n))
    candidates.sort()

    errors: deque[str] = deque(maxlen=_MAX_ERRORS)
    best: tuple[dict[str, Any], int, int, str] | None = None
    covered = -1  # end of the last parsed unfenced object: line starts inside it are skipped
    for pos, kind, start, end, span_start, span_end in candidates:
        unfenced = kind >= _WHOLE
        if unfenced and pos < covered:
            continue
        segment = text[start:end]
        if kind == _JSON and not segment.strip():
            errors.append("empty ```json block")
            continue
        value, length, parse_error = _loads_prefix(segment)
        if parse_error is not None:
            # A line-start "{" in prose is only reported if it clearly meant to be one.
            if kind != _LINE or '"state_patch"' in segment[:_MAX_MESSAGE_CHARS]:
                errors.append(f"invalid JSON in {_WHERE[kind]}: {parse_error}")
            continue
        if unfenced:
            covered = span_end = start + length
        problem = _envelope_problem(value, _WHERE[kind])
        if problem is not None:
            if kind != _LINE or (isinstance(value, dict) and "state_patch" in value):
                errors.append(problem)
            continue
        best = (value, span_start, span_end, segment)

    if best is None:
        return Extraction(None, list(errors) if errors else [NO_ENVELOPE_ERROR])
    raw, span_start, span_end, source = best
    reasoning = raw.get("reasoning")
    if not isinstance(reasoning, str):
        before, after = text[:span_start].strip(), text[span_end:].strip()
        reasoning = "\n\n".join(p for p in (before, after) if p) or None
    return Extraction(Envelope(raw["state_patch"], raw.get("action"), reasoning, source), [])


# --------------------------------------------------------------------------- merge


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON Merge Patch of ``target`` by ``patch``.

    A non-object patch replaces the target; objects merge recursively; ``null`` deletes a
    key; arrays (and every other value) replace whole. Neither input is mutated. The result
    shares no dict or list with ``patch``; with ``target`` it shares the values the patch
    leaves untouched (copying them cost a turn more than the rest of the merge): a state is
    never changed in place, every change is a new merge. Keys keep the target's order, new
    ones follow in the patch's. Recursive: depth is bounded by validation.
    """
    if not isinstance(patch, dict):
        return _copy_json(patch)
    if not isinstance(target, dict):
        target = {}
    result = dict(target)
    for key, change in patch.items():
        if change is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(target.get(key), change)
    return result


# --------------------------------------------------------------------------- validation


def infer_key_types(initial_state: dict[str, Any]) -> dict[str, str]:
    """Expected JSON type per top-level key, from the initial state's values.

    ``None`` values (and non-JSON values) leave the key unconstrained.
    """
    types: dict[str, str] = {}
    for key, value in initial_state.items():
        name = _json_type(value)
        if name in JSON_TYPES:
            types[key] = name
    return types


def _check_json_tree(
    patch: dict[str, Any], max_depth: int, large: list[tuple[Any, ...]]
) -> str | None:
    """Depth ≤ max_depth (the patch is level 1), string keys, finite numbers, JSON types
    only. Iterative, stops at the first problem. Adds to ``large`` where a float of
    magnitude 2**63 or more is (each may be an integer orjson could not hold)."""
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(patch, 1, ())]
    while stack:
        node, depth, path = stack.pop()
        if depth > max_depth:
            return f"state_patch is nested deeper than {max_depth} levels under key '{path[0]}'"
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if not isinstance(key, str) and isinstance(node, dict):
                return f"state_patch has a non-string key {key!r} {_at(path)}"
            child = (*path, key)
            if isinstance(value, (dict, list)):
                stack.append((value, depth + 1, child))
            elif isinstance(value, float):
                if not math.isfinite(value):
                    return f"state_patch has a non-finite number {_at(child)}"
                if not -LARGE_FLOAT < value < LARGE_FLOAT:
                    large.append(child)
            elif value is not None and not isinstance(value, (str, int)):
                return f"state_patch has a non-JSON value ({type(value).__name__}) {_at(child)}"
    return None


def _integers_beyond_64_bits(
    patch: dict[str, Any],
    large: list[tuple[Any, ...]],
    source: str | bytes,
    within: tuple[str, ...],
) -> list[str]:
    """An error for each of the ``large`` floats of ``patch`` (their paths) that ``source``
    wrote as an integer beyond 64 bits (the first ``_MAX_NUMBER_ERRORS``)."""
    found = integers_beyond_64_bits(source, [(*within, *path) for path in large])
    errors = []
    for full in found[:_MAX_NUMBER_ERRORS]:
        path = full[len(within) :]
        read: Any = patch
        for part in path:
            read = read[part]
        errors.append(
            f"state_patch has an integer beyond 64 bits {_at(path)}, which would be kept as"
            f" the float {read!r}: send it as a string"
        )
    if len(found) > _MAX_NUMBER_ERRORS:
        errors.append(f"and {len(found) - _MAX_NUMBER_ERRORS} more integers beyond 64 bits")
    return errors


def _dumped(value: Any) -> bytes | str:
    """``value`` as compact JSON, or why orjson cannot write it."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        return str(exc)


def _fail(errors: list[str], warnings: list[str]) -> Transition:
    return Transition(False, None, None, errors, warnings)


def _patch_problems(
    patch: Any, policy: PatchPolicy, source: str | bytes | None, within: tuple[str, ...]
) -> list[str]:
    """What makes ``patch`` no patch at all (``validate_and_merge``'s first checks): not an
    object of JSON values within ``max_depth``, an integer beyond 64 bits (with ``source``),
    not serializable, or over ``max_patch_bytes``."""
    if not isinstance(patch, dict):
        return [f"state_patch must be an object, got {_json_type(patch)}"]
    large: list[tuple[Any, ...]] = []
    problem = _check_json_tree(patch, policy.max_depth, large)
    if problem is not None:
        return [problem]
    if large and source is not None:
        wide = _integers_beyond_64_bits(patch, large, source, within)
        if wide:
            return wide
    dumped = _dumped(patch)
    if isinstance(dumped, str):
        return [f"state_patch is not serializable: {dumped}"]
    if len(dumped) > policy.max_patch_bytes:
        return [f"state_patch is {len(dumped)} bytes, over the {policy.max_patch_bytes}-byte limit"]
    return []


def _allowed_part(
    patch: dict[str, Any], policy: PatchPolicy, warnings: list[str]
) -> tuple[dict[str, Any], list[str]]:
    """The part of ``patch`` whose top-level keys ``allowed_keys`` has, and an error for each
    other key (``schema_violation: reject``) or a warning (``drop``, added to ``warnings``)."""
    allowed = policy.allowed_keys
    unknown = [k for k in patch if k not in allowed] if allowed else []
    if not unknown:
        return patch, []
    applied = {k: v for k, v in patch.items() if k in allowed}
    if policy.schema_violation == "drop":
        warnings.extend(f"dropped key '{k}': not in the state schema" for k in unknown)
        return applied, []
    listed = sorted(allowed)
    shown = ", ".join(listed[:_MAX_LISTED_KEYS])
    if len(listed) > _MAX_LISTED_KEYS:
        shown += ", ..."
    return applied, [f"key '{k}' is not in the state schema (allowed: {shown})" for k in unknown]


def validate_and_merge(
    state: dict[str, Any],
    patch: dict[str, Any],
    policy: PatchPolicy,
    *,
    source: str | bytes | None = None,
    within: tuple[str, ...] = (),
) -> Transition:
    """Validate ``patch`` under ``policy`` and merge it into ``state`` (RFC 7386).

    ``source``: the JSON text ``patch`` was parsed from (with orjson), the patch at
    ``within`` in it (``("state_patch",)`` in an envelope's text; ``()``: the text is the
    patch). With it, an integer beyond 64 bits in the patch, which orjson read as the
    nearest float, is an error naming where it is: the state would silently hold another
    number (and orjson cannot write the integer itself). The text is read again only when
    the patch holds a float of magnitude 2**63 or more, to tell such an integer from a float
    written as one (``1e30`` stays a float). Without ``source`` nothing can tell them apart.

    Checks, in order: the patch is an object of JSON values no deeper than
    ``max_depth``, with no integer beyond 64 bits; its compact size ≤ ``max_patch_bytes``;
    its top-level keys are in ``allowed_keys`` (reject, or drop with a warning); each
    patched key's merged value has its ``key_types`` type (``null`` deletes and is always
    allowed); the merged state's compact size ≤ ``max_state_bytes``; the merged state
    satisfies ``state_schema``. Neither ``state`` nor ``patch`` is mutated.
    """
    warnings: list[str] = []
    problems = _patch_problems(patch, policy, source, within)
    if problems:
        return _fail(problems, warnings)
    applied, errors = _allowed_part(patch, policy, warnings)

    new_state = merge_patch(state, applied)
    for key, change in applied.items():
        expected = policy.key_types.get(key)
        if expected is None or change is None:
            continue
        merged = new_state[key]
        if not _type_matches(expected, merged):
            errors.append(f"key '{key}' must be {expected}, got {_json_type(merged)}")
    if errors:
        return _fail(errors, warnings)

    state_json = _dumped(new_state)
    if isinstance(state_json, str):
        return _fail([f"merged state is not serializable: {state_json}"], warnings)
    size = len(state_json)
    if size > policy.max_state_bytes:
        return _fail(
            [f"merged state would be {size} bytes, over the {policy.max_state_bytes}-byte limit"],
            warnings,
        )

    validator = policy._validator
    if validator is not None:
        found = sorted(validator.iter_errors(new_state), key=relevance, reverse=True)
        if found:
            return _fail(
                [
                    f"state_schema violation {_at(tuple(err.absolute_path))}: {_clip(err.message)}"
                    for err in found[:_MAX_SCHEMA_ERRORS]
                ],
                warnings,
            )

    return Transition(True, new_state, _copy_json(applied), [], warnings, state_json)
