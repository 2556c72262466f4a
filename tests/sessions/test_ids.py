"""Minted session ids (a request without ``x-skillstate-session``): valid, unguessable, and
in the order they were minted, so the ledger's ``(session, ts)`` index takes them at its end."""

from __future__ import annotations

import time

import pytest

from skillstate.sessions.ids import is_valid_session_id, resolve_session_id


def test_minted_ids_sort_in_the_order_they_were_minted(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(1_764_000_000_000_000_000, 1_764_000_050_000_000_000, 1_000_000))
    monkeypatch.setattr(time, "time_ns", lambda: next(clock))
    minted = [resolve_session_id(None) for _ in range(50)]
    assert minted == sorted(minted)
    assert all(is_valid_session_id(s) for s in minted)


def test_minted_ids_in_one_millisecond_differ_by_96_random_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: 1_764_000_000_000_000_000)
    minted = {resolve_session_id(None) for _ in range(1000)}
    assert len(minted) == 1000
    prefixes = {s[:-16] for s in minted}
    assert prefixes == {f"s_{1_764_000_000_000:012x}"}  # then 16 base64url characters


def test_a_named_session_keeps_its_id() -> None:
    assert resolve_session_id("my-session_1") == "my-session_1"
