"""The `skillstate` command (alias `skillstate-proxy`). Start-up problems are one line on
stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from .. import __version__
from ..choices import Constrain, GroupBy, Mode

# Nothing heavier than the choices is imported here: the console script imports this module
# before main() runs, and a Ctrl-C during an import outside main() is a traceback. The
# config (pydantic, jsonschema: a third of a second) is imported inside main().

# Every route web.routes mounts, once (each /v1/... is also served without /v1): kept here,
# not built from the route table, so --help does not import the app; tests/cli/test_cli.py
# checks the two agree.
ENDPOINTS = (
    """endpoints (each /v1/... also without the /v1):
  POST /v1/chat/completions   OpenAI chat completions (JSON and SSE, tools)
  POST /v1/messages           Anthropic Messages (JSON and SSE, tools)
  POST /v1/messages/count_tokens   tokens the turn would send upstream
  POST /v1/responses          OpenAI Responses API (JSON and SSE, tools, stored responses)
  POST /v1/responses/compact  the transcript compacted into the session's state
  POST /v1/responses/input_tokens  tokens the Responses turn would send upstream
  GET|DELETE /v1/responses/{id}    a stored response (?stream=true: a background one's
                              events); forget it
  GET  /v1/responses/{id}/input_items   the items a stored response was made from
  POST /v1/responses/{id}/cancel   a background response (finished: as it is)
  GET  /v1/models[/{id}]      the upstream's models, in the client's format
  GET  /health                upstream circuits, limits, store
  GET  /state[?session=ID[&history=1]]   list sessions, or one session's state
  PATCH /state?session=ID     operator correction (body: a JSON merge patch)
  DELETE /state?session=ID    forget a session
  GET  /metrics               Prometheus metrics (Bearer metrics_token when set)
  GET  /cost[?since=24h&session=ID&group_by="""
    + GroupBy.spelled("|")
    + """]
  GET|POST /admin/keys        client keys (admin key only): list, create
  POST /admin/keys/{name}/rotate   a new secret for a key
  DELETE /admin/keys/{name}   revoke a key
  GET  /ui                    the dashboard"""
)

SESSION_HELP = f"""session header:
  x-skillstate-session: ID    ([A-Za-z0-9_-]{{1,128}}) names the session whose state this turn
                              reads and updates; without it a new session is created. The id in
                              use comes back in the same response header.
  x-skillstate-mode: {Mode.spelled("|")}   per-request mode (default from config)
  x-skillstate-constrain: {"|".join(reversed(Constrain.values()))}     constrained decoding of \
