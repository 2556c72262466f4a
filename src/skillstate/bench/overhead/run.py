"""Orchestration: start the servers, run the client process, report."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ...store.schemes import shares_database
from ...urltext import redacted
from ..console import make_console, phase_progress
from .arguments import validate
from .client_process import run_client
from .engines import count_turns
from .machine import machine_info
from .report import build_report, print_report
from .servers import FLOOR_SERVERS, base_of, start_floor, start_proxy
from .transcripts import parse_sizes
from .workload import Endpoint, chat_body, initial_state

FLOOR_NAMES = {
    "aiohttp": "aiohttp + uvloop minimal forwarder (bench/overhead/floor.py)",
    "uvicorn": "uvicorn (uvloop, httptools) + bare ASGI minimal forwarder "
    "(bench/overhead/floor.py --server uvicorn)",
}

# Measurement parameters passed to the client process and echoed in the report's config.
RUN_PARAMS = ("warmup", "rounds", "requests", "concurrency", "duration", "segments")


def _say(quiet: bool, msg: str) -> None:
    if not quiet:
        print(f"  {msg}", file=sys.stderr, flush=True)


def _settings_env(args: argparse.Namespace) -> dict[str, str]:
    env = {}
    if args.store:
        env["SKILLSTATE_STORE"] = args.store
    if args.coordination:
        env["SKILLSTATE_COORDINATION"] = args.coordination
    return env


def _counts_trips(args: argparse.Namespace) -> bool:
    """Round trips are counted for skillstate's state turns on a shared engine."""
    shared = bool(args.coordination) or shares_database(args.store)
    return args.trips > 0 and args.mode == "state" and shared and not args.target


@dataclass
class _Servers:
    """What the run started (each stopped at the end, whatever happened) and where it is."""

    direct_url: str = ""
    proxied_url: str = ""
    proxy_name: str = ""
    proxy_pid: int | None = None
    replica_urls: list[str] = field(default_factory=list)
    replicas: list[Any] = field(default_factory=list)
    upstream: Any = None
    floor: Any = None
    floor_ep: list[Any] | None = None
    pids: dict[str, int] = field(default_factory=dict)

    def stop(self) -> None:
        for child in (*self.replicas, self.floor):
            if child is not None:
                child.stop()
        if self.upstream is not None:
            self.upstream.stop()


def run_overhead(args: argparse.Namespace) -> int:
    """Run the benchmark described by ``args``; 0 on success."""
    err = validate(args)
    if err:
        print(f"skillstate bench overhead: {err}", file=sys.stderr)
        return 2
    q = args.quiet
    info: dict[str, Any] = {"machine": machine_info()}
    srv = _Servers()
    tmp = tempfile.TemporaryDirectory(prefix="skillstate-bench-")
    state = initial_state(args.state_kib)
    try:
        _start_servers(args, srv, Path(tmp.name), state)
        spec = _client_spec(args, srv)
        info["config"] = _config(args, srv, state, spec)
        console = make_console(stderr=True)
        with phase_progress(console, not q and console.is_terminal) as say:
            raw = run_client(spec, say if not q else lambda msg: None)
        if _counts_trips(args):
            _say(q, f"counting engine round trips over {args.trips} state turns")
            raw["engines"] = count_turns(
                srv.proxied_url,
                chat_body(args.model, False),
                [_auth(args), ("x-skillstate-mode", "state")],
                store=args.store,
                coordination=args.coordination,
                turns=args.trips,
                tag=os.urandom(3).hex(),
            )
    except (RuntimeError, OSError) as e:
        print(f"skillstate bench overhead: {e}", file=sys.stderr)
        return 1
    finally:
        srv.stop()
        tmp.cleanup()
    with contextlib.suppress(OSError, AttributeError):
        info["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    rep = build_report(args, raw, info)
    print_report(rep)
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=2) + "\n")
        _say(q, f"wrote {args.json}")
    return 0


def _auth(args: argparse.Namespace) -> tuple[str, str]:
    return ("authorization", f"Bearer {args.api_key}")


def _mode_header(args: argparse.Namespace) -> str:
    return "passthrough" if args.mode == "forward" else "state"


