"""The arms of a benchmark: the same workload, model, params and prompts, once per arm.

* ``baseline``: the client sends its full, growing transcript straight to the upstream.
* ``state``, ``mask``, ``auto``: the client sends the same growing transcript to an
  in-process ``ProxyServer`` (one session, the workload's schema) in that mode (``state``:
  the bench's ``--mode``); the proxy compacts it (state), masks old observations (mask) or
  picks the form it expects to be billed least (auto).

The simulated model bills its prompt cache by ``--cache-regime`` (``none``, ``openai``,
``anthropic``; :mod:`skillstate.bench.simcache`), and is forgotten between arms. Under
``anthropic`` the client speaks the Anthropic Messages API with its own breakpoints and the
proxy's upstream is Anthropic-kind.

Both arms use the same client (:mod:`skillstate.bench.arm`): the real ``openai`` client in
the benches, a standard-library one in ``skillstate demo``. Offline (``--offline``, the
default without ``--upstream``) the upstream is the simulated model
(``skillstate.bench.simmodel``) and token counts are its usage, i.e.
``skillstate.cost.tokens.estimate_tokens`` for both arms. Live (``--upstream URL --model M``, key
from ``SKILLSTATE_API_KEY`` or ``OPENAI_API_KEY``) the counts are the provider's usage; a call
whose response has no usage FAILS (we refuse a silent 0). Failures are counted and make the
run INVALID; nothing is retried behind the report's back (the openai client's own retries are
counted as ``http_requests``; the proxy's re-asks after an invalid state patch come from its
``x-skillstate-retries`` header, and their tokens from the simulated model's log offline or
the proxy's ledger live).
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from skillstate.bench.arm import (
    ARMS,
    CACHE_REGIMES,
    Arm,
    ArmResult,
    BenchConfig,
    BenchError,
    BenchRun,
    Progress,
    bench_prices,
)
from skillstate.bench.simmodel import SIM_MODEL_ID, SimModel
from skillstate.bench.wire import get_json
from skillstate.bench.workloads import ConversationWorkload, ToolsWorkload

_ANSWER = re.compile(r"\bANSWER ([A-Za-z_]\w*)=(\S+)")
KEY_ENVS = ("SKILLSTATE_API_KEY", "OPENAI_API_KEY")  # where live runs read the key, in order


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
        sim = stack.enter_context(SimModel(regime=cast(Any, cfg.cache_regime)))
        return Target(sim.url, SIM_MODEL_ID, "sim-needs-no-key", sim)
    return live_target(cfg)


def live_target(cfg: BenchConfig) -> Target:
    """``--upstream URL --model M`` with the key from the config or the environment."""
    assert cfg.upstream is not None
    if not cfg.model:
        raise BenchError("--upstream needs --model")
    key = cfg.api_key or next((os.environ[k] for k in KEY_ENVS if k in os.environ), None)
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


def available_arms() -> tuple[str, ...]:
    """The arms this proxy can run: ``ARMS`` less those whose mode it does not have."""
    from skillstate.choices import Mode

    modes = {m.value for m in Mode}
    return tuple(a for a in ARMS if a in ("baseline", "state") or a in modes)


def arm_mode(cfg: BenchConfig, name: str) -> str:
    """The proxy mode of a proxied arm (``mask``, ``window`` and ``auto`` run their mode;
    ``state`` and any other name the bench's ``--mode``)."""
    return name if name in ("mask", "window", "auto") else cfg.mode


def run_state_arm(
    cfg: BenchConfig,
    workload: ConversationWorkload | ToolsWorkload,
    target: Target,
    progress: Progress | None = None,
    *,
    name: str = "state",
    constrain: str | None = None,
    mode: str | None = None,
) -> ArmResult:
    """The same client loop through a fresh in-process proxy (its own store, one session)
    in ``mode`` (default: :func:`arm_mode` of ``name``).

    ``constrain`` overrides ``cfg.constrain`` (``bench validity`` runs both settings)."""
    from skillstate.sessions.ids import SESSION_HEADER

    if target.sim is not None:
        target.sim.reset_cache()
    with contextlib.ExitStack() as stack:
        proxy = open_proxy(
            stack,
            target,
            schema_keys=workload.schema_keys,
            initial_state=workload.initial_state,
            state_schema=getattr(workload, "state_schema", None),
            mode=mode or arm_mode(cfg, name),
            constrain=constrain or cfg.constrain,
            cfg=cfg,
        )
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


def open_proxy(
    stack: contextlib.ExitStack,
    target: Target,
    *,
    schema_keys: Any,
    initial_state: Any,
    mode: str,
    constrain: str,
    state_schema: Any = None,
    tmp_prefix: str = "skillstate-bench-",
    cfg: BenchConfig | None = None,
) -> Any:
    """A fresh in-process proxy in front of ``target`` with its own store in a temporary
    directory (both closed with ``stack``); returns the running ``ProxyServer``.

    With ``cfg``, the upstream is of the cache regime's kind (Anthropic-kind under
    ``anthropic``), bills its cache by that regime, and is priced at the bench's own rates,
    so the proxy's ledger prices what the bench bills."""
    from skillstate.app.server import ProxyServer
    from skillstate.choices import Mode
    from skillstate.config import Settings, Upstream

    if mode not in {m.value for m in Mode}:
        raise BenchError(f"this proxy has no mode {mode!r} (its modes: {Mode.spelled(', ')})")
    tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix=tmp_prefix))
    upstream: dict[str, Any] = {"name": "bench", "url": target.url, "api_key": target.key}
    if cfg is not None and cfg.offline:
        upstream["kind"] = "anthropic" if cfg.cache_regime == "anthropic" else "openai"
        if "cache_pricing" in Upstream.model_fields:
            upstream["cache_pricing"] = cfg.cache_regime
        prices = bench_prices(cfg)
        if prices is not None:
            upstream["prices"] = {
                "input_per_mtok": prices.input_per_mtok,
                "output_per_mtok": prices.output_per_mtok,
                "cache_read_per_mtok": prices.cache_read_per_mtok,
                "cache_write_per_mtok": prices.cache_write_per_mtok,
            }
    settings = Settings.model_validate(
        {
            **proxy_file_settings(cfg),
            "host": "127.0.0.1",
            "port": 0,
            "upstreams": [Upstream.model_validate(upstream)],
            "schema": list(schema_keys),
            "initial_state": initial_state,
            "state_schema": state_schema,
            "data_dir": Path(tmp),
            "mode": mode,
            "constrain": constrain,
            **({"auto_compact": True} if cfg is not None and cfg.auto_compact else {}),
        }
    )
    return stack.enter_context(ProxyServer(settings))


