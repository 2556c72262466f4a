"""BFCL v4 multi-turn replay: public tasks, real backends, both arms.

``skillstate bench bfcl`` runs tasks of the Berkeley Function Calling Leaderboard (BFCL v4,
``pip install bfcl-eval``) through the two benchmark arms (``baseline``: the full transcript
straight to the upstream; ``state``: the same transcript through an in-process proxy, one
session per task).

* **Tasks and observations are BFCL's own.** The questions, the ground-truth call sequences
  (``possible_answer``), the function docs and the Python backends (``GorillaFileSystem``,
  ``TwitterAPI``, ``MathAPI``, ``TradingBot``, ...) all come from the installed ``bfcl_eval``
  package; every tool call is executed with BFCL's own ``execute_multi_turn_func_call``
  against fresh backend instances per arm (loaded from the task's ``initial_config``), so
  every tool result a model sees is real.
* **Offline, the model replays the ground truth** (``ReplayModel``, a ``SimModel`` with a
  different policy): per step it emits the next ground-truth call(s) as ``tool_calls`` and,
  once the turn's calls are done, a short final text. It finds its place (turn, calls done)
  only from what it receives: the transcript in the baseline arm, the state in the state arm
  (so the state has to carry it), and it refuses (HTTP 400) when the context does not match
  the task. When the proxy's contract is in the context it ends every reply with a valid
  state envelope. Token counts are the simulated model's usage
  (``skillstate.cost.tokens.estimate_tokens`` of messages + tool definitions), as in the other
  offline benches, so both arms are counted by one estimator.
* **Grouping.** BFCL's ground truth is one flat list of calls per user turn; how a model
  spreads them over steps is not recorded. ``--grouping same-name`` (default) makes
  consecutive calls to the same function one parallel step, ``call`` one call per step,
  ``turn`` all of a turn's calls in one step. The client executes a step's calls in order.
* **Checks.** After every turn each arm's backend state is compared with the ground truth's
  (BFCL's ``state_checker``: public attributes of every instance), the tool outputs with the
  ground truth's, the two arms' final states with each other, and each arm's decoded calls
  go through BFCL's own ``multi_turn_checker``.

Live (``--upstream URL --model M``) a real model makes the calls; the arms may then make
different numbers of calls (the verdict says PER-CALL ONLY) and the checks measure how well
the model did in each arm.

The machinery does not need ``bfcl_eval``: ``LocalSuite`` runs hand-written tasks in BFCL's
format against your own backend classes (that is what the tests do); ``BfclSuite`` is the
real data. bfcl-eval's declared dependencies are heavy (torch, transformers, sentence-
transformers, faiss, several provider SDKs); the multi-turn backends and data need only
``mpmath``: ``pip install --no-deps bfcl-eval==2026.3.23 mpmath==1.3.0`` works fully offline.

The package, one concern per module: :mod:`.constants`, :mod:`.tasks` (entries, ground-truth
calls, call strings), :mod:`.tools` (function docs -> OpenAI tools), :mod:`.replay` (the
offline replay model), :mod:`.backends` (the ``Suite``/``Executor`` protocols and the local
suite), :mod:`.installed` (the installed bfcl-eval as a suite), :mod:`.workload` (config,
workload, ground-truth run, task records), :mod:`.task_loop` (one task in one arm),
:mod:`.run` (both arms), :mod:`.quality`, :mod:`.report` and :mod:`.cli`.
"""

from __future__ import annotations

from .backends import Executor, LocalExecutor, LocalSuite, Suite, compare_instances, select_ids
from .cli import add_bfcl_parser, config_from_args, run_bfcl_bench
from .constants import (
    ADDED_FUNCTIONS_PROMPT,
    BFCL_PIN,
    CATEGORIES,
    GORILLA_TO_OPENAPI,
    GROUPINGS,
    INITIAL_STATE,
    INSTALL_HINT,
    MAX_STEPS,
    SCHEMA_KEYS,
)
from .installed import BfclSuite
from .replay import ReplayModel, Script, make_script, replay_reply
from .report import build_bfcl_report, render_bfcl_console
from .run import run_bfcl
from .tasks import FuncCall, Task, bfcl_call_string, group_calls, make_task, parse_call
from .tools import openai_tools
from .workload import BfclConfig, TaskRun

__all__ = [
    "ADDED_FUNCTIONS_PROMPT",
    "BFCL_PIN",
    "CATEGORIES",
    "GORILLA_TO_OPENAPI",
    "GROUPINGS",
    "INITIAL_STATE",
    "INSTALL_HINT",
    "MAX_STEPS",
    "SCHEMA_KEYS",
    "BfclConfig",
    "BfclSuite",
    "Executor",
    "FuncCall",
    "LocalExecutor",
    "LocalSuite",
    "ReplayModel",
    "Script",
    "Suite",
    "Task",
    "TaskRun",
    "add_bfcl_parser",
    "bfcl_call_string",
    "build_bfcl_report",
    "compare_instances",
    "config_from_args",
    "group_calls",
    "make_script",
    "make_task",
    "openai_tools",
    "parse_call",
    "render_bfcl_console",
    "replay_reply",
    "run_bfcl",
    "run_bfcl_bench",
    "select_ids",
]
