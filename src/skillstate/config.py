"""Configuration: defaults < config file < environment < CLI flags, validated by pydantic.

Layering is explicit (plain dicts merged in order, validated once) so that each error can
name the setting it is about. Config files use snake_case keys; the camelCase spellings of
the original Node tool are accepted as aliases.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import jsonschema
import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .choices import (
    AuthMode,
    CacheBreakpoints,
    Compaction,
    Constrain,
    CoordinationDown,
    Mode,
    ReplyEnvelope,
)
from .cost.baseline import (
    ANTHROPIC_MIN_TOKENS,
    CACHE_PRICING,
    DEFAULT_MIN_TOKENS,
    DEFAULT_TTL_S,
    CachePricing,
    CacheRegime,
)
from .cost.pricing import PriceOverride
from .dialects.registry import DIALECTS
from .jsontext import integers_beyond_64_bits, large_floats
from .numbertext import whole_number
from .store.schemes import URL_FORMS, url_problem
from .urltext import masked

DEFAULT_PORT = 8789
MiB = 1024 * 1024
DAY = 86400.0


class ConfigError(Exception):
    """A configuration problem, reported as one line naming the setting."""


@functools.lru_cache(maxsize=256)
def _anthropic_min_tokens(model: str | None) -> int:
    """Anthropic's minimum cacheable prefix for ``model`` (asked on every turn)."""
    for pattern, tokens in ANTHROPIC_MIN_TOKENS.items():
        if model and fnmatch.fnmatchcase(model, pattern):
            return tokens
    return DEFAULT_MIN_TOKENS


@functools.lru_cache(maxsize=256, typed=True)
def _cache_regime(pricing: CachePricing, ttl_s: float, min_tokens: int) -> CacheRegime:
    """One (immutable) CacheRegime per setting: every answered turn asks for its upstream's,
    and building and validating one costs more than the rest of the lookup."""
    return CacheRegime(pricing, ttl_s, min_tokens)


