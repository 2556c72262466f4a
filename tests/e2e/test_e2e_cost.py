"""The usage, cost and savings ledger end to end: through the real proxy (in-process),
driven by the real openai SDK (and plain HTTP for native /v1/messages) against the fake
provider, and the `skillstate cost` command run as a separate process.

Every cost asserted here is worked out by hand in the test, from prices the test sets itself
(a price override) or from the provider's public list price (genai-prices' bundled data).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from skillstate.cost.tokens import estimate_tokens
from tests.conftest import InProcessProxy, Proxy, StartProxy, launch_in_process, proxy_env
from tests.fakeprovider import FakeProvider, Reply
from tests.fakeprovider import estimate_tokens as fake_prompt_tokens
from tests.helpers import SESSION_HEADER, envelope, listed_rates, oai

# Prices of our own (USD per million tokens), so every number below is ours.
MY_PRICES = {
    "input_per_mtok": 2.0,
    "output_per_mtok": 10.0,
    "cache_read_per_mtok": 0.2,
    "cache_write_per_mtok": 2.5,
}


def cost_of(p: Proxy, **params: Any) -> dict[str, Any]:
    r = p.get("/cost", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def usd(micro_dollars: float) -> float:
    """A hand-computed sum of tokens x USD-per-million, in USD."""
    return micro_dollars / 1_000_000


@dataclass
class Shared:
    """One fake provider and one proxy for the tests that only need distinct sessions."""

    fake: FakeProvider
    proxy: InProcessProxy
    data_dir: Path


@pytest.fixture(scope="module")
def shared_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    tmp = tmp_path_factory.mktemp("cost")
    fp = FakeProvider().start()
    config = {
        "schema": ["notes", "step"],
        "upstreams": [  # claude-* to the Anthropic-kind upstream, anything else to "o"
            {
                "name": "a",
                "url": fp.url,
                "kind": "anthropic",
                "api_key": "k",
                "models": ["claude-*"],
            },
            {"name": "o", "url": fp.url, "kind": "openai", "api_key": "k"},
        ],
        "prices": {
            "gpt-mine": MY_PRICES,
            "claude-mine": MY_PRICES,
            "eight-model": {"input_per_mtok": 1.0, "output_per_mtok": 2.0},
        },
        "retry_base_delay": 0,
        "retry_max_delay": 0,
        "purge_interval": 0.2,  # ledger_retention stays at its default of 90 days
    }
    proxy = launch_in_process(tmp, config=config)
    try:
        yield Shared(fp, proxy, tmp / "data")
    finally:
        proxy.stop()
        fp.stop()


@pytest.fixture
def shared(shared_env: Shared) -> Shared:
    shared_env.fake.reset()
    return shared_env


def run_cli(data_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "skillstate", "--data-dir", str(data_dir), "cost", *args],
        capture_output=True,
        text=True,
        env=proxy_env(),
        cwd=cwd,
        timeout=60,
    )


def ask(
    p: Proxy,
    client_kind: str,
    model: str,
    msgs: list[dict[str, Any]],
    session: str,
    streamed: bool,
) -> tuple[str, Mapping[str, str]]:
    """One turn; returns the reply text and the response headers.

    OpenAI clients use the openai SDK; the native Anthropic path is plain HTTP (the wire
    format is what matters here, and the anthropic SDK takes seconds to import)."""
    hdr = {SESSION_HEADER: session}
    if client_kind == "openai":
        c = oai(p)
        if streamed:
            stream = c.chat.completions.with_raw_response.create(
                model=model,
                messages=msgs,
                stream=True,
                extra_headers=hdr,
            )
            with stream.parse() as chunks:
                text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            return text, stream.headers
        raw = c.chat.completions.with_raw_response.create(
            model=model,
            messages=msgs,
            extra_headers=hdr,
        )
        return raw.parse().choices[0].message.content or "", raw.headers
    body = {"model": model, "max_tokens": 100, "messages": msgs, "stream": streamed}
    headers = {"x-api-key": "sk-client", "anthropic-version": "2023-06-01", **hdr}
    url = p.url + "/v1/messages"
    if not streamed:
        r = p.http.post(url, json=body, headers=headers, timeout=10)
        assert r.status_code == 200, r.text
        return "".join(b.get("text", "") for b in r.json()["content"]), r.headers
    text = ""
    with p.http.stream("POST", url, json=body, headers=headers, timeout=10) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if event.get("type") == "content_block_delta":
                    text += event["delta"].get("text", "")
    return text, r.headers


def test_streamed_and_unstreamed_turns_record_the_same_usage_and_cost(shared: Shared) -> None:
    fake, p = shared.fake, shared.proxy
    # OpenAI usage: prompt_tokens 1200 INCLUDES the 200 cached tokens.
    # Anthropic usage: input_tokens 1000 EXCLUDES the 150 cache-read and 50 cache-write tokens.
    usage = {"prompt_tokens": 1200, "completion_tokens": 80, "cached_tokens": 200}
    a_usage = {"prompt_tokens": 1000, "completion_tokens": 80, "cache_read": 150, "cache_write": 50}
    msgs = [{"role": "user", "content": "Summarise the incident report."}]
    text = envelope({"notes": "summarised"})
    cases = {
        # (client, model, usage) -> the same reply, once unstreamed and once streamed
        "oai-openai": ("openai", "gpt-mine", usage),
        "oai-anthropic": ("openai", "claude-mine", a_usage),  # translated
        "ant-anthropic": ("anthropic", "claude-mine", a_usage),  # native
    }
    for name, (client_kind, model, u) in cases.items():
        for streamed in (False, True):
            session = f"{name}-{'s' if streamed else 'n'}"
            fake.enqueue(Reply(text=text, usage=u))
            got, headers = ask(p, client_kind, model, msgs, session, streamed)
            assert got == "ok", (session, got)  # reply_envelope: strip (the default)
            if not streamed:
                unstreamed_header = headers.get("x-skillstate-cost-usd")

        plain = cost_of(p, session=f"{name}-n")["totals"]
        stream = cost_of(p, session=f"{name}-s")["totals"]
        assert plain.pop("attempts") == {**dict.fromkeys(stream["attempts"], 0), "generation": 1}
        assert stream.pop("attempts")["stream"] == 1
        assert plain == stream, name  # tokens, cost, baseline and savings: all identical

        # Both dialects normalise to input = everything read, cache parts included: 1200.
        assert plain["input_tokens"] == 1200, name
        assert plain["output_tokens"] == 80, name
        if model == "gpt-mine":
            assert (plain["cache_read_tokens"], plain["cache_write_tokens"]) == (200, 0)
            # 1000 plain x $2 + 200 cache-read x $0.2 + 80 output x $10 per million
            expected = usd(1000 * 2.0 + 200 * 0.2 + 80 * 10.0)  # = $0.00284
        else:
            assert (plain["cache_read_tokens"], plain["cache_write_tokens"]) == (150, 50)
            # 1000 plain x $2 + 150 x $0.2 + 50 x $2.5 + 80 x $10 per million
            expected = usd(1000 * 2.0 + 150 * 0.2 + 50 * 2.5 + 80 * 10.0)  # = $0.002955
        assert plain["cost_usd"] == pytest.approx(expected, abs=1e-12), name
        assert unstreamed_header is not None
        assert float(unstreamed_header) == pytest.approx(expected, abs=1e-8), name


@pytest.mark.parametrize(
    ("tier", "rates"),
    [(None, (1.25, 0.125, 10.0)), ("default", (1.25, 0.125, 10.0)),
     ("flex", (0.625, 0.0625, 5.0)), ("priority", (2.5, 0.25, 20.0))],
)  # fmt: skip
def test_a_call_is_priced_at_the_service_tier_its_reply_names(
    shared: Shared, tier: str | None, rates: tuple[float, float, float]
) -> None:
    """OpenAI bills flex at half its standard rates and priority at twice (gpt-5: $1.25 in,
    $0.125 cache read, $10 out per million standard, the bundled genai-prices list); the
    reply's ``service_tier`` names the tier that served the call. Streamed or not."""
    fake, p = shared.fake, shared.proxy
    usage = {"prompt_tokens": 1200, "completion_tokens": 80, "cached_tokens": 200}
    inp, read, out = rates
    expected = usd(1000 * inp + 200 * read + 80 * out)
    extra = {} if tier is None else {"service_tier": tier}
    for streamed in (False, True):
        session = f"tier-{tier}-{'s' if streamed else 'n'}"
        fake.enqueue(Reply(text=envelope({"notes": "x"}), usage=usage))
        kw: dict[str, Any] = {"stream_options": {"include_usage": True}} if streamed else {}
        c = oai(p).chat.completions
        raw = c.with_raw_response.create(
            model="gpt-5", messages=[{"role": "user", "content": "go"}], stream=streamed,
            extra_headers={SESSION_HEADER: session, "x-skillstate-mode": "passthrough"},
            **extra, **kw,
        )  # fmt: skip
        got = raw.parse()
        if streamed:
            chunks = list(got)  # type: ignore[call-overload]
            assert chunks[-1].service_tier == (tier or "default")
        sent = fake.last.json
        assert (sent["model"], sent.get("service_tier")) == ("gpt-5", tier)  # as the client asked
        assert cost_of(p, session=session)["totals"]["cost_usd"] == pytest.approx(expected)


