"""The configuration reference page, generated from the config model (skillstate.config).

Used by the docs build (docs/hooks.py replaces a marker in docs/configuration.md with
``render()``) and by tests/app/test_config_reference.py, which fails when a setting of the model has
no description here, or a description names a setting the model no longer has. Run it
directly to print the page's table: ``python scripts/config_reference.py``.
"""

from __future__ import annotations

import enum
import json
import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from skillstate.config import ENV_VARS, PriceOverride, Settings, Upstream

# One line per setting: what it does and why one would change it (the model holds the rest:
# type, default and bounds).
DESCRIPTIONS: dict[type[BaseModel], dict[str, str]] = {
    Settings: {
        "host": "Listen address. Keep the loopback default unless the proxy sits behind "
        "something that authenticates callers.",
        "port": "Listen port; 0 picks a free one (the chosen URL is printed at start-up).",
        "upstreams": "The providers, tried by `priority` (lower first) with failover; see "
        "*Upstream entries* below. `--upstream URL` is a shorthand for one entry named "
        "`default`.",
        "schema_keys": "The allowed top-level state keys. Empty: the keys of `initial_state`.",
        "initial_state": "The state a new session starts from; its values also type the keys "
        "(a key that starts as a list must stay a list).",
        "state_schema": "A JSON Schema every new state must satisfy (checked after the merge).",
        "data_dir": "Where the default SQLite store lives (when `store` is unset) and, with a "
        "SQLite store, the client keys' secret (`auth.secret`). One proxy per data dir.",
        "verbose": "One log line per request (never bodies or keys).",
        "metrics_token": "When set, `GET /metrics` needs `Authorization: Bearer <token>` or an "
        "admin key (401 otherwise); unset, it needs an admin key once client keys are on, and "
        "is open without keys. At least 16 characters.",
        "metrics_key_label": "Also count requests, tokens and cost by client key *name* in "
        "`/metrics` (`skillstate_key_*`). Off by default; key names are the operator's, never "
        "a key or its id.",
        "otel_endpoint": "OTLP/HTTP base URL (`http://collector:4318`) to export "
        "OpenTelemetry traces to; the standard `OTEL_EXPORTER_OTLP_ENDPOINT` turns them on too. "
        "Needs the `otel` extra.",
        "otel_capture_content": "Put the client's messages, the state patch and the action on "
        "the turn's span. Off by default: spans carry sizes, tokens and statuses only.",
        "mode": "Default mode: `state` (compact context), `passthrough` (untouched transcript), "
        "`window` (the state plus the recent messages verbatim, checkpointed), `auto` "
        "(passthrough, then `window` once it is expected to cost less), `mask` (the "
        "transcript with tool results and long observations older than the last `mask_keep` "
        "replaced by a placeholder; no state). Per request: `x-skillstate-mode`.",
        "constrain": "`json_schema` asks the upstream for a grammar-constrained envelope "
        "(small local models). Per request: `x-skillstate-constrain`.",
        "reply_envelope": "`strip` (default): the client sees the model's reply without the "
        "state envelope, streams included (a reply that is only the envelope shows its "
        "`action`); `keep`: the reply as the model wrote it.",
        "mask_keep": "Mode `mask`: the last observations kept whole; older ones are masked in "
        "blocks of this many, so the prefix stays cacheable between re-masks.",
        "compaction": "Who compacts for an upstream that can itself (a `/v1/responses` "
        "`compaction_trigger` or `context_management` to an `openai-responses` upstream, the "
        "`compact_20260112` edit to an `anthropic` one): `native` (passed through, the upstream "
        "compacts) or `proxy` (a checkpoint into the session's state, as for every other "
        "upstream). See [Compaction](compaction.md).",
        "window_keep": "Modes `window` and `auto`: the exchanges (an assistant message with its "
        "tool results, or a user message with its reply) kept verbatim after a checkpoint; a "
        "window never checkpoints while it holds no more than this many. 0 keeps none.",
        "window_max_tokens": "Modes `window` and `auto`: the window's bound (estimated tokens "
        "of its messages); a turn that would pass it checkpoints whatever the bill says.",
        "auto_compact": "Mode `auto`: also move a session to the compact context (`state` "
        "mode's) when its expected bill is lower than the window's (short envelopes, an "
        "OpenAI cache read at 0.5x input). Off by default: `auto` moves sessions to `window`, "
        "whose recent turns stay verbatim (an `Edit` that quotes an earlier `Read` keeps "
        "working).",
        "schema_violation": "What a patch key outside the allowed keys does: `reject` the whole "
        "transition (the model is re-asked), or `drop` the key with a warning.",
        "unsupported_tools": "`/v1/responses` tools that only the Responses API has "
        "(`web_search`, `namespace`, `file_search`, ...) when an upstream of another kind may "
        "serve the model: `drop` them (the reply's `x-skillstate-dropped-tools` names them) or "
        "`reject` the request with a 400.",
        "allowed_hosts": "Host names served besides loopback (`localhost`, `127.0.0.1`, "
        "`[::1]`) and the listen host; any other `Host` is a 403 (DNS rebinding). `*` turns "
        "the check off.",
        "allowed_origins": "Browser origins (`https://app.example`) that may call the proxy; "
        "any other `Origin` than the proxy's own is a 403. `*` turns the check off.",
        "forward_scoping_headers": "Client headers that pick what a key bills "
        "(`openai-organization`, `openai-project`, `api-key`, `x-goog-api-key`, ...) still "
        "forwarded to an upstream with its own `api_key`; by default they are dropped.",
        "auth": "When client keys are checked: `auto` (once any key exists, see "
        "`skillstate keys`) or `required` (always; with no key nothing but `/health` answers).",
        "insecure_no_auth": "Start on a non-loopback host without client keys (refused "
        "otherwise). Anyone who reaches the port then spends the upstream keys and reads every "
        "session; the log and `/health` say so.",
        "auth_cache_ttl": "Seconds a verified key is trusted without asking the store: how "
        "soon a key revoked or rotated by `skillstate keys` is refused by a running proxy.",
        "wrong_key_limit": "Wrong client keys accepted from one client address per "
        "`wrong_key_window`; past it the address gets a 429 with `Retry-After`, answered "
        "before the key is hashed (a right key from another address is unaffected). 0 turns "
        "the limit off. Behind a load balancer every client shares its address: see "
        "docs/security.md.",
        "wrong_key_window": "Seconds over which `wrong_key_limit` counts an address's wrong "
        "keys (a fixed window from its first failure).",
        "max_body_bytes": "Largest request body accepted (413 above).",
        "max_header_bytes": "Largest request head (request line and headers) accepted; "
        "431 above (414 while still in the request target), refused before it is buffered.",
        "header_timeout": "Seconds a connection has to send a request's head (also a new "
        "connection that sends nothing); 408 and closed after.",
        "body_timeout": "Seconds a request has to send its body after its head; 408 and "
        "closed after.",
        "max_connections": "Open client connections; one more is answered 503 (Anthropic "
        "clients: 529) with `retry-after` and closed.",
        "max_patch_bytes": "Largest `state_patch` accepted from a model.",
        "max_state_bytes": "Largest state after a merge; a patch that grows it past this is "
        "rejected.",
        "max_retries": "Re-asks (rollback-retries) after an invalid patch, per turn.",
        "capture_limit_bytes": "How much of a streamed reply is kept to find the envelope in.",
        "session_ttl": "Seconds after the last update before a session is purged (0 = never).",
        "max_sessions": "Sessions the store keeps; a turn that would start one more is refused "
        "with 507 before it calls upstream (0 = no cap).",
        "session_cache_bytes": "Bytes of session state kept in memory (the write-through "
        "cache); states are held as their stored JSON, so this is the real bound. A PostgreSQL "
        "store keeps one only with `coordination` set (a turn's lease tells whether a copy is "
        "current).",
        "store_busy_timeout": "SQLite: seconds a write waits for a lock held by another "
        "process before the turn fails with 503 `store_unavailable` (nothing committed).",
        "store_synchronous": "SQLite: `normal` (the default) writes each commit to the WAL "
        "file before the turn is answered, so a killed or crashed proxy loses nothing "
        "acknowledged, and syncs it to disk at checkpoints: a power loss or an OS crash can "
        "lose the last commits. `full` also syncs the WAL on every commit (each turn waits "
        "for the disk).",
        "store": "Where durable data lives: `sqlite:///path/to/file.db` (the URL's path is the "
        "file), or `postgresql://user:pass@host:port/db` for a store shared by replicas. Unset: "
        "`<data_dir>/skillstate.db`, one proxy process per data directory.",
        "store_pool_size": "PostgreSQL connections each replica keeps in its pool.",
        "store_timeout": "Seconds a PostgreSQL store may take to connect, to hand out a pooled "
        "connection or to run one statement; past it the turn fails with 503 in its dialect "
        "(a turn's commit is one statement: written whole or not at all).",
        "coordination": "Redis URL (`redis://host:port/db`, `rediss://…`) for what replicas "
        "share: per-session turn leases, rpm/tpm windows, circuit breakers. Unset: all of them "
        "live in this process, which is right for a single proxy.",
        "coordination_down": "While Redis is unreachable: `refuse` turns (503 in the client's "
        "dialect), or run them on this replica's `local` leases, windows and breakers (limits "
        "then hold per replica only, and /health reports the degradation). Either way Redis "
        "is tried again every second, and its return needs no restart.",
        "coordination_timeout": "Seconds a Redis connect, command or wait for a pooled "
        "connection may take before Redis counts as unreachable (then `coordination_down` "
        "decides). Raise it for a Redis across a slow link; every turn may wait this long on a "
        "dead Redis before it is found out.",
        "lease_ttl": "Seconds a turn's session lease lives without renewal; a running turn "
        "renews it every third of this, so this bounds how long a crashed replica blocks its "
        "sessions. A turn whose lease went unrenewed this long (the process paused) is not "
        "committed: 409 `lease_lost`. See docs/scaling.md.",
        "lease_wait": "Seconds a turn queues (first come, first served across replicas) for "
        "its session's lease before it gets a 409 `session_busy`, with nothing sent upstream.",
        "health_timeout": "Longest wait of `/health` for the store; a store that cannot "
        "write is a 503, not a stall.",
        "ledger_retention": "Seconds the cost ledger keeps rows (0 = forever).",
        "idempotency_ttl": "Seconds a turn's reply is kept under its `Idempotency-Key`: a "
        "retry with the key within this time gets the kept reply (nothing sent upstream); "
        "after it the key is purged and a retry is a new turn. See docs/endpoints.md.",
        "idempotency_max_reply_bytes": "Largest reply (a JSON body or a stream's bytes) kept "
        "under an `Idempotency-Key`. A larger one is still committed with its key, but a "
        "retry gets a 409 `idempotency_reply_not_kept` instead of the reply.",
        "purge_interval": "Seconds between purges of expired sessions, ledger rows and "
        "replies kept under an `Idempotency-Key`.",
        "retry_max_attempts": "Attempts per upstream request (transport errors, 5xx, 429).",
        "retry_base_delay": "Backoff base in seconds: full jitter, uniform in "
        "[0, min(retry_max_delay, base × 2^attempt)].",
        "retry_max_delay": "Upper bound of a backoff delay in seconds.",
        "retry_after_cap": "Longest `Retry-After` the proxy honours before failing over.",
        "failure_threshold": "Consecutive failures that open an upstream's circuit breaker.",
        "open_cooldown": "Seconds an open breaker waits before one probe request.",
        "breaker_sync": "With coordination: seconds a replica trusts a shared breaker it "
        "last read as closed without failures, before asking Redis again (0: every call "
        "asks; capped at half of open_cooldown).",
        "connect_timeout": "Seconds to connect to an upstream.",
        "first_byte_timeout": "The longest wait, in seconds, for any read from an upstream.",
        "total_timeout": "One deadline, in seconds, for a whole request: retries, failover "
        "and the reading of a stream included.",
        "prices": "Per-model price overrides (USD per million tokens), keyed by model name; "
        "see *Price overrides* below.",
        "budget_max_tokens": "Output tokens a budget reserves for a call that sets no "
        "`max_tokens` (nor `max_completion_tokens`, `max_output_tokens`): with the estimated "
        "input, the call's worst case, held against the key's and the session's budgets "
        "until its real cost is in the ledger. Such a call under a budget is sent with this "
        "limit (the model stops there, `finish_reason` `length`; a provider that refuses "
        "it, as above the model's own output maximum, gets the call again as it came); "
        "without a budget it goes as it came.",
    },
    Upstream: {
        "name": "Unique name; shown in `x-skillstate-upstream`, `/health` and `/cost`.",
        "url": "Base URL (`https://api.openai.com/v1`, `https://api.anthropic.com`, "
        "`http://127.0.0.1:8080/v1`, ...).",
        "api_key": "The proxy's key for this upstream. Unset: the client's own key is "
        "forwarded; `SKILLSTATE_API_KEY` fills in keys the file leaves out.",
        "priority": "Lower is tried first.",
        "kind": "Wire format: `openai` (chat completions) or `anthropic` (Messages).",
        "models": "fnmatch patterns of the models this upstream serves; empty = every model.",
        "rpm": "Local requests-per-minute limit, checked before each attempt.",
        "tpm": "Local tokens-per-minute limit.",
        "headers": "Extra headers sent to this upstream.",
        "anthropic_version": "The `anthropic-version` header for an `anthropic` upstream.",
        "prices": "Price overrides for every model of this upstream.",
        "max_tokens_field": "The field an Anthropic client's `max_tokens` becomes on an "
        "`openai` upstream; `auto` = `max_completion_tokens` for OpenAI and Azure OpenAI, "
        "`max_tokens` elsewhere.",
        "cache_pricing": "How this provider bills its prompt cache, for the honest baseline: "
        "`openai` (automatic prefix caching, reads at the cache-read price), `anthropic` (reads "
        "only of prefixes written at `cache_control` breakpoints, writes at the cache-write "
        "price) or `none`. Unset: the upstream's `kind`.",
        "cache_ttl_s": "Seconds a cached prefix lives after its last use (baseline model).",
        "cache_min_tokens": "Shortest prefix (tokens) the provider caches; below it, no cache "
        "read or write is modelled and no breakpoint is added. Unset on an `anthropic` "
        "upstream: Anthropic's minimum for the model (4,096 for Claude Opus 4.5/4.6 and Haiku "
        "4.5, 2,048 for Sonnet 4.6 and Haiku 3/3.5, else 1,024).",
        "cache_min_tokens_by_model": "`cache_min_tokens` per model: fnmatch pattern -> tokens "
        "(the first match wins; it overrides Anthropic's own minimums).",
        "cache_breakpoints": "`auto`: on an `anthropic` upstream the proxy marks the end of the "
        "state context's stable prefix with one `cache_control` breakpoint (within the 4 "
        "allowed, the client's own kept); `off`: never.",
        "context_tokens": "The served model's context limit in tokens (a local server's "
        "`--ctx-size`/`num_ctx`). The `window` form checkpoints before its request passes "
        "0.6 of it. Unset: genai-prices' limit for a hosted model it knows, else only "
        "`window_max_tokens` bounds the window.",
        "context_tokens_by_model": "`context_tokens` per model: fnmatch pattern -> tokens "
        "(the first match wins).",
    },
    PriceOverride: {
        "input_per_mtok": "USD per million plain input tokens.",
        "output_per_mtok": "USD per million output tokens.",
        "cache_read_per_mtok": "USD per million input tokens read from the prompt cache.",
        "cache_write_per_mtok": "USD per million input tokens written to the prompt cache "
        "(Anthropic's: for five minutes).",
        "cache_write_1h_per_mtok": "USD per million input tokens written to the prompt cache "
        'for one hour (Anthropic\'s `"ttl": "1h"`). Unset: twice the input price, as '
        "Anthropic bills them.",
        "local_zero": "A local model: every token costs 0 (priced, not `unknown`).",
    },
}

