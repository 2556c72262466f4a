"""Command-line arguments of ``skillstate bench overhead``, and their checks."""

from __future__ import annotations

import argparse
from urllib.parse import urlsplit

from skillstate.cli.paths import output_file
from skillstate.store.schemes import BACKENDS, shares_database

from .servers import FLOOR_SERVERS
from .transcripts import BLOCKS, parse_sizes

DESCRIPTION = (
    "Added-latency benchmark: direct calls to a fast local upstream vs the same calls "
    "through the proxy, interleaved, from a separate client process."
)


def add_args(p: argparse.ArgumentParser) -> None:
    _add_what(p.add_argument_group("what to measure"))
    _add_engines(p.add_argument_group("shared engines and replicas (docs/scaling.md)"))
    _add_sequential(p.add_argument_group("sequential (one keep-alive connection per path)"))
    _add_concurrency(p.add_argument_group("concurrency"))
    _add_state(p.add_argument_group("state mode"))
    _add_transcripts(p.add_argument_group("large transcripts (runs only this phase)"))
    _add_output(p.add_argument_group("output"))


def _add_what(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--mode",
        choices=("forward", "state"),
        default="forward",
        help="forward: x-skillstate-mode: passthrough (default); state: sessions commit a "
        "state patch every turn",
    )
    g.add_argument("--stream", action="store_true", help="stream: true (time to last byte)")
    g.add_argument(
        "--target",
        metavar="URL",
        help="measure this OpenAI-compatible gateway instead of starting skillstate "
        "(it must forward to the same upstream as the direct path)",
    )
    g.add_argument(
        "--target-pid",
        type=int,
        metavar="PID",
        help="with --target: its process id, for --turn-profile CPU time",
    )
    g.add_argument(
        "--floor",
        action="store_true",
        help="also measure a minimal aiohttp + uvloop forwarder in the same interleaved run, "
        "and state the proxy's cost as a ratio to it",
    )
    g.add_argument(
        "--floor-server",
        choices=FLOOR_SERVERS,
        help="with --floor: serve the floor with aiohttp's server (the default) or with "
        "uvicorn, the proxy's own (a bare ASGI app: no Starlette)",
    )
    g.add_argument(
        "--direct",
        metavar="URL",
        help="use this existing upstream instead of starting the fast one",
    )
    g.add_argument(
        "--upstream-port",
        type=int,
        default=0,
        metavar="N",
        help="port for the fast upstream (default 0: a free one), e.g. to point a --target "
        "gateway at it",
    )
    g.add_argument("--api-key", default="sk-bench", help="bearer key sent on both paths")
    g.add_argument("--model", default="bench-model")
    g.add_argument(
        "--proxy-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for the skillstate proxy (repeatable; use --proxy-arg=--flag)",
    )
    g.add_argument(
        "--proxy-module",
        default="skillstate",
        metavar="MOD",
        help="start `python -m MOD` with the same flags instead of skillstate (e.g. a "
        "profiling or experiment wrapper that must be importable)",
    )


def _add_engines(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--store",
        metavar="URL",
        help="the proxy's store (sqlite:///path or postgresql://…; default: SQLite in a "
        "temporary data dir)",
    )
    g.add_argument(
        "--coordination", metavar="URL", help="the proxy's coordination Redis (redis://…)"
    )
    g.add_argument(
        "--replicas",
        type=int,
        default=1,
        metavar="N",
        help="start N proxies sharing --store and --coordination (1); the concurrency phase "
        "spreads its connections over them, the sequential phase uses the first",
    )
    g.add_argument(
        "--trips",
        type=int,
        default=200,
        metavar="N",
        help="with --store postgresql:// or --coordination: N steady-state state turns "
        "counted on the engines themselves (round trips per turn), 0 skips (200)",
    )


def _add_sequential(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--warmup", type=int, default=15, metavar="N", help="warm-up requests per path (15)"
    )
    g.add_argument(
        "--rounds", type=int, default=7, metavar="N", help="interleaved rounds, 0 skips (7)"
    )
    g.add_argument(
        "--requests", type=int, default=25, metavar="N", help="requests per round per path (25)"
    )


