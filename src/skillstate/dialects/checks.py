"""The small checks every dialect's request validation shares: one definition of "an
integer" (``bool`` is not one), "a number", a number within the provider's documented
bounds, and the 400 that names a bad member."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

from ..errors import ProxyError


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ProxyError:
    """An ``invalid_request`` error (400) naming the offending member ``param``; ``code`` as
    the provider names the case (OpenAI's ``invalid_value``, ``missing_required_parameter``)."""
    return ProxyError("invalid_request", message, param=param, code=code)


def is_int(value: Any) -> TypeGuard[int]:
    """Whether ``value`` is an integer (JSON ``true``/``false`` are not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_one_of(value: Any, choices: frozenset[str]) -> bool:
    """Whether ``value`` is one of ``choices``. A client's list or object is never one, and
    is unhashable: ``value in choices`` would raise instead of answering no."""
    return isinstance(value, str) and value in choices


def is_number(value: Any) -> bool:
    """Whether ``value`` is an integer or a float (JSON ``true``/``false`` are not)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def json_type(value: Any) -> str:
    """What ``value`` is, named as JSON names it ("a string", "an array"...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def check_bounds(
    body: Mapping[str, Any],
    key: str,
    low: float | None,
    high: float | None,
    *,
    integer: bool = False,
) -> None:
    """400 when ``body[key]`` is present (not null) and is not a number (an integer when
    ``integer``) within ``low``..``high`` (inclusive; None: unbounded on that side). JSON
    has no NaN or Infinity (the body parser refuses them), so every number compares."""
    value = body.get(key)
    if value is None:
        return
    kind = "an integer" if integer else "a number"
    if not (is_int(value) if integer else is_number(value)):
        raise bad_request(f"'{key}' must be {kind}; got {json_type(value)}", key, "invalid_type")
    if (low is not None and value < low) or (high is not None and value > high):
        if low is not None and high is not None:
            span = f"between {low:g} and {high:g}"
        else:
            span = f"at least {low:g}" if low is not None else f"at most {high:g}"
        raise bad_request(f"'{key}' must be {kind} {span}; got {value!r}", key, "invalid_value")


def validate_allowed_tools(mode: Any, tools: Any, path: str) -> None:
    """An ``allowed_tools`` choice's ``mode`` and ``tools`` (the SDK's ToolChoiceAllowedParam,
    and chat's ChatCompletionAllowedToolsParam: both Required), which the translations read."""
    if mode not in ("auto", "required"):
        raise bad_request(f'{path}.mode: must be "auto" or "required"', f"{path}.mode")
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and isinstance(t.get("type"), str) for t in tools
    ):
        raise bad_request(
            f"{path}.tools: must be an array of tool objects with a type", f"{path}.tools"
        )
