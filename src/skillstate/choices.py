"""The closed vocabularies of the proxy, one enum per concept, used by config, CLI, the
pipeline, the ledger and every help text, so that a value is added or renamed in one place.

Members are ``str`` enums: they compare equal to, serialise as and format as their value.
"""

from __future__ import annotations

from enum import Enum


class Choice(str, Enum):
    """A ``str`` enum that prints as its value (``f"{Mode.STATE}" == "state"``)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """The accepted spellings, in declaration order."""
        return tuple(str(m.value) for m in cls)

    @classmethod
    def spelled(cls, sep: str = " | ") -> str:
        """The accepted spellings for a help text, e.g. ``state | passthrough | auto``."""
        return sep.join(cls.values())


class Mode(Choice):
    """How a turn is sent upstream: the compact context, the client's transcript untouched,
    or whichever of the two is smaller (state kept either way)."""

    STATE = "state"
    PASSTHROUGH = "passthrough"
    AUTO = "auto"


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


class ContextShape(Choice):
    """What a turn sent upstream (the ``x-skillstate-context`` header): the compact context,
    the full transcript plus the contract (``auto`` mode), or the client's body as is."""

    COMPACT = "compact"
    FULL = "full"
    PASSTHROUGH = "passthrough"


class AuthMode(Choice):
    """When client keys are checked: once any key exists (``auto``), or always."""

    AUTO = "auto"
    REQUIRED = "required"