@pytest.mark.parametrize("fast", [False, True])
def test_an_anthropic_fast_mode_call_is_priced_at_its_rates(shared: Shared, fast: bool) -> None:
    """Anthropic bills fast mode (``speed: "fast"``, its usage says so) at rates of its own
    (Claude Opus 5.5: twice the standard ones in genai-prices 0.2.3's list; a list without
    the variant prices it at the standard ones). Streamed or not."""
    fake, p = shared.fake, shared.proxy
    model = "claude-opus-5-5"
    inp, out = listed_rates("anthropic", model, {"speed": "fast"} if fast else None)
    expected = usd(1000 * inp + 80 * out)
    for streamed in (False, True):
        session = f"speed-{fast}-{'s' if streamed else 'n'}"
        fake.enqueue(
            Reply(
                text=envelope({"notes": "x"}),
                usage={"prompt_tokens": 1000, "completion_tokens": 80},
            )
        )
        body = {
            "model": model,
            "max_tokens": 100,
            "stream": streamed,
            "messages": [{"role": "user", "content": "go"}],
            **({"speed": "fast"} if fast else {}),
        }
        headers = {
            "x-api-key": "sk-client",
            "anthropic-version": "2023-06-01",
            SESSION_HEADER: session,
            "x-skillstate-mode": "passthrough",
        }
        r = p.http.post(p.url + "/v1/messages", json=body, headers=headers, timeout=10)
        assert r.status_code == 200, r.text
        assert fake.last.json.get("speed") == ("fast" if fast else None)
        assert cost_of(p, session=session)["totals"]["cost_usd"] == pytest.approx(expected)


