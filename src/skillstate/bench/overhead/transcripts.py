"""The large-transcript phase (``--transcript-kb``): proxy CPU per call while a client's
transcript grows by one exchange per turn, as an agent loop's does.

For each size S (KB) and each path (passthrough, state, and the floor with ``--floor``) the
client runs one session whose chat transcript starts at about S KB less half the growth of the
measured turns, so that the transcripts measured average S KB. Every turn appends one
exchange (an assistant reply carrying a fenced state envelope and a bash block, then a tool
result with code in it: the stripper, the token estimate and the prefix hashes all have work
in it) and posts the whole transcript again. The sizes and paths alternate block by block, so
a noisy machine hits them alike. Reported per size and path: the proxy's CPU per call (median
and mean of the calls, from ``/proc/PID/task/*/schedstat`` read around each call), and the
wall time per call.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from .clients import ResponseError, SyncConn
from .cpu_time import proc_cpu_seconds
from .stats import percentile, round3
from .workload import Endpoint, build_request

WARMUP_TURNS = 2  # per size and path, not measured: a session's first turns take the full path
BLOCKS = 3  # the measured turns of a size and path run in this many alternating blocks
MAX_SIZES = 8

_SYSTEM = (
    "You are a software engineering agent working in a Python repository through a shell. "
    "Each turn you get the output of your last command. Reply with a THOUGHT, ONE bash block "
    "and a JSON envelope holding a state_patch (an RFC 7386 merge patch of your working "
    "state) and the next action. Keep the state small: decisions, file summaries and open "
    "questions, not transcripts. "
) * 3
_TASK = (
    "<pr_description>\nThe HTTP client gives up on the first 503. Add retries with "
    "exponential backoff and jitter for 429, 503 and connection resets; POST bodies that were "
    "already sent must not be retried. Cover it with tests.\n</pr_description>"
)


def parse_sizes(text: str) -> list[float]:
    """``"10,100,300"`` as KB sizes; ValueError with the reason otherwise."""
    sizes = [float(part) for part in text.split(",") if part.strip()]
    if not sizes or len(sizes) > MAX_SIZES:
        raise ValueError(f"give 1 to {MAX_SIZES} sizes in KB, e.g. 10,100,300")
    if any(not 4 <= s <= 8192 for s in sizes):
        raise ValueError("each size must be between 4 and 8192 KB")
    return sizes


def exchange(k: int) -> list[dict[str, Any]]:
    """Turn ``k``'s assistant reply and the tool result that answers it (about 0.6 KB)."""
    envelope = {
        "reasoning": f"step {k}: read send() next",
        "state_patch": {"step": k, "files": {f"src/mod_{k % 40:02d}.py": "no retries"}},
        "action": "read_file",
    }
    reply = (
        f"THOUGHT: step {k} shows where the request is sent.\n\n```bash\nsed -n "
        f"'{k},{k + 40}p' src/mod_{k % 40:02d}.py\n```\n\n```json\n"
        f"{orjson.dumps(envelope).decode()}\n```"
    )
    code = "\n".join(
        f"    def handler_{k}_{i}(self, req: dict) -> dict:  # {{'status': {400 + i}}}\n"
        f"        return {{'ok': req.get('n', {i}) > {k % 7}}}"
        for i in range(2)
    )
    return [
        {"role": "assistant", "content": reply},
        {"role": "user", "content": f"<returncode>0</returncode>\n<output>\n{code}\n</output>"},
    ]


