"""Turns cancelled by their clients at random moments leave every session usable: the next
turn of each succeeds and the steps stay contiguous (no commit lost, none applied twice)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from typing import Any

import httpx

from tests.conftest import StartProxy
from tests.fakeprovider import FakeProvider, RecordedRequest, Reply
from tests.helpers import SESSION_HEADER

SESSIONS = [f"c{i}" for i in range(16)]
CONCURRENCY = 64  # abandoned turns in flight at once, over the 16 sessions
ROUNDS = 10
ABORT_WITHIN = 0.3  # seconds: about the time a round takes, so aborts land in every stage


def envelope(n: int) -> str:
    return f"ok\n```json\n{json.dumps({'state_patch': {'notes': f'n{n}'}, 'action': 'next'})}\n```"


async def _turn(c: httpx.AsyncClient, url: str, session: str, stream: bool) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}], "stream": stream}
    if not stream:
        return await c.post(url, json=body, headers={SESSION_HEADER: session})
    async with c.stream("POST", url, json=body, headers={SESSION_HEADER: session}) as r:
        await r.aread()
        return r


async def _abort_turns(c: httpx.AsyncClient, url: str, rng: random.Random) -> None:
    """Turns on random sessions, each abandoned by its client after a random delay (some
    before the upstream answers, some while the proxy commits, some after)."""

    async def abandoned() -> None:
        turn = _turn(c, url, rng.choice(SESSIONS), stream=rng.random() < 0.25)
        with contextlib.suppress(asyncio.TimeoutError, httpx.HTTPError):
            await asyncio.wait_for(turn, timeout=rng.uniform(0.0, ABORT_WITHIN))

    await asyncio.gather(*(abandoned() for _ in range(CONCURRENCY)))


async def _rounds(url: str, rng: random.Random, fake: FakeProvider) -> list[httpx.Response]:
    """Rounds of abandoned turns, each followed by one ordinary turn per session.

    The abandoned turns have a client of their own per round, with a pool that never makes
    a request wait: httpcore (1.0.9) leaks a pool slot for good when a request is cancelled
    while it waits for a connection (encode/httpcore#1093), and enough of those made the
    ordinary turns fail with PoolTimeout, the proxy never asked."""
    failed: list[httpx.Response] = []
    no_waiting = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=30, limits=no_waiting) as c:
        for _ in range(ROUNDS):
            async with httpx.AsyncClient(timeout=30, limits=no_waiting) as aborting:
                await _abort_turns(aborting, url, rng)
            replies = await asyncio.gather(*(_turn(c, url, s, stream=False) for s in SESSIONS))
            failed += [r for r in replies if r.status_code != 200]
    return failed


def test_turns_cancelled_at_random_moments_leave_every_session_usable(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    rng = random.Random(1213)
    counter = iter(range(10**9))

    def answer(rec: RecordedRequest) -> Reply:
        return Reply(text=envelope(next(counter)), delay=rng.uniform(0.0, 0.02))

    fake.responder = answer
    p = start_proxy(fake.url + "/v1", "--schema", "facts,notes,step")
    failed = asyncio.run(_rounds(p.v1 + "/chat/completions", rng, fake))
    assert [(r.status_code, r.text[:200]) for r in failed] == []
    for session in SESSIONS:
        doc = p.get("/state", params={"session": session, "history": "1"}).json()
        history: list[dict[str, Any]] = doc["history"]
        assert [t["step"] for t in history] == list(range(1, doc["step"] + 1)), session
