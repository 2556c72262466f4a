"""BFCL's names and limits as this replay uses them, and the state the replay model keeps."""

from __future__ import annotations

from typing import Any

BFCL_PIN = "2026.3.23"
CATEGORIES = (
    "multi_turn_base",
    "multi_turn_long_context",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
)
GROUPINGS = ("same-name", "call", "turn")
MAX_STEPS = 20  # BFCL's MAXIMUM_STEP_LIMIT per turn
# BFCL's DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC: the user turn of a miss_func turn.
ADDED_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"
INSTALL_HINT = (
    f"pip install --no-deps bfcl-eval=={BFCL_PIN} mpmath==1.3.0 (the multi-turn backends and "
    f"data need nothing else), or pip install 'skillstate-proxy[bfcl]' (bfcl-eval with all "
    "its declared dependencies: torch, transformers, ...)"
)

# The state the replay model keeps in the state arm (and what a real model is asked to keep).
SCHEMA_KEYS = ("turn", "request", "calls_done", "results", "history")
INITIAL_STATE: dict[str, Any] = {
    "turn": 0,
    "request": "",
    "calls_done": 0,
    "results": [],
    "history": [],
}
RESULT_CHARS = 200  # one call's output as kept in state["results"]
HISTORY_CHARS = 300  # one finished turn as kept in state["history"]

# bfcl_eval.constants.type_mappings.GORILLA_TO_OPENAPI (BfclSuite uses the installed one).
GORILLA_TO_OPENAPI: dict[str, str] = {
    "integer": "integer",
    "number": "number",
    "float": "number",
    "string": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "dict": "object",
    "object": "object",
    "tuple": "array",
    "any": "string",
    "byte": "integer",
    "short": "integer",
    "long": "integer",
    "double": "number",
    "char": "string",
    "ArrayList": "array",
    "Array": "array",
    "HashMap": "object",
    "Hashtable": "object",
    "Queue": "array",
    "Stack": "array",
    "Any": "string",
    "String": "string",
    "Bigint": "integer",
}