# Strict: a config value is of its JSON type ("port": true, "80" or 80.0, "rpm": "1_000" are
# errors, not 1, 80 and 1000); choices (the enums) and paths are read from their names.
class Upstream(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(min_length=1)
    url: str
    api_key: str | None = None
    priority: int = 0
    kind: str = "openai"  # a wire format in skillstate.dialects.registry.DIALECTS
    models: list[str] = Field(default_factory=list)  # fnmatch patterns; empty = every model
    rpm: int | None = Field(default=None, ge=0)
    tpm: int | None = Field(default=None, ge=0)
    headers: dict[str, str] = Field(default_factory=dict)
    anthropic_version: str = "2023-06-01"
    prices: PriceOverride | None = None
    # The field a translated Anthropic request's max_tokens becomes on an OpenAI-kind upstream.
    # "auto": max_completion_tokens for OpenAI's own API (its reasoning models refuse
    # max_tokens), max_tokens elsewhere (Ollama, LM Studio and others ignore the newer name).
    max_tokens_field: Literal["auto", "max_tokens", "max_completion_tokens"] = "auto"
    # How the provider bills its prompt cache (the honest baseline's model of it, and the
    # cost-aware auto's estimates). None: the upstream's kind when it is a known regime.
    cache_pricing: CachePricing | None = None
    cache_ttl_s: float = Field(default=DEFAULT_TTL_S, ge=0)
    cache_min_tokens: int = Field(default=DEFAULT_MIN_TOKENS, ge=0)
    cache_min_tokens_by_model: dict[str, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict
    )  # fnmatch pattern -> tokens
    cache_breakpoints: CacheBreakpoints = Field(default=CacheBreakpoints.AUTO, strict=False)
    # The model's context limit in tokens, for the window's checkpoint rule: genai-prices
    # knows the hosted models' limits, not a local server's (llama.cpp's --ctx-size, Ollama's
    # num_ctx), and a window that outgrows the server's context fails the turn upstream.
    context_tokens: int | None = Field(default=None, ge=1_000)
    context_tokens_by_model: dict[str, Annotated[int, Field(ge=1_000)]] = Field(
        default_factory=dict
    )  # fnmatch pattern -> tokens

    @property
    def cache_pricing_in_effect(self) -> CachePricing:
        if self.cache_pricing is not None:
            return self.cache_pricing
        for pricing in CACHE_PRICING:  # openai-responses is billed like openai
            if self.kind == pricing or self.kind.startswith(pricing + "-"):
                return pricing
        return "none"

    def cache_regime(self, model: str | None) -> CacheRegime:
        """How this upstream bills the prompt cache for ``model``. Its minimum: the first
        ``cache_min_tokens_by_model`` pattern that matches; else, on an ``anthropic``
        upstream whose ``cache_min_tokens`` is not set, Anthropic's for the model (4,096 for
        Haiku 4.5, ...); else ``cache_min_tokens``."""
        pricing = self.cache_pricing_in_effect
        minimum = self.cache_min_tokens
        for pattern, tokens in self.cache_min_tokens_by_model.items():
            if model and fnmatch.fnmatchcase(model, pattern):
                minimum = tokens
                break
        else:
            if pricing == "anthropic" and "cache_min_tokens" not in self.model_fields_set:
                minimum = _anthropic_min_tokens(model)
        return _cache_regime(pricing, self.cache_ttl_s, minimum)

    def context_limit(self, model: str | None) -> int | None:
        """The context limit this upstream's entry sets for ``model`` (the first matching
        ``context_tokens_by_model`` pattern, else ``context_tokens``); None: not set."""
        for pattern, tokens in self.context_tokens_by_model.items():
            if model and fnmatch.fnmatchcase(model, pattern):
                return tokens
        return self.context_tokens

    @property
    def openai_max_tokens_field(self) -> str:
        if self.max_tokens_field != "auto":
            return self.max_tokens_field
        host = (urlsplit(self.url).hostname or "").lower()
        openai_host = host == "api.openai.com" or host.endswith(".openai.azure.com")
        return "max_completion_tokens" if openai_host else "max_tokens"

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        if v not in DIALECTS:
            raise ValueError(f"must be one of {', '.join(sorted(DIALECTS))}, got {v!r}")
        return v

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str, info: ValidationInfo) -> str:
        problem = upstream_url_problem(v)
        if problem:
            name = info.data.get("name")
            raise ValueError(f"upstream {name!r}: {problem}" if isinstance(name, str) else problem)
        return v.rstrip("/")