def proxy_file_settings(cfg: BenchConfig | None) -> dict[str, Any]:
    """The settings of the bench's ``--config`` file (``{}`` without one), under the ones the
    bench sets itself (upstream, store, mode, schema, initial state); a bad file is a
    one-line BenchError."""
    from skillstate.config import ConfigError, file_settings

    try:
        return file_settings(cfg.config if cfg is not None else None)
    except ConfigError as e:
        raise BenchError(f"--config: {e}") from None


def check_config(cfg: BenchConfig) -> None:
    """The checks every bench makes before it starts (one-line BenchErrors)."""
    if cfg.mode not in ("state", "auto"):
        raise BenchError(f"--mode must be state or auto, got {cfg.mode!r}")
    if cfg.inject_failure is not None and not cfg.offline:
        raise BenchError("--inject-failure needs the simulated model (--offline)")
    if cfg.cache_regime not in CACHE_REGIMES:
        raise BenchError(f"--cache-regime must be one of {', '.join(CACHE_REGIMES)}")
    unknown = [a for a in cfg.arms if a not in ARMS]
    if unknown or "baseline" not in cfg.arms or len(set(cfg.arms)) < 2:
        raise BenchError(f"--arms: baseline and at least one of mask, state, auto (got {cfg.arms})")
    if cfg.cache_regime == "anthropic" and not cfg.offline:
        raise BenchError("--cache-regime is the simulated provider's (offline runs only)")
    if cfg.cache_regime == "anthropic" and cfg.stream:
        raise BenchError("--stream is not available with --cache-regime anthropic")
    proxy_file_settings(cfg)  # a bad --config fails before the first arm runs


def run_benchmark(cfg: BenchConfig, progress: Progress | None = None) -> BenchRun:
    """Run every arm; returns the raw results (``report.build_report`` makes the report)."""
    check_config(cfg)
    workload = make_workload(cfg)
    with contextlib.ExitStack() as stack:
        target = open_target(cfg, stack)
        arms = {"baseline": run_baseline_arm(cfg, workload, target, progress)}
        for name in cfg.arms:
            if name != "baseline":
                arms[name] = run_state_arm(cfg, workload, target, progress, name=name)
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
