"""The small checks every dialect's request validation shares: one definition of "an
integer" (``bool`` is not one), "a number", and the 400 that names a bad member."""

from __future__ import annotations

from typing import Any, TypeGuard

from ..errors import ProxyError


def bad_request(message: str, param: str | None = None) -> ProxyError:
    """An ``invalid_request`` error (400) naming the offending member ``param``."""
    return ProxyError("invalid_request", message, param=param)


def is_int(value: Any) -> TypeGuard[int]:
    """Whether ``value`` is an integer (JSON ``true``/``false`` are not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether ``value`` is an integer or a float (JSON ``true``/``false`` are not)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
