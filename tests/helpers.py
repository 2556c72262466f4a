"""What many tests need alike: the session header, a reply carrying the state envelope, and
the clients that talk to a proxy. Spelled out once here, so that a test says what it checks
rather than how a header is named or an envelope is fenced.

The header's name is written out here, not imported from the proxy: a rename in the proxy
must fail the tests, not follow silently."""

from __future__ import annotations

import json
from typing import Any, Protocol

import anthropic
import openai

SESSION_HEADER = "x-skillstate-session"


class _HasURL(Protocol):
    url: str


def session(sid: str) -> dict[str, str]:
    """The headers that name session ``sid``."""
    return {SESSION_HEADER: sid}


def envelope(patch: Any, action: str = "next", prefix: str = "ok") -> str:
    """A model reply: ``prefix``, then the fenced state envelope (``state_patch`` and
    ``action``) as the proxy asks the model to write it."""
    return f"{prefix}\n```json\n{json.dumps({'state_patch': patch, 'action': action})}\n```"


def oai(proxy: _HasURL, key: str = "sk-client", **kw: Any) -> openai.OpenAI:
    """An OpenAI SDK client of the proxy's /v1 that does not retry (a test sees each answer)."""
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0, **kw)


def ant(proxy: _HasURL, key: str = "sk-client", **kw: Any) -> anthropic.Anthropic:
    """An Anthropic SDK client of the proxy that does not retry."""
    return anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0, **kw)
