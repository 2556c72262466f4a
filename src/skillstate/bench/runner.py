"""The two-arm benchmark: the same workload, model, params and prompts, twice.

* ``baseline``: the client sends its full, growing transcript straight to the upstream.
* ``state``: the client sends the same growing transcript to an in-process ``ProxyServer``
  (one session, the workload's schema); the proxy compacts it.

Both arms use the real ``openai`` client. Offline (``--offline``, the default without
``--upstream``) the upstream is the simulated model (``skillstate.bench.simmodel``) and token
counts are its usage, i.e. ``skillstate.tokens.estimate_tokens`` for both arms. Live
(``--upstream URL --model M``, key from ``SKILLSTATE_API_KEY`` or ``OPENAI_API_KEY``) the
counts are the provider's usage; a call whose response has no usage FAILS (we refuse a silent
0). Failures are counted and make the run INVALID; nothing is retried behind the report's back
(the openai client's own retries are counted as ``http_requests``; the proxy's re-asks after an
invalid state patch come from its ``x-skillstate-retries`` header, and their tokens from the
simulated model's log offline or the proxy's ledger live).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from skillstate.bench.simmodel import SIM_MODEL_ID, SimModel
from skillstate.bench.workloads import ConversationWorkload, ToolsWorkload

Progress = Callable[[str, int, int], None]  # (arm, calls done, calls expected)

ARMS = ("baseline", "state")
_ANSWER = re.compile(r"\bANSWER ([A-Za-z_]\w*)=(\S+)")
_KEY_ENVS = ("SKILLSTATE_API_KEY", "OPENAI_API_KEY")


class BenchError(Exception):
    """A usage or setup problem, reported as one line."""


@dataclass
class BenchConfig:
    workload: str = "conversation"  # conversation | tools
    turns: int = 50  # conversation turns
    steps: int = 20  # tools: expected model calls
    seed: int = 7
    distractor_bytes: int = 1500
    mode: str = "state"  # the proxy mode of the state arm: state | auto
    constrain: str = "off"  # the proxy's `constrain` setting for the state arm: off | json_schema
    upstream: str | None = None  # None = offline (simulated model)
    model: str | None = None
    api_key: str | None = None
    stream: bool = False
    max_tokens: int = 512
    temperature: float = 0.0
    price_as: str | None = None  # price the token counts as this model (offline: hypothetical)
    inject_failure: tuple[str, int] | None = None  # (arm, turn): that call fails (offline)
    timeout: float = 120.0

    @property
    def offline(self) -> bool:
        return self.upstream is None


@dataclass
class CallRecord:
    turn: int
    status: str = "ok"  # ok | error
    error: str | None = None
    prompt_tokens: int | None = None  # as reported to the client
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    latency_ms: float = 0.0
    retries: int | None = None  # proxy re-asks (x-skillstate-retries), None when not reported
    http_requests: int = 0  # requests the openai client sent (its own retries included)
    upstream_requests: int | None = None  # offline: requests the simulated model answered
    upstream_prompt_tokens: int | None = None  # offline: prompt tokens of all those requests
    injected_tokens: int | None = None  # offline: tokens of the proxy's contract/state text
    context: str | None = None  # the proxy's x-skillstate-context (compact | full)
    transition: str | None = None  # the proxy's x-skillstate-transition (valid | invalid | ...)
    validation: str | None = None  # the proxy's x-skillstate-validation (why it was invalid)
    model: str | None = None  # the model the response names
    cost_usd: float | None = None


@dataclass
class ArmResult:
    name: str
    calls: list[CallRecord] = field(default_factory=list)
    quality: dict[str, Any] = field(default_factory=dict)
    final_state: Any = None
    ledger: Any = None  # the proxy's /cost summary for the session (state arm)
    session: str | None = None
    seconds: float = 0.0


@dataclass
class BenchRun:
    config: BenchConfig
    workload: ConversationWorkload | ToolsWorkload
    model: str
    arms: dict[str, ArmResult]


# -- pricing ---------------------------------------------------------------------------------


def _price(cfg: BenchConfig, rec: CallRecord) -> float | None:
    model = cfg.price_as or (None if cfg.offline else cfg.model)
    if model is None or rec.prompt_tokens is None or rec.completion_tokens is None:
        return None
    from skillstate.ledger import Usage

    cached = min(rec.cached_tokens or 0, rec.prompt_tokens)
    usage = Usage(rec.prompt_tokens, rec.completion_tokens, cached, 0)
    hint = None if cfg.offline else cfg.upstream
    priced = _price_book().price(usage, model=model, upstream=None, provider_hint=hint)
    return priced.cost_usd


_BOOK: Any = None


def _price_book() -> Any:
    global _BOOK
    if _BOOK is None:
        from skillstate.pricing import PriceBook

        _BOOK = PriceBook()
    return _BOOK


# -- one call --------------------------------------------------------------------------------


def _header_int(headers: Any, name: str) -> int | None:
    value = headers.get(name) if headers is not None else None
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _accumulate_stream(stream: Any) -> tuple[dict[str, Any], Any, str | None]:
    """Chunks -> (assistant message dict, usage object or None, model name)."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    usage = None
    model = None
    for chunk in stream:
        model = model or getattr(chunk, "model", None)
        if getattr(chunk, "usage", None) is not None:
            usage = chunk.usage
        for choice in chunk.choices or []:
            delta = choice.delta
            if delta is None:
                continue
            if delta.content:
                content.append(delta.content)
            for tc in delta.tool_calls or []:
                slot = calls.setdefault(
                    tc.index,
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if tc.id:
                    slot["id"] = tc.id
                if tc.function is not None:
                    if tc.function.name:
                        slot["function"]["name"] += tc.function.name
                    if tc.function.arguments:
                        slot["function"]["arguments"] += tc.function.arguments
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, usage, model


def _message_dict(msg: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
    if msg.tool_calls:
        out["tool_calls"] = [
            {
                "id": tc.id,
                "type": "function",
                "function": {"name": tc.function.name, "arguments": tc.function.arguments},
            }
            for tc in msg.tool_calls
        ]
    return out


class Arm:
    """One arm's openai client plus the bookkeeping around each call."""

    def __init__(
        self,
        name: str,
        cfg: BenchConfig,
        base_url: str,
        api_key: str,
        model: str,
        headers: dict[str, str],
        sim: SimModel | None,
    ) -> None:
        import openai

        self.name = name
        self.cfg = cfg
        self.model = model
        self.sim = sim
        self._requests = 0

        def count(request: Any) -> None:
            self._requests += 1

        # Loopback (the simulated model, the in-process proxy) never goes through an
        # environment-configured HTTP proxy.
        self._http = openai.DefaultHttpxClient(
            event_hooks={"request": [count]}, trust_env=not _is_loopback(base_url)
        )
        self.client = openai.OpenAI(
            base_url=base_url,
            api_key=api_key,
            default_headers=headers,
            max_retries=2,
            timeout=cfg.timeout,
            http_client=self._http,
        )

    def close(self) -> None:
        self.client.close()

    def call(
        self, turn: int, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[dict[str, Any] | None, CallRecord]:
        import openai

        cfg = self.cfg
        rec = CallRecord(turn=turn)
        if cfg.inject_failure == (self.name, turn):
            if self.sim is None:
                raise BenchError("--inject-failure needs the simulated model (--offline)")
            self.sim.fail_next(1, status=400)
        log_start = len(self.sim.requests) if self.sim is not None else 0
        self._requests = 0
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": cfg.temperature,
            "max_tokens": cfg.max_tokens,
        }
        if tools:
            kwargs["tools"] = tools
        if cfg.stream:
            kwargs["stream"] = True
            kwargs["stream_options"] = {"include_usage": True}
        t0 = time.perf_counter()
        message: dict[str, Any] | None = None
        usage: Any = None
        try:
            raw = self.client.chat.completions.with_raw_response.create(**kwargs)
            headers = raw.headers
            if cfg.stream:
                message, usage, rec.model = _accumulate_stream(raw.parse())
            else:
                completion = raw.parse()
                usage = completion.usage
                rec.model = completion.model
                if completion.choices:
                    message = _message_dict(completion.choices[0].message)
                else:
                    rec.status, rec.error = "error", "the response has no choices"
            rec.retries = _header_int(headers, "x-skillstate-retries")
            rec.context = headers.get("x-skillstate-context")
            rec.transition = headers.get("x-skillstate-transition")
            rec.validation = headers.get("x-skillstate-validation")
        except openai.APIStatusError as e:
            detail = e.body.get("message") if isinstance(e.body, dict) else None
            rec.status, rec.error = "error", f"HTTP {e.status_code}: {_short(detail or e.message)}"
        except openai.APIError as e:  # connection errors, timeouts, bad responses
            rec.status, rec.error = "error", f"{type(e).__name__}: {_short(str(e))}"
        rec.latency_ms = round((time.perf_counter() - t0) * 1000, 1)
        rec.http_requests = self._requests
        if rec.status == "ok":
            if usage is None or getattr(usage, "prompt_tokens", None) is None:
                rec.status = "error"
                rec.error = "the response carries no usage (refusing silent 0)"
            else:
                rec.prompt_tokens = int(usage.prompt_tokens)
                rec.completion_tokens = int(usage.completion_tokens or 0)
                details = getattr(usage, "prompt_tokens_details", None)
                cached = getattr(details, "cached_tokens", None) if details else None
                rec.cached_tokens = int(cached) if cached is not None else 0
        if self.sim is not None:
            seen = self.sim.requests[log_start:]
            rec.upstream_requests = len(seen)
            rec.upstream_prompt_tokens = sum(r.prompt_tokens for r in seen if r.status == 200)
            rec.injected_tokens = sum(r.injected_tokens for r in seen if r.status == 200)
        rec.cost_usd = _price(cfg, rec) if rec.status == "ok" else None
        return message, rec


def _is_loopback(url: str) -> bool:
    from urllib.parse import urlsplit

    return (urlsplit(url).hostname or "") in ("127.0.0.1", "localhost", "::1")


def _short(text: str, limit: int = 200) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


# -- the workloads' client loops -------------------------------------------------------------


def _conversation(
    arm: Arm, w: ConversationWorkload, result: ArmResult, progress: Progress | None
) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": w.system},
        {"role": "user", "content": w.task},
    ]
    answers: dict[str, str] = {}
    for turn in range(1, w.turns + 1):
        if turn > 1:
            messages.append({"role": "user", "content": w.user_text(turn)})
        reply, rec = arm.call(turn, messages, None)
        result.calls.append(rec)
        if reply is not None:
            messages.append({"role": "assistant", "content": reply.get("content") or ""})
            answers.update(_ANSWER.findall(reply.get("content") or ""))
        if progress:
            progress(arm.name, turn, w.turns)
    result.quality = w.score(answers)


def _tools(arm: Arm, w: ToolsWorkload, result: ArmResult, progress: Progress | None) -> None:
    env = w.tracker()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": w.system},
        {"role": "user", "content": w.task},
    ]
    finished = False
    for turn in range(1, w.max_calls + 1):
        reply, rec = arm.call(turn, messages, w.tools)
        result.calls.append(rec)
        if progress:
            progress(arm.name, turn, max(w.steps, turn))
        if reply is None:
            break  # without the model's calls the loop cannot go on; the failure is counted
        messages.append(reply)
        tool_calls = reply.get("tool_calls") or []
        if not tool_calls:
            finished = True
            break
        for tc in tool_calls:
            fn = tc.get("function") or {}
            output = env.call(str(fn.get("name")), str(fn.get("arguments") or ""))
            messages.append({"role": "tool", "tool_call_id": tc.get("id"), "content": output})
    result.quality = w.score(env, finished)