def transcript(start_bytes: int) -> list[dict[str, Any]]:
    """A system prompt, the task, then exchanges until the messages are ``start_bytes``."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": _SYSTEM},
        {"role": "user", "content": _TASK},
    ]
    size = len(orjson.dumps(messages))
    k = 0
    while size < start_bytes:
        more = exchange(k)
        messages += more
        size += len(orjson.dumps(more)) - 1
        k += 1
    return messages


class GrowingSession:
    """One growing transcript on one path."""

    def __init__(self, kb: float, path: str, model: str, turns: int) -> None:
        self.kb, self.path, self.model = kb, path, model
        # the measured calls' transcripts average about kb
        before_middle = len(orjson.dumps(exchange(0))) * (WARMUP_TURNS + 1 + (turns - 1) / 2)
        self.messages = transcript(int(kb * 1024 - before_middle))
        self.next = len(self.messages)
        self.sizes: list[int] = []
        self.cpu_ms: list[float] = []
        self.wall_ms: list[float] = []

    def body(self) -> bytes:
        self.messages += exchange(self.next)
        self.next += 1
        return orjson.dumps({"model": self.model, "messages": self.messages, "max_tokens": 256})


def timed_call(conn: SyncConn, data: bytes, pid: int | None) -> tuple[float, float]:
    """One call: (proxy CPU ms or nan, wall ms)."""
    conn.fresh()
    c0 = proc_cpu_seconds(pid)[0] if pid else 0.0
    t0 = time.perf_counter_ns()
    status, body = conn.request(data)
    t1 = time.perf_counter_ns()
    c1 = proc_cpu_seconds(pid)[0] if pid else float("nan")
    if status != 200:
        raise ResponseError(status, body)
    return (c1 - c0) * 1000, (t1 - t0) / 1e6


def run_transcripts(
    spec: dict[str, Any],
    eps: dict[str, Endpoint],
    headers: Mapping[str, Sequence[tuple[Any, ...]]],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """The phase, in the client process; ``eps``/``headers`` per path (``proxied`` is
    used twice: passthrough and state)."""
    turns, pids = spec["transcript_turns"], spec["pids"]
    tag = secrets.token_hex(3)
    paths = [("passthrough", "proxied"), ("state", "proxied")]
    if "floor" in eps:
        paths.append(("floor", "floor"))
    conns = {name: SyncConn(eps[where]) for name, where in paths}
    sessions = [
        (GrowingSession(kb, name, spec["model"], turns), name, where)
        for kb in spec["transcript_kb"]
        for name, where in paths
    ]
    per_block = -(-turns // BLOCKS)
    for block in range(BLOCKS + 1):  # block 0: the warm-up turns
        progress(f"transcripts: block {block}/{BLOCKS}")
        order = sessions[block % len(sessions) :] + sessions[: block % len(sessions)]
        for s, name, where in order:
            n = WARMUP_TURNS if block == 0 else min(per_block, turns - len(s.cpu_ms))
            hs = [h for h in headers[where] if h[0] != "x-skillstate-mode"]
            if name != "floor":
                sid = f"bench-tr-{tag}-{s.kb:g}-{name}"
                hs += [("x-skillstate-mode", name), ("x-skillstate-session", sid)]
            for _ in range(n):
                data = s.body()
                request = build_request(eps[where], data, hs)
                cpu, wall = timed_call(conns[name], request, pids.get(where))
                if block:
                    s.sizes.append(len(data))
                    s.cpu_ms.append(cpu)
                    s.wall_ms.append(wall)
    for c in conns.values():
        c.close()
    return {"turns": turns, "rows": [_row(s) for s, _, _ in sessions]}


def _row(s: GrowingSession) -> dict[str, Any]:
    cpu, wall = sorted(s.cpu_ms), sorted(s.wall_ms)
    known = [c for c in cpu if c == c]  # nan without a pid
    return {
        "kb": s.kb,
        "path": s.path,
        "calls": len(cpu),
        "body_bytes_first": s.sizes[0] if s.sizes else None,
        "body_bytes_last": s.sizes[-1] if s.sizes else None,
        "cpu_ms_per_call_median": round3(percentile(known, 50)) if known else None,
        "cpu_ms_per_call_mean": round3(sum(known) / len(known)) if known else None,
        "wall_ms_p50": round3(percentile(wall, 50)),
    }


def summarize_transcripts(raw: dict[str, Any]) -> dict[str, Any]:
    """The report's section: the rows, and the state path's CPU at the largest size against
    the smallest (the target: at most 1.5x)."""
    rows = raw["rows"]
    state = sorted((r for r in rows if r["path"] == "state"), key=lambda r: r["kb"])
    ratio = None
    if len(state) > 1 and state[0]["cpu_ms_per_call_median"]:
        last = state[-1]["cpu_ms_per_call_median"]
        ratio = round(last / state[0]["cpu_ms_per_call_median"], 3) if last is not None else None
    return {"turns": raw["turns"], "rows": rows, "state_largest_vs_smallest_cpu": ratio}


def print_transcripts(con: Any, section: dict[str, Any], table: Callable[..., Any]) -> None:
    con.print(
        f"[bold]transcripts[/bold]: one session per size and path, growing by one exchange "
        f"per call, {section['turns']} measured calls each (proxy CPU ms per call)"
    )
    rows = [
        [
            f"{r['kb']:g} KB",
            r["path"],
            f"{_kb(r['body_bytes_first'])}-{_kb(r['body_bytes_last'])} KB",
            _ms(r["cpu_ms_per_call_median"]),
            _ms(r["cpu_ms_per_call_mean"]),
            _ms(r["wall_ms_p50"]),
        ]
        for r in section["rows"]
    ]
    con.print(table(("size", "path", "body", "CPU median", "CPU mean", "wall p50"), rows))
    if section["state_largest_vs_smallest_cpu"] is not None:
        con.print(
            f"  state CPU per call, largest size vs smallest: "
            f"x{section['state_largest_vs_smallest_cpu']:.3f}"
        )


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.3f}"


def _kb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024:,.0f}"
