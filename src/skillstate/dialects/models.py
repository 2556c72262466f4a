"""The model list and model objects (`GET /v1/models`, `GET /v1/models/{id}`) in either dialect.

OpenAI: ``{"object": "list", "data": [{"id", "object": "model", "created", "owned_by"}]}``.
Anthropic: ``{"data": [{"type": "model", "id", "display_name", "created_at"}], "has_more",
"first_id", "last_id"}``. Only what both sides know is carried over; the rest is derived.

The context window, where the upstream gives one, goes across too, so that an agent's
compaction threshold matches the model behind the proxy: Anthropic's ``max_input_tokens``
becomes ``context_window`` on an OpenAI model object, and an OpenAI-compatible server's
(vLLM ``max_model_len``, OpenRouter ``context_length``, llama.cpp ``meta.n_ctx_train``,
``context_window``) becomes ``max_input_tokens``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

JSON = dict[str, Any]


def _created_to_iso(created: Any) -> str:
    ts = created if isinstance(created, int | float) and not isinstance(created, bool) else 0
    try:
        when = datetime.fromtimestamp(ts, timezone.utc)
    except (OverflowError, OSError, ValueError):  # a nonsense timestamp: the epoch
        when = datetime.fromtimestamp(0, timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _iso_to_created(created_at: Any) -> int:
    if isinstance(created_at, str):
        try:
            return int(datetime.fromisoformat(created_at.replace("Z", "+00:00")).timestamp())
        except ValueError:
            pass
    return 0


def _positive(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok else None


def openai_context_window(m: JSON) -> int | None:
    """The context window an OpenAI-compatible model object states, if any."""
    meta = m.get("meta")
    found = [m.get("context_window"), m.get("max_model_len"), m.get("context_length")]
    if isinstance(meta, dict):
        found += [meta.get("n_ctx"), meta.get("n_ctx_train")]
    return next((n for n in map(_positive, found) if n is not None), None)


def model_to_anthropic(m: JSON) -> JSON:
    mid = str(m.get("id", ""))
    out: JSON = {
        "type": "model",
        "id": mid,
        "display_name": mid,
        "created_at": _created_to_iso(m.get("created")),
    }
    window = openai_context_window(m)
    if window is not None:
        out["max_input_tokens"] = window
    return out


def model_to_openai(m: JSON) -> JSON:
    out: JSON = {
        "id": str(m.get("id", "")),
        "object": "model",
        "created": _iso_to_created(m.get("created_at")),
        "owned_by": "anthropic",
    }
    window = _positive(m.get("max_input_tokens"))
    if window is not None:
        out["context_window"] = window
    return out


def _entries(body: JSON) -> list[JSON]:
    data = body.get("data")
    return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []


def models_to_anthropic(body: JSON) -> JSON:
    data = [model_to_anthropic(m) for m in _entries(body)]
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return {"data": data, "has_more": False, "first_id": first, "last_id": last}


def models_to_openai(body: JSON) -> JSON:
    return {"object": "list", "data": [model_to_openai(m) for m in _entries(body)]}