def test_anthropic_cache_tokens_use_cache_prices_without_double_counting(shared: Shared) -> None:
    fake, p = shared.fake, shared.proxy
    # What an Anthropic upstream reports: input_tokens EXCLUDES the cache parts.
    wire = {
        "prompt_tokens": 1000,
        "cache_read": 6000,
        "cache_write": 3000,
        "completion_tokens": 400,
    }
    msgs = [{"role": "user", "content": "Continue the review."}]

    # 1) Our own prices: input $2, output $10, cache read $0.2, cache write $2.5 per million.
    #    Tokens read in total: 1000 + 6000 + 3000 = 10,000 (the ledger's input_tokens).
    #    cost = 1000 x 2        (plain input, cache parts NOT included)   =  2,000
    #         + 6000 x 0.2      (cache read)                              =  1,200
    #         + 3000 x 2.5      (cache write)                             =  7,500
    #         +  400 x 10       (output)                                  =  4,000
    #                                                                       ------
    #                                                        14,700 / 1e6 = $0.0147
    #    Double counting (billing all 10,000 as plain input on top of the cache prices) would
    #    give (10,000 x 2 + 1,200 + 7,500 + 4,000) / 1e6 = $0.0327.
    fake.enqueue(Reply(text=envelope({"notes": "a"}), usage=wire))
    raw = oai(p).chat.completions.with_raw_response.create(
        model="claude-mine",
        messages=msgs,
        extra_headers={SESSION_HEADER: "cache-mine"},
    )
    assert raw.headers["x-skillstate-pricing"] == "override"
    assert raw.headers["x-skillstate-cost-usd"] == "0.01470000"
    t = cost_of(p, session="cache-mine")["totals"]
    assert (t["input_tokens"], t["cache_read_tokens"], t["cache_write_tokens"]) == (
        10_000,
        6_000,
        3_000,
    )
    assert t["output_tokens"] == 400
    assert t["cost_usd"] == pytest.approx(0.0147, abs=1e-12)
    assert t["unknown_pricing_rows"] == 0

    # 2) A real model name, priced from genai-prices' bundled data. Claude Sonnet 4.5's list
    #    price: input $3, output $15, cache read $0.30, cache write (5 min) $3.75 per million.
    #    cost = 1000 x 3 + 6000 x 0.3 + 3000 x 3.75 + 400 x 15
    #         = 3,000 + 1,800 + 11,250 + 6,000 = 22,050 / 1e6 = $0.02205
    fake.enqueue(Reply(text=envelope({"notes": "b"}), usage=wire))
    raw = oai(p).chat.completions.with_raw_response.create(
        model="claude-sonnet-4-5",
        messages=msgs,
        extra_headers={SESSION_HEADER: "cache-real"},
    )
    assert raw.headers["x-skillstate-pricing"] == "known"
    assert raw.headers["x-skillstate-cost-usd"] == "0.02205000"
    t = cost_of(p, session="cache-real")["totals"]
    assert t["cost_usd"] == pytest.approx(0.02205, abs=1e-12)
    assert t["input_tokens"] == 10_000

    for session, model in (("cache-mine", "claude-mine"), ("cache-real", "claude-sonnet-4-5")):
        by = cost_of(p, session=session, group_by="upstream")
        assert [g["key"] for g in by["groups"]] == ["a"]  # the Anthropic-kind upstream
        by = cost_of(p, session=session, group_by="model")
        assert [g["key"] for g in by["groups"]] == [model]


