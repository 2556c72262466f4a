"""``skillstate bench overhead``: the latency a proxy adds in front of a fast upstream.

Measured the way independent gateway benchmarks do it:

* a fast local OpenAI-compatible upstream (:mod:`skillstate.bench.fastupstream`) in its
  own process answers immediately, so whatever is added on the proxied path is the proxy;
* the proxy under test runs in its own process (by default the real ``skillstate``
  started as ``python -m skillstate --port 0 --upstream <fast>/v1 --data-dir <tmp>``;
  ``--target URL`` measures any other OpenAI-compatible gateway instead);
* the client runs in a third process over persistent keep-alive connections: sequential
  rounds alternate direct and proxied calls (the order flips every round) so that a noisy
  machine hits both paths alike, and a concurrency phase drives N connections for a fixed
  time per path (segments alternate direct/proxied/proxied/direct).

Modes: ``forward`` sends ``x-skillstate-mode: passthrough``; ``state`` sends
``x-skillstate-mode: state`` with many session ids (``x-skillstate-session``), a
2-8 KiB initial state, and an upstream reply that carries a valid envelope, so every turn
commits a small state patch. ``--stream`` measures SSE pass-through to the last byte.
``--turn-profile`` runs one session for many turns and compares the proxy's CPU time per
turn early vs late (it should stay flat).

Standalone: ``python -m skillstate.bench.overhead --help``.

The package: :mod:`.arguments` (flags), :mod:`.workload` (requests, state),
:mod:`.clients` (raw-socket HTTP clients), :mod:`.measure` (the phases the client runs),
:mod:`.client_process` (running it in its own interpreter), :mod:`.servers` (the proxy
process), :mod:`.machine`, :mod:`.cpu_time`, :mod:`.stats`, :mod:`.report` (JSON and
tables), :mod:`.run` (orchestration) and :mod:`.cli` (entry points).
"""

from __future__ import annotations

from .arguments import build_parser
from .cli import add_overhead_parser, main
from .clients import ResponseError, SyncConn
from .cpu_time import proc_cpu_seconds
from .machine import machine_info
from .report import SCHEMA_VERSION, TARGETS, print_report
from .run import run_overhead
from .stats import percentile, summarize
from .workload import Endpoint, build_request, chat_body, initial_state, session_ids

__all__ = [
    "SCHEMA_VERSION",
    "TARGETS",
    "Endpoint",
    "ResponseError",
    "SyncConn",
    "add_overhead_parser",
    "build_parser",
    "build_request",
    "chat_body",
    "initial_state",
    "machine_info",
    "main",
    "percentile",
    "print_report",
    "proc_cpu_seconds",
    "run_overhead",
    "session_ids",
    "summarize",
]
