"""``Turn``'s derived facts (``skillstate.turn.types``)."""

from __future__ import annotations

import dataclasses

import pytest

from skillstate.choices import Mode
from skillstate.dialects.registry import get_dialect
from skillstate.turn import types
from skillstate.turn.types import Turn


def test_a_session_is_new_only_while_it_is_the_one_the_proxy_made_up() -> None:
    named = Turn("openai", {}, {}, "k:s", Mode.PASSTHROUGH)
    assert not named.new_session  # the client named it: it may have a stored budget
    minted = dataclasses.replace(named, minted_session="k:s")
    assert minted.new_session
    # A compaction block or a previous response resolved it to an existing session.
    assert not dataclasses.replace(minted, session="k:old").new_session


def test_a_turn_keeps_the_dialect_its_maker_looked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 22: one dialect lookup a turn. parse_turn looks it up for the request checks and
    # hands it over; the turn must not look it up again.
    looked_up = get_dialect("anthropic")
    monkeypatch.setattr(types, "get_dialect", lambda name: pytest.fail(f"looked up {name}"))
    turn = Turn("anthropic", {}, {}, "s", Mode.STATE, looked_up=looked_up)
    assert turn.wire is looked_up
    with pytest.raises(AssertionError):  # another dialect's object is a bug, not a turn
        Turn("openai", {}, {}, "s", Mode.STATE, looked_up=looked_up)


def test_a_turn_made_without_its_dialect_looks_it_up_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(types, "get_dialect", lambda name: calls.append(name) or get_dialect(name))
    turn = Turn("openai", {}, {}, "s", Mode.STATE)
    assert turn.wire is turn.wire is get_dialect("openai")
    assert calls == ["openai"]
    # dataclasses.replace makes a new turn, which looks it up again when asked
    assert dataclasses.replace(turn, session="t").wire is get_dialect("openai")
    assert calls == ["openai", "openai"]