def upstream_url_problem(v: str) -> str | None:
    """What is wrong with ``v`` as an upstream's base URL, or None. The proxy appends the
    API's path to it and sends the key in a header, so a user part, query, fragment, blank or
    control character would break every call; the message shows the URL masked (it may
    carry a key)."""
    shown = masked(v)
    if any(c.isspace() or not c.isprintable() for c in v):
        return (
            f"blanks or control characters in {shown!r}; write the base URL alone, "
            "e.g. https://api.openai.com/v1"
        )
    try:
        parts = urlsplit(v)
    except ValueError as e:  # e.g. an unclosed IPv6 bracket
        return f"{e} in {shown!r}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"must be an http(s) URL, got {shown!r}"
    try:
        parts.port  # noqa: B018 - raises on a port outside 0-65535 or not a number
    except ValueError:
        return f"bad port in {shown!r}"
    if any(c in '<>"{}|\\^`' for c in parts.netloc):
        return f"bad host in {shown!r}"
    if "@" in parts.netloc:
        return (
            f"a user or password in the URL ({shown}) is not how a key is sent; put the key"
            " in the upstream's api_key (SKILLSTATE_API_KEY for --upstream) and the URL"
            " without it"
        )
    if "?" in v or "#" in v:
        return (
            f"a query or fragment in the URL ({shown}) would come before the API path the"
            " proxy appends; give the base URL alone (a key goes in api_key, other values in"
            " headers)"
        )
    if re.search(r"%(?![0-9A-Fa-f]{2})", v):
        return f"a bad %-escape in {shown!r}"
    return None


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)

    host: str = "127.0.0.1"
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    upstreams: list[Upstream] = Field(default_factory=list)
    schema_keys: list[str] = Field(default_factory=list, alias="schema")
    initial_state: dict[str, Any] = Field(default_factory=dict)
    state_schema: dict[str, Any] | None = None
    data_dir: Path = Field(default_factory=lambda: Path("~/.skillstate"), strict=False)
    verbose: bool = False
    # Observability: /metrics (behind a bearer token when set) and optional OTLP traces.
    metrics_token: str | None = Field(default=None, min_length=16)
    metrics_key_label: bool = False  # /metrics by client key name too (names are bounded)
    otel_endpoint: str | None = None  # OTLP/HTTP base URL; OTEL_EXPORTER_OTLP_ENDPOINT works too
    otel_capture_content: bool = False  # message content and patches on spans
    mode: Mode = Field(default=Mode.STATE, strict=False)
    constrain: Constrain = Field(default=Constrain.OFF, strict=False)
    schema_violation: Literal["reject", "drop"] = "reject"
    # Responses API tools without a chat-completions/Anthropic form (web_search, namespace…)
    # for an upstream not of kind openai-responses.
    unsupported_tools: Literal["drop", "reject"] = "drop"
    reply_envelope: ReplyEnvelope = Field(default=ReplyEnvelope.STRIP, strict=False)
    mask_keep: int = Field(default=3, ge=1)  # mode mask: the last observations kept whole
    # who compacts for openai-responses upstreams
    compaction: Compaction = Field(default=Compaction.NATIVE, strict=False)
    # mode window: exchanges kept verbatim after a checkpoint, and the window's bound (tokens)
    window_keep: int = Field(default=3, ge=0)
    window_max_tokens: int = Field(default=32_000, ge=1_000)
    # mode auto: may it move a session to the compact context (state mode's) where that is
    # cheaper than the window? Off: the recent turns stay verbatim (issue 23).
    auto_compact: bool = False

    # Which Host and Origin headers are served besides loopback and the proxy's own pages
    # (DNS rebinding and cross-site protection, see guards.py); "*" turns a check off.
    allowed_hosts: list[str] = Field(default_factory=list)
    allowed_origins: list[str] = Field(default_factory=list)
    # Credential and billing-scoping client headers (openai-organization, ...) still forwarded
    # to an upstream that has its own api_key; by default they are dropped.
    forward_scoping_headers: list[str] = Field(default_factory=list)
    # Client keys (skillstate.auth): on once a key exists, or always with "required"; a
    # non-loopback listen refuses to start without them unless insecure_no_auth.
    auth: AuthMode = Field(default=AuthMode.AUTO, strict=False)
    insecure_no_auth: bool = False
    auth_cache_ttl: float = Field(default=5.0, ge=0)  # seconds a verified key is trusted
    # Wrong keys from one client address (auth/failures.py): after this many in a window,
    # a 429 before any hashing; 0 = no limit.
    wrong_key_limit: int = Field(default=20, ge=0)
    wrong_key_window: float = Field(default=60.0, gt=0)  # seconds

    max_body_bytes: int = Field(default=16 * MiB, ge=1024)
    # HTTP limits uvicorn does not enforce itself (httplimits.py).
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)  # request line + headers; 431/414
    header_timeout: float = Field(default=10.0, gt=0)  # seconds to receive a request's head; 408
    body_timeout: float = Field(default=60.0, gt=0)  # seconds to receive its body; 408
    max_connections: int = Field(default=512, ge=1)  # open client connections; 503 beyond

    max_patch_bytes: int = Field(default=32 * 1024, ge=16)
    max_state_bytes: int = Field(default=64 * 1024, ge=16)
    max_retries: int = Field(default=2, ge=0, le=10)  # rollback-retries for an invalid patch
    capture_limit_bytes: int = Field(default=1 * MiB, ge=1024)  # stream content kept for extraction

    session_ttl: float = Field(default=7 * DAY, ge=0)  # seconds; 0 = never expire
    max_sessions: int = Field(default=10_000, ge=0)  # sessions kept; more is a 507; 0 = no cap
    session_cache_bytes: int = Field(default=64 * MiB, ge=0)  # in-memory session cache
    store_busy_timeout: float = Field(default=1.0, ge=0)  # wait for another process's lock
    # SQLite's fsync on every commit ("full") or only at checkpoints ("normal": a kill -9
    # loses nothing committed, a power loss or OS crash can lose the last commits).
    store_synchronous: Literal["normal", "full"] = "normal"
    # Where sessions, transitions, the ledger, keys and stored responses live: sqlite:///path
    # (None: <data_dir>/skillstate.db, one proxy per data dir) or postgresql://… (shared by
    # replicas; pair it with coordination).
    store: str | None = None
    store_pool_size: int = Field(default=10, ge=1, le=1000)  # PostgreSQL connections per replica
    store_timeout: float = Field(default=5.0, gt=0)  # PostgreSQL connect/statement bound; 503
    # Redis (redis://… or rediss://…) for what replicas share: per-session turn leases,
    # rpm/tpm windows, circuit breakers. None: all of them in this process.
    coordination: str | None = None
    coordination_down: CoordinationDown = Field(default=CoordinationDown.REFUSE, strict=False)
    # Raise coordination_timeout for a Redis across a slow link.
    coordination_timeout: float = Field(default=1.0, gt=0, le=60)  # seconds; longer: Redis down
    lease_ttl: float = Field(default=10.0, gt=0)  # seconds a turn's session lease lives unrenewed
    # Seconds a turn queues for its session's Redis lease (with ``coordination``; one process
    # queues without bound), and a retry for its Idempotency-Key's turn in flight.
    lease_wait: float = Field(default=30.0, ge=0)
    health_timeout: float = Field(default=1.0, gt=0)  # /health's wait for the store
    ledger_retention: float = Field(default=90 * DAY, ge=0)
    # Replies kept under a client's Idempotency-Key (turn/idempotency.py).
    idempotency_ttl: float = Field(default=DAY, gt=0)  # seconds a key's reply is kept
    idempotency_max_reply_bytes: int = Field(default=4 * MiB, ge=1024)  # larger: not kept
    purge_interval: float = Field(default=3600.0, gt=0)

    retry_max_attempts: int = Field(default=3, ge=1, le=20)
    retry_base_delay: float = Field(default=0.25, ge=0)
    retry_max_delay: float = Field(default=8.0, ge=0)
    retry_after_cap: float = Field(default=30.0, ge=0)
    failure_threshold: int = Field(default=5, ge=1)
    open_cooldown: float = Field(default=30.0, ge=0)
    # With coordination: seconds a replica trusts a shared breaker it read as closed (and
    # clean) without asking Redis again; 0 asks on every call (coordination/breakers.py).
    breaker_sync: float = Field(default=1.0, ge=0)
    connect_timeout: float = Field(default=10.0, gt=0)
    first_byte_timeout: float = Field(default=120.0, gt=0)
    total_timeout: float = Field(default=600.0, gt=0)

    prices: dict[str, PriceOverride] = Field(default_factory=dict)  # per-model overrides
    # The output tokens a budget reserves for a call that sets no max_tokens (nor
    # max_completion_tokens, max_output_tokens): see cost/worstcase.py.
    budget_max_tokens: int = Field(default=32_768, ge=1)

    @field_validator("schema_keys")
    @classmethod
    def _keys(cls, v: list[str]) -> list[str]:
        return [k for k in (s.strip() for s in v) if k]

    @field_validator("state_schema")
    @classmethod
    def _valid_json_schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            try:
                jsonschema.validators.validator_for(v).check_schema(v)
            except jsonschema.SchemaError as e:
                where = "/".join(str(p) for p in e.absolute_path) or "(root)"
                raise ValueError(f"not a valid JSON Schema at {where}: {e.message}") from None
        return v

    @model_validator(mode="after")
    def _initial_state_within_limits(self) -> Settings:
        # Every new session stores it: the same bounds as any state a patch can make.
        try:
            size = len(orjson.dumps(self.initial_state))
        except orjson.JSONEncodeError as e:
            raise ValueError(f"initial_state: cannot be stored as JSON ({e})") from None
        if size > self.max_state_bytes:
            raise ValueError(
                f"initial_state: {size} bytes, over max_state_bytes ({self.max_state_bytes})"
            )
        return self

    @model_validator(mode="after")
    def _unique_upstream_names(self) -> Settings:
        names = [u.name for u in self.upstreams]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"upstream names must be unique: {sorted(dup)}")
        return self

    @field_validator("store")
    @classmethod
    def _store_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        problem = url_problem(v)  # names only the scheme: the URL may carry a password
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("coordination")
    @classmethod
    def _coordination_url(cls, v: str | None) -> str | None:
        # The URL may carry a password: name only its scheme in the error.
        scheme = urlsplit(v).scheme if v is not None else "redis"
        if scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"must be redis://host:port[/db] or rediss://…, not {scheme or '?'}:")
        return v

    @property
    def allowed_keys(self) -> list[str]:
        """The schema: explicit keys, else the keys of initial_state."""
        return self.schema_keys or list(self.initial_state)

    @property
    def db_path(self) -> Path:
        return self.data_dir.expanduser() / "skillstate.db"


