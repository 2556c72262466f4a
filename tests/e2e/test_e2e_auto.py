"""``mode: auto`` by expected bill (issue 14 §4), end to end: the real proxy (in-process), the
real openai SDK, the fake provider billing prompt caching like OpenAI's API."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from skillstate.engine.window import CHECKPOINT_MARK
from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, RecordedRequest
from tests.helpers import SESSION_HEADER, oai

PRICES = {
    "input_per_mtok": 2.0,
    "output_per_mtok": 10.0,
    "cache_read_per_mtok": 1.0,
    "cache_write_per_mtok": 2.0,
}


def envelope(step: int) -> str:
    body = {"state_patch": {"step": step}, "action": "next"}
    return f"Step {step}.\n```json\n{json.dumps(body)}\n```"


@pytest.fixture
def cached_fake() -> Iterator[FakeProvider]:
    fp = FakeProvider(cache="openai").start()
    yield fp
    fp.stop()


def start(start_proxy: StartProxy, fake: FakeProvider) -> Proxy:
    return start_proxy(
        fake.url + "/v1",
        "--mode",
        "auto",
        config={"schema": ["step"], "prices": {"m": PRICES}},
    )


def like_a_model(request: RecordedRequest) -> str:
    """A model writes the envelope when the request asks for one (a checkpoint), only then."""
    turn = sum(m["role"] == "user" for m in request.json["messages"])
    asked = CHECKPOINT_MARK in json.dumps(request.json["messages"][-1])
    return envelope(turn) if asked else f"Step {turn}."


def chat(
    p: Proxy,
    fake: FakeProvider,
    session: str,
    observations: list[str],
    mode: str = "auto",
    responder: Any = like_a_model,
) -> list[dict[str, str]]:
    """A session of len(observations) turns; returns each reply's headers."""
    fake.responder = responder
    c = oai(p, "k")
    transcript: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    out = []
    for obs in observations:
        transcript.append({"role": "user", "content": obs})
        raw = c.chat.completions.with_raw_response.create(
            model="m",
            messages=transcript,  # type: ignore[arg-type]
            extra_headers={SESSION_HEADER: session, "x-skillstate-mode": mode},
        )
        out.append(dict(raw.headers))
        transcript.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
    return out