# -- the benchmark ---------------------------------------------------------------------------


def make_workload(cfg: BenchConfig) -> ConversationWorkload | ToolsWorkload:
    if cfg.workload == "conversation":
        return ConversationWorkload(cfg.turns, cfg.seed, cfg.distractor_bytes)
    if cfg.workload == "tools":
        return ToolsWorkload(cfg.steps, cfg.seed, cfg.distractor_bytes)
    raise BenchError(f"unknown workload {cfg.workload!r}")


def get_json(url: str) -> Any:
    import httpx

    try:
        resp = httpx.get(url, timeout=10, trust_env=False)
    except httpx.HTTPError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    try:
        data = resp.json()
    except ValueError:
        return {"error": f"HTTP {resp.status_code}: not JSON"}
    if resp.status_code != 200:
        return {"error": f"HTTP {resp.status_code}", "body": data}
    return data


def unwrap_state(data: Any) -> Any:
    if isinstance(data, dict) and isinstance(data.get("state"), dict):
        return data["state"]
    return data


@dataclass
class Target:
    """Where the arms send their calls: a live upstream or the simulated model."""

    url: str
    model: str
    key: str
    sim: SimModel | None = None


def open_target(cfg: BenchConfig, stack: contextlib.ExitStack) -> Target:
    """The upstream of a run; the simulated model is started (and stopped with ``stack``)."""
    if cfg.offline:
        sim = stack.enter_context(SimModel())
        return Target(sim.url, SIM_MODEL_ID, "sim-needs-no-key", sim)
    assert cfg.upstream is not None
    if not cfg.model:
        raise BenchError("--upstream needs --model")
    key = cfg.api_key or next((os.environ[k] for k in _KEY_ENVS if k in os.environ), None)
    if not key:
        raise BenchError("live runs need a key in SKILLSTATE_API_KEY or OPENAI_API_KEY")
    return Target(cfg.upstream.rstrip("/"), cfg.model, key)


