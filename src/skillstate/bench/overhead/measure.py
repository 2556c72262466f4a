"""The measurements, run inside the client process: sequential rounds, the turn profile,
the concurrency phase and the state check."""

from __future__ import annotations

import asyncio
import gc
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from .clients import ResponseError, SyncConn, conc_segment, open_conn
from .cpu_time import proc_cpu_seconds
from .stats import percentile, round3
from .workload import Endpoint, build_request, session_ids


def _timed(c: SyncConn, data: bytes) -> float:
    """One request on a fresh-read connection, in ms; anything but a 200 is an error."""
    c.fresh()
    t0 = time.perf_counter_ns()
    status, body = c.request(data)
    t1 = time.perf_counter_ns()
    if status != 200:
        raise ResponseError(status, body)
    return (t1 - t0) / 1e6


def _sequential(
    spec: dict[str, Any],
    d: SyncConn,
    p: SyncConn,
    d_reqs: list[bytes],
    p_reqs: list[bytes],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    rounds, per, pid = spec["rounds"], spec["requests"], spec.get("proxy_pid")
    cpu_s = 0.0
    lat: dict[str, list[float]] = {"direct": [], "proxied": []}
    per_round: list[dict[str, Any]] = []
    cursor = {"direct": 0, "proxied": 0}
    conns = {"direct": d, "proxied": p}
    reqs = {"direct": d_reqs, "proxied": p_reqs}

    def run(path: str, n: int, out: list[float] | None) -> None:
        c, rs = conns[path], reqs[path]
        for _ in range(n):
            data = rs[cursor[path] % len(rs)]
            cursor[path] += 1
            ms = _timed(c, data)
            if out is not None:
                out.append(ms)

    for path in ("direct", "proxied"):
        run(path, spec["warmup"], None)
    for i in range(rounds):
        progress(f"sequential round {i + 1}/{rounds}")
        order = ("direct", "proxied") if i % 2 == 0 else ("proxied", "direct")
        this: dict[str, list[float]] = {"direct": [], "proxied": []}
        for path in order:
            if path == "proxied" and pid:
                c0 = proc_cpu_seconds(pid)[0]
                run(path, per, this[path])
                cpu_s += proc_cpu_seconds(pid)[0] - c0
            else:
                run(path, per, this[path])
        for path in order:
            lat[path] += this[path]
        per_round.append(
            {
                "order": "direct-first" if i % 2 == 0 else "proxied-first",
                "direct_p50_ms": percentile(sorted(this["direct"]), 50),
                "proxied_p50_ms": percentile(sorted(this["proxied"]), 50),
            }
        )
    cpu = cpu_s * 1000 / (rounds * per) if pid and rounds else None
    return {"lat": lat, "per_round": per_round, "proxy_cpu_ms_per_request": cpu}


def _turn_profile(
    spec: dict[str, Any], p: SyncConn, ep: Endpoint, progress: Callable[[str], None]
) -> dict[str, Any]:
    turns, batch, pid = spec["turns"], spec["turn_batch"], spec.get("proxy_pid")
    sid = f"bench-turnprof-{secrets.token_hex(4)}"
    headers = [h for h in spec["proxied_headers"] if h[0] != "x-skillstate-mode"]
    headers += [("x-skillstate-mode", "state"), ("x-skillstate-session", sid)]
    data = build_request(ep, spec["body"], headers)
    last = turns - batch + 1
    first = max(1, min(10, last - batch))
    starts = sorted({s for s in (100, 250, 500) if s + batch - 1 < last} | {first, last})
    # windows never overlap: a later start is moved past the previous window's end
    windows: list[tuple[int, int]] = []
    for s in starts:
        s = max(s, windows[-1][1] + 1) if windows else s
        if s + batch - 1 <= turns:
            windows.append((s, s + batch - 1))
    wall: list[float] = []
    cpu_at: dict[int, float] = {}
    clock = None
    edges = {a - 1 for a, _ in windows} | {b for _, b in windows}
    if pid and 0 in edges:
        cpu_at[0], clock = proc_cpu_seconds(pid)
    for turn in range(1, turns + 1):
        wall.append(_timed(p, data))
        if pid and turn in edges:
            cpu_at[turn], clock = proc_cpu_seconds(pid)
        if turn % 100 == 0:
            progress(f"turn profile {turn}/{turns}")
    rows: list[dict[str, Any]] = []
    for a, b in windows:
        w = sorted(wall[a - 1 : b])
        cpu = (cpu_at[b] - cpu_at[a - 1]) * 1000 / (b - a + 1) if pid else None
        rows.append(
            {
                "turns": [a, b],
                "proxy_cpu_ms_per_turn": round3(cpu) if cpu is not None else None,
                "wall_p50_ms": round3(percentile(w, 50)),
                "wall_mean_ms": round3(sum(w) / len(w)),
            }
        )
    c0, c1 = rows[0]["proxy_cpu_ms_per_turn"], rows[-1]["proxy_cpu_ms_per_turn"]
    ratio = round(c1 / c0, 3) if c0 and c1 is not None else None
    w0, w1 = rows[0]["wall_p50_ms"], rows[-1]["wall_p50_ms"]
    wall_ratio = round(w1 / w0, 3) if w0 and w1 is not None else None
    return {
        "session": sid,
        "turns": turns,
        "batch": batch,
        "cpu_clock": clock,
        "windows": rows,
        "cpu_ratio_last_vs_first": ratio,
        "wall_ratio_last_vs_first": wall_ratio,
    }


async def _concurrency(
    spec: dict[str, Any],
    eps: dict[str, Endpoint],
    reqs: dict[str, list[list[bytes]]],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    n = spec["concurrency"]
    conns = {path: [await open_conn(ep) for _ in range(n)] for path, ep in eps.items()}
    for path in ("direct", "proxied"):
        progress(f"concurrency warm-up ({path})")
        await conc_segment(eps[path], conns[path], reqs[path], min(1.0, spec["duration"] / 4))
    segs = spec["segments"]
    seconds = spec["duration"] / segs
    order: list[str] = []
    for i in range(segs):
        order += ["direct", "proxied"] if i % 2 == 0 else ["proxied", "direct"]
    agg: dict[str, dict[str, Any]] = {
        p: {"lat": [], "errors": 0, "elapsed": 0.0, "first_error": [], "proxy_cpu_s": 0.0}
        for p in eps
    }
    pid = spec.get("proxy_pid")
    for i, path in enumerate(order):
        progress(f"concurrency segment {i + 1}/{len(order)} ({path}, {seconds:g} s)")
        gc.collect()
        c0 = proc_cpu_seconds(pid)[0] if pid and path == "proxied" else 0.0
        r = await conc_segment(eps[path], conns[path], reqs[path], seconds)
        a = agg[path]
        if pid and path == "proxied":
            a["proxy_cpu_s"] += proc_cpu_seconds(pid)[0] - c0
        a["lat"] += r["lat"]
        a["errors"] += r["errors"]
        a["elapsed"] += r["elapsed"]
        a["first_error"] = a["first_error"] or r["first_error"]
    for cs in conns.values():
        for c in cs:
            if c.transport is not None:
                c.transport.close()
    return agg


def _state_check(ep: Endpoint, headers: Sequence[tuple[str, str]], sid: str) -> dict[str, Any]:
    """Ask a skillstate proxy (``GET /state?session=ID``) whether turns really committed."""
    lines = [f"GET /state?session={sid} HTTP/1.1", f"host: {ep.netloc}"]
    lines += [f"{k}: {v}" for k, v in headers]
    c = SyncConn(ep)
    try:
        status, body = c.request(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    except OSError as e:
        return {"session": sid, "error": repr(e)}
    finally:
        c.close()
    if status != 200:
        return {"session": sid, "status": status}
    try:
        rec = orjson.loads(body)
        return {
            "session": sid,
            "step": rec.get("step"),
            "state_bytes": len(orjson.dumps(rec.get("state"))),
        }
    except (orjson.JSONDecodeError, AttributeError):
        return {"session": sid, "status": status, "error": "not a state record"}


def client_run(spec: dict[str, Any], progress: Callable[[str], None]) -> dict[str, Any]:
    eps = {"direct": Endpoint(*spec["direct_ep"]), "proxied": Endpoint(*spec["proxied_ep"])}
    body: bytes = spec["body"]
    dh = [tuple(h) for h in spec["direct_headers"]]
    ph = [tuple(h) for h in spec["proxied_headers"]]
    state = spec["mode"] == "state"
    out: dict[str, Any] = {}

    d, p = SyncConn(eps["direct"]), SyncConn(eps["proxied"])
    # probe both paths once, so a misconfiguration fails fast with the server's words
    for name, c, hs in (("direct", d, dh), ("proxied", p, ph)):
        status, rbody = c.request(build_request(eps[name], body, hs))
        if status != 200:
            raise RuntimeError(f"{name} path: HTTP {status}: {rbody[:500]!r}")
        out[f"{name}_sample"] = rbody[:2000].decode("utf-8", "replace")

    sids = session_ids(spec["sessions"], secrets.token_hex(3)) if state else []
    if state:
        p_reqs = [
            build_request(eps["proxied"], body, [*ph, ("x-skillstate-session", s)]) for s in sids
        ]
        for i, req in enumerate(p_reqs):  # seed: each session exists before it is measured
            status, rbody = p.request(req)
            if status != 200:
                raise RuntimeError(f"seeding session {sids[i]}: HTTP {status}: {rbody[:500]!r}")
            if i % 64 == 63:
                progress(f"seeded {i + 1}/{len(p_reqs)} sessions")
    else:
        p_reqs = [build_request(eps["proxied"], body, ph)]
    d_reqs = [build_request(eps["direct"], body, dh)]

    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        if spec["rounds"] > 0:
            out["sequential"] = _sequential(spec, d, p, d_reqs, p_reqs, progress)
        if spec["turn_profile"]:
            out["turn_profile"] = _turn_profile(spec, p, eps["proxied"], progress)
    finally:
        gc.enable()
    d.close()
    p.close()

    if state:
        out["state_check"] = {"seeded": _state_check(eps["proxied"], ph, sids[0])}
        tp = out.get("turn_profile")
        if tp:
            out["state_check"]["turn_profile"] = _state_check(eps["proxied"], ph, tp["session"])

    if spec["duration"] > 0:
        n = spec["concurrency"]
        conc_reqs: dict[str, list[list[bytes]]] = {"direct": [d_reqs] * n}
        if state:
            # connection i owns sessions i, i+n, i+2n, ... so no two in-flight turns share one
            conc_reqs["proxied"] = [p_reqs[i::n] or [p_reqs[i % len(p_reqs)]] for i in range(n)]
        else:
            conc_reqs["proxied"] = [p_reqs] * n
        try:
            import uvloop
        except ImportError:  # pragma: no cover
            out["concurrency"] = asyncio.run(_concurrency(spec, eps, conc_reqs, progress))
        else:
            out["concurrency"] = uvloop.run(_concurrency(spec, eps, conc_reqs, progress))
    return out
