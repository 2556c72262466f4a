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