def test_unknown_model_is_unknown_never_free(shared: Shared) -> None:
    fake, p = shared.fake, shared.proxy
    # The client asks for a known model, the upstream answers as a model nobody prices:
    # the ledger prices what the upstream reports.
    fake.enqueue(
        Reply(
            text=envelope({"notes": "x"}),
            model="acme-private-llm-7",
            usage={"prompt_tokens": 500, "completion_tokens": 20},
        )
    )
    raw = oai(p).chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={SESSION_HEADER: "unk"},
    )
    assert raw.headers["x-skillstate-pricing"] == "unknown"
    assert "x-skillstate-cost-usd" not in raw.headers
    s = cost_of(p, session="unk", group_by="model")
    t = s["totals"]
    assert t["cost_usd"] is None and t["baseline_cost_usd"] is None and t["saved_cost_usd"] is None
    assert t["unknown_pricing_rows"] == 1
    assert (t["input_tokens"], t["output_tokens"]) == (500, 20)  # tokens are still counted
    assert [g["key"] for g in s["groups"]] == ["acme-private-llm-7"]
    assert "not" in s["note"] and "invoice" in s["note"]

    # Mixed with a priced row, the total is the known part and the unknown row is flagged.
    fake.enqueue(
        Reply(
            text=envelope({"notes": "y"}),
            model="gpt-4o-mini",
            usage={"prompt_tokens": 1000, "completion_tokens": 100},
        )
    )
    oai(p).chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={SESSION_HEADER: "unk"},
    )
    t = cost_of(p, session="unk")["totals"]
    # gpt-4o-mini list price: $0.15 input, $0.60 output per million.
    assert t["cost_usd"] == pytest.approx(usd(1000 * 0.15 + 100 * 0.6), abs=1e-12)
    assert t["unknown_pricing_rows"] == 1