the state envelope"""


def _env_help() -> str:
    from ..config import ENV_VARS

    width = max(len(k) for k in ENV_VARS)
    lines = [f"  {k.ljust(width)}  {v}" for k, v in ENV_VARS.items()]
    return "environment:\n" + "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line too (no usage dump), like every other start-up error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def build_parser(with_benches: bool = True) -> argparse.ArgumentParser:
    p = _Parser(
        prog="skillstate",
        description=(
            "skillstate-proxy: a local proxy for OpenAI/Anthropic clients that keeps long agent "
            "loops flat. Each turn it sends upstream only the task, an explicit JSON state and "
            "the latest observation. With no command it runs the proxy."
        ),
        epilog="\n\n".join([_env_help(), ENDPOINTS, SESSION_HELP]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"skillstate-proxy {__version__}")
    _proxy_options(p)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    # The proxy's flags after `serve` too; SUPPRESS keeps a value given before it.
    _proxy_options(sub.add_parser("serve", help="run the proxy (the default)"), after=True)
    demo = sub.add_parser("demo", help="offline demo: real proxy + simulated model, 30 turns")
    demo.add_argument("--turns", type=int, default=30)
    demo.add_argument("--out-dir", metavar="DIR", help="where to write the report and chart")
    demo.add_argument(
        "--price-as",
        metavar="MODEL",
        help="price the tokens as this model, hypothetically (default claude-sonnet-4-5)",
    )
    cost = sub.add_parser("cost", help="usage, cost and savings from the store")
    # Also accepted after the command; SUPPRESS keeps a value given before it.
    cost.add_argument("--data-dir", metavar="DIR", default=argparse.SUPPRESS)
    cost.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS)
    cost.add_argument("--since", default="24h", help="ISO time or duration like 24h (default)")
    cost.add_argument("--until", default=None)
    cost.add_argument("--session", default=None)
    cost.add_argument("--by", choices=GroupBy.values(), default=None)
    cost.add_argument("--json", action="store_true", help="print JSON instead of a table")
    from .keys import add_keys_parser
    from .migrate import add_migrate_parser

    add_keys_parser(sub)
    add_migrate_parser(sub)
    from .store import add_store_parser

    add_store_parser(sub)
    from ..bench.replay.cli import add_replay_parser

    add_replay_parser(sub)
    bench = sub.add_parser("bench", help="benchmarks: overhead, conversation, tools, bfcl, replay")
    bench_sub = bench.add_subparsers(dest="bench", metavar="BENCH", required=True)
    if with_benches:  # their modules are only imported when a bench is asked for
        _add_benches(bench_sub)
    return p


def _proxy_options(p: argparse.ArgumentParser, *, after: bool = False) -> None:
    """The proxy's flags: on the top-level parser, and (``after``) on ``serve``'s."""
    from ..config import DEFAULT_PORT

    kw: dict[str, Any] = {"default": argparse.SUPPRESS} if after else {}
    p.add_argument("--config", metavar="FILE", help="JSON config file (default ./skillstate.json)",
                   **kw)  # fmt: skip
    p.add_argument("--upstream", metavar="URL", help="upstream base URL (key: SKILLSTATE_API_KEY)",
                   **kw)  # fmt: skip
    p.add_argument("--port", type=_port, help=f"listen port (default {DEFAULT_PORT}; 0 = any)",
                   **kw)  # fmt: skip
    p.add_argument("--host", help="listen host (default 127.0.0.1)", **kw)
    p.add_argument("--schema", metavar="KEYS", help="comma-separated allowed state keys", **kw)
    p.add_argument("--data-dir", metavar="DIR", help="store directory (default ~/.skillstate)",
                   **kw)  # fmt: skip
    p.add_argument("--mode", choices=Mode.values(), help="default mode", **kw)
    p.add_argument("--verbose", action="store_const", const=True,
                   help="log one line per request", **kw)  # fmt: skip
    p.add_argument(
        "--insecure-no-auth",
        action="store_const",
        const=True,
        help="allow a non-loopback --host without client keys (anyone reaching it spends the keys)",
        **kw,
    )


def _add_benches(bench_sub: Any) -> None:
    from ..bench.commands import add_bench_parsers

    add_bench_parsers(bench_sub, overhead=True)


def _port(value: str) -> int:
    from ..config import port_number

    port = port_number(value)
    if port is None:
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to 65535, got {value!r}")
    return port


def _cli_layer(args: argparse.Namespace) -> dict[str, Any]:
    keys = (
        "config", "upstream", "port", "host", "schema", "data_dir", "verbose", "mode",
        "insecure_no_auth", "store",
    )  # fmt: skip
    return {k: getattr(args, k, None) for k in keys}


# Ctrl-Cs whose KeyboardInterrupt landed where Python cannot raise it (see _keep_interrupts).
_SWALLOWED: list[BaseException] = []


def _keep_interrupts(previous: Callable[[Any], object], unraisable: Any) -> None:
    """``sys.unraisablehook`` while a command runs. A Ctrl-C's KeyboardInterrupt is raised in
    whatever Python code runs next; when that is a callback the interpreter cannot raise
    from (the import lock's weakref callback, a ``__del__``), it printed a traceback and was
    lost, and the proxy went on to serve. It is kept instead, to be raised where it can be
    (``raise_swallowed_interrupt``); anything else goes to ``previous``, the hook before."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        _SWALLOWED.append(unraisable.exc_value)
        return
    previous(unraisable)


def raise_swallowed_interrupt() -> None:
    """Raise the Ctrl-C that ``_keep_interrupts`` kept, if any (before the proxy listens)."""
    if _SWALLOWED:
        raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """The command; Ctrl-C at any point is exit 130 and nothing on stderr, also during the
    imports the parser needs (a third of a second before anything runs), and also when it
    landed where Python could not raise it (``_keep_interrupts``)."""
    _SWALLOWED.clear()
    previous = sys.unraisablehook
    sys.unraisablehook = functools.partial(_keep_interrupts, previous)
    try:
        code = _run(list(sys.argv[1:] if argv is None else argv))
        raise_swallowed_interrupt()
        return code
    except KeyboardInterrupt:
        # CPython marks a KeyboardInterrupt that leaves an exec() of a string (code that
        # pydantic, dataclasses and namedtuple generate while importing) as unhandled, even
        # once caught here, and then kills the process with SIGINT at exit instead of
        # exiting 130; the next exec() of a string clears the mark.
        exec("")
        return 130
    finally:
        sys.unraisablehook = previous


def _run(argv: list[str]) -> int:
    from ..config import ConfigError

    parser = build_parser(with_benches="bench" in argv)
    args = parser.parse_args(argv)
    _check_bench_upstream(parser, args)
    try:
        return _dispatch(args)
    except ConfigError as e:
        print(f"skillstate: {e}", file=sys.stderr)
        return 2


def _check_bench_upstream(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``skillstate --upstream URL bench …``: the top-level flag reaches the bench unchecked
    (the bench's own ``--upstream`` checks its URL while parsing), and a bad URL would be the
    bench config's multi-line error; it gets the same one usage line."""
    from ..config import upstream_url_problem

    url = getattr(args, "upstream", None)
    if args.command == "bench" and url is not None:
        problem = upstream_url_problem(url)
        if problem:
            parser.error(f"argument --upstream: {problem}")


def _dispatch(args: argparse.Namespace) -> int:
    command = args.command or "serve"
    if command == "demo":
        from .demo import run_demo

        return run_demo(args)
    if command == "bench":  # the benches that need the bench extra say so in one line
        from ..bench.commands import run_bench

        return run_bench(args)
    if command == "replay":  # it runs its own proxies (the --config file's settings)
        from ..bench.replay.cli import run_replay

        return run_replay(args)
    if command == "store":  # its URLs are its arguments: no settings needed
        from .store import run_store

        return run_store(args)
    from ..config import ConfigError, load_settings

    settings = load_settings(_cli_layer(args))
    if command == "cost":
        from .cost import print_cost

        return print_cost(settings, args)
    if command == "keys":
        from .keys import run_keys

        return run_keys(settings, args)
    if command == "migrate":
        from .migrate import run_migrate

        return run_migrate(settings)
    if not settings.upstreams:
        raise ConfigError(
            "upstreams: none configured; use --upstream URL, SKILLSTATE_UPSTREAM or "
            "'upstreams' in skillstate.json (try `skillstate demo` for an offline run)"
        )
    from ..app.server import serve

    return serve(settings, before_listening=raise_swallowed_interrupt)


if __name__ == "__main__":
    sys.exit(main())
