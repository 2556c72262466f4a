"""``Turn``'s derived facts (``skillstate.turn.types``)."""

from __future__ import annotations

import dataclasses

from skillstate.choices import Mode
from skillstate.turn.types import Turn


def test_a_session_is_new_only_while_it_is_the_one_the_proxy_made_up() -> None:
    named = Turn("openai", {}, {}, "k:s", Mode.PASSTHROUGH)
    assert not named.new_session  # the client named it: it may have a stored budget
    minted = dataclasses.replace(named, minted_session="k:s")
    assert minted.new_session
    # A compaction block or a previous response resolved it to an existing session.
    assert not dataclasses.replace(minted, session="k:old").new_session