def _add_concurrency(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--concurrency", type=int, default=64, metavar="N", help="connections (64)")
    g.add_argument(
        "--duration",
        type=float,
        default=5.0,
        help="seconds per path, 0 skips (5); run as alternating segments",
    )
    g.add_argument(
        "--segments",
        type=int,
        default=2,
        help="segments per path, alternating direct/proxied (2: D P P D)",
    )


def _add_state(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--sessions",
        type=int,
        default=256,
        help="distinct session ids (256), each seeded with one turn before measuring",
    )
    g.add_argument(
        "--state-kib", type=float, default=4.0, help="initial state size in KiB (4; 2-8 is real)"
    )
    g.add_argument(
        "--turn-profile",
        action="store_true",
        help="also run one state session for --turns turns and compare the proxy's CPU "
        "time per turn early vs late",
    )
    g.add_argument(
        "--turns", type=int, default=1000, metavar="N", help="turns for --turn-profile (1000)"
    )
    g.add_argument(
        "--turn-batch",
        type=int,
        default=25,
        help="turns per CPU-measurement window in --turn-profile (25)",
    )


def _add_transcripts(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--transcript-kb",
        metavar="KB,KB,...",
        help="proxy CPU per call, passthrough and state (and the floor with --floor), for "
        "transcripts of about these sizes that grow by one exchange per call, e.g. 10,100,300",
    )
    g.add_argument(
        "--transcript-turns",
        type=int,
        default=24,
        metavar="N",
        help="measured calls per size and path (24), after 2 warm-up calls",
    )


def _add_output(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--json", metavar="FILE", type=output_file, help="write the numbers and machine info here"
    )
    g.add_argument("--quiet", action="store_true", help="no progress lines")
    g.add_argument(
        "--start-timeout", type=float, default=30.0, help="seconds to wait for servers (30)"
    )


def build_parser(prog: str = "python -m skillstate.bench.overhead") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    add_args(p)
    return p


def validate(a: argparse.Namespace) -> str | None:
    if a.warmup < 0 or a.rounds < 0 or a.requests < 1:
        return "--warmup and --rounds must be >= 0, --requests >= 1"
    if a.concurrency < 1 or a.duration < 0 or a.segments < 1:
        return "--concurrency and --segments must be >= 1, --duration >= 0"
    if a.sessions < 1 or a.state_kib <= 0:
        return "--sessions must be >= 1 and --state-kib > 0"
    if a.turn_profile and (a.turn_batch < 1 or a.turns < 2 * a.turn_batch):
        return "--turn-profile needs --turn-batch >= 1 and --turns >= 2 * --turn-batch"
    for flag in ("target", "direct"):
        url = getattr(a, flag)
        if url and urlsplit(url).scheme != "http":
            return f"--{flag}: only http:// URLs are supported, got {url!r}"
    if a.target_pid and not a.target:
        return "--target-pid only makes sense with --target"
    if a.floor_server and not a.floor:
        return "--floor-server only makes sense with --floor"
    if a.transcript_kb is not None:
        try:
            parse_sizes(a.transcript_kb)
        except ValueError as e:
            return f"--transcript-kb: {e}"
        if a.transcript_turns < BLOCKS or a.target or a.replicas > 1:
            return (
                f"--transcript-kb needs --transcript-turns >= {BLOCKS}, no --target or --replicas"
            )
    if a.replicas < 1 or a.trips < 0:
        return "--replicas must be >= 1 and --trips >= 0"
    shared = shares_database(a.store)
    if a.replicas > 1 and not (shared and a.coordination):
        forms = " or ".join(b.form for b in BACKENDS if b.shared)
        return f"--replicas > 1 needs --store {forms} and --coordination redis://…"
    if a.target and (a.store or a.coordination or a.replicas > 1):
        return "--store, --coordination and --replicas configure skillstate, not a --target"
    return None