def run_baseline_arm(
    cfg: BenchConfig,
    workload: ConversationWorkload | ToolsWorkload,
    target: Target,
    progress: Progress | None = None,
) -> ArmResult:
    """The client's full, growing transcript straight to the upstream."""
    from skillstate.upstream.client import base_url as openai_base

    result = ArmResult("baseline")
    arm = Arm("baseline", cfg, openai_base(target.url), target.key, target.model, {}, target.sim)
    try:
        t0 = time.perf_counter()
        _run_workload(arm, workload, result, progress)
        result.seconds = round(time.perf_counter() - t0, 3)
    finally:
        arm.close()
    return result


def run_state_arm(
    cfg: BenchConfig,
    workload: ConversationWorkload | ToolsWorkload,
    target: Target,
    progress: Progress | None = None,
    *,
    name: str = "state",
    constrain: str | None = None,
) -> ArmResult:
    """The same client loop through a fresh in-process proxy (its own store, one session).

    ``constrain`` overrides ``cfg.constrain`` (``bench validity`` runs both settings)."""
    from skillstate.config import Settings, Upstream
    from skillstate.server import ProxyServer
    from skillstate.session import SESSION_HEADER

    if target.sim is not None:
        target.sim.reset_cache()
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="skillstate-bench-"))
        settings = Settings.model_validate(
            {
                "host": "127.0.0.1",
                "port": 0,
                "upstreams": [Upstream(name="bench", url=target.url, api_key=target.key)],
                "schema": list(workload.schema_keys),
                "initial_state": workload.initial_state,
                "state_schema": getattr(workload, "state_schema", None),
                "data_dir": Path(tmp),
                "mode": cfg.mode,
                "constrain": constrain or cfg.constrain,
            }
        )
        proxy = stack.enter_context(ProxyServer(settings))
        session = f"bench-{workload.name}-{uuid.uuid4().hex[:12]}"
        result = ArmResult(name, session=session)
        arm = Arm(
            name, cfg, proxy.url + "/v1", target.key, target.model,
            {SESSION_HEADER: session}, target.sim,
        )  # fmt: skip
        stack.callback(arm.close)
        t0 = time.perf_counter()
        _run_workload(arm, workload, result, progress)
        result.seconds = round(time.perf_counter() - t0, 3)
        result.final_state = unwrap_state(get_json(f"{proxy.url}/state?session={session}"))
        result.ledger = get_json(f"{proxy.url}/cost?session={session}")
    return result


