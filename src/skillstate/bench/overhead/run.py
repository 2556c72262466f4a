"""Orchestration: start the servers, run the client process, report."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

from ..console import make_console, phase_progress
from .arguments import validate
from .client_process import run_client
from .machine import machine_info
from .report import build_report, print_report
from .servers import base_of, start_floor, start_proxy
from .workload import Endpoint, chat_body, initial_state

# Measurement parameters passed to the client process and echoed in the report's config.
RUN_PARAMS = ("warmup", "rounds", "requests", "concurrency", "duration", "segments")


def _say(quiet: bool, msg: str) -> None:
    if not quiet:
        print(f"  {msg}", file=sys.stderr, flush=True)


def run_overhead(args: argparse.Namespace) -> int:
    """Run the benchmark described by ``args``; 0 on success."""
    err = validate(args)
    if err:
        print(f"skillstate bench overhead: {err}", file=sys.stderr)
        return 2
    q = args.quiet
    info: dict[str, Any] = {"machine": machine_info()}
    upstream = proxy = floor = None
    tmp = tempfile.TemporaryDirectory(prefix="skillstate-bench-")
    state = initial_state(args.state_kib)
    try:
        if args.direct:
            direct_url = args.direct
        else:
            from skillstate.bench.fastupstream import start_fast_upstream

            upstream = start_fast_upstream(args.upstream_port, timeout=args.start_timeout)
            direct_url = upstream.url
            _say(q, f"fast upstream: {direct_url} (pid {upstream.pid})")
        proxy_pid: int | None
        if args.target:
            proxied_url = args.target
            proxy_pid = args.target_pid
            proxy_name = args.target
        else:
            proxy, proxied_url = start_proxy(
                base_of(direct_url),
                tmp.name,
                state,
                args.proxy_arg,
                args.start_timeout,
                args.proxy_module,
            )
            proxy_pid = proxy.proc.pid
            proxy_name = "skillstate" if args.proxy_module == "skillstate" else args.proxy_module
            _say(q, f"skillstate proxy: {proxied_url} (pid {proxy_pid})")

        pids = {"proxied": proxy_pid} if proxy_pid else {}
        floor_ep = None
        if args.floor:
            floor, floor_url = start_floor(base_of(direct_url), args.start_timeout)
            pids["floor"] = floor.proc.pid
            f_ep = Endpoint.from_base(floor_url)
            floor_ep = [f_ep.host, f_ep.port, f_ep.path, f_ep.netloc]
            _say(q, f"floor forwarder: {floor_url} (pid {floor.proc.pid})")

        auth = ("authorization", f"Bearer {args.api_key}")
        direct_headers = [auth]
        mode_header = "passthrough" if args.mode == "forward" else "state"
        proxied_headers = [auth, ("x-skillstate-mode", mode_header)]
        d_ep, p_ep = Endpoint.from_base(direct_url), Endpoint.from_base(proxied_url)
        # What the client process runs, and what the report says it ran: the same values.
        run_params = {k: getattr(args, k) for k in RUN_PARAMS}
        spec = {
            "mode": args.mode,
            "direct_ep": [d_ep.host, d_ep.port, d_ep.path, d_ep.netloc],
            "proxied_ep": [p_ep.host, p_ep.port, p_ep.path, p_ep.netloc],
            "body": chat_body(args.model, args.stream),
            "direct_headers": direct_headers,
            "proxied_headers": proxied_headers,
            **run_params,
            "sessions": args.sessions,
            "turn_profile": args.turn_profile,
            "turns": args.turns,
            "turn_batch": args.turn_batch,
            "pids": pids,
            "floor_ep": floor_ep,
        }
        info["config"] = {
            "mode": args.mode,
            "stream": args.stream,
            "proxy": proxy_name,
            "floor": "aiohttp + uvloop minimal forwarder (bench/overhead/floor.py)"
            if args.floor
            else None,
            "direct": direct_url,
            "proxied": proxied_url,
            "mode_header": mode_header,
            **run_params,
            "sessions": args.sessions if args.mode == "state" else None,
            "state_bytes": len(orjson.dumps(state)) if not args.target else None,
            "request_body_bytes": len(spec["body"]),
            "turn_profile": args.turn_profile,
            "proxy_args": args.proxy_arg,
            "client": "separate process; raw sockets + httptools (sequential), uvloop "
            "protocol (concurrency)",
        }
        console = make_console(stderr=True)
        with phase_progress(console, not q and console.is_terminal) as say:
            raw = run_client(spec, say if not q else lambda msg: None)
    except (RuntimeError, OSError) as e:
        print(f"skillstate bench overhead: {e}", file=sys.stderr)
        return 1
    finally:
        for child in (proxy, floor):
            if child is not None:
                child.stop()
        if upstream is not None:
            upstream.stop()
        tmp.cleanup()
    with contextlib.suppress(OSError, AttributeError):
        info["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    rep = build_report(args, raw, info)
    print_report(rep)
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=2) + "\n")
        _say(q, f"wrote {args.json}")
    return 0
