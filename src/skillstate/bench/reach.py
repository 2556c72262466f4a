"""Verbatim reach: how much of what the agent's next action used the upstream was shown
verbatim (issue 23's definition; the replay and the benches measure it here, once).

For one replayed call:

* the **action** is the recorded reply's tool calls: the distinctive tokens of their
  arguments (:func:`distinctive_tokens`: identifiers and paths of 8+ characters);
* of those, the **reachable** ones occur in an earlier message of the client's transcript
  for this call, and not in the system prompt, the tool definitions or the task (the first
  user message): a token the model could only know from the history;
* **verbatim reach** is the share of the reachable tokens present in what the upstream
  received, counting only strings the upstream received verbatim from the client's
  transcript (a text block, a tool result, a tool call's arguments): the proxy's state
  block, a summary or a placeholder does not count. Passthrough reaches 1.0 by
  construction; state mode about what its latest exchange holds;
* **reach with state** counts every string the upstream received, the state's text too.

A call without reachable tokens has no reach (None) and is left out of the means.
Strings are compared whole: a transcript string the proxy cut or rewrote is not verbatim.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = [
    "MIN_TOKEN_CHARS",
    "CallReach",
    "ReachMeter",
    "action_tokens",
    "distinctive_tokens",
    "mean_reach",
    "strings_of",
]

MIN_TOKEN_CHARS = 8
_TOKEN = re.compile(r"[A-Za-z_./][A-Za-z0-9_./-]{" + str(MIN_TOKEN_CHARS - 1) + ",}")
_LETTER = re.compile(r"[A-Za-z]")
# Keys whose values are structure, not content (ids, kinds, signatures, cache markers).
_STRUCTURAL = frozenset(
    {
        "type",
        "id",
        "role",
        "tool_use_id",
        "tool_call_id",
        "call_id",
        "signature",
        "status",
        "cache_control",
        "encrypted_content",
        "data",
        "media_type",
    }
)
_JSON_STRING_KEYS = frozenset({"arguments"})  # JSON-encoded objects: walk what they encode


def distinctive_tokens(text: str) -> set[str]:
    """Identifiers and paths of at least ``MIN_TOKEN_CHARS`` characters in ``text``
    (a trailing ``.``, ``-`` or ``/`` is not part of a token)."""
    out: set[str] = set()
    for m in _TOKEN.finditer(text):
        token = m.group(0).rstrip("./-")
        if len(token) >= MIN_TOKEN_CHARS and _LETTER.search(token):
            out.add(token)
    return out


def strings_of(value: Any) -> Iterator[str]:
    """Every content string of a message, block or item (any dialect): texts, tool results,
    tool-call arguments (a JSON-encoded ``arguments`` is decoded and walked), not ids, kinds
    or signatures."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from strings_of(item)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if key in _STRUCTURAL:
                continue
            if key in _JSON_STRING_KEYS and isinstance(item, str):
                yield from strings_of(_decoded(item))
            else:
                yield from strings_of(item)


def _decoded(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def action_tokens(tool_inputs: Iterable[Any]) -> set[str]:
    """The distinctive tokens of a reply's tool-call arguments (dicts or JSON strings)."""
    out: set[str] = set()
    for args in tool_inputs:
        for s in strings_of(_decoded(args) if isinstance(args, str) else args):
            out |= distinctive_tokens(s)
    return out


@dataclass(frozen=True, slots=True)
class CallReach:
    """One call's figures: ``reachable`` tokens, and how many of them the upstream got
    verbatim / anywhere (the state included)."""

    reachable: int
    verbatim: int
    with_state: int

    @property
    def verbatim_share(self) -> float | None:
        return self.verbatim / self.reachable if self.reachable else None

    @property
    def with_state_share(self) -> float | None:
        return self.with_state / self.reachable if self.reachable else None


class ReachMeter:
    """Per session: tokenizes each distinct string once (transcript strings repeat in every
    call), then measures calls (:meth:`measure`)."""

    def __init__(self) -> None:
        self._tokens: dict[str, frozenset[str]] = {}

    def tokens(self, text: str) -> frozenset[str]:
        found = self._tokens.get(text)
        if found is None:
            found = frozenset(distinctive_tokens(text))
            self._tokens[text] = found
        return found

    def tokens_of(self, strings: Iterable[str]) -> set[str]:
        out: set[str] = set()
        for s in strings:
            out |= self.tokens(s)
        return out

    def reachable(
        self, action: set[str], history: Iterable[str], excluded: Iterable[str]
    ) -> set[str]:
        """The action's tokens found in the history's strings and not in the excluded ones
        (system prompt, tools, task)."""
        if not action:
            return set()
        found = action & self.tokens_of(history)
        return found - self.tokens_of(excluded) if found else found

    def measure(
        self, reachable: set[str], transcript: set[str], received: Iterable[str]
    ) -> CallReach:
        """``transcript``: the strings of the client's messages for this call; ``received``:
        the strings of the messages (and system) the upstream received."""
        if not reachable:
            return CallReach(0, 0, 0)
        verbatim: set[str] = set()
        anywhere: set[str] = set()
        for s in received:
            toks = self.tokens(s) & reachable
            if toks:
                anywhere |= toks
                if s in transcript:
                    verbatim |= toks
        return CallReach(len(reachable), len(verbatim), len(anywhere))


def mean_reach(calls: Iterable[CallReach]) -> dict[str, Any]:
    """The mean over calls with reachable tokens of both shares, and the count of them."""
    measured = [c for c in calls if c.reachable]
    if not measured:
        return {"verbatim": None, "with_state": None, "calls": 0}
    n = len(measured)
    return {
        "verbatim": sum(c.verbatim / c.reachable for c in measured) / n,
        "with_state": sum(c.with_state / c.reachable for c in measured) / n,
        "calls": n,
    }