def run_benchmark(cfg: BenchConfig, progress: Progress | None = None) -> BenchRun:
    """Run both arms; returns the raw results (``report.build_report`` makes the report)."""
    if cfg.mode not in ("state", "auto"):
        raise BenchError(f"--mode must be state or auto, got {cfg.mode!r}")
    if cfg.inject_failure is not None and not cfg.offline:
        raise BenchError("--inject-failure needs the simulated model (--offline)")
    workload = make_workload(cfg)
    with contextlib.ExitStack() as stack:
        target = open_target(cfg, stack)
        arms = {
            "baseline": run_baseline_arm(cfg, workload, target, progress),
            "state": run_state_arm(cfg, workload, target, progress),
        }
    return BenchRun(cfg, workload, target.model, arms)


def _run_workload(
    arm: Arm,
    workload: ConversationWorkload | ToolsWorkload,
    result: ArmResult,
    progress: Progress | None,
) -> None:
    if isinstance(workload, ConversationWorkload):
        _conversation(arm, workload, result, progress)
    else:
        _tools(arm, workload, result, progress)


def call_rows(result: ArmResult) -> list[dict[str, Any]]:
    return [asdict(c) for c in result.calls]


# -- command line ----------------------------------------------------------------------------


def upstream_args(p: argparse.ArgumentParser) -> None:
    """--offline / --upstream / --model."""
    src = p.add_argument_group("upstream")
    src.add_argument(
        "--offline",
        action="store_true",
        help="use the built-in simulated model (the default when --upstream is not given)",
    )
    # SUPPRESS: `skillstate --upstream URL bench ...` (the top-level flag) keeps working.
    src.add_argument(
        "--upstream",
        metavar="URL",
        default=argparse.SUPPRESS,
        help="a live OpenAI-compatible upstream",
    )
    src.add_argument("--model", metavar="M", help="model name for --upstream")


