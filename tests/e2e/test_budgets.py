"""Issue 26, budgets that hold: a real proxy (in-process uvicorn) in front of the fake
provider, driven by the real openai and anthropic SDKs and httpx. Reservations on every
route, per-session budgets and unpriced models under a budget."""

from __future__ import annotations

import asyncio
import contextlib
import io
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from skillstate.cli.main import main
from tests.conftest import InProcessProxy, StartProxy
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, ant, envelope, oai

# $0.001 per output token, input free: a call with max_tokens 100 has a worst case of $0.10,
# and costs exactly that when the model writes its 100 tokens.
OUTPUT_PRICED = {"m": {"input_per_mtok": 0, "output_per_mtok": 1_000}}
WORST = 0.10
SESSION = SESSION_HEADER


def make_key(data: Path, *args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["keys", "--data-dir", str(data), *args]) == 0
    return out.getvalue().strip()


def start(start_proxy: StartProxy, fake: FakeProvider, prices: dict[str, Any]) -> InProcessProxy:
    return start_proxy(
        fake.url + "/v1",
        "--schema",
        "facts,notes,step",
        config={"auth_cache_ttl": 0, "prices": prices},
    )


def passthrough_to(
    start_proxy: StartProxy, fake: FakeProvider, kind: str, budget_max_tokens: int
) -> InProcessProxy:
    """A passthrough proxy in front of one upstream of ``kind``, output priced at $1 per 1,000
    tokens, that holds a call without its own limit at ``budget_max_tokens``."""
    url = fake.url if kind == "anthropic" else fake.url + "/v1"
    return start_proxy(
        None,
        "--mode",
        "passthrough",
        config={
            "auth_cache_ttl": 0,
            "prices": OUTPUT_PRICED,
            "budget_max_tokens": budget_max_tokens,
            "upstreams": [{"name": "u", "url": url, "kind": kind, "api_key": "sk"}],
        },
    )


def full_reply(n: int = 100) -> Reply:
    """An answer that writes ``n`` output tokens (max_tokens' worth: the worst case)."""
    return Reply(text=envelope({}), usage={"completion_tokens": n})


async def one_call(proxy: InProcessProxy, key: str, route: int, session: str) -> int | str:
    """One turn with max tokens 100 on chat completions, Messages or Responses (by ``route``):
    200, or the error's status and message."""
    headers = {SESSION: session}
    try:
        if route == 0:
            oc = openai.AsyncOpenAI(base_url=proxy.v1, api_key=key, max_retries=0)
            async with oc:
                await oc.chat.completions.create(
                    model="m", max_tokens=100, messages=[{"role": "user", "content": "hi"}],
                    extra_headers=headers,
                )  # fmt: skip
        elif route == 1:
            ac = anthropic.AsyncAnthropic(base_url=proxy.url, api_key=key, max_retries=0)
            async with ac:
                await ac.messages.create(
                    model="m", max_tokens=100, messages=[{"role": "user", "content": "hi"}],
                    extra_headers=headers,
                )  # fmt: skip
        else:
            rc = openai.AsyncOpenAI(base_url=proxy.v1, api_key=key, max_retries=0)
            async with rc:
                await rc.responses.create(
                    model="m", max_output_tokens=100, input="hi", extra_headers=headers
                )
        return 200
    except (openai.APIStatusError, anthropic.APIStatusError) as e:
        return f"{e.status_code} {e.message}"


def spent_today(proxy: InProcessProxy, key_name: str) -> float:
    r = proxy.get("/cost", params={"key": key_name})
    assert r.status_code == 200, r.text
    return float(r.json()["totals"]["cost_usd"])


