"""Budgets that hold across replicas (issue 26): three real proxy processes sharing one
PostgreSQL store (the ledger) and one Redis (the holds), in front of the fake provider,
driven by the real SDKs. 20 calls at once against a budget with room for 5 worst cases."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.conftest import proxy_env
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER

from .replicas import Replica, ReplicaSet

# $0.001 per output token, input free: max_tokens 100 is a worst case of $0.10, and the fake
# writes the 100 tokens, so each call that passes costs exactly its worst case.
CONFIG = {
    "retry_max_attempts": 1,
    "auth_cache_ttl": 0,
    "prices": {"m": {"input_per_mtok": 0, "output_per_mtok": 1_000}},
}


def make_key(reps: ReplicaSet, tmp_path: Path, *args: str) -> str:
    made = subprocess.run(
        [sys.executable, "-m", "skillstate", "keys", "--data-dir", str(tmp_path / "cli"),
         "--config", str(reps[0].root / "skillstate.json"), "create", *args],
        env=proxy_env(), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    key = re.search(r"sk-ss-\S+", made.stdout)
    assert key is not None, made.stdout + made.stderr
    return key[0]


async def call(replica: Replica, key: str, route: int, headers: dict[str, str]) -> int | str:
    """One call with max tokens 100 on chat completions, Messages or Responses."""
    try:
        if route == 1:
            ac = anthropic.AsyncAnthropic(base_url=replica.url, api_key=key, max_retries=0)
            async with ac:
                await ac.messages.create(
                    model="m", max_tokens=100, messages=[{"role": "user", "content": "hi"}],
                    extra_headers=headers,
                )  # fmt: skip
            return 200
        oc = openai.AsyncOpenAI(base_url=replica.v1, api_key=key, max_retries=0, timeout=120)
        async with oc:
            if route == 0:
                await oc.chat.completions.create(
                    model="m", max_tokens=100, messages=[{"role": "user", "content": "hi"}],
                    extra_headers=headers,
                )  # fmt: skip
            else:
                await oc.responses.create(
                    model="m", max_output_tokens=100, input="hi", extra_headers=headers
                )
        return 200
    except (openai.APIStatusError, anthropic.APIStatusError) as e:
        return f"{e.status_code} {e.message}"


def burst(reps: ReplicaSet, key: str, headers_of: Any) -> list[int | str]:
    async def run() -> list[int | str]:
        calls = (call(reps[i % 3], key, i % 3, headers_of(i)) for i in range(20))
        return list(await asyncio.gather(*calls))

    return asyncio.run(run())


def check_burst(results: list[int | str], budget_refusal: str) -> int:
    """At most 5 of the 20 calls passed, every other one was refused by the budget (429) or,
    on a machine loaded enough for a Redis call to time out, by the coordination (503:
    nothing sent); exactly 5 passed unless the latter happened. Returns how many passed."""
    passed = results.count(200)
    by_budget = [r for r in results if str(r).startswith("429 ") and budget_refusal in str(r)]
    unreachable = [r for r in results if str(r).startswith("503 ") and "(Redis)" in str(r)]
    assert passed + len(by_budget) + len(unreachable) == 20, results
    assert passed <= 5 and (passed == 5 or unreachable), results
    return passed


def spent(reps: ReplicaSet, key: str, **params: str) -> float:
    r = reps[0].http.get(
        reps[0].url + "/cost", params=params, headers={"authorization": f"Bearer {key}"}
    )
    assert r.status_code == 200, r.text
    return float(r.json()["totals"]["cost_usd"] or 0.0)


def test_a_key_budget_holds_across_three_replicas(
    tmp_path: Path, fake: FakeProvider, pg_url: str, redis_url: str
) -> None:
    reps = ReplicaSet(
        tmp_path, fake.url + "/v1", store=pg_url, coordination=redis_url, n=3, config=CONFIG
    )
    try:
        key = make_key(reps, tmp_path, "--name", "team", "--budget-usd-per-day", "0.5")
        reps.start()
        fake.enqueue(*[Reply(usage={"completion_tokens": 100}) for _ in range(20)])
        results = burst(reps, key, lambda i: {SESSION_HEADER: f"k{i}"})
        passed = check_burst(results, "daily budget $0.5 reached")
        assert len(fake.requests) == passed
        total = spent(reps, key)
        assert total == pytest.approx(0.1 * passed) and total <= 0.5 + 1e-9
    finally:
        reps.close()
        print(reps.logs())


def test_a_session_budget_holds_across_three_replicas(
    tmp_path: Path, fake: FakeProvider, pg_url: str, redis_url: str
) -> None:
    """One session's 20 calls at once on three replicas (passthrough: its turns do not wait
    on each other), its budget set by the first: 5 pass; another session goes on."""
    reps = ReplicaSet(
        tmp_path, fake.url + "/v1", store=pg_url, coordination=redis_url, n=3,
        config={**CONFIG, "mode": "passthrough"},
    )  # fmt: skip
    try:
        key = make_key(reps, tmp_path, "--name", "team")
        reps.start()
        fake.enqueue(*[Reply(usage={"completion_tokens": 100}) for _ in range(21)])
        first = reps[0].http.post(
            reps[0].v1 + "/chat/completions",
            json={"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "x"}]},
            headers={"authorization": f"Bearer {key}", SESSION_HEADER: "run",
                     "x-skillstate-budget-usd": "0.6"},
        )  # fmt: skip
        assert first.status_code == 200, first.text  # $0.10 of $0.60 spent: room for 5
        results = burst(reps, key, lambda i: {SESSION_HEADER: "run"})
        check_burst(results, "session 'run': budget $0.6 reached")
        assert spent(reps, key, session="run") <= 0.6 + 1e-9
        assert asyncio.run(call(reps[1], key, 0, {SESSION_HEADER: "other"})) == 200
    finally:
        reps.close()
        print(reps.logs())
