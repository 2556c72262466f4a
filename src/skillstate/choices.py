"""The closed vocabularies of the proxy, one enum per concept, used by config, CLI, the
pipeline, the ledger and every help text, so that a value is added or renamed in one place.

Members are ``str`` enums: they compare equal to, serialise as and format as their value.
"""

from __future__ import annotations

from enum import Enum
from functools import cache


class Choice(str, Enum):
    """A ``str`` enum that prints as its value (``f"{Mode.STATE}" == "state"``)."""

    # The member's own string (its value) through str's C methods: ``str(turn.mode)`` runs
    # several times a turn, and going through ``self.value`` (an enum property) costs more.
    __str__ = str.__str__

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """The accepted spellings, in declaration order (read on every request: computed
        once per enum)."""
        return _values(cls)

    @classmethod
    def spelled(cls, sep: str = " | ") -> str:
        """The accepted spellings for a help text, e.g. ``state | passthrough | auto``."""
        return sep.join(cls.values())


class Mode(Choice):
    """How a turn is sent upstream: the compact context, the client's transcript untouched,
    the transcript with old observations masked, the state plus a window of recent messages
    verbatim (checkpointed), or whichever form ``auto`` expects to be billed least (state
    kept in state, window and auto modes)."""

    STATE = "state"
    PASSTHROUGH = "passthrough"
    AUTO = "auto"
    MASK = "mask"
    WINDOW = "window"


class Compaction(Choice):
    """Who serves a compaction for an upstream that has its own (a Responses
    ``compaction_trigger`` for ``openai-responses``, the ``compact_20260112`` edit for
    ``anthropic``): that upstream (``native``), or the proxy, from the session's state
    (``proxy``). Every other upstream is served by the proxy."""

    NATIVE = "native"
    PROXY = "proxy"


class ReplyEnvelope(Choice):
    """Whether the client sees the model's state envelope (``keep``) or the reply without
    it (``strip``)."""

    STRIP = "strip"
    KEEP = "keep"


class CacheBreakpoints(Choice):
    """Whether the proxy marks the end of the stable prefix with a ``cache_control``
    breakpoint on Anthropic-kind upstreams."""

    AUTO = "auto"
    OFF = "off"


class CoordinationDown(Choice):
    """What turns do while the coordination service (Redis) is unreachable: ``refuse``
    them (503 in the client's dialect), or run on this replica's ``local`` leases, windows
    and breakers (limits then hold per replica only; /health says so)."""

    REFUSE = "refuse"
    LOCAL = "local"


class Constrain(Choice):
    """Whether the upstream is asked for a JSON-schema-constrained envelope."""

    OFF = "off"
    JSON_SCHEMA = "json_schema"


class GroupBy(Choice):
    """How ``/cost`` and ``skillstate cost`` group ledger rows (``day`` = UTC date)."""

    MODEL = "model"
    UPSTREAM = "upstream"
    SESSION = "session"
    DAY = "day"
    CONTEXT = "context"
    KEY = "key"  # the client key's name (None: a call without client keys)


class ContextShape(Choice):
    """What a turn sent upstream (the ``x-skillstate-context`` header): the compact context,
    the full transcript plus the contract (``auto`` mode), the client's body as is, or the
    transcript with old observations masked; in the window form, ``window`` (the state and
    the recent messages, no envelope asked) or ``checkpoint`` (the same, asking for the
    envelope)."""

    COMPACT = "compact"
    FULL = "full"  # the transcript plus the contract (a compaction's checkpoint)
    PASSTHROUGH = "passthrough"
    MASK = "mask"
    WINDOW = "window"
    CHECKPOINT = "checkpoint"


class AuthMode(Choice):
    """When client keys are checked: once any key exists (``auto``), or always."""

    AUTO = "auto"
    REQUIRED = "required"


@cache
def _values(kind: type[Choice]) -> tuple[str, ...]:
    return tuple(str(m.value) for m in kind)
