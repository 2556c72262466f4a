"""``GET /v1/models`` and ``GET /v1/models/{id}``: the upstream's model catalog, answered in the
client's dialect.

The two SDKs share these paths, so the dialect comes from the request: the Anthropic SDK
always sends ``anthropic-version``, an OpenAI client never does. An upstream of the other kind
has its list (or model object, or error) translated; the same kind is relayed untouched,
query string (Anthropic's ``limit``/``after_id`` paging) included.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

import orjson

from ..dialects.registry import dialect_for_headers, error_reply, get_dialect
from ..errors import Dialect, ProxyError
from ..turn.types import Reply
from ..upstream.client import UpstreamPool


def catalog_dialect(headers: Mapping[str, str]) -> Dialect:
    """The client's dialect on ``/v1/models``, which both SDKs use."""
    return dialect_for_headers(headers)


# The longest model id looked up: real ids are far shorter (OpenAI's fine-tuned
# ``ft:<base>:<org>:<suffix>:<id>`` and Hugging Face's ``<owner>/<repo>``, at most 96
# characters each part, stay under 200; a Bedrock inference-profile ARN about 120), and a
# longer one would only go out in the upstream's URL, which servers cap (8 KiB for many).
MAX_MODEL_ID_CHARS = 256


def check_model_id(model_id: str) -> None:
    """A model id goes into the upstream's path, sent with the operator's key: ``..`` or
    ``.`` segments (``/v1/models/..%2Ffiles``) would name another route to any gateway that
    decodes ``%2F`` before routing, so they are refused, as are empty and control characters
    and ids over ``MAX_MODEL_ID_CHARS``. Ids with ``/`` (``meta-llama/Llama-3``) are fine."""
    if len(model_id) > MAX_MODEL_ID_CHARS:
        raise ProxyError(
            "invalid_request",
            f"model id is {len(model_id)} characters long; at most {MAX_MODEL_ID_CHARS}",
            param="model",
            code="invalid_value",
        )
    segments = model_id.split("/")
    if (
        not model_id
        or any(seg in ("", ".", "..") for seg in segments)
        or not model_id.isprintable()
    ):
        raise ProxyError("invalid_request", "invalid model id", param="model")


async def fetch_models(
    pool: UpstreamPool,
    headers: Mapping[str, str],
    dialect: Dialect,
    model_id: str | None = None,
    query: str = "",
) -> Reply:
    """Raises ProxyError when no upstream answered, or for a model id that is a path."""
    if model_id is not None:
        check_model_id(model_id)
    path = "/models" if model_id is None else "/models/" + quote(model_id, safe="")
    native = [up for up in pool.upstreams if up.kind == dialect]
    if query and native:
        # Paging parameters mean something only to an upstream of the client's own kind.
        ex = await pool.fetch(f"{path}?{query}", headers, upstreams=native)
    else:
        ex = await pool.fetch(path, headers)
    raw = await ex.read()
    ex.release()
    out_headers = ex.relay_headers()
    out_headers["content-type"] = "application/json"
    if ex.status >= 400:
        return Reply(*error_reply(raw, ex.status, ex.upstream.kind, dialect), out_headers)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        name = ex.upstream.name
        raise ProxyError("upstream_unreachable", f"upstream {name} returned a non-JSON model list")
    if ex.upstream.kind == dialect:
        return Reply(ex.status, raw, out_headers)
    translated = get_dialect(dialect).model_list(body, single=model_id is not None)
    return Reply(ex.status, orjson.dumps(translated), out_headers)