def test_eight_turn_session_baseline_and_saved_pct(shared: Shared) -> None:
    fake, p = shared.fake, shared.proxy
    c = oai(p)
    hdr = {SESSION_HEADER: "eight"}
    transcript: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful migration planner."},
        {"role": "user", "content": "TASK: move the billing service to the new cluster."},
    ]
    client_bodies: list[dict[str, Any]] = []
    saved_headers = []
    replies = []
    for turn in range(1, 9):
        if turn > 1:
            transcript.append(
                {"role": "user", "content": f"Observation {turn}: " + "kubectl output " * 40}
            )
        replies.append(envelope({"step": turn, "notes": f"did step {turn}"}))
        fake.enqueue(Reply(text=replies[-1]))
        raw = c.chat.completions.with_raw_response.create(
            model="eight-model",
            messages=transcript,
            extra_headers=hdr,
        )
        client_bodies.append({"messages": json.loads(json.dumps(transcript))})
        saved_headers.append(int(raw.headers["x-skillstate-saved-tokens"]))
        transcript.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
    sent = [r.json for r in fake.requests]
    assert len(sent) == 8

    # The ledger rows, read straight from the store (SQLite allows readers next to the proxy).
    db = sqlite3.connect(shared.data_dir / "skillstate.db")
    rows = db.execute(
        "SELECT kind, input_tokens, baseline_input_tokens, cost_usd, baseline_cost_usd,"
        " output_tokens, baseline_output_tokens FROM ledger WHERE session = 'eight' ORDER BY ts"
    ).fetchall()
    db.close()
    assert [r[0] for r in rows] == ["generation"] * 8

    # Each row: input = what the upstream reported; baseline = input x est(client) / est(sent).
    def est(body: dict[str, Any]) -> int:
        return estimate_tokens([body.get("system"), body.get("messages"), body.get("tools")])

    for i, (_kind, inp, base, cost, base_cost, out, base_out) in enumerate(rows):
        assert inp == fake_prompt_tokens(sent[i]["messages"])
        expected_base = round(inp * est(client_bodies[i]) / est(sent[i]))
        assert base == expected_base, i
        assert saved_headers[i] == base - inp
        # The baseline's output is the reply without the envelope's share of its characters:
        # "ok\n```json\n{...}\n```" -> the fenced block is the envelope.
        text = replies[i]
        envelope_chars = len(text) - len("ok\n")
        assert base_out == round(Fraction(out * (len(text) - envelope_chars), len(text))), i
        # No cache prices for eight-model: a cache read costs the input price.
        expected_saving = ((base - inp) * 1.0 + (base_out - out) * 2.0) / 1e6
        assert base_cost - cost == pytest.approx(expected_saving, abs=1e-12)
    inputs = [r[1] for r in rows]
    baselines = [r[2] for r in rows]
    # Turn 1: nothing to drop yet, and the state instructions make the request bigger.
    assert baselines[0] < inputs[0]
    assert baselines[-1] > 2 * inputs[-1]  # turn 8: the transcript has grown, the state has not

    t = cost_of(p, session="eight")["totals"]
    assert t["requests"] == 8
    assert t["input_tokens"] == sum(inputs)
    assert t["baseline_input_tokens"] == sum(baselines) > sum(inputs)
    assert t["saved_input_tokens"] == sum(baselines) - sum(inputs) == sum(saved_headers)
    assert t["saved_pct"] == round(100 * (sum(baselines) - sum(inputs)) / sum(baselines), 2)
    assert t["saved_pct"] > 30
    # Saved dollars: the saved input tokens at the $1/M input price, and the envelope's
    # output tokens at $2/M.
    saved_output = sum(r[5] - r[6] for r in rows)
    assert t["saved_cost_usd"] == pytest.approx(
        ((sum(baselines) - sum(inputs)) * 1.0 - saved_output * 2.0) / 1e6, abs=1e-12
    )