# The Node tool's spellings that are not a mechanical camelCase of ours.
_LEGACY_ALIASES = {
    "listenPort": "port",
    "listenHost": "host",
    "stateDir": "data_dir",
    "upstreamUrl": "upstream",
    "apiKey": "api_key",
    "stateSchema": "state_schema",
}
_CAMEL = re.compile(r"(?<=[a-z0-9])([A-Z])")
# Settings fields that pydantic also reads under an alias (populate_by_name): a file's key is
# read as the alias, the name the flags and environment set, so that they override it (and
# both spellings in one file are two spellings of one setting).
_FIELD_ALIASES = {"schema_keys": "schema"}


def _snake(key: str) -> str:
    snake = _LEGACY_ALIASES.get(key) or _CAMEL.sub(r"_\1", key).lower()
    return _FIELD_ALIASES.get(snake, snake)


def _normalise_keys(obj: Any, *, nested: tuple[str, ...] = ("upstreams",), at: str = "") -> Any:
    """camelCase -> snake_case for config keys (top level and upstream entries only;
    user data such as initial_state and headers keep their keys). Two spellings of one
    setting in one object (``listenPort`` and ``port``) are an error naming both, not one
    of them silently dropped; ``at`` is where the object is (the top level: "")."""
    if not isinstance(obj, dict):
        return obj
    out: dict[str, Any] = {}
    written: dict[Any, Any] = {}  # snake_case key -> the key as the file wrote it
    for k, v in obj.items():
        sk = _snake(k) if isinstance(k, str) else k
        if sk in written:
            raise ConfigError(
                f"{at or 'config'}: {written[sk]!r} and {k!r} are the same setting ({sk}); keep one"
            )
        written[sk] = k
        here = f"{at}.{sk}" if at else str(sk)
        if sk in nested and isinstance(v, list):
            v = [_normalise_keys(e, nested=("prices",), at=f"{here}.{i}") for i, e in enumerate(v)]
        elif sk == "prices" and isinstance(v, dict):
            v = {m: _normalise_keys(p, nested=(), at=f"{here}.{m}") for m, p in v.items()}
        out[sk] = v
    # The one-upstream shorthand would silently replace the list.
    if not at and "upstream" in written and "upstreams" in written:
        raise ConfigError(
            f"config: {written['upstream']!r} (one upstream) and {written['upstreams']!r}"
            " both set the upstreams; keep one"
        )
    return out