def test_a_short_chat_stays_in_passthrough_and_bills_what_passthrough_bills(
    cached_fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(start_proxy, cached_fake)
    said = ["Hi!", "What is 2 + 2?", "Thanks."]
    auto = chat(p, cached_fake, "short-auto", said)
    n = len(cached_fake.requests)
    chat(p, cached_fake, "short-pass", said, mode="passthrough")
    assert [h["x-skillstate-context"] for h in auto] == ["passthrough"] * 3
    assert all("x-skillstate-transition" not in h for h in auto)  # no envelope, no state
    # The upstream got exactly what passthrough sends: the client's transcript untouched
    # (an auto passthrough reply is not stripped: it asked for no envelope).
    for a, b in zip(cached_fake.requests[:n], cached_fake.requests[n:], strict=True):
        assert a.json["messages"] == b.json["messages"]
    totals = {
        s: p.get("/cost", params={"session": s}).json()["totals"]
        for s in ("short-auto", "short-pass")
    }
    assert totals["short-auto"]["cost_usd"] == totals["short-pass"]["cost_usd"] > 0
    assert totals["short-auto"]["input_tokens"] == totals["short-pass"]["input_tokens"]
    # Nothing was added and nothing stripped: the baseline is the call, the saving 0.
    assert totals["short-auto"]["saved_cost_usd"] == 0
    assert p.get("/state", params={"session": "short-auto"}).status_code == 404


# The fake provider's cache read at 0.1x input (OpenAI's, priced as GPT-5) and at 0.5x.
READ_01 = {**PRICES, "cache_read_per_mtok": 0.2}


def long_envelope(request: RecordedRequest) -> str:
    """like_a_model, with an envelope of a few hundred tokens (a coding agent's state)."""
    reply = like_a_model(request)
    if "```json" not in reply:
        return reply
    turn = sum(m["role"] == "user" for m in request.json["messages"])
    body = {"state_patch": {"step": turn}, "action": "edited the parser; " * 60}
    return f"Step {turn}.\n```json\n{json.dumps(body)}\n```"


@pytest.mark.parametrize(
    "prices, responder, auto_compact, form",
    [
        # auto_compact: the recent turns read at 0.1x and a long envelope: the window
        (READ_01, long_envelope, True, "window"),
        # auto_compact: read at 0.5x and a short envelope: compact
        (PRICES, like_a_model, True, "compact"),
        # by default compact is no candidate: the window
        (PRICES, like_a_model, False, "window"),
    ],
    ids=["window", "compact", "default"],
)
def test_a_long_session_switches_once_into_the_cheaper_form_and_stays(
    cached_fake: FakeProvider,
    start_proxy: StartProxy,
    prices: Any,
    responder: Any,
    auto_compact: bool,
    form: str,
) -> None:
    p = start_proxy(
        cached_fake.url + "/v1",
        "--mode",
        "auto",
        config={"schema": ["step"], "prices": {"m": prices}, "auto_compact": auto_compact},
    )
    observations = [f"Observation {t}: " + "log line with numbers 12345 " * 30 for t in range(100)]
    headers = chat(p, cached_fake, "long", observations, responder=responder)
    contexts = [h["x-skillstate-context"] for h in headers]
    switch = contexts.index("checkpoint")
    assert switch >= 1  # it starts in passthrough
    assert contexts[:switch] == ["passthrough"] * switch
    # The switch is a checkpoint that builds the state; the cheaper form from then on (the
    # window checkpoints now and then).
    forms = {form, "checkpoint"} if form == "window" else {form}
    assert set(contexts[switch + 1 :]) == forms
    assert contexts.count("checkpoint") < (100 - switch) / 2  # checkpoints, not every turn
    # The switch turn's request is the client's transcript as it was, plus the instruction
    # (the prefix the passthrough turns cached is read again).
    before, at = cached_fake.requests[switch - 1].json, cached_fake.requests[switch].json
    assert at["messages"][: len(before["messages"])] == before["messages"]
    # The estimates behind each decision are in x-skillstate-auto.
    decided = headers[switch]["x-skillstate-auto"]
    assert "saving_usd=" in decided and "window_usd=" in decided and "compact_usd=" in decided
    # The envelope's real size, known after the switch, settles window or compact.
    assert f"form={form}" in headers[switch + 1]["x-skillstate-auto"]
    figures = dict(kv.split("=") for kv in decided.split("; "))
    assert float(figures["saving_usd"]) > 0
    before_f = dict(kv.split("=") for kv in headers[switch - 1]["x-skillstate-auto"].split("; "))
    # The turn before it saw no saving, or the window's checkpoint rule put the switch off
    # (the switch is the window's first checkpoint).
    assert float(before_f["saving_usd"]) <= 0 or before_f.get("put_off") == "True"
    # The switch built the state; the turns after it keep it.
    assert "step" in p.state("long")["state"]
    # ... and in the transition history: the checkpoint that built it, with the estimates.
    history = p.get("/state", params={"session": "long", "history": "1"}).json()["history"]
    assert history[0]["context"] == "checkpoint" and history[0]["status"] == "valid"
    assert history[0]["estimate"]["saving_usd"] > 0
    assert {h["context"] for h in history[1:]} == forms
    by_context = p.get("/cost", params={"session": "long", "group_by": "context"}).json()
    groups = {g["key"]: g["requests"] for g in by_context["groups"]}
    assert groups["passthrough"] == switch
    assert sum(groups.get(f, 0) for f in {*forms, "checkpoint"}) == 100 - switch