@pytest.mark.parametrize("stream", [False, True])
def test_a_turn_no_attempt_answered_is_a_request_whose_last_attempt_is_its_own(
    fake: FakeProvider, start_proxy: StartProxy, stream: bool
) -> None:
    """Every attempt cut (the provider closed the connection after taking the request):
    the client gets the proxy's 502, and the turn counts as one request, its last attempt
    the turn's own row. All of them were transport retries: `/cost` said `requests: 0`
    for a turn that was charged."""
    config = {"schema": ["notes"], "prices": {"m": MY_PRICES}, "retry_max_attempts": 3,
              "retry_base_delay": 0, "retry_max_delay": 0, "failure_threshold": 10}  # fmt: skip
    p = start_proxy(fake.url, config=config)
    fake.enqueue(Reply(drop=True), Reply(drop=True), Reply(drop=True))
    r = p.http.post(
        p.v1 + "/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": stream},
        headers={SESSION_HEADER: "lost"},
        timeout=10,
    )
    assert r.status_code == 502, r.text
    assert r.json()["error"]["code"] == "upstream_answer_lost"
    assert len(fake.requests) == 3
    t = cost_of(p, session="lost")["totals"]
    assert t["requests"] == 1
    assert t["attempts"] == {
        "generation": 1,
        "stream": 0,
        "rollback-retry": 0,
        "transport-retry": 2,
    }
    assert t["usage_unavailable_rows"] == 3  # each may be billed: no usage, never "free"


