"""The benchmarks' command-line options and the ``BenchConfig`` they make."""

from __future__ import annotations

import argparse
from typing import Any

from skillstate.bench.arm import (
    ARMS,
    CACHE_REGIMES,
    DEFAULT_ARMS,
    BenchConfig,
    BenchError,
    split_regime,
)
from skillstate.cli.paths import output_file
from skillstate.config import upstream_url_problem
from skillstate.numbertext import whole_number

EPILOG = (
    "Live runs read the key from SKILLSTATE_API_KEY or OPENAI_API_KEY. Exit status: 0 valid "
    "run, 1 INVALID run (a call failed), 2 usage error."
)


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
        type=upstream_url,
        default=argparse.SUPPRESS,
        help="a live OpenAI-compatible upstream",
    )
    src.add_argument("--model", metavar="M", help="model name for --upstream")


def upstream_url(text: str) -> str:
    """A bench's ``--upstream``, checked as the proxy checks an upstream's URL (one usage
    line, not the config model's multi-line error after the parse)."""
    problem = upstream_url_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


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


def common_args(p: argparse.ArgumentParser) -> None:
    """The options of the two-arm benches (conversation, tools)."""
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
    cost_args(p)
    p.add_argument("--out", metavar="FILE", type=output_file, help="write the JSON report here")
    p.add_argument(
        "--chart", metavar="FILE", type=output_file, help="write a chart (.svg, .html, or .png)"
    )
    p.add_argument("--json", action="store_true", help="print the JSON report to stdout")
    p.add_argument(
        "--inject-failure",
        metavar="ARM:TURN",
        help="make that call of that arm fail (offline), to see the INVALID verdict",
    )


def cost_args(p: argparse.ArgumentParser) -> None:
    """--price-as / --cache-regime / --auto-compact / --config / --arms (every bench that
    runs arms)."""
    p.add_argument(
        "--price-as",
        metavar="MODEL",
        help="price the token counts as this model (bundled prices; hypothetical offline)",
    )
    p.add_argument(
        "--cache-regime",
        metavar="{" + ",".join(CACHE_REGIMES) + "}[@READ]",
        default="openai",
        help="how the simulated provider caches and bills prompt prefixes: none; openai "
        "(automatic prefix cache, reads at 0.5x input); anthropic (cache_control breakpoints, "
        "reads 0.1x, writes 1.25x; the client speaks the Messages API and marks the end of "
        "system and of the last message); @READ prices the cache read at that fraction of "
        "the input instead (openai@0.1). TTL 300 s, minimum 1,024 tokens (default openai)",
    )
    p.add_argument(
        "--auto-compact",
        action="store_true",
        help="the proxies run with auto_compact: true (auto may move a session to the compact "
        "context where it is cheaper than the window)",
    )
    # SUPPRESS: `skillstate --config FILE bench ...` (the top-level flag) works too.
    p.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="the proxies' config file (default: the proxy's defaults); the bench sets their "
        "upstream, store, mode, schema and initial state itself",
    )
    p.add_argument(
        "--arms",
        metavar="A,B",
        default=",".join(DEFAULT_ARMS),
        help=f"which arms to run, of {', '.join(ARMS)}, or all (those this proxy has) (default "
        f"{','.join(DEFAULT_ARMS)}); mask/state/window/auto run through the proxy in that mode",
    )


def parse_arms(value: str | None) -> tuple[str, ...]:
    """``--arms``: 'all' (every arm this proxy has a mode for) or a comma list; baseline is
    always run, first."""
    if value == "all":
        from skillstate.bench.runner import available_arms

        return available_arms()
    if not value:
        return DEFAULT_ARMS
    names = [a.strip() for a in value.split(",") if a.strip()]
    unknown = [a for a in names if a not in ARMS]
    if unknown:
        raise BenchError(f"--arms: unknown arm(s) {', '.join(unknown)} (of {', '.join(ARMS)})")
    ordered = tuple(a for a in ARMS if a in names or a == "baseline")
    if len(ordered) < 2:
        raise BenchError("--arms: baseline and at least one of mask, state, window, auto")
    return ordered


def parse_injection(value: str | None) -> tuple[str, int] | None:
    if not value:
        return None
    arm, _, turn = value.partition(":")
    n = whole_number(turn)
    if arm not in ARMS or n is None or n < 1:
        raise BenchError(
            f"--inject-failure: expected ARM:N (ARM one of {', '.join(ARMS)}), got {value!r}"
        )
    return arm, n


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
        constrain=getattr(args, "constrain", "off") or "off",
        **client_fields(args, upstream),
    )


def client_fields(args: argparse.Namespace, upstream: str | None) -> dict[str, Any]:
    """The BenchConfig fields every workload's options set alike (``bench`` and ``bench
    bfcl``): the mode, the upstream and model, streaming, the token limit, pricing,
    injected failures, the cache regime, the arms, auto's compaction and the proxies'
    config file."""
    return {
        "mode": getattr(args, "mode", "state") or "state",
        "upstream": upstream,
        "model": getattr(args, "model", None),
        "stream": bool(getattr(args, "stream", False)),
        "max_tokens": getattr(args, "max_tokens", 512),
        "price_as": getattr(args, "price_as", None),
        "inject_failure": parse_injection(getattr(args, "inject_failure", None)),
        **regime_fields(args),
        "arms": parse_arms(getattr(args, "arms", None)),
        "auto_compact": bool(getattr(args, "auto_compact", False)),
        "config": getattr(args, "config", None) or None,
    }


def regime_fields(args: argparse.Namespace) -> dict[str, Any]:
    """``--cache-regime REGIME[@READ]`` as ``BenchConfig``'s cache_regime and cache_read."""
    regime, read = split_regime(getattr(args, "cache_regime", "openai") or "openai")
    return {"cache_regime": regime, "cache_read": read}
