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
from .transcripts import run_transcripts
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


def _rotation(paths: Sequence[str], i: int) -> list[str]:
    """Round ``i``'s order: each path leads in turn, so a noisy machine hits all alike."""
    k = i % len(paths)
    return [*paths[k:], *paths[:k]]


def _sequential(
    spec: dict[str, Any],
    conns: dict[str, SyncConn],
    reqs: dict[str, list[bytes]],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    rounds, per = spec["rounds"], spec["requests"]
    pids: dict[str, int] = spec["pids"]
    paths = list(conns)
    cpu_s = dict.fromkeys(pids, 0.0)
    lat: dict[str, list[float]] = {p: [] for p in paths}
    per_round: list[dict[str, Any]] = []
    cursor = dict.fromkeys(paths, 0)

    def run(path: str, n: int, out: list[float] | None) -> None:
        c, rs = conns[path], reqs[path]
        for _ in range(n):
            data = rs[cursor[path] % len(rs)]
            cursor[path] += 1
            ms = _timed(c, data)
            if out is not None:
                out.append(ms)

    for path in paths:
        run(path, spec["warmup"], None)
    for i in range(rounds):
        progress(f"sequential round {i + 1}/{rounds}")
        order = _rotation(paths, i)
        this: dict[str, list[float]] = {p: [] for p in paths}
        for path in order:
            pid = pids.get(path)
            c0 = proc_cpu_seconds(pid)[0] if pid else 0.0
            run(path, per, this[path])
            if pid:
                cpu_s[path] += proc_cpu_seconds(pid)[0] - c0
        for path in order:
            lat[path] += this[path]
        per_round.append(
            {"order": "-".join(order)}
            | {f"{p}_p50_ms": percentile(sorted(this[p]), 50) for p in paths}
        )
    cpu = {p: cpu_s[p] * 1000 / (rounds * per) if rounds else None for p in pids}
    return {"lat": lat, "per_round": per_round, "cpu_ms_per_request": cpu}


def _turn_profile(
    spec: dict[str, Any], p: SyncConn, ep: Endpoint, progress: Callable[[str], None]
) -> dict[str, Any]:
    turns, batch, pid = spec["turns"], spec["turn_batch"], spec["pids"].get("proxied")
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
    eps: dict[str, list[Endpoint]],
    reqs: dict[str, list[list[bytes]]],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """``eps[path][i]`` is where connection ``i`` of ``path`` goes."""
    paths = list(eps)
    pids: dict[str, list[int]] = {p: [pid] for p, pid in spec["pids"].items()}
    if "proxied" in pids:
        pids["proxied"] += spec.get("replica_pids", [])
    conns = {}
    for path, targets in eps.items():  # a loop: Python 3.10 rejects await in a comprehension
        conns[path] = [await open_conn(ep) for ep in targets]
    for path in paths:
        progress(f"concurrency warm-up ({path})")
        await conc_segment(eps[path], conns[path], reqs[path], min(1.0, spec["duration"] / 4))
    segs = spec["segments"]
    seconds = spec["duration"] / segs
    order: list[str] = []
    for i in range(segs):
        # D P P D for two paths; with the floor each path leads and trails in turn
        o = _rotation(paths, i)
        order += o if i % 2 == 0 else o[::-1]
    agg: dict[str, dict[str, Any]] = {
        p: {"lat": [], "errors": 0, "elapsed": 0.0, "first_error": [], "cpu_s": 0.0} for p in eps
    }
    for i, path in enumerate(order):
        progress(f"concurrency segment {i + 1}/{len(order)} ({path}, {seconds:g} s)")
        gc.collect()
        of = pids.get(path, [])
        c0 = sum(proc_cpu_seconds(pid)[0] for pid in of)
        r = await conc_segment(eps[path], conns[path], reqs[path], seconds)
        a = agg[path]
        if of:
            a["cpu_s"] += sum(proc_cpu_seconds(pid)[0] for pid in of) - c0
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
    if spec.get("floor_ep"):
        eps["floor"] = Endpoint(*spec["floor_ep"])
    body: bytes = spec["body"]
    dh = [tuple(h) for h in spec["direct_headers"]]
    ph = [tuple(h) for h in spec["proxied_headers"]]
    # the floor forwards what the direct path sends: it has no modes and no sessions
    hs = {"direct": dh, "proxied": ph, "floor": dh}
    state = spec["mode"] == "state"
    out: dict[str, Any] = {}

    conns = {name: SyncConn(ep) for name, ep in eps.items()}
    # probe every path once, so a misconfiguration fails fast with the server's words
    for name, c in conns.items():
        status, rbody = c.request(build_request(eps[name], body, hs[name]))
        if status != 200:
            raise RuntimeError(f"{name} path: HTTP {status}: {rbody[:500]!r}")
        out[f"{name}_sample"] = rbody[:2000].decode("utf-8", "replace")

    if spec.get("transcript_kb"):
        out["transcripts"] = run_transcripts(spec, eps, hs, progress)
        for c in conns.values():
            c.close()
        return out

    p = conns["proxied"]
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
    reqs = {name: [build_request(ep, body, hs[name])] for name, ep in eps.items()}
    reqs["proxied"] = p_reqs

    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        if spec["rounds"] > 0:
            out["sequential"] = _sequential(spec, conns, reqs, progress)
        if spec["turn_profile"]:
            out["turn_profile"] = _turn_profile(spec, p, eps["proxied"], progress)
    finally:
        gc.enable()
    for c in conns.values():
        c.close()

    if state:
        out["state_check"] = {"seeded": _state_check(eps["proxied"], ph, sids[0])}
        tp = out.get("turn_profile")
        if tp:
            out["state_check"]["turn_profile"] = _state_check(eps["proxied"], ph, tp["session"])

    if spec["duration"] > 0:
        out["concurrency"] = _concurrency_phase(spec, eps, reqs, sids, progress)
    return out


def _concurrency_phase(
    spec: dict[str, Any],
    eps: dict[str, Endpoint],
    reqs: dict[str, list[bytes]],
    sids: list[str],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """``spec["concurrency"]`` connections per path; the proxied ones spread over the
    replicas, each owning its own sessions in state mode."""
    body: bytes = spec["body"]
    ph = [tuple(h) for h in spec["proxied_headers"]]
    n = spec["concurrency"]
    conc_reqs: dict[str, list[list[bytes]]] = {name: [r] * n for name, r in reqs.items()}
    conn_eps = {name: [ep] * n for name, ep in eps.items()}
    replicas = [eps["proxied"], *(Endpoint(*e) for e in spec.get("replica_eps", []))]
    # connection i goes to replica i % len(replicas)
    conn_eps["proxied"] = [replicas[i % len(replicas)] for i in range(n)]
    if sids:
        # connection i owns sessions i, i+n, i+2n, ... so no two in-flight turns share one
        owned = [sids[i::n] or [sids[i % len(sids)]] for i in range(n)]
        conc_reqs["proxied"] = [
            [build_request(conn_eps["proxied"][i], body, [*ph, ("x-skillstate-session", s)])
             for s in owned[i]]
            for i in range(n)
        ]  # fmt: skip
    elif len(replicas) > 1:
        conc_reqs["proxied"] = [[build_request(ep, body, ph)] for ep in conn_eps["proxied"]]
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(_concurrency(spec, conn_eps, conc_reqs, progress))
    return uvloop.run(_concurrency(spec, conn_eps, conc_reqs, progress))
