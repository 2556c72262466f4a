"""Awaiting work that must finish even when the awaiting task is cancelled (a client that
went away): a commit, a lease's release, a Redis call whose effect must be known before
what follows it is sent."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


async def uncancellable(work: Awaitable[T]) -> T:
    """Await ``work`` to its end even if the caller is cancelled meanwhile; a cancellation
    that arrived is re-raised once ``work`` is done."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True
        except Exception:
            break  # work's own failure: task.result() raises it below
    if cancelled:
        raise asyncio.CancelledError
    return task.result()


async def shielded(coro: Awaitable[Any]) -> None:
    """Finish cleanup even if the surrounding task is being cancelled (the cancellation is
    swallowed: the caller is on its way out already)."""
    task = asyncio.ensure_future(coro)
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.shield(task)
    if not task.done():
        await task
