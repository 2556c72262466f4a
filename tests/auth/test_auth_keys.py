"""Client keys (issue 16): the `keys` commands, what the store keeps, how keys compare."""

from __future__ import annotations

import hmac
import json
import os
import sqlite3
import stat
from pathlib import Path

import pytest

from skillstate.auth import keys as keymod
from skillstate.auth.keys import KeyHasher, parse_duration, same_digest, server_secret
from skillstate.cli.main import main


def keys_cmd(capsys: pytest.CaptureFixture[str], data: Path, *args: str) -> tuple[int, str, str]:
    rc = main(["keys", "--data-dir", str(data), *args])
    out, err = capsys.readouterr()
    return rc, out.strip(), err.strip()


def test_create_prints_a_key_once_and_the_store_holds_only_its_digest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, key, _ = keys_cmd(capsys, tmp_path, "create", "--name", "alice", "--rpm", "5")
    assert rc == 0 and key.startswith("sk-ss-") and len(key) > 40
    rc, listing, _ = keys_cmd(capsys, tmp_path, "list", "--json")
    assert rc == 0 and '"alice"' in listing and key not in listing and "digest" not in listing
    db = sqlite3.connect(tmp_path / "skillstate.db")
    raw = (tmp_path / "skillstate.db").read_bytes()
    rows = db.execute("SELECT * FROM api_keys").fetchall()
    assert len(rows) == 1
    assert all(key not in str(v) and key[6:] not in str(v) for v in rows[0])
    assert key.encode() not in raw and key[6:].encode() not in raw
    digest = db.execute("SELECT digest FROM api_keys").fetchone()[0]
    assert digest == KeyHasher(server_secret(tmp_path)).digest(key)
    mode = stat.S_IMODE(os.stat(tmp_path / keymod.SECRET_FILE).st_mode)
    assert mode == 0o600


def test_rotate_replaces_the_digest_and_revoke_marks_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, old, _ = keys_cmd(capsys, tmp_path, "create", "--name", "bob", "--admin")
    rc, new, _ = keys_cmd(capsys, tmp_path, "rotate", "bob")
    assert rc == 0 and new.startswith("sk-ss-") and new != old
    hasher = KeyHasher(server_secret(tmp_path))
    db = sqlite3.connect(tmp_path / "skillstate.db")
    (digest,) = db.execute("SELECT digest FROM api_keys WHERE name='bob'").fetchone()
    assert digest == hasher.digest(new) and digest != hasher.digest(old)
    assert keys_cmd(capsys, tmp_path, "revoke", "bob")[:2] == (0, "revoked bob")
    (revoked,) = db.execute("SELECT revoked FROM api_keys WHERE name='bob'").fetchone()
    assert revoked is not None
    assert "revoked" in keys_cmd(capsys, tmp_path, "list")[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("create", "--name", "a b"), "key name must match"),
        (("create", "--name", "x", "--expires", "soon"), "expected a duration"),
        (("create", "--name", "x", "--expires", "99999999999w"), "at most 36500d"),
        (("create", "--name", "x", "--rpm", "9" * 23), "rpm must be at most 9,007,199,254,740,991"),
        (("create", "--name", "x", "--budget-usd-per-day", "1e300"), "budget_usd_per_day must be"),
        (("revoke", "nobody"), "no key named 'nobody'"),
        (("rotate", "nobody"), "no key named 'nobody'"),
    ],
)
def test_cli_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    assert keys_cmd(capsys, tmp_path, "create", "--name", "first")[0] == 0  # a store
    rc, _, err = keys_cmd(capsys, tmp_path, *args)
    assert rc == 2 and message in err and "\n" not in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--rpm", "0", "argument --rpm: must be a whole number >= 1 (got '0')"),
        ("--tpm", "1_000", "argument --tpm: must be a whole number >= 1"),
        ("--rpm", "\uff11", "argument --rpm: must be a whole number >= 1"),
        ("--budget-usd-per-day", "inf", "argument --budget-usd-per-day: must be a positive"),
        ("--budget-usd-per-day", "nan", "positive number of USD, like 5.00"),
        ("--budget-usd-per-day", "1_000", "positive number of USD, like 5.00 (got '1_000')"),
        ("--budget-usd-per-day", "\uff11", "positive number of USD"),
        ("--budget-usd-per-day", "-5", "positive number of USD"),
        ("--max-session-budget-usd", "inf", "argument --max-session-budget-usd: must be"),
        ("--max-session-budget-usd", "0x10", "positive number of USD"),
    ],
)
def test_limit_options_take_what_the_budget_header_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, message: str
) -> None:
    # float() and int() would take 1_000 as 1000 and a full-width digit as that digit:
    # a budget typed at the command line reads as the budget header does (cost.budgets).
    with pytest.raises(SystemExit) as exc:
        main(["keys", "--data-dir", str(tmp_path), "create", "--name", "x", option, value])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and message in err and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "skillstate.db").exists()  # nothing was created


@pytest.mark.parametrize(
    ("option", "value", "stored"),
    [("--budget-usd-per-day", " 2.50 ", 2.5), ("--rpm", "60", 60), ("--tpm", "1000", 1000)],
)
def test_limit_options_in_the_plain_forms_are_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, stored: float
) -> None:
    assert keys_cmd(capsys, tmp_path, "create", "--name", "x", option, value)[0] == 0
    assert main(["keys", "--data-dir", str(tmp_path), "list", "--json"]) == 0
    (key,) = json.loads(capsys.readouterr().out)
    assert key[option.lstrip("-").replace("-", "_")] == stored


def test_a_taken_name_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys_cmd(capsys, tmp_path, "create", "--name", "alice")
    rc, out, err = keys_cmd(capsys, tmp_path, "create", "--name", "alice")
    assert rc == 2 and out == ""
    assert err == "skillstate: keys create: a key named 'alice' already exists"


def test_digests_are_compared_with_hmac_compare_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str]] = []
    real = hmac.compare_digest

    def spy(a: str, b: str) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(keymod.hmac, "compare_digest", spy)
    assert same_digest("ab", "ab") and not same_digest("ab", "ac")
    assert calls == [("ab", "ab"), ("ab", "ac")]


def test_durations() -> None:
    assert parse_duration("30d") == 30 * 86400
    assert parse_duration("90m") == 5400
    with pytest.raises(ValueError):
        parse_duration("0d")
    for other_digits in ("\uff13\uff10d", "\u0663d"):  # float() reads them; a duration does not
        with pytest.raises(ValueError, match="expected a duration"):
            parse_duration(other_digits)


def test_a_stored_expiry_past_year_9999_still_lists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store written before durations were bounded may hold such a key: it lists."""
    keys_cmd(capsys, tmp_path, "create", "--name", "old", "--expires", "30d")
    with sqlite3.connect(tmp_path / "skillstate.db") as db:
        db.execute("UPDATE api_keys SET expires = 1e20 WHERE name = 'old'")
    rc, out, err = keys_cmd(capsys, tmp_path, "list")
    assert rc == 0 and "old" in out and "9999-12-31" in out and err == ""