ENV_VARS = {
    "SKILLSTATE_UPSTREAM": "upstream URL (shorthand for a single upstream)",
    "SKILLSTATE_API_KEY": "key for that upstream",
    "SKILLSTATE_PORT": f"listen port (default {DEFAULT_PORT}; 0 picks a free one)",
    "SKILLSTATE_HOST": "listen host (default 127.0.0.1)",
    "SKILLSTATE_SCHEMA": "comma-separated allowed top-level state keys",
    "SKILLSTATE_INITIAL_STATE": "initial state, a JSON object",
    "SKILLSTATE_CONFIG": "path of the JSON config file",
    "SKILLSTATE_DATA_DIR": "where the SQLite store lives (default ~/.skillstate)",
    "SKILLSTATE_STORE": f"store URL: {URL_FORMS} (the store setting)",
    "SKILLSTATE_COORDINATION": "Redis URL shared by replicas (the coordination setting)",
    "SKILLSTATE_VERBOSE": "1 to log one line per request",
    "SKILLSTATE_MODE": Mode.spelled(),
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def port_number(text: str) -> int | None:
    """A listen port typed as text (``--port``, ``SKILLSTATE_PORT``): a whole number from 0 to
    65535 in the digits 0-9, blanks around it aside; None otherwise (not ``int()``: it reads
    ``8_080``, ``+80`` and ``８０``)."""
    port = whole_number(text.strip())
    return port if port is not None and port <= 65535 else None


def _env_layer(env: Mapping[str, str]) -> dict[str, Any]:
    layer: dict[str, Any] = {}
    simple = {
        "SKILLSTATE_PORT": "port",
        "SKILLSTATE_HOST": "host",
        "SKILLSTATE_DATA_DIR": "data_dir",
        "SKILLSTATE_UPSTREAM": "upstream",
        "SKILLSTATE_API_KEY": "api_key",
        "SKILLSTATE_MODE": "mode",
        "SKILLSTATE_STORE": "store",
        "SKILLSTATE_COORDINATION": "coordination",
    }
    for var, key in simple.items():
        if var in env:
            layer[key] = env[var]
    if "SKILLSTATE_PORT" in env:
        port = port_number(env["SKILLSTATE_PORT"])
        if port is None:
            raise ConfigError(
                f"SKILLSTATE_PORT: the port must be a whole number from 0 to 65535, got"
                f" {env['SKILLSTATE_PORT']!r}"
            )
        layer["port"] = port
    if "SKILLSTATE_SCHEMA" in env:
        layer["schema"] = env["SKILLSTATE_SCHEMA"].split(",")
    if "SKILLSTATE_INITIAL_STATE" in env:
        text = env["SKILLSTATE_INITIAL_STATE"]
        try:
            layer["initial_state"] = orjson.loads(text)
        except orjson.JSONDecodeError as e:
            raise ConfigError(f"SKILLSTATE_INITIAL_STATE: not valid JSON ({e})") from None
        large = large_floats(layer["initial_state"])
        _refuse_wide_integers(
            "SKILLSTATE_INITIAL_STATE", text, [(p, ("initial_state", *p)) for p in large]
        )
    if "SKILLSTATE_VERBOSE" in env:
        val = env["SKILLSTATE_VERBOSE"].strip().lower()
        if val not in _TRUE | _FALSE:
            raise ConfigError(f"SKILLSTATE_VERBOSE: expected 1/0/true/false, got {val!r}")
        layer["verbose"] = val in _TRUE
    return layer


def _file_layer(path: Path, *, explicit: bool) -> dict[str, Any]:
    if not path.exists():
        if explicit:
            raise ConfigError(f"config: file not found: {path}")
        return {}
    try:
        raw = _read_config_file(path)
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ConfigError(f"config: {path} is not valid JSON ({e})") from None
    except OSError as e:
        raise ConfigError(f"config: cannot read {path}: {e.strerror}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path} must hold a JSON object")
    _refuse_wide_integers(
        f"config: {path}",
        raw,
        [
            ((key, *p), (_snake(key), *p))
            for key, value in data.items()
            if _snake(key) in _STATE_JSON
            for p in large_floats(value)
        ],
    )
    data.pop("$schema", None)
    data.pop("_comment", None)
    return _normalise_keys(data)


# The settings a session's state is made of or checked against: an integer in them that
# orjson cannot hold (it reads the nearest float) is an error, not another number.
_STATE_JSON = ("initial_state", "state_schema")


def _refuse_wide_integers(
    label: str, text: str | bytes, places: list[tuple[tuple[Any, ...], tuple[Any, ...]]]
) -> None:
    """A ConfigError when ``text`` writes an integer beyond 64 bits at one of ``places``
    ((path in the parsed ``text``, path as the error names it), each a large float orjson
    read: ``jsontext.large_floats``)."""
    if not places:
        return
    named = dict(places)
    found = integers_beyond_64_bits(text, named)
    if found:
        where = named[found[0]]
        shown = where[0] + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in where[1:])
        raise ConfigError(
            f"{label}: {shown} is an integer beyond 64 bits, which would be read as a float"
            " (another number): write it as a string, or as a float if one is meant"
        )


