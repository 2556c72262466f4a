"""Limits that hold across replicas (#17): three real proxy processes sharing one Redis, in
front of the fake provider, driven by the real openai SDK. Each replica has its own data dir
(and SQLite store): what is shared here is the upstream's rpm/tpm windows and its breaker.
Every request is its own session, so no two requests wait on each other's session."""

from __future__ import annotations

import asyncio
import itertools
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai

from tests.conftest import proxy_env
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER

from .replicas import Replica, ReplicaSet

_sessions = itertools.count()
# A prompt of a few thousand estimated tokens: a handful of them fill the tpm window.
BIG = "lorem ipsum dolor sit amet " * 400


def start(
    start_replicas: Callable[..., ReplicaSet],
    fake: FakeProvider,
    redis_url: str,
    **upstream: Any,
) -> ReplicaSet:
    cfg = {
        "upstreams": [{"name": "a", "url": fake.url + "/v1", **upstream}],
        "retry_max_attempts": 1,
        "failure_threshold": 5,
        "open_cooldown": 1.0,
    }
    # store None: each replica its own SQLite in its data dir.
    return start_replicas(fake.url + "/v1", None, redis_url, n=3, config=cfg)


async def turn(replica: Replica, content: str = "hello") -> int | openai.APIStatusError:
    """One chat turn through the openai SDK (no retries of its own): 200 or the error."""
    client = openai.AsyncOpenAI(base_url=replica.v1, api_key="sk-client", max_retries=0)
    try:
        await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": content}],
            extra_headers={SESSION_HEADER: f"s{next(_sessions)}"},
            timeout=60,
        )
        return 200
    except openai.APIStatusError as e:
        return e
    finally:
        await client.close()


async def burst(
    reps: ReplicaSet, n: int, content: str = "hello"
) -> list[int | openai.APIStatusError]:
    """``n`` turns at once, spread over the replicas."""
    return await asyncio.gather(*(turn(reps[i % len(reps)], content) for i in range(n)))


def limits_everywhere(reps: ReplicaSet, window: str) -> list[Any]:
    return [r.upstream("a")["limits"][window] for r in reps]


def test_rpm_30_across_three_replicas_admits_exactly_30_of_90(
    start_replicas: Callable[..., ReplicaSet], fake: FakeProvider, redis_url: str
) -> None:
    reps = start(start_replicas, fake, redis_url, rpm=30)
    results = asyncio.run(burst(reps, 90))
    refused = [r for r in results if not isinstance(r, int)]
    assert results.count(200) == 30 and len(refused) == 60
    for e in refused:
        assert e.status_code == 429
        assert e.response.json()["error"]["code"] == "local_rate_limit"
        assert 1 <= int(e.response.headers["retry-after"]) <= 60
    assert len(fake.requests) == 30  # nothing refused reached the upstream
    assert limits_everywhere(reps, "rpm") == [{"limit": 30, "used": 30}] * 3
    for r in reps:  # /metrics reads the shared window too
        text = r.http.get(r.url + "/metrics").text
        assert 'skillstate_upstream_window_used{upstream="a",window="rpm"} 30.0' in text


def test_tpm_across_replicas_reserves_the_estimate_then_settles_the_real_usage(
    start_replicas: Callable[..., ReplicaSet], fake: FakeProvider, redis_url: str
) -> None:
    tpm = 20_000
    reps = start(start_replicas, fake, redis_url, tpm=tpm)
    # One turn held in flight at the upstream: every replica sees its estimate reserved.
    hold = threading.Event()
    fake.enqueue(Reply(usage={"prompt_tokens": 30, "completion_tokens": 7}, hold=hold))

    async def first() -> int | openai.APIStatusError:
        task = asyncio.ensure_future(turn(reps[0], BIG))
        await fake.wait_for_async(lambda reqs: len(reqs) == 1, timeout=30)
        estimate = await asyncio.to_thread(limits_everywhere, reps, "tpm")
        assert len({e["used"] for e in estimate}) == 1 and estimate[0]["used"] > 37
        held.append(estimate[0]["used"])
        hold.set()
        return await task

    held: list[int] = []
    assert asyncio.run(first()) == 200
    estimate = held[0]
    # Settled: the window holds the 37 tokens the upstream reported, on every replica.
    assert limits_everywhere(reps, "tpm") == [{"limit": tpm, "used": 37}] * 3
    # 90 turns of the same size at once; each really uses its estimate, so exactly as many
    # as fit in what is left are admitted.
    fits = (tpm - 37) // estimate
    assert 0 < fits < 90
    for _ in range(fits):
        fake.enqueue(Reply(usage={"prompt_tokens": estimate, "completion_tokens": 0}))
    results = asyncio.run(burst(reps, 90, BIG))
    refused = [r for r in results if not isinstance(r, int)]
    assert results.count(200) == fits and len(refused) == 90 - fits
    for e in refused:
        assert e.status_code == 429 and 1 <= int(e.response.headers["retry-after"]) <= 60
    assert len(fake.requests) == 1 + fits
    assert limits_everywhere(reps, "tpm") == [{"limit": tpm, "used": 37 + fits * estimate}] * 3


