"""The honest baseline (issue 14 §1) end to end: the real proxy (in-process) driven by the
real openai SDK and native /v1/messages over HTTP, against the fake provider.

Every expected figure is worked out in the test from the documented model
(``skillstate.cost.ledger`` and ``skillstate.cost.baseline`` docstrings): the baseline
transcript is the client's without the proxy's envelopes, its input is the reported input
scaled by the estimated size ratio, the prompt cache is modelled at message boundaries, each
boundary's share of the input in proportion to the estimated size of the prefix up to it
(``ceil(len(compact JSON) / 4)`` per piece, plus 4 per message).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from skillstate.cost.tokens import estimate_tokens
from skillstate.engine.context import CONTRACT_MARK
from tests.conftest import InProcessProxy, launch_in_process, proxy_env
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, oai

PRICES = {  # USD per million tokens, our own
    "input_per_mtok": 2.0,
    "output_per_mtok": 10.0,
    "cache_read_per_mtok": 0.2,
    "cache_write_per_mtok": 2.5,
}
ROW_FIELDS = (
    "kind, input_tokens, output_tokens, baseline_input_tokens, baseline_cached_tokens,"
    " baseline_output_tokens, cost_usd, baseline_cost_usd, saved_cost_usd, saved_cost_pct"
)


def reply_text(step: int) -> str:
    patch = {"step": step, "notes": f"did {step}"}
    return (
        "ok "
        + str(step)
        + "\n```json\n"
        + json.dumps({"state_patch": patch, "action": "go"})
        + "\n```"
    )


def prose(text: str) -> str:
    """The reply without its envelope, worked out by hand: the first line."""
    return text.split("\n", 1)[0]


def est(body: dict[str, Any]) -> int:
    return estimate_tokens([body.get("system"), body.get("messages"), body.get("tools")])


def piece_tokens(piece: Any, message: bool) -> int:
    """skillstate.cost.baseline's estimate of one piece of the prefix: a string content (or
    system) counts as its one text block."""
    if message and isinstance(piece.get("content"), str):
        piece = {**piece, "content": [{"type": "text", "text": piece["content"]}]}
    elif isinstance(piece, str):
        piece = [{"type": "text", "text": piece}]
    return -(-len(orjson.dumps(piece)) // 4) + (4 if message else 0)


def cumulative(pieces: list[tuple[Any, bool]]) -> list[int]:
    out, total = [], 0
    for piece, message in pieces:
        total += piece_tokens(piece, message)
        out.append(total)
    return out


def share(tokens: int, part: int, whole: int) -> int:
    return round(Fraction(tokens * part, whole))


def in_steps(tokens: int) -> int:
    """A cached prefix as OpenAI serves it: in whole steps of 128 tokens."""
    return tokens - tokens % 128


def base_output(out: int, text: str) -> int:
    kept = len(prose(text))  # the envelope (fences included) and the newline before it go
    envelope_chars = len(text) - kept - 1
    return round(Fraction(out * (len(text) - envelope_chars), len(text)))


@pytest.fixture(scope="module")
def env(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[FakeProvider, InProcessProxy, Path]]:
    tmp = tmp_path_factory.mktemp("baseline")
    fp = FakeProvider().start()
    config = {
        "schema": ["notes", "step"],
        "reply_envelope": "keep",  # the client's transcript carries the envelopes
        "upstreams": [
            {
                "name": "a",
                "url": fp.url,
                "kind": "anthropic",
                "api_key": "k",
                "models": ["claude-*"],
                "cache_min_tokens": 0,
            },
            {
                "name": "none",
                "url": fp.url + "/v1",
                "kind": "openai",
                "api_key": "k",
                "models": ["plain-*"],
                "cache_pricing": "none",
            },
            {
                "name": "real",  # OpenAI's own cache rules: from 1,024 tokens on
                "url": fp.url + "/v1",
                "kind": "openai",
                "api_key": "k",
                "models": ["gpt-real"],
            },
            {
                "name": "o",
                "url": fp.url + "/v1",
                "kind": "openai",
                "api_key": "k",
                "cache_min_tokens": 0,
            },
        ],
        "prices": {m: PRICES for m in ("plain-model", "gpt-mine", "gpt-real", "claude-mine")},
    }
    proxy = launch_in_process(tmp, config=config)
    try:
        yield fp, proxy, tmp / "data" / "skillstate.db"
    finally:
        proxy.stop()
        fp.stop()


def without_proxy_breakpoint(sent: dict[str, Any]) -> dict[str, Any]:
    """The body as the proxy estimated it: before the upstream layer marked the contract
    block with its cache_control breakpoint (issue 14 §2)."""
    first = sent["messages"][0]
    blocks = [
        {k: v for k, v in b.items() if k != "cache_control"}
        if b.get("text", "").startswith(CONTRACT_MARK)
        else b
        for b in first["content"]
    ]
    return {**sent, "messages": [{**first, "content": blocks}, *sent["messages"][1:]]}


def rows_of(db_path: Path, session: str) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(db_path)
    try:
        return db.execute(
            f"SELECT {ROW_FIELDS} FROM ledger WHERE session = ? ORDER BY ts", (session,)
        ).fetchall()
    finally:
        db.close()


def test_ten_turn_baseline_is_the_envelope_free_transcript(env: Any) -> None:
    fake, p, db = env
    fake.reset()
    session = {SESSION_HEADER: "ten"}
    transcript: list[dict[str, Any]] = [
        {"role": "system", "content": "You plan migrations."},
        {"role": "user", "content": "TASK: move billing to the new cluster."},
    ]
    clean: list[dict[str, Any]] = [dict(m) for m in transcript]  # built by hand, in step
    sent_clients, replies = [], []
    for turn in range(1, 11):
        if turn > 1:
            obs = {"role": "user", "content": f"Observation {turn}: " + "pods ready " * 30}
            transcript.append(obs)
            clean.append(obs)
        replies.append(reply_text(turn))
        fake.enqueue(Reply(text=replies[-1]))
        got = oai(p).chat.completions.create(
            model="plain-model", messages=transcript, extra_headers=session
        )
        content = got.choices[0].message.content or ""
        assert content == replies[-1]  # keep: the reply as the model wrote it
        sent_clients.append({"messages": list(clean)})
        transcript.append({"role": "assistant", "content": content})
        clean.append({"role": "assistant", "content": prose(content)})
    sent = [r.json for r in fake.requests]
    rows = rows_of(db, "ten")
    assert len(rows) == 10
    for i, row in enumerate(rows):
        kind, inp, out, b_in, b_cached, b_out, cost, b_cost, saved, _pct = row
        assert kind == "generation"
        assert b_in == round(Fraction(inp * est(sent_clients[i]), est(sent[i]))), i
        assert b_out == base_output(out, replies[i]), i
        assert b_cached == 0  # cache_pricing: none
        assert b_cost == pytest.approx((b_in * 2.0 + b_out * 10.0) / 1e6, abs=1e-12)
        assert saved == pytest.approx(b_cost - cost, abs=1e-9)
    # The envelopes are really out: the transcript as the client holds it is bigger.
    with_envelopes = {"messages": transcript[:-1]}
    assert est(with_envelopes) > est(sent_clients[-1])


def test_openai_cached_prefix_baseline_and_a_negative_saving(env: Any) -> None:
    fake, p, db = env
    fake.reset()
    session = {SESSION_HEADER: "oai-cache"}
    system = {"role": "system", "content": "You review code. " * 40}
    task = {"role": "user", "content": "TASK: review the diff."}
    first = reply_text(1)
    fake.enqueue(Reply(text=first))
    c = oai(p)
    c.chat.completions.create(model="gpt-mine", messages=[system, task], extra_headers=session)
    # Turn 1 sends the contract and the state on top of the transcript: it costs more than
    # the baseline, and says so with a negative saving.
    (row1,) = rows_of(db, "oai-cache")
    assert row1[8] < 0 and row1[9] < 0
    assert row1[8] == pytest.approx(row1[7] - row1[6], abs=1e-9)
    totals = httpx.get(p.url + "/cost", params={"session": "oai-cache"}).json()["totals"]
    assert totals["saved_cost_usd"] < 0 and totals["saved_cost_pct"] < 0

    reply2 = reply_text(2)
    fake.enqueue(Reply(text=reply2))
    obs = {"role": "user", "content": "The tests pass."}
    messages = [system, task, {"role": "assistant", "content": first}, obs]
    c.chat.completions.create(model="gpt-mine", messages=messages, extra_headers=session)
    _, inp, out, b_in, b_cached, b_out, cost, b_cost, saved, _ = rows_of(db, "oai-cache")[1]
    # The baseline request of turn 2: the envelope-free transcript. Its longest boundary
    # prefix that turn 1's baseline request also had ends after the task.
    clean2 = [system, task, {"role": "assistant", "content": prose(first)}, obs]
    points = cumulative([(m, True) for m in clean2])
    assert b_in == round(Fraction(inp * est({"messages": clean2}), est(fake.requests[1].json)))
    # ... served in OpenAI's steps of 128 tokens (the minimum is lowered to 0 here)
    assert b_cached == in_steps(share(b_in, points[1], points[-1])) > 0
    expected = ((b_in - b_cached) * 2.0 + b_cached * 0.2 + b_out * 10.0) / 1e6
    assert b_out == base_output(out, reply2)
    assert b_cost == pytest.approx(expected, abs=1e-12)
    assert saved == pytest.approx(b_cost - cost, abs=1e-9)


def test_openai_baseline_reads_what_openai_would_serve_the_unproxied_client(env: Any) -> None:
    """The baseline's cached tokens of a turn are what the provider bills the client's own
    (unproxied) request: OpenAI's rule, from 1,024 tokens on in steps of 128 (the fake
    provider's ``cache="openai"``)."""
    fake, p, db = env
    fake.reset()
    session = {SESSION_HEADER: "oai-steps"}
    # A shared prefix of about 1,215 tokens: mid-way between two steps (1,152 and 1,280),
    # so that the ledger's estimate and the fake's byte count fall in the same step.
    system = {"role": "system", "content": "You review code. " * 284}
    task = {"role": "user", "content": "TASK: review the diff."}
    first, reply2 = reply_text(1), reply_text(2)
    obs = {"role": "user", "content": "The tests pass."}
    c = oai(p)
    fake.enqueue(Reply(text=first), Reply(text=reply2))
    c.chat.completions.create(model="gpt-real", messages=[system, task], extra_headers=session)
    turn2 = [system, task, {"role": "assistant", "content": first}, obs]
    c.chat.completions.create(model="gpt-real", messages=turn2, extra_headers=session)
    b_cached = rows_of(db, "oai-steps")[1][4]

    # The same client without the proxy: the envelope-free transcripts, to OpenAI's rule.
    direct = FakeProvider(cache="openai").start()
    try:
        client = openai.OpenAI(base_url=direct.url + "/v1", api_key="k", max_retries=0)
        clean2 = [system, task, {"role": "assistant", "content": prose(first)}, obs]
        direct.enqueue(Reply(text="a"), Reply(text="b"))
        client.chat.completions.create(model="gpt-real", messages=[system, task])
        got = client.chat.completions.create(model="gpt-real", messages=clean2)
    finally:
        direct.stop()
    assert got.usage is not None and got.usage.prompt_tokens_details is not None
    served = got.usage.prompt_tokens_details.cached_tokens
    assert served == 1152  # the system and the task, in steps of 128
    assert b_cached == served


