"""Reading an upstream's SSE stream through a relay: the client's bytes, one write per
upstream read, and what went wrong if the stream did not finish properly (its source broke
off, it sent an event the relay cannot read, or it closed early)."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

import orjson

from ..errors import ProxyError
from . import sse
from .base import StreamRelay

log = logging.getLogger("skillstate")


class StreamCut(Exception):
    """The stream's source broke off (a failed connection, a timeout): what happened, in the
    message. The reader of an upstream's stream raises it."""


@dataclass
class StreamProblem:
    """Why a stream did not finish properly (said to the client in its dialect)."""

    # An error the upstream reported (its kind and code kept), or the proxy's own failure
    # (``failure``).
    problem: ProxyError


def failure(message: str) -> ProxyError:
    """A stream that failed on the proxy's side of it (its source cut, an event it cannot
    read, an early end), or an upstream's error known only by its message: a server error
    in each dialect's own shape (chat's error chunk of type ``api_error``, Anthropic's
    ``api_error`` event, Responses' ``response.failed`` with ``server_error``), not an
    error event with a code of the proxy's own making that no client acts on."""
    return ProxyError("api_error", message)


async def relay_events(
    first: bytes, read: Callable[[], Awaitable[bytes]], relay: StreamRelay, source: str
) -> AsyncGenerator[bytes | StreamProblem, None]:
    """The stream from ``source`` through the relay: client bytes, one write per read
    (``first``, then ``read()`` until it gives b""), then a ``StreamProblem`` if the stream
    did not finish properly."""
    parser = sse.SSEParser()
    try:
        chunk = first
        while chunk:
            ready = [b for event in parser.feed(chunk) for b in _feed(relay, event, source)]
            if ready:
                yield b"".join(ready)
            if parser.pending > sse.MAX_EVENT_BYTES:
                raise _Unreadable(f"an SSE event over {sse.MAX_EVENT_BYTES} bytes")
            chunk = await read()
        ready = [b for event in parser.flush() for b in _feed(relay, event, source)]
        if ready:
            yield b"".join(ready)
    except StreamCut as e:
        yield StreamProblem(failure(str(e)))
        return
    except _Unreadable as e:
        yield StreamProblem(failure(f"upstream {source} sent {e}"))
        return
    problem_ = relay.upstream_error or (
        None if relay.complete else "upstream closed the stream before it finished"
    )
    if problem_ is not None:
        yield StreamProblem(problem_ if isinstance(problem_, ProxyError) else failure(problem_))


class _Unreadable(Exception):
    """An upstream's stream event the proxy cannot read (what it was, in the message)."""


def _feed(relay: StreamRelay, event: sse.SSEEvent, source: str) -> list[bytes]:
    """``relay.feed(event)``, for an event from a hostile upstream: one the relay cannot
    read (a shape no provider sends, JSON too deep to write back) ends the stream with an
    error event in the client's dialect instead of cutting the connection, which clients
    retry (billed again)."""
    try:
        return relay.feed(event)
    except orjson.JSONDecodeError:
        log.warning("upstream %s: a stream event whose data is not JSON", source)
        raise _Unreadable("a stream event whose data is not JSON") from None
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, RecursionError) as e:
        log.warning(
            "upstream %s: a stream event the relay cannot read (%s: %s)",
            source, type(e).__name__, str(e)[:200],
        )  # fmt: skip
        raise _Unreadable(f"a stream event the proxy cannot read ({type(e).__name__})") from None