def test_breaker_failing_across_replicas_opens_for_all_and_one_probe_goes_out(
    start_replicas: Callable[..., ReplicaSet], fake: FakeProvider, redis_url: str
) -> None:
    reps = start(start_replicas, fake, redis_url)
    fake.enqueue(*[Reply(status=500) for _ in range(5)])
    for i in range(5):  # one failure on each replica in turn
        result = asyncio.run(turn(reps[i % 3]))
        assert not isinstance(result, int) and result.status_code == 500
    for r in reps:
        up = r.upstream("a")
        assert (up["circuit"], up["consecutive_failures"]) in {("open", 5), ("half_open", 5)}
    assert len(fake.requests) == 5
    # Half open once the cooldown is over, as every replica reads it.
    deadline = time.monotonic() + 30
    while any(r.upstream("a")["circuit"] != "half_open" for r in reps):
        assert time.monotonic() < deadline, [r.upstream("a") for r in reps]
        time.sleep(0.1)
    # 30 turns at once over the three replicas: the probe is held at the upstream until
    # all the others have been answered, so exactly one call can have gone out.
    hold = threading.Event()
    fake.enqueue(Reply(hold=hold))

    async def half_open_burst() -> list[int | openai.APIStatusError]:
        tasks = [asyncio.ensure_future(turn(reps[i % 3])) for i in range(30)]
        deadline = time.monotonic() + 60
        while len([t for t in tasks if t.done()]) < 29 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        hold.set()
        return [await t for t in tasks]

    results = asyncio.run(half_open_burst())
    refused = [r for r in results if not isinstance(r, int)]
    assert results.count(200) == 1 and len(refused) == 29
    assert all(e.status_code == 503 for e in refused)
    assert len(fake.requests) == 6  # exactly one probe reached the upstream
    for r in reps:  # its success closed the breaker for every replica
        up = r.upstream("a")
        assert (up["circuit"], up["consecutive_failures"]) == ("closed", 0)
    assert asyncio.run(turn(reps[2])) == 200


def test_a_client_keys_rpm_holds_across_replicas(
    tmp_path: Path, fake: FakeProvider, pg_url: str, redis_url: str
) -> None:
    """A key with --rpm 10, used through three replicas sharing PostgreSQL (where the key
    is, with the secret its digest is made with) and Redis (where its window is): 10 of 30
    turns at once are admitted."""
    reps = ReplicaSet(
        tmp_path, fake.url + "/v1", store=pg_url, coordination=redis_url, n=3,
        config={"retry_max_attempts": 1},
    )  # fmt: skip
    try:
        home = reps[0].root
        made = subprocess.run(
            [sys.executable, "-m", "skillstate", "keys", "--data-dir", str(tmp_path / "cli"),
             "--config", str(home / "skillstate.json"), "create", "--name", "team", "--rpm", "10"],
            env=proxy_env(), capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        key = re.search(r"sk-ss-\S+", made.stdout)
        assert key is not None, made.stdout + made.stderr
        reps.start()

        async def as_the_key(replica: Replica) -> int | openai.APIStatusError:
            client = openai.AsyncOpenAI(base_url=replica.v1, api_key=key[0], max_retries=0)
            try:
                await client.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": "hi"}],
                    extra_headers={SESSION_HEADER: f"k{next(_sessions)}"},
                )
                return 200
            except openai.APIStatusError as e:
                return e
            finally:
                await client.close()

        async def burst_as_key() -> list[int | openai.APIStatusError]:
            return await asyncio.gather(*(as_the_key(reps[i % 3]) for i in range(30)))

        results = asyncio.run(burst_as_key())
        refused = [r for r in results if not isinstance(r, int)]
        assert results.count(200) == 10 and len(refused) == 20, results
        for e in refused:
            assert e.status_code == 429 and e.response.json()["error"]["code"] == "key_rate_limit"
            assert 1 <= int(e.response.headers["retry-after"]) <= 60
        assert len(fake.requests) == 10
    finally:
        reps.close()
        print(reps.logs())
