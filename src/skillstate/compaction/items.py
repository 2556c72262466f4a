"""The Responses API's compaction items, as the proxy serves them (pure functions).

* ``{"type": "compaction_trigger"}`` (last input item): compact now (Codex's remote
  compaction v2). The answer's output holds exactly one ``compaction`` item.
* ``POST /v1/responses/compact`` (v1): the answer is a ``response.compaction`` object whose
  output is the request's user messages, then one ``compaction`` item.
* ``{"type": "compaction", "id", "encrypted_content"}``: the item a later request carries
  back. Its ``encrypted_content`` is a compaction token (``compaction.token``); the proxy
  puts in its place the state the checkpoint committed, as a user message.

Shapes from the openai SDK's ``types/responses`` (``ResponseCompactionItem``,
``CompactedResponse``, ``CompactionTrigger``) and what Codex 0.169.0 sends and reads
(``codex-rs/core/src/compact_remote_v2.rs``: it counts ``compaction`` items among the
``response.output_item.done`` events and stops at ``response.completed``).
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..dialects import sse
from ..dialects.responses.translate import response_object
from ..engine.context import state_text
from ..engine.window import CHECKPOINT_MARK as CHECKPOINT_MARK  # one mark, every checkpoint

JSON = dict[str, Any]
TRIGGER = "compaction_trigger"
COMPACTION = "compaction"
RESTORED_MARK = "[skillstate] COMPACTED CONVERSATION"


def kind(item: Any) -> str:
    t = item.get("type", "message") if isinstance(item, dict) else ""
    return t if isinstance(t, str) else ""


def trigger_at(items: list[Any]) -> int | None:
    """Where the compaction trigger is (it must be the last item), None without one."""
    at = [k for k, item in enumerate(items) if kind(item) == TRIGGER]
    return at[-1] if at else None


def user_message(text: str) -> JSON:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def checkpoint_request() -> JSON:
    """The instruction that ends the checkpoint of a session with no state yet (a full turn
    with the contract): everything above leaves the model's context, and only the state the
    envelope writes stays. (A session with state gets the window form's checkpoint.)"""
    return user_message(
        f"{CHECKPOINT_MARK}: the conversation above is being compacted. Everything in it "
        "except the state will be dropped from your context. Fold into state_patch all you "
        "will need to continue the task (goal, facts found, decisions, files and commands, "
        "progress, what to do next), then end your reply with the ```json envelope."
    )


def restored_state(state: JSON, step: int) -> JSON:
    """What stands in for a compaction item upstream: the state its checkpoint committed."""
    return user_message(
        f"{RESTORED_MARK}: the conversation up to here was compacted into this state "
        f"(step {step}); continue from it.\n{state_text(state)}"
    )


def token_id(prefix: str, token: str, label: str = "") -> str:
    """An id of something a compaction serves: ``prefix`` and a digest of ``label`` and the
    compaction's token, so the same checkpoint served again (a retry under its
    Idempotency-Key) has the same ids, byte for byte."""
    return prefix + hashlib.sha256((label + token).encode()).hexdigest()[:32]


def compaction_item(token: str) -> JSON:
    """The ``compaction`` item of ``token``, its id the token's (``token_id``)."""
    return {"id": token_id("cmp_", token), "type": COMPACTION, "encrypted_content": token}


def response_id(token: str) -> str:
    """The id of the response that serves ``token``'s compaction (``token_id``)."""
    return token_id("resp_", token, "response\n")


def triggered_response(model: str, item: JSON, usage: JSON | None, created_at: int) -> JSON:
    """The ``response`` of a request that ended with the trigger: exactly one output item.
    Its id is the token's (``response_id``), ``created_at`` the checkpoint's."""
    token = str(item["encrypted_content"])
    body = response_object(
        model=model, output=[item], usage=usage, finish_reason=None, response_id=response_id(token)
    )
    body["created_at"] = created_at
    return body


def compacted_response(items: list[Any], item: JSON, usage: JSON | None, created_at: int) -> JSON:
    """``POST /responses/compact``'s answer: the user messages, then the compaction item.
    Its id is the token's (``response_id``), ``created_at`` the checkpoint's."""
    token = str(item["encrypted_content"])
    users = [i for i in items if kind(i) == "message" and i.get("role") == "user"]
    return {
        "id": response_id(token),
        "object": "response.compaction",
        "created_at": created_at,
        "output": [*(_output_message(u, token, k) for k, u in enumerate(users)), item],
        "usage": usage,
    }


def _output_message(message: JSON, token: str, k: int) -> JSON:
    """A user message of the request as an output item, as the API answers it: with its
    ``type``, an ``id`` (the token's and its place's digest: the same checkpoint served again
    is the same answer), ``status`` and its content as parts (a string is one input_text)."""
    content = message.get("content")
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
    return {
        "id": message.get("id") or token_id("msg_", token, f"message {k}\n"),
        "type": "message",
        "status": "completed",
        "role": "user",
        "content": parts,
    }


def response_events(response: JSON) -> bytes:
    """The event stream of a finished ``response`` whose items are whole (a compaction
    item has no deltas): created, in_progress, each item added and done, completed."""
    start = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[JSON] = [
        {"type": "response.created", "response": start},
        {"type": "response.in_progress", "response": start},
    ]
    for i, item in enumerate(response["output"]):
        events.append({"type": "response.output_item.added", "output_index": i, "item": item})
        events.append({"type": "response.output_item.done", "output_index": i, "item": item})
    events.append({"type": "response.completed", "response": response})
    return b"".join(
        sse.encode({**e, "sequence_number": n}, event=e["type"]) for n, e in enumerate(events)
    )


def compact_threshold(body: JSON) -> int | None:
    """The request's ``context_management`` compaction threshold (input tokens), None when
    it asks for none; a ValueError (what is wrong) when the field is malformed."""
    cm = body.get("context_management")
    if cm is None:
        return None
    if not isinstance(cm, list) or not all(isinstance(e, dict) for e in cm):
        raise ValueError("context_management: expected a list of objects")
    found = None
    for entry in cm:
        if entry.get("type") != COMPACTION:
            raise ValueError(f"context_management: unknown entry type {entry.get('type')!r}")
        n = entry.get("compact_threshold")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError("context_management: compact_threshold must be a positive integer")
        found = n if n is not None else found
    return found


def with_item_first(response: JSON, item: JSON) -> JSON:
    """A ``response`` whose output starts with ``item`` (a compaction run before the call)."""
    return {**response, "output": [item, *(response.get("output") or ())]}


def shifted_event(data: JSON, item: JSON) -> list[JSON]:
    """One event of a stream whose output gains ``item`` at index 0: indexes move up by
    one, the terminal response holds the item, and it is announced after ``in_progress``."""
    kind = data.get("type")
    if isinstance(data.get("output_index"), int):
        data = {**data, "output_index": data["output_index"] + 1}
    if kind in ("response.completed", "response.incomplete", "response.failed"):
        resp = data.get("response")
        if isinstance(resp, dict):
            data = {**data, "response": with_item_first(resp, item)}
    if kind == "response.in_progress":
        return [
            data,
            {"type": "response.output_item.added", "output_index": 0, "item": item},
            {"type": "response.output_item.done", "output_index": 0, "item": item},
        ]
    return [data]