SECTIONS: list[tuple[str, type[BaseModel]]] = [
    ("Settings", Settings),
    ("Upstream entries (`upstreams: [...]`)", Upstream),
    ("Price overrides (`prices`, and `prices` of an upstream)", PriceOverride),
]


def config_key(name: str, info: FieldInfo) -> str:
    """The key as written in skillstate.json (the alias when the model has one)."""
    return info.alias or name


def env_vars() -> dict[str, str]:
    """Config key -> the environment variable that sets it (by the SKILLSTATE_<KEY> rule)."""
    out = {}
    for var in ENV_VARS:
        key = var.removeprefix("SKILLSTATE_").lower()
        fields = {config_key(n, i): n for n, i in Settings.model_fields.items()}
        if key in fields:
            out[key] = var
    return out


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value: Any = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if isinstance(value, BaseModel):
        value = value.model_dump()
    text = json.dumps(value, default=str)
    return f"`{text}`"


def _type_text(ann: Any) -> str:
    args = get_args(ann)
    origin = get_origin(ann)
    if origin is Literal:
        return " or ".join(f"`{json.dumps(a)}`" for a in args)
    if isinstance(ann, type) and issubclass(ann, enum.Enum):  # skillstate.choices
        return " or ".join(f"`{json.dumps(m.value)}`" for m in ann)
    if origin in (Union, types.UnionType):
        return " or ".join("`null`" if a is type(None) else _type_text(a) for a in args)
    if not args:
        return f"`{getattr(ann, '__name__', str(ann))}`"
    inner = ", ".join(_type_text(a).strip("`") for a in args)
    return f"`{getattr(origin, '__name__', str(origin))}[{inner}]`".replace("typing.", "")