def workload_args(p: argparse.ArgumentParser) -> None:
    """--seed / --distractor-bytes / --max-tokens."""
    p.add_argument("--seed", type=int, default=7, help="workload seed (default 7)")
    p.add_argument(
        "--distractor-bytes",
        type=int,
        default=1500,
        metavar="N",
        help="size of each observation's filler (log lines, issue descriptions)",
    )
    p.add_argument("--max-tokens", type=int, default=512, metavar="N", help="per call (512)")


def _common(p: argparse.ArgumentParser) -> None:
    upstream_args(p)
    workload_args(p)
    p.add_argument(
        "--mode",
        choices=("state", "auto"),
        default=argparse.SUPPRESS,
        help="proxy mode of the state arm: state = always compact; auto = compact only when "
        "smaller than the full transcript (default state)",
    )
    p.add_argument(
        "--constrain",
        choices=("off", "json_schema"),
        default="off",
        help="the state arm's proxy asks the upstream for a JSON-schema-constrained state "
        "envelope (response_format; small local models) (default off)",
    )
    p.add_argument("--stream", action="store_true", help="stream the replies (SSE)")
    p.add_argument(
        "--price-as",
        metavar="MODEL",
        help="price the token counts as this model (bundled prices; hypothetical offline)",
    )
    p.add_argument("--out", metavar="FILE", help="write the JSON report here")
    p.add_argument("--chart", metavar="FILE", help="write a chart (.svg, .html, or .png)")
    p.add_argument("--json", action="store_true", help="print the JSON report to stdout")
    p.add_argument(
        "--inject-failure",
        metavar="ARM:TURN",
        help="make that call of that arm fail (offline), to see the INVALID verdict",
    )


EPILOG = (
    "Live runs read the key from SKILLSTATE_API_KEY or OPENAI_API_KEY. Exit status: 0 valid "
    "run, 1 INVALID run (a call failed), 2 usage error."
)


def add_bench_parsers(subparsers: Any) -> None:
    """Add the ``conversation`` and ``tools`` subcommands to an argparse subparsers object."""
    conv = subparsers.add_parser(
        "conversation",
        help="long chat with facts to keep and recall probes",
        description="Baseline (full transcript) vs state (through the proxy): a long chat.",
        epilog=EPILOG,
    )
    conv.add_argument("--turns", type=int, default=50, metavar="N", help="turns (default 50)")
    _common(conv)
    conv.set_defaults(bench_workload="conversation")
    tools = subparsers.add_parser(
        "tools",
        help="multi-step tool loop over an in-memory issue tracker",
        description="Baseline vs state: a tool-calling loop that triages an issue tracker.",
        epilog=EPILOG,
    )
    tools.add_argument(
        "--steps", type=int, default=20, metavar="N", help="about this many model calls (20)"
    )
    _common(tools)
    tools.set_defaults(bench_workload="tools")
    from skillstate.bench.bfcl import add_bfcl_parser  # BFCL v4 replay (bfcl-eval optional)
    from skillstate.bench.validity import add_validity_parser

    add_bfcl_parser(subparsers)
    add_validity_parser(subparsers)


