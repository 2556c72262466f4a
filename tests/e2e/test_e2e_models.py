"""`/v1/models` and `/v1/models/{id}` through the real proxy, in each SDK's own dialect,
whatever kind of upstream answers."""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider
from tests.helpers import ant, oai


@pytest.fixture(params=["openai", "anthropic"])
def mproxy(request: pytest.FixtureRequest, fake: FakeProvider, start_proxy: StartProxy) -> Proxy:
    up = {"name": "up", "url": fake.url, "kind": request.param, "api_key": "k"}
    return start_proxy(None, config={"upstreams": [up]})


def test_openai_sdk_lists_and_retrieves(fake: FakeProvider, mproxy: Proxy) -> None:
    c = oai(mproxy, "k")
    listed = c.models.list()
    assert [m.id for m in listed.data] == fake.models
    assert all(m.object == "model" and isinstance(m.created, int) for m in listed.data)
    m = c.models.retrieve("gpt-4o")
    assert (m.id, m.object) == ("gpt-4o", "model")
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("no-such-model")
    assert "no-such-model" in e.value.message
    # The SDK found OpenAI's {"error": {...}} and unwrapped it.
    assert isinstance(e.value.body, dict) and {"message", "type"} <= set(e.value.body)


def test_anthropic_sdk_lists_and_retrieves(fake: FakeProvider, mproxy: Proxy) -> None:
    c = ant(mproxy, "k")
    page = c.models.list()
    assert [m.id for m in page.data] == fake.models
    assert all(m.type == "model" and m.created_at.year >= 1970 for m in page.data)
    assert page.has_more is False
    m = c.models.retrieve("claude-sonnet-4-5")
    assert (m.id, m.type) == ("claude-sonnet-4-5", "model")
    with pytest.raises(anthropic.NotFoundError) as e:
        c.models.retrieve("no-such-model")
    assert e.value.body["type"] == "error"  # type: ignore[index]
    assert e.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


def test_paging_reaches_an_upstream_of_the_clients_kind(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    up = {"name": "a", "url": fake.url, "kind": "anthropic", "api_key": "k"}
    p = start_proxy(None, config={"upstreams": [up]})
    ant(p, "k").models.list(limit=2)
    assert fake.last.path == "/v1/models" and fake.last.query == "limit=2"


def test_unknown_route_errors_follow_the_anthropic_sdk(proxy: Proxy) -> None:
    c = ant(proxy, "k")
    with pytest.raises(anthropic.NotFoundError) as e:
        c.get("/v1/nowhere", cast_to=object)
    assert e.value.body["type"] == "error"  # type: ignore[index]
    assert e.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


def test_a_model_list_that_is_not_json_is_a_502(fake: FakeProvider, mproxy: Proxy) -> None:
    fake.models_body = b"<html>maintenance</html>"
    c = oai(mproxy, "k")
    with pytest.raises(openai.APIStatusError) as e:
        c.models.list()
    assert e.value.status_code == 502 and "non-JSON model list" in e.value.message


# (Plain ".." segments never leave the client: HTTP clients normalise them away.)
@pytest.mark.parametrize(
    "model_id", ["..%2Ffiles", "a%2F..%2F..%2Ffiles", "%2E%2E", "a//b", "x%00y"]
)
def test_a_model_id_that_names_another_path_is_refused(
    fake: FakeProvider, proxy: Proxy, model_id: str
) -> None:
    before = len(fake.requests)
    r = proxy.get(f"/v1/models/{model_id}")
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == "invalid model id"
    assert len(fake.requests) == before  # nothing went upstream with the operator's key
    assert proxy.get("/v1/models/meta-llama%2FLlama-3").status_code in (200, 404)
