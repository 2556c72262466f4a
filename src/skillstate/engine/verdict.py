"""The verdict on a model reply or an operator's patch: read the envelope, validate the
patch against the session's schema and merge it. Pure (no I/O): the pipeline decides what to
do with a verdict, and commits it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..config import Settings
from .context import EnvelopeForm
from .patch import (
    Envelope,
    Extraction,
    PatchPolicy,
    Transition,
    extract_envelope,
    infer_key_types,
    validate_and_merge,
)

ACTION_MAX_CHARS = 1000  # of the model's "action", as stored and shown
_IN_ENVELOPE = ("state_patch",)  # where an envelope's text holds its patch


@dataclass
class Outcome:
    """The verdict on one model reply."""

    status: str  # valid | invalid | tool-noop | format-noop
    state: dict[str, Any] | None = None  # the new state, when it changed
    patch: dict[str, Any] | None = None
    action: str | None = None
    errors: list[str] = field(default_factory=list)
    state_json: bytes | None = None  # ``state`` as compact JSON (``Transition.new_state_json``)


class Verdicts:
    """Judges replies and patches under the configured rules (one per process)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @lru_cache(maxsize=64)  # noqa: B019 - one per process; keys are small tuples
    def policy(self, schema: tuple[str, ...]) -> PatchPolicy:
        """The patch rules for a session with this schema (cached: built once per schema)."""
        s = self.settings
        return PatchPolicy(
            allowed_keys=frozenset(schema),
            key_types=infer_key_types(s.initial_state),
            schema_violation=s.schema_violation,
            max_patch_bytes=s.max_patch_bytes,
            max_state_bytes=s.max_state_bytes,
            state_schema=s.state_schema,
        )

    def check_patch(
        self,
        state: dict[str, Any],
        patch: dict[str, Any],
        schema: list[str],
        source: bytes | str | None = None,
    ) -> Transition:
        """Validate an operator's patch exactly like a model's. ``source``: the JSON text
        ``patch`` was parsed from (``validate_and_merge``: an integer beyond 64 bits in it is
        refused, not kept as a float)."""
        return validate_and_merge(state, patch, self.policy(tuple(schema)), source=source)

    def judge(
        self,
        text: str,
        has_tool_calls: bool,
        state: dict[str, Any],
        schema: list[str],
        form: EnvelopeForm = "block",
        sole: Envelope | None = None,
    ) -> Outcome:
        """The verdict on one model reply: its envelope read, its patch validated and merged
        into ``state``. Pure: nothing is committed here. ``sole``: the envelope stripping
        ``text`` found as its only candidate (``Stripped.sole``), which is the one the
        extractor would find: the reply is not read a second time."""
        if form == "none":
            # The reply follows the client's own format, so it has no envelope to read and
            # nothing to re-ask: the state stays as it is.
            return Outcome("tool-noop" if has_tool_calls else "format-noop")
        extraction = Extraction(sole, []) if sole is not None else extract_envelope(text)
        env = extraction.envelope
        errors = list(extraction.errors)
        if env is not None:
            tr = validate_and_merge(
                state,
                env.state_patch,
                self.policy(tuple(schema)),
                source=env.source,
                within=_IN_ENVELOPE,
            )
            if tr.ok:
                action = _capped(env.action, ACTION_MAX_CHARS)
                return Outcome(
                    "valid", tr.new_state, tr.applied_patch, action, tr.warnings,
                    tr.new_state_json,
                )  # fmt: skip
            errors = tr.errors
        if has_tool_calls:
            return Outcome("tool-noop", errors=errors if env is not None else [])
        return Outcome("invalid", errors=errors or ["no valid state envelope"])


def _capped(text: str | None, limit: int) -> str | None:
    """``text`` cut to ``limit`` characters (marked with an ellipsis when cut)."""
    if text is None or len(text) <= limit:
        return text
    return text[: limit - 1] + "…"