MAX_CONFIG_BYTES = 1 * MiB


def _read_config_file(path: Path) -> bytes:
    """The file's bytes, refusing what is not a regular file (a FIFO or /dev/zero would hang
    or fill memory) or is larger than any real config."""
    # O_NONBLOCK: opening a FIFO would otherwise wait for a writer (no effect on files).
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"config: {path} is not a regular file")
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config: {path} is larger than {MAX_CONFIG_BYTES // MiB} MiB")
    return data


def load_settings(
    cli: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Settings:
    """Build validated settings. `cli` holds only the flags the user actually gave."""
    cli = {k: v for k, v in (cli or {}).items() if v is not None}
    env = os.environ if env is None else env
    env_layer = _env_layer(env)

    config_path = cli.get("config") or env.get("SKILLSTATE_CONFIG")
    if config_path:
        file_layer = _file_layer(Path(config_path).expanduser(), explicit=True)
    else:
        file_layer = _file_layer((cwd or Path.cwd()) / "skillstate.json", explicit=False)

    if file_layer:
        # The file on its own first: a value in it that the environment or a flag overrides
        # is still checked, so a broken file shows now, not the day the override goes.
        _validated(dict(file_layer))
    merged: dict[str, Any] = {}
    for layer in (file_layer, env_layer, {k: v for k, v in cli.items() if k != "config"}):
        merged.update(layer)
    return _validated(merged)


def _validated(layers: dict[str, Any]) -> Settings:
    """The settings ``layers`` (merged, or the file's alone) make; a ConfigError naming the
    first bad one."""
    _apply_upstream_shorthand(layers)
    if "schema" in layers and isinstance(layers["schema"], str):
        layers["schema"] = layers["schema"].split(",")
    try:
        return Settings.model_validate(layers)
    except ValidationError as e:
        raise ConfigError(_one_line(e)) from None


def file_settings(path: str | Path | None) -> dict[str, Any]:
    """The settings a config file sets, validated, and only those (``{}`` for no file): what
    a bench's own proxies start from before the bench sets its upstream, store and mode."""
    if path is None:
        return {}
    settings = load_settings({"config": str(path)}, env={})
    return settings.model_dump(exclude_unset=True)


def _apply_upstream_shorthand(merged: dict[str, Any]) -> None:
    url = merged.pop("upstream", None)
    key = merged.pop("api_key", None)
    if url is not None:
        merged["upstreams"] = [{"name": "default", "url": url, "api_key": key}]
    elif key is not None and isinstance(merged.get("upstreams"), list):
        # SKILLSTATE_API_KEY fills in keys the file left out.
        merged["upstreams"] = [
            {**u, "api_key": u.get("api_key") or key} if isinstance(u, dict) else u
            for u in merged["upstreams"]
        ]


_TYPE_ERRORS = frozenset({"int_type", "float_type", "bool_type", "string_type", "list_type"})


def _shown(value: Any) -> str:
    """A config value as its JSON (at most 40 characters), for an error line."""
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _one_line(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "config"
    if loc == "schema_keys":
        loc = "schema"
    msg = err["msg"].removeprefix("Value error, ")  # our validators' own words
    if err["type"] == "extra_forbidden":
        msg = "unknown setting"
    elif err["type"] in _TYPE_ERRORS:  # a value of another JSON type: show what it was
        msg += f", got {_shown(err.get('input'))}"
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    return f"{loc}: {msg}{more}"
