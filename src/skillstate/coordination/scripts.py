"""Running the coordination's Lua scripts: EVALSHA by the script's SHA-1, and EVAL (which
also caches it on the server) the first time a server does not know it (a new or restarted
Redis). Imported only with ``coordination`` configured: it needs the redis package."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

_SHA: dict[str, str] = {}


def lua_now_us(argv: int) -> str:
    """Lua setting ``now`` (microseconds) from ``ARGV[argv]``, the caller's clock (a test's),
    or from the server's TIME when that argument is empty: every replica then shares one
    clock. ``n(x)`` formats a number for Redis (Lua's default would round microseconds)."""
    return f"""
local now
if ARGV[{argv}] ~= '' then
  now = tonumber(ARGV[{argv}])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function n(x) return string.format('%.0f', x) end
"""


async def run_script(redis: Redis, source: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """``source``'s reply on ``redis``, with ``keys`` and ``args``: one round trip (two
    the first time a server sees the script)."""
    sha = _SHA.get(source)
    if sha is None:
        sha = _SHA[source] = hashlib.sha1(source.encode()).hexdigest()
    try:
        return await redis.evalsha(sha, len(keys), *keys, *args)
    except NoScriptError:
        return await redis.eval(source, len(keys), *keys, *args)
