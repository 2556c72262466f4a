"""Whole numbers a person or a client types: the digits 0-9 and nothing else."""

from __future__ import annotations


def whole_number(text: str) -> int | None:
    """``text`` as a whole number written in the digits 0-9 (no sign, blank, ``_`` or other
    scripts' digits); None when it is not one. ``str.isdigit()`` alone is also true of
    ``²``, which ``int()`` refuses; ``int()`` alone reads ``1_000`` and a full-width ``１``."""
    return int(text) if text.isascii() and text.isdigit() else None
