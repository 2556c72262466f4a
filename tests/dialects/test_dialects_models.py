"""Model lists and model objects between the OpenAI and Anthropic shapes."""

from __future__ import annotations

from skillstate.dialects.registry import get_dialect


def translate_models(body: dict, to: str, *, single: bool) -> dict:
    return get_dialect(to).model_list(body, single=single)


OPENAI_LIST = {
    "object": "list",
    "data": [
        {"id": "gpt-4o", "object": "model", "created": 1700000000, "owned_by": "openai"},
        {"id": "odd", "object": "model", "created": 10**20, "owned_by": "x"},  # nonsense time
    ],
}


def test_openai_list_to_anthropic_and_back() -> None:
    a = translate_models(OPENAI_LIST, "anthropic", single=False)
    assert a["has_more"] is False and (a["first_id"], a["last_id"]) == ("gpt-4o", "odd")
    assert a["data"][0] == {
        "type": "model", "id": "gpt-4o", "display_name": "gpt-4o",
        "created_at": "2023-11-14T22:13:20Z",
    }  # fmt: skip
    assert a["data"][1]["created_at"] == "1970-01-01T00:00:00Z"
    back = translate_models(a, "openai", single=False)
    assert back["object"] == "list"
    assert [(m["id"], m["created"]) for m in back["data"]] == [("gpt-4o", 1700000000), ("odd", 0)]


def test_one_model_and_an_empty_list() -> None:
    one = translate_models({"type": "model", "id": "claude", "created_at": "bad"}, "openai",
                           single=True)  # fmt: skip
    assert one == {"id": "claude", "object": "model", "created": 0, "owned_by": "anthropic"}
    assert translate_models({"data": "nope"}, "anthropic", single=False) == {
        "data": [], "has_more": False, "first_id": None, "last_id": None,
    }  # fmt: skip


def test_the_context_window_goes_across() -> None:
    """Anthropic's max_input_tokens <-> an OpenAI-compatible server's window fields."""
    ant = {"type": "model", "id": "claude", "created_at": "2025-01-01T00:00:00Z",
           "max_input_tokens": 200000}  # fmt: skip
    assert translate_models(ant, "openai", single=True)["context_window"] == 200000
    for listed in (
        {"id": "m", "max_model_len": 32768},  # vLLM
        {"id": "m", "context_length": 32768},  # OpenRouter
        {"id": "m", "meta": {"n_ctx_train": 32768}},  # llama.cpp
        {"id": "m", "context_window": 32768},
    ):
        assert translate_models(listed, "anthropic", single=True)["max_input_tokens"] == 32768
    assert "max_input_tokens" not in translate_models({"id": "m", "max_model_len": True},
                                                      "anthropic", single=True)  # fmt: skip