def test_anthropic_cached_prefix_baseline_reads_what_a_breakpoint_wrote(env: Any) -> None:
    fake, p, db = env
    fake.reset()
    headers = {SESSION_HEADER: "ant-cache", "anthropic-version": "2023-06-01"}
    system = [
        {"type": "text", "text": "You review code. " * 40, "cache_control": {"type": "ephemeral"}}
    ]
    task = {"role": "user", "content": "TASK: review the diff."}
    first = reply_text(1)

    def turn(messages: list[dict[str, Any]], text: str) -> None:
        fake.enqueue(Reply(text=text))
        body = {"model": "claude-mine", "max_tokens": 500, "system": system, "messages": messages}
        r = httpx.post(p.url + "/v1/messages", json=body, headers=headers, timeout=30)
        assert r.status_code == 200, r.text

    turn([task], first)
    unmarked_system = [{"type": "text", "text": system[0]["text"]}]
    # Turn 1: nothing cached yet; the client's breakpoint (end of system) writes that prefix.
    _, inp, out, b_in, b_cached, b_out, cost, b_cost, _, _ = rows_of(db, "ant-cache")[0]
    sent1 = without_proxy_breakpoint(fake.requests[0].json)
    assert b_in == round(Fraction(inp * est({"system": system, "messages": [task]}), est(sent1)))
    assert b_out == base_output(out, first)
    points = cumulative([(unmarked_system, False), (task, True)])
    write1 = share(b_in, points[0], points[-1])
    assert b_cached == 0
    expected = ((b_in - write1) * 2.0 + write1 * 2.5 + b_out * 10.0) / 1e6
    assert b_cost == pytest.approx(expected, abs=1e-12)

    reply2 = reply_text(2)
    obs = {"role": "user", "content": "The tests pass."}
    turn([task, {"role": "assistant", "content": first}, obs], reply2)
    _, _, out, b_in, b_cached, b_out, cost, b_cost, saved, _ = rows_of(db, "ant-cache")[1]
    clean2 = [task, {"role": "assistant", "content": prose(first)}, obs]
    points = cumulative([(unmarked_system, False), *((m, True) for m in clean2)])
    # Turn 2 reads the system prefix turn 1 wrote; its last breakpoint is that same prefix,
    # so nothing new is written.
    assert b_cached == share(b_in, points[0], points[-1]) > 0
    expected = ((b_in - b_cached) * 2.0 + b_cached * 0.2 + b_out * 10.0) / 1e6
    assert b_out == base_output(out, reply2)
    assert b_cost == pytest.approx(expected, abs=1e-12)
    assert saved == pytest.approx(b_cost - cost, abs=1e-9)


def test_cost_command_shows_token_and_dollar_savings_negative_as_negative(
    env: Any, tmp_path: Path
) -> None:
    fake, p, db = env
    fake.reset()
    fake.enqueue(Reply(text=reply_text(1)))
    oai(p).chat.completions.create(
        model="gpt-mine",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={SESSION_HEADER: "neg"},
    )
    saved = httpx.get(p.url + "/cost", params={"session": "neg"}).json()["totals"]
    assert saved["saved_cost_usd"] < 0
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "skillstate",
            "--data-dir",
            str(db.parent),
            "cost",
            "--session",
            "neg",
            "--since",
            "all",
        ],
        capture_output=True,
        text=True,
        env={**proxy_env(), "COLUMNS": "200"},
        cwd=tmp_path,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert f"-${abs(saved['saved_cost_usd']):,.4f}" in out.stdout
    assert "Baseline: your transcript without the proxy's envelopes" in out.stdout
    assert "saved tokens" in out.stdout
