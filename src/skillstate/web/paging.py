"""``limit`` and ``cursor`` of the paginated ``/state`` listings.

A cursor is opaque to clients: base64url of a small JSON object that names the listing it
belongs to and where the previous page ended. Anything else is a 400, never a 500.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

from ..errors import ProxyError
from ..numbertext import whole_number

SESSIONS_PAGE = 100  # default sessions per page
HISTORY_PAGE = 1000  # default transitions per page
MAX_PAGE = 1000


def parse_limit(value: str | None, default: int, most: int = MAX_PAGE) -> int:
    """The page size asked for: an integer in 1..``most``, else a 400."""
    if value is None:
        return default
    limit = whole_number(value)
    if limit is None or not 1 <= limit <= most:
        raise ProxyError(
            "invalid_request", f"limit must be an integer from 1 to {most}", param="limit"
        )
    return limit


def encode_cursor(kind: str, position: list[Any]) -> str:
    """An opaque cursor for the page after ``position`` in listing ``kind``."""
    raw = orjson.dumps({"k": kind, "p": position})
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(value: str, kind: str) -> list[Any]:
    """The position a cursor of listing ``kind`` stands for; a 400 for anything else."""
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        doc = orjson.loads(raw)
    except (binascii.Error, ValueError):
        doc = None
    if not isinstance(doc, dict) or doc.get("k") != kind or not isinstance(doc.get("p"), list):
        raise ProxyError("invalid_request", "invalid cursor for this listing", param="cursor")
    position: list[Any] = doc["p"]
    return position
