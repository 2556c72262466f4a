"""Configuration layering, aliases and one-line errors (unit level)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from skillstate.config import MAX_CONFIG_BYTES, ConfigError, load_settings


def write(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "skillstate.json"
    p.write_text(json.dumps(data))
    return p


def test_defaults(tmp_path: Path) -> None:
    s = load_settings({}, env={}, cwd=tmp_path)
    assert (s.host, s.port, s.mode, s.max_body_bytes) == ("127.0.0.1", 8789, "state", 16 << 20)
    assert s.session_ttl == 7 * 86400 and s.retry_max_attempts == 3 and s.failure_threshold == 5
    assert str(s.data_dir) == "~/.skillstate"


def test_precedence_cli_over_env_over_file(tmp_path: Path) -> None:
    cfg = write(tmp_path, {"port": 1111, "host": "127.0.0.2", "schema": ["a"], "verbose": True})
    env = {"SKILLSTATE_PORT": "2222", "SKILLSTATE_CONFIG": str(cfg), "SKILLSTATE_SCHEMA": "b,c"}
    s = load_settings({"port": 3333}, env=env, cwd=tmp_path)
    assert s.port == 3333  # CLI
    assert s.schema_keys == ["b", "c"]  # env over file
    assert s.host == "127.0.0.2" and s.verbose is True  # file over defaults
    s = load_settings({}, env=env, cwd=tmp_path)
    assert s.port == 2222


def test_implicit_config_file_in_cwd(tmp_path: Path) -> None:
    write(tmp_path, {"mode": "auto"})
    assert load_settings({}, env={}, cwd=tmp_path).mode == "auto"


def test_camelcase_aliases_of_the_node_tool(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        {
            "listenPort": 9999,
            "stateDir": "/tmp/x",
            "initialState": {"stepCount": 0},
            "maxBodyBytes": 2048,
            "upstreams": [{"name": "u", "url": "http://h", "apiKey": "k"}],
        },
    )
    s = load_settings({"config": str(cfg)}, env={}, cwd=tmp_path)
    assert s.port == 9999 and str(s.data_dir) == "/tmp/x" and s.max_body_bytes == 2048
    assert s.initial_state == {"stepCount": 0}  # user data keeps its keys
    assert s.upstreams[0].api_key == "k"
    assert s.allowed_keys == ["stepCount"]  # empty schema -> keys of initial_state


def test_upstream_shorthand_and_env_key(tmp_path: Path) -> None:
    env = {"SKILLSTATE_UPSTREAM": "https://api.example.com/v1", "SKILLSTATE_API_KEY": "sk-1"}
    s = load_settings({}, env=env, cwd=tmp_path)
    assert [(u.name, u.url, u.api_key, u.kind) for u in s.upstreams] == [
        ("default", "https://api.example.com/v1", "sk-1", "openai")
    ]


def test_upstream_list_entries(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        {
            "upstreams": [
                {
                    "name": "a",
                    "url": "https://x/v1",
                    "priority": 2,
                    "kind": "anthropic",
                    "models": ["claude-*"],
                    "rpm": 10,
                    "tpm": 1000,
                    "headers": {"X-Team": "t"},
                }
            ]
        },
    )
    u = load_settings({"config": str(cfg)}, env={}, cwd=tmp_path).upstreams[0]
    assert (u.priority, u.kind, u.models, u.rpm, u.tpm, u.headers) == (
        2, "anthropic", ["claude-*"], 10, 1000, {"X-Team": "t"},
    )  # fmt: skip


def test_cache_minimum_is_anthropics_per_model_unless_set(tmp_path: Path) -> None:
    """An anthropic upstream caches from Anthropic's minimum for the model (the baseline,
    auto's estimates and the proxy's breakpoint use it); a set cache_min_tokens, or a
    cache_min_tokens_by_model pattern, is the user's word; OpenAI's is 1,024 for all."""
    ups = [
        {"name": "a", "url": "https://a/v1", "kind": "anthropic"},
        {"name": "b", "url": "https://b/v1", "kind": "anthropic", "cache_min_tokens": 1500},
        {"name": "c", "url": "https://c/v1", "kind": "anthropic",
         "cache_min_tokens_by_model": {"claude-haiku-*": 3000}},
        {"name": "o", "url": "https://o/v1", "kind": "openai"},
    ]  # fmt: skip
    cfg = write(tmp_path, {"upstreams": ups})
    a, b, c, o = load_settings({"config": str(cfg)}, env={}, cwd=tmp_path).upstreams
    minimum = {
        model: [u.cache_regime(model).min_tokens for u in (a, b, c, o)]
        for model in ("claude-haiku-4-5-20251001", "claude-sonnet-4-6", "claude-sonnet-4-5", None)
    }
    assert minimum == {
        "claude-haiku-4-5-20251001": [4096, 1500, 3000, 1024],
        "claude-sonnet-4-6": [2048, 1500, 2048, 1024],
        "claude-sonnet-4-5": [1024, 1500, 1024, 1024],
        None: [1024, 1500, 1024, 1024],
    }


@pytest.mark.parametrize(
    ("url", "field", "sent"),
    [
        ("https://api.openai.com/v1", "auto", "max_completion_tokens"),
        ("https://team.openai.azure.com/openai/v1", "auto", "max_completion_tokens"),
        ("http://127.0.0.1:11434/v1", "auto", "max_tokens"),
        ("http://127.0.0.1:11434/v1", "max_completion_tokens", "max_completion_tokens"),
        ("https://api.openai.com/v1", "max_tokens", "max_tokens"),
    ],
)
def test_max_tokens_field_for_translated_requests(
    tmp_path: Path, url: str, field: str, sent: str
) -> None:
    cfg = write(tmp_path, {"upstreams": [{"name": "u", "url": url, "max_tokens_field": field}]})
    u = load_settings({"config": str(cfg)}, env={}, cwd=tmp_path).upstreams[0]
    assert u.openai_max_tokens_field == sent


@pytest.mark.parametrize(
    ("cli", "env", "file", "needle"),
    [
        ({"port": 70000}, {}, None, "port"),
        ({}, {"SKILLSTATE_PORT": "abc"}, None, "port"),
        ({"upstream": "ftp://x"}, {}, None, "url"),
        ({"config": "/nonexistent/skillstate.json"}, {}, None, "not found"),
        ({}, {"SKILLSTATE_INITIAL_STATE": "[1, 2]"}, None, "initial_state"),
        ({}, {"SKILLSTATE_INITIAL_STATE": "{bad"}, None, "SKILLSTATE_INITIAL_STATE"),
        ({}, {}, {"listen_prot": 1}, "listen_prot: unknown setting"),
        ({}, {}, {"max_retries": "many"}, "max_retries"),
        ({}, {}, {"upstreams": [{"name": "u"}]}, "upstreams.0.url"),
        ({}, {"SKILLSTATE_VERBOSE": "maybe"}, None, "SKILLSTATE_VERBOSE"),
        ({}, {}, {"state_schema": {"type": "bogus"}}, "state_schema: not a valid JSON Schema"),
        ({"upstream": "http://127.0.0.1:99999/v1"}, {}, None, "bad port"),
        ({"upstream": "http://a b/v1"}, {}, None, "blanks or control characters"),
        ({}, {}, {"store_synchronous": "off"}, "store_synchronous"),
        # A value of another JSON type is an error, not read as a number or a flag.
        ({}, {}, {"port": True}, "port: Input should be a valid integer, got true"),
        ({}, {}, {"port": "8080"}, 'port: Input should be a valid integer, got "8080"'),
        ({}, {}, {"port": 80.0}, "port: Input should be a valid integer, got 80.0"),
        ({}, {}, {"verbose": "yes"}, 'verbose: Input should be a valid boolean, got "yes"'),
        ({}, {}, {"header_timeout": "10"}, "header_timeout: Input should be a valid number"),
        (
            {},
            {},
            {"upstreams": [{"name": "u", "url": "http://a/v1", "rpm": "1_000"}]},
            "upstreams.0.rpm: Input should be a valid integer",
        ),
        (
            {},
            {},
            {"upstreams": [{"name": "u", "url": "http://a/v1", "prices": {"input_per_mtok": "3"}}]},
            "upstreams.0.prices.input_per_mtok: Input should be a valid number",
        ),
        ({}, {"SKILLSTATE_PORT": "8_080"}, None, "SKILLSTATE_PORT: the port must be a whole"),
        ({}, {"SKILLSTATE_PORT": "+80"}, None, "SKILLSTATE_PORT"),
        ({}, {"SKILLSTATE_PORT": "80.0"}, None, "SKILLSTATE_PORT"),
        ({}, {"SKILLSTATE_PORT": "\uff18\uff10"}, None, "SKILLSTATE_PORT"),
    ],
)
def test_bad_config_is_one_clear_line(
    tmp_path: Path, cli: dict, env: dict, file: dict | None, needle: str
) -> None:
    if file is not None:
        write(tmp_path, file)
    with pytest.raises(ConfigError) as e:
        load_settings(cli, env=env, cwd=tmp_path)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg


def test_store_limits_defaults_and_an_initial_state_within_the_state_bounds(
    tmp_path: Path,
) -> None:
    s = load_settings({}, env={}, cwd=tmp_path)
    assert (s.max_sessions, s.session_cache_bytes) == (10_000, 64 << 20)
    assert (s.store_busy_timeout, s.health_timeout) == (1.0, 1.0)
    # Every new session stores initial_state: it gets the bounds of any other state.
    big = json.dumps({"a": "x" * 70_000})
    with pytest.raises(ConfigError, match=r"initial_state: 70008 bytes, over max_state_bytes"):
        load_settings({}, env={"SKILLSTATE_INITIAL_STATE": big}, cwd=tmp_path)
    deep = '{"a": ' + "[" * 300 + "]" * 300 + "}"
    with pytest.raises(ConfigError, match="initial_state: cannot be stored as JSON"):
        load_settings({}, env={"SKILLSTATE_INITIAL_STATE": deep}, cwd=tmp_path)


def test_a_config_that_is_not_a_regular_file_is_refused_without_reading_it(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer forever
    with pytest.raises(ConfigError, match="not a regular file"):
        load_settings({"config": str(fifo)}, env={})
    with pytest.raises(ConfigError, match="not a regular file"):
        load_settings({"config": "/dev/zero"}, env={})


def test_an_oversized_config_file_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_bytes(b'{"_comment": "' + b"x" * (MAX_CONFIG_BYTES + 1) + b'"}')
    with pytest.raises(ConfigError, match="larger than 1 MiB"):
        load_settings({"config": str(big)}, env={})
    ok = tmp_path / "ok.json"
    ok.write_bytes(b'{"_comment": "' + b"x" * (MAX_CONFIG_BYTES - 100) + b'", "port": 9}')
    assert load_settings({"config": str(ok)}, env={}).port == 9


@pytest.mark.parametrize(
    ("setting", "url"),
    [
        ("store", "mysql://admin:hunter2@db/x"),
        ("coordination", "http://admin:hunter2@cache:6379"),
    ],
)
def test_a_bad_store_or_coordination_url_is_one_line_without_its_password(
    setting: str, url: str
) -> None:
    with pytest.raises(ConfigError) as e:
        load_settings({setting: url}, env={})
    assert str(e.value).startswith(f"{setting}: must be ")
    assert "hunter2" not in str(e.value)


def test_store_and_coordination_urls_from_the_environment() -> None:
    s = load_settings(
        {}, env={"SKILLSTATE_STORE": "postgresql://u@h/db", "SKILLSTATE_COORDINATION": "redis://h"}
    )
    assert (s.store, s.coordination) == ("postgresql://u@h/db", "redis://h")
    assert load_settings({}, env={}).store is None


def test_values_of_their_json_type_and_choices_by_name_are_read(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        {"port": 8090, "mode": "window", "auth": "required", "header_timeout": 10,
         "data_dir": str(tmp_path / "d"), "verbose": True,
         "upstreams": [{"name": "u", "url": "http://a/v1", "rpm": 60,
                        "cache_breakpoints": "off", "prices": {"input_per_mtok": 3}}]},
    )  # fmt: skip
    s = load_settings({"config": str(cfg)}, env={"SKILLSTATE_PORT": " 8091 "}, cwd=tmp_path)
    assert (s.port, s.mode.value, s.auth.value, s.header_timeout) == (
        8091,
        "window",
        "required",
        10.0,
    )
    assert s.data_dir == tmp_path / "d" and s.verbose is True
    u = s.upstreams[0]
    assert (u.rpm, u.cache_breakpoints.value) == (60, "off")
    assert u.prices is not None and u.prices.input_per_mtok == 3.0


BIG = 123456789012345678901234567890  # orjson reads it as the float 1.2345678901234568e+29


def test_an_integer_beyond_64_bits_in_the_state_settings_is_refused_not_made_a_float(
    tmp_path: Path,
) -> None:
    # Every new session would start from another number than the one written.
    wide = "an integer beyond 64 bits, which would be read as a float"
    env = {"SKILLSTATE_INITIAL_STATE": json.dumps({"ids": [1, BIG]})}
    with pytest.raises(
        ConfigError, match=rf"^SKILLSTATE_INITIAL_STATE: initial_state\.ids\[1\] is {wide}"
    ):
        load_settings({}, env=env, cwd=tmp_path)
    for key, value, where in [
        ("initial_state", {"id": BIG}, "initial_state.id"),
        ("initialState", {"n": {"m": -(2**63) - 1}}, "initial_state.n.m"),  # the Node spelling
        (
            "state_schema",
            {"properties": {"id": {"const": 2**64}}},
            "state_schema.properties.id.const",
        ),
    ]:
        cfg = write(tmp_path, {key: value})
        with pytest.raises(
            ConfigError, match=rf"^config: {re.escape(str(cfg))}: {where} is {wide}"
        ):
            load_settings({"config": str(cfg)}, env={}, cwd=tmp_path)


def test_large_floats_and_64_bit_integers_in_the_state_settings_are_kept(tmp_path: Path) -> None:
    text = (
        '{"initial_state": {"f": 1e30, "g": 123456789012345678901234567890.0,'
        ' "u": 18446744073709551615, "s": -9223372036854775808}}'
    )
    cfg = tmp_path / "skillstate.json"
    cfg.write_text(text)
    s = load_settings({"config": str(cfg)}, env={}, cwd=tmp_path)
    assert s.initial_state == {"f": 1e30, "g": float(BIG), "u": 2**64 - 1, "s": -(2**63)}
    env = {"SKILLSTATE_INITIAL_STATE": '{"f": 1e30}'}
    assert load_settings({}, env=env, cwd=tmp_path).initial_state == {"f": 1e30}
    # Elsewhere a number is its setting's to judge (a strict integer setting refuses a float).
    cfg = write(tmp_path, {"max_state_bytes": BIG})
    with pytest.raises(ConfigError, match="max_state_bytes"):
        load_settings({"config": str(cfg)}, env={}, cwd=tmp_path)


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("http://usr9:pw9@127.0.0.1:1/v1", "a user or password in the URL"),
        ("https://usr9:SECRET@h/v1?api_key=SECRET", "put the key in the upstream's api_key"),
        ("http://usr9@h/v1", "a user or password in the URL"),
        ("http://127.0.0.1:1/v1?api-version=2024-9", "a query or fragment in the URL"),
        ("http://127.0.0.1:1/v1?api_key=SECRET", "a query or fragment in the URL"),
        ("http://127.0.0.1:1/v1?", "a query or fragment in the URL"),
        ("http://127.0.0.1:1/v1#frag9", "a query or fragment in the URL"),
        ("http://127.0.0.1:1/v1 ", "blanks or control characters"),
        (" http://127.0.0.1:1/v1", "blanks or control characters"),
        (
            "http://127.0.0.1:1/v1\x01",
            "blanks or control characters in 'http://127.0.0.1:1/v1\\x01'",
        ),
        ("http://127.0.0.1:1/v1\n", "blanks or control characters"),
        ("http://127.0.0.1:1/v%zz", "a bad %-escape"),
        ("ftp://usr9:SECRET@h/v1", "must be an http(s) URL, got 'ftp://***@h/v1'"),
        ("http://usr9:SECRET/pw9@h/v1", "upstreams.0.url"),
    ],
)
def test_an_upstream_url_the_proxy_could_not_call_is_refused_without_its_secrets(
    url: str, needle: str
) -> None:
    """These started, then every turn was a 500 (aiohttp refuses credentials in the URL
    beside the Authorization header) or went to a wrong path (the API path appended after
    the query, fragment or blank); and the start-up line showed the password and query."""
    with pytest.raises(ConfigError) as e:
        load_settings({"upstream": url}, env={})
    msg = str(e.value)
    assert needle in msg and "\n" not in msg and "\x01" not in msg, msg
    assert msg.startswith("upstreams.0.url: upstream 'default': ")
    for secret in ("usr9", "pw9", "SECRET", "frag9", "2024-9"):
        assert secret not in msg, msg
    good = load_settings({"upstream": "http://127.0.0.1:1/v1/"}, env={})
    assert good.upstreams[0].url == "http://127.0.0.1:1/v1"


def test_a_file_upstreams_bad_url_names_that_upstream(tmp_path: Path) -> None:
    upstreams = [{"name": "ok", "url": "http://a/v1"}, {"name": "azure", "url": "https://h/v1?k=1"}]
    cfg = write(tmp_path, {"upstreams": upstreams})
    with pytest.raises(ConfigError, match=r"^upstreams\.1\.url: upstream 'azure': a query"):
        load_settings({"config": str(cfg)}, env={})


def test_masked_hides_the_user_part_query_and_fragment() -> None:
    from skillstate.urltext import masked

    assert masked("https://u:p@h:1/v1?api_key=S#f") == "https://***@h:1/v1?***"
    assert masked("http://u:p/w@h/v1") == "http://***@h/v1"  # a "/" in the password
    assert masked("http://h/v1") == "http://h/v1"


@pytest.mark.parametrize(
    ("file", "cli", "env"),
    [
        ({"mode": "bogus"}, {"mode": "state"}, {}),
        ({"mode": "bogus"}, {}, {"SKILLSTATE_MODE": "state"}),
        ({"port": "8080"}, {"port": 0}, {}),
        ({"port": "8080"}, {}, {"SKILLSTATE_PORT": "0"}),
        ({"upstreams": "x"}, {"upstream": "http://127.0.0.1:1/v1"}, {}),
        ({"listenHost": 7}, {"host": "127.0.0.1"}, {}),
        ({"initial_state": []}, {}, {"SKILLSTATE_INITIAL_STATE": "{}"}),
    ],
)
def test_a_file_value_a_flag_or_the_environment_overrides_is_still_checked(
    tmp_path: Path, file: dict, cli: dict, env: dict
) -> None:
    """They started: the broken file showed only on the day the override was dropped."""
    cfg = write(tmp_path, file)
    with pytest.raises(ConfigError) as alone:
        load_settings({"config": str(cfg)}, env={})
    with pytest.raises(ConfigError) as overridden:
        load_settings({"config": str(cfg), **cli}, env=env)
    assert str(overridden.value) == str(alone.value)
    assert "\n" not in str(alone.value)


def test_a_file_the_environment_completes_is_still_valid(tmp_path: Path) -> None:
    """The file alone is checked as a file: what the environment adds to it (an upstream's
    key) is not required of it."""
    cfg = write(tmp_path, {"upstreams": [{"name": "u", "url": "http://h/v1"}], "port": 1})
    s = load_settings({"config": str(cfg)}, env={"SKILLSTATE_API_KEY": "k", "SKILLSTATE_PORT": "2"})
    assert (s.upstreams[0].api_key, s.port) == ("k", 2)


@pytest.mark.parametrize(
    ("file", "message"),
    [
        ({"listenPort": 1, "port": 2},
         "config: 'listenPort' and 'port' are the same setting (port)"),
        ({"port": 2, "listenPort": 1},
         "config: 'port' and 'listenPort' are the same setting (port)"),
        ({"stateDir": "/a", "dataDir": "/b"},
         "config: 'stateDir' and 'dataDir' are the same setting (data_dir)"),
        ({"maxBodyBytes": 2048, "max_body_bytes": 4096}, "'maxBodyBytes' and 'max_body_bytes'"),
        ({"schema": ["a"], "schema_keys": ["b"]}, "'schema' and 'schema_keys' are the same"),
        ({"schemaKeys": ["a"], "schema": ["b"]}, "'schemaKeys' and 'schema' are the same setting"),
        ({"upstreams": [{"name": "u", "url": "http://h", "apiKey": "a", "api_key": "b"}]},
         "upstreams.0: 'apiKey' and 'api_key' are the same setting (api_key)"),
        ({"prices": {"m": {"inputPerMtok": 1.0, "input_per_mtok": 2.0}}},
         "prices.m: 'inputPerMtok' and 'input_per_mtok' are the same setting"),
        ({"upstreamUrl": "http://h/v1", "upstreams": [{"name": "u", "url": "http://g/v1"}]},
         "config: 'upstreamUrl' (one upstream) and 'upstreams' both set the upstreams"),
    ],
)  # fmt: skip
def test_two_spellings_of_one_setting_in_the_file_are_refused_naming_both(
    tmp_path: Path, file: dict, message: str
) -> None:
    """``{"listenPort": 18858, "port": 18859}`` started on 18859 without a word."""
    cfg = write(tmp_path, file)
    with pytest.raises(ConfigError) as e:
        load_settings({"config": str(cfg)}, env={})
    assert message in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).endswith("; keep one")


def test_the_schema_keys_spelling_in_a_file_is_overridden_like_schema(tmp_path: Path) -> None:
    cfg = write(tmp_path, {"schema_keys": ["a"]})
    assert load_settings({"config": str(cfg)}, env={}).schema_keys == ["a"]
    assert load_settings({"config": str(cfg), "schema": "b,c"}, env={}).schema_keys == ["b", "c"]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u@h/db?password=s3cret", "postgresql://u@h/db?password=***"),
        ("postgresql://u@h/db?sslmode=require&sslpassword=s3cret&passfile=/etc/pgpass",
         "postgresql://u@h/db?sslmode=require&sslpassword=***&passfile=/etc/pgpass"),
        ("postgresql://u:pw@h/db?password=s3cret", "postgresql://u:***@h/db?password=***"),
        ("postgresql://u@h/db?pass%77ord=s3cret", "postgresql://u@h/db?pass%77ord=***"),
        ("postgresql://u@h/db?Password=s3cret&x=1", "postgresql://u@h/db?Password=***&x=1"),
        ("redis://h:6379/0?password=s3cret", "redis://h:6379/0?password=***"),
        ("postgresql://u:s3cret@h:abc/db", "postgresql://u:***@h:abc/db"),  # it raised
        ("postgresql://u:s3/cret@h/db", "postgresql://u:***@h/db"),  # "/" in the password
        ("postgresql://u@h/db#s3cret", "postgresql://u@h/db#***"),
        ("sqlite:////var/a@b/x.db", "sqlite:////var/a@b/x.db"),
        ("postgresql://u@h/db?passfile=/p", "postgresql://u@h/db?passfile=/p"),
    ],
)  # fmt: skip
def test_redacted_hides_every_password_a_store_url_can_carry(url: str, shown: str) -> None:
    """A password in the query (asyncpg and libpq read ``password`` and ``sslpassword``
    there) was shown in clear in the start-up line, errors and ``store`` commands."""
    from skillstate.urltext import redacted

    assert redacted(url) == shown
    assert "s3" not in redacted(url)