def test_cost_endpoint_and_cli_agree(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    config = {"schema": ["notes"], "prices": {"m": MY_PRICES}}
    p = start_proxy(fake.url, config=config)
    c = oai(p)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Start."}]
    for i in range(3):
        fake.enqueue(Reply(text=envelope({"notes": f"n{i}"}), usage={"cached_tokens": 10 * i}))
        c.chat.completions.create(
            model="m",
            messages=msgs,
            extra_headers={SESSION_HEADER: "agree"},
        )
        msgs += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": f"obs {i}"}]
    fake.enqueue(Reply(text=envelope({"notes": "z"})))
    c.chat.completions.create(
        model="m",
        messages=msgs,
        extra_headers={SESSION_HEADER: "other"},
    )
    data = tmp_path / "data"

    def strip(s: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in s.items() if k not in ("since", "until")}

    http = strip(cost_of(p, session="agree", group_by="day"))
    assert http["totals"]["requests"] == 3 and http["session"] == "agree"
    while_running = run_cli(data, "--session", "agree", "--by", "day", "--json", cwd=tmp_path)
    assert while_running.returncode == 0, while_running.stderr
    assert strip(json.loads(while_running.stdout)) == http

    # `all` in `until` is no upper bound (it read as the start of time: always empty, and a
    # 400 with the default since); both take `all`, the docs say.
    everything = strip(cost_of(p, since="all"))
    assert everything["totals"]["requests"] == 4
    for params in ({"since": "all", "until": "all"}, {"since": "all", "until": " ALL "}):
        assert strip(cost_of(p, **params)) == everything
    assert strip(cost_of(p, until="all")) == strip(cost_of(p))
    r = run_cli(data, "--since", "all", "--until", "all", "--json", cwd=tmp_path)
    assert r.returncode == 0 and strip(json.loads(r.stdout)) == everything, r.stderr

    for bad in ({"since": "yesterday"}, {"until": "soon"}, {"group_by": "colour"}):
        r = p.get("/cost", params=bad)
        assert r.status_code == 400 and next(iter(bad.values())) in r.text, r.text

    p.stop()
    stopped = run_cli(data, "--session", "agree", "--by", "day", "--json", cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stderr
    assert strip(json.loads(stopped.stdout)) == http

    table = run_cli(data, "--since", "1h", "--by", "session", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert "agree" in table.stdout and "other" in table.stdout and "total" in table.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--since", "yesterday"), "invalid --since value 'yesterday'"),
        (("--since=-5h",), "invalid --since value '-5h'"),
        (("--until", "soon"), "invalid --until value 'soon'"),
    ],
)
def test_cost_cli_bad_time_is_one_line(tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    r = run_cli(tmp_path / "data", *args, cwd=tmp_path)
    assert r.returncode != 0
    assert r.stdout == ""
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("skillstate: ") and needle in lines[0]


def test_retries_are_separate_attempts_counted_against_savings(shared: Shared) -> None:
    fake, p = shared.fake, shared.proxy
    u = {"prompt_tokens": 100, "completion_tokens": 10}
    # A 503 (retried by the proxy), an answer without a valid envelope (rolled back and
    # re-asked), then a valid answer.
    fake.enqueue(
        Reply(status=503),
        Reply(text="no envelope here", usage=u),
        Reply(text=envelope({"notes": "fine"}), usage=u),
    )
    raw = p.http.post(
        p.v1 + "/chat/completions",
        json={"model": "gpt-mine", "messages": [{"role": "user", "content": "x"}]},
        headers={SESSION_HEADER: "retry"},
        timeout=10,
    )
    assert raw.status_code == 200, raw.text
    assert raw.headers["x-skillstate-retries"] == "1"
    # The turn cost both priced attempts: 2 x (100 x $2 + 10 x $10) / 1e6 = $0.0006.
    assert raw.headers["x-skillstate-cost-usd"] == "0.00060000"
    assert raw.headers["x-skillstate-pricing"] == "override"
    t = cost_of(p, session="retry")["totals"]
    assert t["requests"] == 1
    assert t["attempts"] == {
        "generation": 1,
        "stream": 0,
        "rollback-retry": 1,
        "transport-retry": 1,
    }
    assert t["usage_unavailable_rows"] == 1  # the 503: no usage, no cost - never "free"
    assert t["input_tokens"] == 200 and t["cost_usd"] == pytest.approx(0.0006, abs=1e-12)

    db = sqlite3.connect(shared.data_dir / "skillstate.db")
    rows = db.execute(
        "SELECT kind, status, pricing, input_tokens, cost_usd, baseline_input_tokens"
        " FROM ledger WHERE session = 'retry' ORDER BY ts"
    ).fetchall()
    db.close()
    failed, rolled_back, delivered = rows
    assert failed == ("transport-retry", 503, "usage-unavailable", None, None, None)
    # The discarded answer is a rollback-retry with a zero baseline: pure extra spend.
    assert rolled_back[:4] == ("rollback-retry", 200, "override", 100)
    assert rolled_back[5] == 0
    assert delivered[:4] == ("generation", 200, "override", 100)  # the answer the client got
    assert rolled_back[4] == delivered[4] == pytest.approx(0.0003, abs=1e-12)
    b3 = delivered[5]
    assert b3 > 0
    saved = (0 - 100) + (b3 - 100)
    assert t["saved_input_tokens"] == saved == int(raw.headers["x-skillstate-saved-tokens"])
    assert t["baseline_input_tokens"] == b3


def test_ledger_retention_purges_old_rows(shared: Shared) -> None:
    fake, p = shared.fake, shared.proxy
    fake.enqueue(Reply(text=envelope({"notes": "x"})))
    oai(p).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "x"}],
        extra_headers={SESSION_HEADER: "retention"},
    )
    # Two rows written "in the past" next to the running proxy: 91 and 89 days old.
    day = 86400
    db = sqlite3.connect(shared.data_dir / "skillstate.db", timeout=10)
    with db:
        db.executemany(
            "INSERT INTO ledger (ts, session, kind, status, pricing, mode)"
            " VALUES (?, 'retention', 'generation', 200, 'usage-unavailable', 'state')",
            [(time.time() - 91 * day,), (time.time() - 89 * day,)],
        )
    db.close()
    # The periodic purge (every 0.2 s here) drops rows older than ledger_retention (90 days).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if cost_of(p, since="all", session="retention")["totals"]["requests"] == 2:
            break
        time.sleep(0.1)
    t = cost_of(p, since="all", session="retention")["totals"]
    assert t["requests"] == 2 and t["usage_unavailable_rows"] == 1