def _type(info: FieldInfo) -> str:
    return _type_text(info.annotation)


def _bounds(info: FieldInfo) -> str:
    parts = []
    for m in info.metadata:
        for attr, sym in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            v = getattr(m, attr, None)
            if v is not None:
                parts.append(f"{sym} {v}")
        if getattr(m, "min_length", None):
            parts.append(f"length ≥ {m.min_length}")
    return ", ".join(parts)


def missing_descriptions() -> list[str]:
    """Settings of the model with no description, and descriptions of settings that are gone."""
    problems = []
    for model, texts in DESCRIPTIONS.items():
        fields = set(model.model_fields)
        problems += [f"{model.__name__}.{n}: no description" for n in sorted(fields - set(texts))]
        problems += [f"{model.__name__}.{n}: not a setting" for n in sorted(set(texts) - fields)]
    return problems


def render() -> str:
    """The reference as Markdown: one table per model, every field of the model in order."""
    problems = missing_descriptions()
    if problems:
        raise ValueError(
            "configuration reference out of date (edit DESCRIPTIONS in "
            "scripts/config_reference.py): " + "; ".join(problems)
        )
    env = env_vars()
    out = []
    for title, model in SECTIONS:
        out += [f"## {title}", "", "| key | default | |", "| --- | --- | --- |"]
        for name, info in model.model_fields.items():
            key = config_key(name, info)
            bounds = _bounds(info)
            var = f" · env `{env[key]}`" if model is Settings and key in env else ""
            meta = f"<small>{_type(info)}{f' ({bounds})' if bounds else ''}{var}</small>"
            out.append(f"| `{key}` | {_default(info)} | {DESCRIPTIONS[model][name]}<br>{meta} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(render())