def cost_of(proxy: InProcessProxy, key: str) -> float:
    """What the key's ledger rows cost (GET /cost as the key)."""
    r = proxy.get("/cost", headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    return float(r.json()["totals"]["cost_usd"] or 0.0)


def test_twenty_concurrent_calls_on_every_route_fit_a_budget_of_five(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    proxy = start(start_proxy, fake, OUTPUT_PRICED)
    key = make_key(tmp_path / "data", "create", "--name", "team", "--budget-usd-per-day", "0.5")
    fake.enqueue(*[full_reply() for _ in range(20)])

    async def burst() -> list[int | str]:
        calls = (one_call(proxy, key, i % 3, f"s{i}") for i in range(20))
        return list(await asyncio.gather(*calls))

    results = asyncio.run(burst())
    assert results.count(200) == 5, results
    refused = [r for r in results if r != 200]
    assert all(str(r).startswith("429 ") and "daily budget $0.5 reached" in str(r) for r in refused)
    assert len(fake.requests) == 5  # the refused calls never reached the upstream
    spent = cost_of(proxy, key)
    assert spent == pytest.approx(5 * WORST) and spent <= 0.5 + 1e-9


def test_a_responses_call_whose_input_alone_is_over_the_budget_is_never_sent(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    # $400 per million input tokens: 100,000 characters of input (about 25,000 tokens) cost
    # about $10, ten times the key's $1 a day.
    proxy = start(start_proxy, fake, {"m": {"input_per_mtok": 400, "output_per_mtok": 0}})
    key = make_key(tmp_path / "data", "create", "--name", "small", "--budget-usd-per-day", "1")
    client = oai(proxy, key)
    with pytest.raises(openai.RateLimitError) as refused:
        client.responses.create(model="m", input="x" * 100_000)
    assert refused.value.body["code"] == "budget_exceeded"
    assert "this call alone" in refused.value.message
    assert fake.requests == []
    fake.enqueue(Reply(text=envelope({})))
    client.responses.create(model="m", input="a short question")  # a small one fits
    assert len(fake.requests) == 1


def chat(proxy: InProcessProxy, key: str, session: str, **headers: str) -> httpx.Response:
    """One chat turn with max_tokens 100 (raw: any status)."""
    return proxy.http.post(
        proxy.v1 + "/chat/completions",
        json={"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {key}", SESSION: session, **headers},
    )


def test_a_session_budget_stops_its_session_and_not_the_keys_others(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    proxy = start(start_proxy, fake, OUTPUT_PRICED)
    key = make_key(tmp_path / "data", "create", "--name", "team")
    fake.enqueue(*[full_reply() for _ in range(10)])
    budget = {"x-skillstate-budget-usd": "0.25"}
    first = chat(proxy, key, "run1", **budget)  # the first turn sets it: room for 2 calls
    assert first.status_code == 200, first.text
    assert first.headers["x-skillstate-session-spent-usd"] == "0.10000000"
    assert first.headers["x-skillstate-session-budget-remaining"] == "0.15000000"
    second = chat(proxy, key, "run1")  # later turns need not repeat the header
    assert second.headers["x-skillstate-session-budget-remaining"] == "0.05000000"
    refused = chat(proxy, key, "run1")
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "session_budget_exceeded"
    assert "session 'run1': budget $0.25 reached" in error["message"]
    assert "retry-after" not in refused.headers  # it never resets on its own
    assert refused.headers["x-skillstate-session-budget-remaining"] == "0.05000000"
    assert len(fake.requests) == 2
    other = chat(proxy, key, "run2")  # the key's other sessions go on
    assert other.status_code == 200 and "x-skillstate-session-spent-usd" not in other.headers
    # The operator raises it (PATCH /state, the same header): the session goes on.
    raised = proxy.http.patch(
        proxy.url + "/state",
        params={"session": "run1"},
        headers={"authorization": f"Bearer {key}", "x-skillstate-budget-usd": "0.35"},
    )
    assert raised.status_code == 200, raised.text
    assert raised.json()["budget_usd"] == 0.35
    again = chat(proxy, key, "run1")
    assert again.status_code == 200
    assert again.headers["x-skillstate-session-spent-usd"] == "0.30000000"
    shown = proxy.get(
        "/state", params={"session": "run1"}, headers={"authorization": f"Bearer {key}"}
    ).json()
    assert shown["budget_usd"] == 0.35 and shown["spent_usd"] == pytest.approx(0.30)


def test_a_bad_session_budget_is_a_400_in_the_clients_dialect(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    proxy = start(start_proxy, fake, OUTPUT_PRICED)
    key = make_key(tmp_path / "data", "create", "--name", "team", "--max-session-budget-usd", "1")
    bad = {"x-skillstate-budget-usd": "five"}
    oc = oai(proxy, key)
    with pytest.raises(openai.BadRequestError) as e:
        oc.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], extra_headers=bad
        )
    assert e.value.body["param"] == "x-skillstate-budget-usd"
    assert "positive number of USD" in e.value.message
    ac = ant(proxy, key)
    for value, says in (("-1", "positive number"), ("2", "max_session_budget_usd $1")):
        with pytest.raises(anthropic.BadRequestError) as ae:
            ac.messages.create(
                model="m", max_tokens=100, messages=[{"role": "user", "content": "hi"}],
                extra_headers={"x-skillstate-budget-usd": value},
            )  # fmt: skip
        assert ae.value.body["error"]["type"] == "invalid_request_error"
        assert says in ae.value.message
    assert fake.requests == []
    # A session that sets none is held to the key's cap.
    fake.enqueue(full_reply())
    capped = chat(proxy, key, "plain")
    assert capped.headers["x-skillstate-session-budget-remaining"] == "0.90000000"


def test_an_unpriced_model_under_a_budget_is_refused_unless_the_key_allows_it(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    proxy = start(start_proxy, fake, OUTPUT_PRICED)
    data = tmp_path / "data"
    strict = make_key(data, "create", "--name", "strict", "--budget-usd-per-day", "100")
    loose = make_key(
        data, "create", "--name", "loose", "--budget-usd-per-day", "100", "--allow-unpriced"
    )
    body = {
        "model": "no-such-model",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
    }

    def ask(key: str, session: str) -> httpx.Response:
        return proxy.http.post(
            proxy.v1 + "/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {key}", SESSION: session},
        )

    refused = ask(strict, "a")
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "model_unpriced" and error["param"] == "model"
    assert "'no-such-model' has no known price" in error["message"]
    assert '"prices": {"no-such-model"' in error["message"]
    assert fake.requests == []
    fake.enqueue(Reply(text=envelope({}), usage={"prompt_tokens": 1000, "completion_tokens": 100}))
    first = ask(loose, "b")
    assert first.status_code == 200, first.text
    assert "x-skillstate-cost-usd" not in first.headers  # the ledger has no price for it
    fake.enqueue(Reply(text=envelope({})))
    second = ask(loose, "c")
    # Counted at the most expensive model genai-prices knows: o1-pro, $150 in, $600 out.
    counted = (1000 * 150 + 100 * 600) / 1e6
    assert float(second.headers["x-skillstate-budget-spent-usd"]) == pytest.approx(counted)


def test_streamed_turns_hold_and_settle_like_the_others(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    proxy = start(start_proxy, fake, OUTPUT_PRICED)
    key = make_key(tmp_path / "data", "create", "--name", "team", "--budget-usd-per-day", "0.25")
    fake.enqueue(*[full_reply() for _ in range(3)])
    oc = oai(proxy, key)

    def stream(session: str) -> str:
        chunks = oc.chat.completions.create(
            model="m", max_tokens=100, stream=True, messages=[{"role": "user", "content": "hi"}],
            extra_headers={SESSION: session},
        )  # fmt: skip
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    assert "ok" in stream("a")
    assert "ok" in stream("b")  # the first one's hold ended with its stream: $0.10 spent
    with pytest.raises(openai.RateLimitError) as refused:
        stream("c")  # $0.20 spent + $0.10 > $0.25
    assert refused.value.body["code"] == "budget_exceeded"
    assert len(fake.requests) == 2
    assert cost_of(proxy, key) == pytest.approx(0.20)


def test_a_call_with_two_output_limits_is_held_at_the_larger(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    """A chat request with max_tokens 1 and max_completion_tokens 1,000 to an Anthropic
    upstream goes with max_tokens 1,000 (the translation reads max_completion_tokens
    first, as vLLM does): its worst case is 1,000 output tokens ($1.00), more than the
    session's $0.25, so it is refused before it is sent."""
    proxy = start_proxy(
        None,
        config={
            "auth_cache_ttl": 0,
            "prices": OUTPUT_PRICED,
            "upstreams": [{"name": "a", "url": fake.url, "kind": "anthropic", "api_key": "sk"}],
        },
    )
    fake.enqueue(Reply(text="word " * 1000))
    r = proxy.http.post(
        proxy.v1 + "/chat/completions",
        json={
            "model": "m",
            "max_tokens": 1,
            "max_completion_tokens": 1000,
            "messages": [{"role": "user", "content": "hi"}],
        },
        headers={SESSION: "two-limits", "x-skillstate-budget-usd": "0.25"},
    )
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "session_budget_exceeded"
    assert "this call alone (worst case $1.000000)" in r.json()["error"]["message"]
    assert fake.requests == []


LIMIT_SENT = {
    "openai": "max_tokens",
    "anthropic": "max_tokens",
    "openai-responses": "max_output_tokens",
}


@pytest.mark.parametrize(
    ("route", "kind"),
    [
        ("chat", "openai"),
        ("chat", "anthropic"),
        ("chat", "openai-responses"),
        ("responses", "openai-responses"),
        ("responses", "openai"),
        ("responses", "anthropic"),
    ],
)
def test_a_call_without_an_output_limit_is_sent_with_the_one_its_budget_holds(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path, route: str, kind: str
) -> None:
    """Under a budget, a request that sets no output limit is held at budget_max_tokens
    (100 here: $0.10) and goes upstream with that limit, so a model that would write 1,250
    tokens ($1.25) stops at 100. Without a budget the request goes as it came."""
    proxy = passthrough_to(start_proxy, fake, kind, 100)
    oc = oai(proxy, "sk")

    def ask(session: str, budget: dict[str, str]) -> Any:
        fake.enqueue(Reply(text="word " * 1000))
        headers = {SESSION: session, **budget}
        if route == "chat":
            return oc.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": "hi"}], extra_headers=headers
            )
        return oc.responses.with_raw_response.create(model="m", input="hi", extra_headers=headers)

    held = ask("held", {"x-skillstate-budget-usd": "0.25"})
    assert fake.requests[-1].json[LIMIT_SENT[kind]] == 100
    assert float(held.headers["x-skillstate-session-spent-usd"]) == pytest.approx(0.10)
    assert float(held.headers["x-skillstate-cost-usd"]) == pytest.approx(0.10)
    free = ask("free", {})
    sent = fake.requests[-1].json
    if kind == "anthropic":  # the Messages API needs one: the translation's own default
        assert sent["max_tokens"] == 4096
    else:
        assert not {"max_tokens", "max_completion_tokens", "max_output_tokens"} & set(sent)
    assert float(free.headers["x-skillstate-cost-usd"]) == pytest.approx(1.25)


def test_the_compact_endpoint_under_a_budget_goes_as_it_came(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    """POST /responses/compact to a Responses upstream takes no output limit (the API
    refuses max_output_tokens there): under a budget it is held and sent as it came."""
    from tests.e2e.test_e2e_compaction import client, history
    from tests.e2e.test_e2e_compaction import start as start_compacting

    p = start_compacting(fake, start_proxy, "openai-responses", "--mode", "passthrough")
    fake.enqueue(Reply(text="the upstream's summary"))
    r = client(p).responses.with_raw_response.compact(
        model="gpt-4o", input=history(), extra_headers={"x-skillstate-budget-usd": "5"}
    )
    assert r.parse().object == "response.compaction"
    assert float(r.headers["x-skillstate-session-spent-usd"]) > 0
    sent = fake.requests[-1]
    assert sent.path == "/v1/responses/compact"
    assert set(sent.json) == {"model", "input", "prompt_cache_key"}


def test_the_compact_endpoint_is_held_at_the_output_it_may_write(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    """/responses/compact goes with no output limit, so it is held at what a model of the API
    may write (128,000 tokens, $128 here), not at budget_max_tokens (100, $0.10): before, a
    compaction of 1,000 output tokens cost $1.00 against the session's $0.25."""
    from tests.e2e.test_e2e_compaction import client, history
    from tests.e2e.test_e2e_compaction import start as start_compacting

    p = start_compacting(
        fake, start_proxy, "openai-responses", "--mode", "passthrough",
        prices=OUTPUT_PRICED, budget_max_tokens=100,
    )  # fmt: skip
    fake.enqueue(Reply(text="word " * 1000))
    with pytest.raises(openai.RateLimitError) as refused:
        client(p).responses.compact(
            model="m", input=history(), extra_headers={"x-skillstate-budget-usd": "0.25"}
        )
    assert refused.value.code == "session_budget_exceeded"
    assert not fake.requests  # refused before it was sent


def test_a_call_for_several_choices_is_held_for_each_of_them(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    """Chat completions' n: the provider writes (and bills) up to max_tokens for each
    choice. n=5 at max_tokens 100 is a worst case of $0.50, over the session's $0.25: refused
    before it is sent; n=2 ($0.20) fits, and costs what its two choices wrote."""
    proxy = start_proxy(fake.url + "/v1", "--mode", "passthrough", config={"prices": OUTPUT_PRICED})
    oc = oai(proxy, "sk")
    headers = {SESSION: "choices", "x-skillstate-budget-usd": "0.25"}
    fake.enqueue(Reply(text="word " * 1000), Reply(text="word " * 1000))
    with pytest.raises(openai.RateLimitError) as refused:
        oc.chat.completions.create(
            model="m", max_tokens=100, n=5, messages=[{"role": "user", "content": "hi"}],
            extra_headers=headers,
        )  # fmt: skip
    assert "this call alone (worst case $0.500000)" in refused.value.message
    assert fake.requests == []
    two = oc.chat.completions.with_raw_response.create(
        model="m", max_tokens=100, n=2, messages=[{"role": "user", "content": "hi"}],
        extra_headers=headers,
    )  # fmt: skip
    assert len(two.parse().choices) == 2
    assert float(two.headers["x-skillstate-cost-usd"]) == pytest.approx(0.20)
    assert float(two.headers["x-skillstate-session-spent-usd"]) == pytest.approx(0.20)


def test_a_long_input_is_held_at_the_models_long_context_price(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    """claude-sonnet-4-5 costs twice as much per input token past 200,000 of them (genai-
    prices: $6 instead of $3 per million, cache writes $7.50 instead of $3.75, output
    $22.50 instead of $15). A call of about 220,000 input tokens is held at those rates:
    its worst case (about $2.06) is more than the session's $1.20, so it is never sent;
    held at the short-context rates (about $1.03) it went, and cost $1.32."""
    upstream = {"name": "a", "url": fake.url, "kind": "anthropic", "api_key": "sk"}
    proxy = start_proxy(None, "--mode", "passthrough", config={"upstreams": [upstream]})
    ac = anthropic.Anthropic(base_url=proxy.url, api_key="sk", max_retries=0)
    fake.enqueue(Reply(text="ok"))
    with pytest.raises(anthropic.RateLimitError) as refused:
        ac.messages.create(
            model="claude-sonnet-4-5", max_tokens=1,
            messages=[{"role": "user", "content": "abcd" * 220_000}],
            extra_headers={SESSION: "long", "x-skillstate-budget-usd": "1.20"},
        )  # fmt: skip
    assert "this call alone (worst case $2.0" in refused.value.message
    assert fake.requests == []


def test_an_unpriced_model_under_a_session_budget_without_keys_names_the_price_to_add(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """Auth off, a session budget: the 400 names the prices entry, the one way to let the
    model through, and no key setting (there is no key)."""
    proxy = start(start_proxy, fake, OUTPUT_PRICED)
    oc = openai.OpenAI(base_url=proxy.v1, api_key="sk", max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        oc.chat.completions.create(
            model="made-up-model", messages=[{"role": "user", "content": "hi"}],
            extra_headers={SESSION: "local", "x-skillstate-budget-usd": "1"},
        )  # fmt: skip
    assert refused.value.body["code"] == "model_unpriced"
    assert '"prices": {"made-up-model"' in refused.value.message
    assert "allow_unpriced" not in refused.value.message
    assert fake.requests == []
    fake.enqueue(Reply(text="hello"))  # no budget: the model goes, as it always did
    r = oc.chat.completions.with_raw_response.create(
        model="made-up-model", messages=[{"role": "user", "content": "hi"}],
        extra_headers={SESSION: "unbudgeted"},
    )  # fmt: skip
    assert r.http_response.status_code == 200 and fake.requests
    assert r.headers["x-skillstate-pricing"] == "unknown"


@pytest.mark.parametrize("route", ["chat", "chat-stream", "responses"])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_limit_the_model_refuses_is_not_sent_again(
    fake: FakeProvider, start_proxy: StartProxy, route: str, kind: str
) -> None:
    """The limit a budget adds (budget_max_tokens, 10,000 here) can be above the model's own
    output maximum (gpt-4o's 16,384 against the default 32,768): the provider refuses it
    (400). The call then goes as the client wrote it (to Messages: with the translation's
    own 4,096), and the model's maximum (5,000) bounds its answer below what the budget
    held; the refused attempt costs nothing."""
    proxy = passthrough_to(start_proxy, fake, kind, 10_000)
    fake.max_output_tokens = {"m": 5_000}
    fake.enqueue(Reply(text="abcd" * 40))
    oc = openai.OpenAI(base_url=proxy.v1, api_key="sk", max_retries=0)
    headers = {SESSION: "small-model", "x-skillstate-budget-usd": "20"}
    hi = [{"role": "user", "content": "hi"}]
    if route == "chat":
        r = oc.chat.completions.with_raw_response.create(
            model="m", messages=hi, extra_headers=headers
        )
        text = r.parse().choices[0].message.content
    elif route == "chat-stream":
        r = oc.chat.completions.with_raw_response.create(
            model="m", messages=hi, stream=True, extra_headers=headers
        )
        text = "".join(c.choices[0].delta.content or "" for c in r.parse() if c.choices)
    else:
        r = oc.responses.with_raw_response.create(model="m", input="hi", extra_headers=headers)
        text = r.parse().output_text
    assert text == "abcd" * 40
    refused, sent = fake.requests
    assert refused.status == 400 and refused.json[LIMIT_SENT[kind]] == 10_000
    assert sent.status == 200
    if kind == "openai":
        assert not {"max_tokens", "max_completion_tokens", "max_output_tokens"} & set(sent.json)
    spent = proxy.get("/cost", params={"session": "small-model"}).json()["totals"]
    assert spent["cost_usd"] == pytest.approx(0.04)  # 40 tokens written, nothing for the 400


def test_a_refused_small_limit_is_not_sent_again_to_messages_with_more_than_was_held(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """budget_max_tokens 100 ($0.10 held) is sent to a Messages upstream and refused (400):
    sent again as the client wrote it, the translation's 4,096 would go, more than was
    held. The 400 is relayed instead; before, the resend wrote 1,000 tokens, $1.00 against
    the session's $0.25."""
    proxy = passthrough_to(start_proxy, fake, "anthropic", 100)
    fake.enqueue(Reply(status=400, error_body="max_tokens: refused"), Reply(text="word " * 1000))
    oc = openai.OpenAI(base_url=proxy.v1, api_key="sk", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        oc.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}],
            extra_headers={SESSION: "small", "x-skillstate-budget-usd": "0.25"},
        )  # fmt: skip
    (refused,) = fake.requests
    assert refused.json["max_tokens"] == 100
    spent = proxy.get("/cost", params={"session": "small"}).json()["totals"]
    assert not spent["cost_usd"] and not spent["estimated_cost_usd"]


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_400_about_something_else_than_the_limit_is_not_sent_again(
    fake: FakeProvider, start_proxy: StartProxy, kind: str
) -> None:
    """Under a budget, a 400 that is not about the limit the budget added (a prompt too
    long) is relayed: sent again without the limit it would be refused again, or write past
    what the budget held."""
    proxy = passthrough_to(start_proxy, fake, kind, 10_000)
    too_long = "This model's maximum context length is 8192 tokens; your messages were 9001."
    fake.enqueue(Reply(status=400, error_body=too_long), Reply(text="word " * 1000))
    oc = openai.OpenAI(base_url=proxy.v1, api_key="sk", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        oc.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}],
            extra_headers={SESSION: "too-long", "x-skillstate-budget-usd": "20"},
        )  # fmt: skip
    (refused,) = fake.requests
    assert refused.status == 400


@pytest.mark.parametrize("route", ["chat", "messages", "budget_max_tokens"])
def test_a_limit_under_the_responses_minimum_is_held_at_the_16_it_is_sent_as(
    fake: FakeProvider, start_proxy: StartProxy, route: str
) -> None:
    """The Responses API takes no max_output_tokens under 16, so a chat or Messages
    max_tokens of 5 (or a budget_max_tokens of 5 added to a request without a limit) goes
    to an openai-responses upstream as 16, and the model may write 16 tokens ($0.016 here).
    That is the call's worst case: over a session's $0.01 it is refused before it is sent
    (held at the client's 5, $0.005, it went and spent $0.016 of the $0.01); under $0.02
    it goes and costs its 16 tokens."""
    proxy = passthrough_to(start_proxy, fake, "openai-responses", 5)
    hi = [{"role": "user", "content": "hi"}]

    def ask(session: str, usd: str) -> Any:
        headers = {SESSION: session, "x-skillstate-budget-usd": usd}
        if route == "messages":
            return ant(proxy, "sk").messages.with_raw_response.create(
                model="m", max_tokens=5, messages=hi, extra_headers=headers
            )
        limit = {"max_tokens": 5} if route == "chat" else {}
        return oai(proxy, "sk").chat.completions.with_raw_response.create(
            model="m", messages=hi, extra_headers=headers, **limit
        )

    fake.enqueue(Reply(text="word " * 100))
    with pytest.raises((openai.RateLimitError, anthropic.RateLimitError)) as refused:
        ask("tight", "0.01")
    assert "this call alone (worst case $0.016000)" in str(refused.value)
    assert fake.requests == []
    r = ask("roomy", "0.02")
    assert fake.requests[-1].json["max_output_tokens"] == 16
    assert float(r.headers["x-skillstate-cost-usd"]) == pytest.approx(0.016)
    assert float(r.headers["x-skillstate-session-spent-usd"]) == pytest.approx(0.016)


def test_a_budgets_output_limit_is_no_more_than_the_claude_models_maximum(
    fake: FakeProvider, start_proxy: StartProxy, tmp_path: Path
) -> None:
    """Under a budget a call without its own limit goes with ``budget_max_tokens`` (32,768
    here), but no more than the model's own maximum where the proxy knows it: Claude 3.5
    Haiku writes at most 8,192, and the Messages API refuses a larger ``max_tokens`` (the
    call was refused, then sent again without it)."""
    proxy = passthrough_to(start_proxy, fake, "anthropic", 32_768)
    fake.enqueue(Reply(text="done"))
    oai(proxy, "sk").chat.completions.create(
        model="claude-3-5-haiku-20241022",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={SESSION: "capped", "x-skillstate-budget-usd": "5"},
    )
    assert len(fake.requests) == 1
    assert fake.requests[-1].json["max_tokens"] == 8192