def _start_servers(args: argparse.Namespace, srv: _Servers, tmp: Path, state: Any) -> None:
    """The fast upstream (unless --direct), the proxy replicas (unless --target) and the
    floor (--floor), each in ``srv`` as soon as it runs."""
    q = args.quiet
    if args.direct:
        srv.direct_url = args.direct
    else:
        from skillstate.bench.fastupstream import start_fast_upstream

        srv.upstream = start_fast_upstream(args.upstream_port, timeout=args.start_timeout)
        srv.direct_url = srv.upstream.url
        _say(q, f"fast upstream: {srv.direct_url} (pid {srv.upstream.pid})")
    if args.target:
        srv.proxied_url = args.target
        srv.proxy_pid = args.target_pid
        srv.proxy_name = args.target
    else:
        for i in range(args.replicas):
            data_dir = tmp / f"r{i}"
            data_dir.mkdir()
            proxy, url = start_proxy(
                base_of(srv.direct_url),
                str(data_dir),
                state,
                args.proxy_arg,
                args.start_timeout,
                args.proxy_module,
                _settings_env(args),
            )
            srv.replicas.append(proxy)
            srv.replica_urls.append(url)
            _say(q, f"skillstate proxy: {url} (pid {proxy.proc.pid})")
        srv.proxied_url = srv.replica_urls[0]
        srv.proxy_pid = srv.replicas[0].proc.pid
        srv.proxy_name = "skillstate" if args.proxy_module == "skillstate" else args.proxy_module
    srv.pids = {"proxied": srv.proxy_pid} if srv.proxy_pid else {}
    if args.floor:
        srv.floor, floor_url = start_floor(
            base_of(srv.direct_url), args.start_timeout, args.floor_server or FLOOR_SERVERS[0]
        )
        srv.pids["floor"] = srv.floor.proc.pid
        f_ep = Endpoint.from_base(floor_url)
        srv.floor_ep = [f_ep.host, f_ep.port, f_ep.path, f_ep.netloc]
        _say(q, f"floor forwarder: {floor_url} (pid {srv.floor.proc.pid})")


def _client_spec(args: argparse.Namespace, srv: _Servers) -> dict[str, Any]:
    """What the client process runs (the report's config echoes the same values)."""
    auth = _auth(args)
    d_ep, p_ep = Endpoint.from_base(srv.direct_url), Endpoint.from_base(srv.proxied_url)
    return {
        "mode": args.mode,
        "direct_ep": [d_ep.host, d_ep.port, d_ep.path, d_ep.netloc],
        "proxied_ep": [p_ep.host, p_ep.port, p_ep.path, p_ep.netloc],
        # Every replica (the concurrency phase spreads its connections over them).
        "replica_eps": [
            [e.host, e.port, e.path, e.netloc]
            for e in (Endpoint.from_base(r) for r in srv.replica_urls[1:])
        ]
        if not args.target
        else [],
        "replica_pids": [r.proc.pid for r in srv.replicas[1:]],
        "body": chat_body(args.model, args.stream),
        "direct_headers": [auth],
        "proxied_headers": [auth, ("x-skillstate-mode", _mode_header(args))],
        **{k: getattr(args, k) for k in RUN_PARAMS},
        "sessions": args.sessions,
        "turn_profile": args.turn_profile,
        "turns": args.turns,
        "turn_batch": args.turn_batch,
        "pids": srv.pids,
        "floor_ep": srv.floor_ep,
        "model": args.model,
        "transcript_kb": parse_sizes(args.transcript_kb) if args.transcript_kb else None,
        "transcript_turns": args.transcript_turns,
    }


def _config(
    args: argparse.Namespace, srv: _Servers, state: Any, spec: dict[str, Any]
) -> dict[str, Any]:
    """The report's ``config``: what was measured, and how."""
    return {
        "mode": args.mode,
        "stream": args.stream,
        "proxy": srv.proxy_name,
        "floor": FLOOR_NAMES[args.floor_server or FLOOR_SERVERS[0]] if args.floor else None,
        "direct": srv.direct_url,
        "proxied": srv.proxied_url,
        "mode_header": _mode_header(args),
        **{k: getattr(args, k) for k in RUN_PARAMS},
        "sessions": args.sessions if args.mode == "state" else None,
        "state_bytes": len(orjson.dumps(state)) if not args.target else None,
        "request_body_bytes": len(spec["body"]),
        "turn_profile": args.turn_profile,
        "transcript_kb": spec["transcript_kb"],
        "transcript_turns": args.transcript_turns if args.transcript_kb else None,
        "proxy_args": args.proxy_arg,
        "store": redacted(args.store) if args.store else "sqlite (temporary data dir)",
        "coordination": redacted(args.coordination) if args.coordination else None,
        "replicas": args.replicas,
        "client": "separate process; raw sockets + httptools (sequential), uvloop "
        "protocol (concurrency)",
    }
