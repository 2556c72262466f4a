"""What the client sends: endpoints, the chat request, the initial state, session ids."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    path: str  # of chat completions
    netloc: str

    @classmethod
    def from_base(cls, url: str) -> Endpoint:
        """``http://h:p``, ``http://h:p/v1`` or a full ``.../chat/completions`` URL."""
        parts = urlsplit(url)
        path = parts.path.rstrip("/")
        if not path.endswith("/chat/completions"):
            path = (
                path + "/chat/completions"
                if path.endswith("/v1")
                else path + "/v1/chat/completions"
            )
        host = parts.hostname or "127.0.0.1"
        return cls(host, parts.port or 80, path, parts.netloc)


def initial_state(kib: float) -> dict[str, Any]:
    """A deterministic, realistic agent state of about ``kib`` KiB of JSON."""
    target = int(kib * 1024)
    state: dict[str, Any] = {
        "goal": "Add retry with exponential backoff to the HTTP client and cover it with tests.",
        "plan": [
            "read src/client.py and find every place that sends a request",
            "add a RetryPolicy with base delay, cap and jitter",
            "wrap send() and stream() in the retry loop",
            "write unit tests for 429, 503 and connection resets",
            "run the test suite and fix failures",
        ],
        "files": {},
        "facts": [],
        "open_questions": ["should POST be retried when the body was already sent?"],
        "step": 0,
        "last_action": "",
    }
    i = 0
    while len(orjson.dumps(state)) < target:
        if i % 3 == 0:
            state["files"][f"src/module_{i:03d}.py"] = (
                f"{40 + i * 7} lines; defines Handler{i} and parse_{i}(); imports client, "
                "config; no retries yet"
            )
        else:
            state["facts"].append(
                f"fact {i}: test_case_{i} covers status {400 + i % 100} and expects "
                f"a {'retry' if i % 2 else 'failure'} after {i % 5 + 1} attempts"
            )
        i += 1
    return state


_SYSTEM = (
    "You are a careful software engineering agent working in a Python repository. "
    "Each turn you receive the latest tool output. Think briefly, then reply with a JSON "
    "envelope holding a state_patch (an RFC 7386 merge patch of your working state) and the "
    "next action. Keep the state small: record decisions, file summaries and open questions, "
    "not transcripts. Available actions: read_file, edit_file, run_tests, search, finish."
)
_USER = (
    "Tool result (run_tests): 41 passed, 2 failed in 3.18s\n"
    "FAILED tests/test_client.py::test_retry_on_503 - AssertionError: expected 3 attempts, "
    "got 1\nFAILED tests/test_client.py::test_no_retry_on_400 - TypeError: RetryPolicy() got "
    "an unexpected keyword argument 'statuses'\nDecide the next action."
)


def chat_body(model: str, stream: bool) -> bytes:
    body: dict[str, Any] = {
        "model": model,
        "messages": [
            {"role": "system", "content": _SYSTEM},
            {"role": "user", "content": _USER},
        ],
        "max_tokens": 256,
        "temperature": 0,
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


def build_request(ep: Endpoint, body: bytes, headers: Sequence[tuple[str, str]]) -> bytes:
    lines = [
        f"POST {ep.path} HTTP/1.1",
        f"host: {ep.netloc}",
        "content-type: application/json",
        "accept: application/json" if b'"stream":true' not in body else "accept: text/event-stream",
        f"content-length: {len(body)}",
        *(f"{k}: {v}" for k, v in headers),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def session_ids(n: int, tag: str) -> list[str]:
    return [f"bench-{tag}-{i:05d}" for i in range(n)]
