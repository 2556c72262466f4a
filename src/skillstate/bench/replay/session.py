"""A recorded agent session, in the form the replay sends it: the client's messages, and per
model call which of them the client sent, what the model answered and what it billed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from skillstate.cost.usage import Usage

# The wire format the session's client spoke: Anthropic Messages, OpenAI chat completions,
# OpenAI Responses.
ClientDialect = Literal["anthropic", "openai", "responses"]
# The provider whose prompt cache the log's own calls were billed under.
Provider = Literal["anthropic", "openai"]
REGIMES = ("openai", "anthropic", "none")  # the replay upstream's cache regimes
# The simulated model's envelope size when a request asks for one: the envelopes the
# simulated coding agent wrote on 60 real SWE-bench traces came to about 130 tokens (issue 23).
ENVELOPE_TOKENS = 130


@dataclass(frozen=True, slots=True)
class Reply:
    """The recorded assistant reply, as the simulated upstream returns it: text and tool
    calls (chat-completions shape: id, name, JSON arguments)."""

    text: str
    tool_calls: tuple[dict[str, Any], ...] = ()
    output_tokens: int | None = None  # recorded by the provider (None: estimate it)

    def tool_inputs(self) -> list[Any]:
        return [c["function"]["arguments"] for c in self.tool_calls]


@dataclass(slots=True)
class Call:
    """One model call: the pool indices of the messages the client sent, in order, the
    ``cache_control`` paths it marked (Anthropic; ``["messages", i, "content", j]`` or
    ``["system", j]``), the recorded reply and usage, and when it was made (seconds)."""

    messages: list[int]
    reply: Reply
    usage: Usage | None = None
    at: float | None = None
    marks: list[tuple[Any, ...]] | None = None  # None: the agent's default breakpoints


@dataclass(slots=True)
class Session:
    """One recorded session. ``pool`` holds each distinct message once (in the client's
    dialect); the calls refer to it by index."""

    id: str
    source: str  # claude-code | codex | transcript
    dialect: ClientDialect
    provider: Provider
    model: str | None
    pool: list[dict[str, Any]] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    system: Any = None  # Anthropic top-level system (blocks or str); None when absent
    tools: list[dict[str, Any]] | None = None  # None: the log did not record them
    params: dict[str, Any] = field(default_factory=dict)  # other body fields as sent
    headers: dict[str, str] = field(default_factory=dict)  # e.g. anthropic-beta as sent
    notes: list[str] = field(default_factory=list)  # what could not be replayed exactly
    skipped: list[str] = field(default_factory=list)  # lines of the log that did not parse
    # Per call, what identifies it in another file too (None: nothing does): a call another
    # session replayed is counted there only (see sources.iter_sessions).
    call_keys: list[Any] = field(default_factory=list)

    def add(self, message: dict[str, Any]) -> int:
        self.pool.append(message)
        return len(self.pool) - 1

    @property
    def recorded_usage(self) -> bool:
        return any(c.usage is not None for c in self.calls)