def parse_injection(value: str | None) -> tuple[str, int] | None:
    if not value:
        return None
    arm, _, turn = value.partition(":")
    if arm not in ARMS or not turn.isdigit() or int(turn) < 1:
        raise BenchError(f"--inject-failure: expected baseline:N or state:N, got {value!r}")
    return arm, int(turn)


def _given(value: int | None, default: int) -> int:
    return default if value is None else value


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    workload = str(
        getattr(args, "bench_workload", None) or getattr(args, "workload", None) or "conversation"
    )
    upstream = getattr(args, "upstream", None)
    if getattr(args, "offline", False) and upstream:
        raise BenchError("--offline and --upstream exclude each other")
    return BenchConfig(
        workload=workload,
        turns=_given(getattr(args, "turns", None), 50),  # --turns 0 is an error, not the default
        steps=_given(getattr(args, "steps", None), 20),
        seed=getattr(args, "seed", 7),
        distractor_bytes=getattr(args, "distractor_bytes", 1500),
        mode=getattr(args, "mode", "state") or "state",
        constrain=getattr(args, "constrain", "off") or "off",
        upstream=upstream,
        model=getattr(args, "model", None),
        stream=bool(getattr(args, "stream", False)),
        max_tokens=getattr(args, "max_tokens", 512),
        price_as=getattr(args, "price_as", None),
        inject_failure=parse_injection(getattr(args, "inject_failure", None)),
    )


@contextlib.contextmanager
def progress_bar(console: Any, enabled: bool = True) -> Iterator[Progress | None]:
    """A rich progress bar with one task per arm; yields the callback."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(
        TextColumn("{task.description:>9}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=console,
        transient=True,
    ) as bar:
        tasks: dict[str, Any] = {}

        def update(arm: str, done: int, total: int) -> None:
            if arm not in tasks:
                tasks[arm] = bar.add_task(arm, total=total)
            bar.update(tasks[arm], completed=done, total=max(total, done))

        yield update


def make_console(stderr: bool = False) -> Any:
    """A rich console; wide enough for the tables when output goes to a file or a pipe."""
    from rich.console import Console

    console = Console(stderr=stderr)
    if not console.is_terminal:
        console = Console(stderr=stderr, width=110)
    return console


def run_bench(args: argparse.Namespace) -> int:
    """``skillstate bench conversation|tools``: 0 = valid run, 1 = INVALID run, 2 = bad usage."""
    if getattr(args, "bench_workload", None) == "bfcl":
        from skillstate.bench.bfcl import run_bfcl_bench

        return run_bfcl_bench(args)
    if getattr(args, "bench_workload", None) == "validity":
        from skillstate.bench.validity import run_validity_bench

        return run_validity_bench(args)
    from skillstate.bench import report as rep

    console = make_console(stderr=bool(getattr(args, "json", False)))
    try:
        cfg = config_from_args(args)
        with progress_bar(console, console.is_terminal) as progress:
            run = run_benchmark(cfg, progress)
    except (BenchError, ValueError) as e:
        print(f"skillstate bench: {e}", file=sys.stderr)
        return 2
    report = rep.build_report(run)
    rep.render_console(report, console)
    return emit_report(report, args, console, "skillstate bench")


def emit_report(report: dict[str, Any], args: argparse.Namespace, console: Any, prog: str) -> int:
    """Write --out / --chart / --json for a finished report; the exit code of a bench."""
    from skillstate.bench import report as rep

    if getattr(args, "out", None):
        rep.write_json(report, Path(args.out))
        console.print(f"report: {args.out}")
    if getattr(args, "chart", None):
        from skillstate.bench.chart import write_chart

        try:
            write_chart(report, Path(args.chart))
        except RuntimeError as e:
            print(f"{prog}: {e}", file=sys.stderr)
            return 2
        console.print(f"chart: {args.chart}")
    if getattr(args, "json", False):
        sys.stdout.write(rep.dumps(report) + "\n")
    return 1 if report["verdict"].startswith("INVALID") else 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point (``python -m skillstate.bench.runner conversation ...``)."""
    parser = argparse.ArgumentParser(prog="skillstate bench")
    sub = parser.add_subparsers(dest="bench_command", required=True)
    add_bench_parsers(sub)
    return run_bench(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
