"""Deterministic benchmark workloads (same seed, same bytes).

* ``ConversationWorkload``: a long chat. Turn 1 is the task; every later turn is an
  observation (log output of ``distractor_bytes``) that may carry ``RECORD key=value`` lines
  (facts the model is told to keep) or ``(aside: key=value)`` passing mentions (never asked to
  be kept). The last turns probe every fact with ``RECALL key?`` lines.
* ``ToolsWorkload``: triage an in-memory issue tracker with ``list_issues`` (paged),
  ``get_issue`` and ``update_issue`` tools whose outputs have a realistic size. The benchmark
  client executes the calls; the tracker's end state is compared with the expected one.
"""

from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass, field
from typing import Any

import orjson

SYSTEM_PROMPT = "You are a careful operations assistant working through a long session."

_WORDS = [
    "deploy",
    "region",
    "cache",
    "bucket",
    "queue",
    "shard",
    "replica",
    "tenant",
    "cluster",
    "gateway",
    "ledger",
    "cursor",
    "budget",
    "window",
    "quota",
    "route",
    "broker",
    "vault",
    "mirror",
    "beacon",
]
_ADJ = [
    "amber",
    "basalt",
    "cobalt",
    "delta",
    "ember",
    "fjord",
    "granite",
    "harbor",
    "indigo",
    "juniper",
    "kestrel",
    "lumen",
]
_SERVICES = [
    "auth",
    "billing",
    "search",
    "ingest",
    "render",
    "notify",
    "export",
    "scheduler",
    "gateway",
]
_LEVELS = ("INFO", "INFO", "INFO", "DEBUG", "WARN")
_VERBS = (
    "processed batch",
    "flushed segment",
    "renewed lease",
    "compacted chunk",
    "served request",
    "rotated handle",
    "synced partition",
)


def _log_line(rng: random.Random, t: int, i: int) -> str:
    svc = rng.choice(_SERVICES)
    return (
        f"2025-03-{1 + t % 28:02d}T{(t * 7 + i) % 24:02d}:{(i * 13) % 60:02d}:"
        f"{(i * 29 + t) % 60:02d}Z {rng.choice(_LEVELS)} {svc}-{rng.randint(1, 9)} "
        f"{rng.choice(_VERBS)} {rng.randint(1000, 99999)} in {rng.randint(3, 900)}ms "
        f"(peer {rng.randint(10, 250)}.{rng.randint(0, 255)}."
        f"{rng.randint(0, 255)}.{rng.randint(1, 254)})"
    )


def _log_block(rng: random.Random, t: int, size: int) -> list[str]:
    lines: list[str] = []
    used = 0
    i = 0
    while used < size:
        line = _log_line(rng, t, i)
        lines.append(line)
        used += len(line) + 1
        i += 1
    return lines


# -- conversation ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    key: str
    value: str
    kind: str  # "recorded" (told to keep) or "aside" (mentioned in passing)
    turn: int


@dataclass
class ConversationWorkload:
    turns: int = 50
    seed: int = 7
    distractor_bytes: int = 1500
    probes_per_turn: int = 3
    facts: list[Fact] = field(default_factory=list)
    probes: dict[int, list[str]] = field(default_factory=dict)

    name = "conversation"
    schema_keys = ("step", "facts")

    def __post_init__(self) -> None:
        if self.turns < 3:
            raise ValueError("the conversation workload needs at least 3 turns")
        if self.distractor_bytes < 0:
            raise ValueError("distractor_bytes must be >= 0")
        rng = random.Random(f"conversation:{self.seed}")
        n_rec = max(1, self.turns // 10)
        n_aside = max(1, self.turns // 25)
        total = n_rec + n_aside
        n_probe_turns = max(1, math.ceil(total / self.probes_per_turn))
        n_probe_turns = min(n_probe_turns, self.turns - 2)
        per_probe_turn = math.ceil(total / n_probe_turns)
        slots = list(range(2, self.turns - n_probe_turns + 1))
        kinds = ["recorded"] * n_rec + ["aside"] * n_aside
        # interleave: asides spread among the recorded facts
        order = sorted(range(total), key=lambda i: (i * 7919) % total)
        self.facts = []
        for pos, idx in enumerate(order):
            turn = slots[pos * len(slots) // total]
            word = _WORDS[idx % len(_WORDS)]
            key = f"{word}_{idx // len(_WORDS) + 1}"
            value = f"{rng.choice(_ADJ)}-{rng.randrange(16**4):04x}"
            self.facts.append(Fact(key, value, kinds[idx], turn))
        first_probe = self.turns - n_probe_turns + 1
        self.probes = {}
        for i, fact in enumerate(self.facts):
            t = first_probe + i // per_probe_turn
            self.probes.setdefault(t, []).append(fact.key)

    @property
    def initial_state(self) -> dict[str, Any]:
        return {"step": 0, "facts": {}}

    @property
    def state_schema(self) -> dict[str, Any]:
        """The state's value types: validation, and the grammar under constrained decoding
        (without it a small model nests objects in ``facts`` until max_tokens)."""
        return {
            "type": "object",
            "properties": {
                "step": {"type": "integer", "minimum": 0, "maximum": 1_000_000},
                "facts": {
                    "type": "object",
                    "additionalProperties": {"type": "string", "maxLength": 24},
                },
            },
        }

    @property
    def system(self) -> str:
        return SYSTEM_PROMPT

    @property
    def task(self) -> str:
        return (
            "TASK: monitor the service logs I paste, one observation per turn.\n"
            "When an observation contains a line `RECORD key=value`, keep that fact: I will "
            "ask for it later. Ignore everything else in the logs.\n"
            "When I write `RECALL key?`, answer `ANSWER key=value`, or `ANSWER key=UNKNOWN` "
            "if you do not have it. Keep replies short."
        )

    def user_text(self, turn: int) -> str:
        """The user message of ``turn`` (turn 1 is the task)."""
        if turn == 1:
            return self.task
        rng = random.Random(f"conversation:{self.seed}:turn:{turn}")
        lines = [f"Observation {turn}: service logs follow."]
        logs = _log_block(rng, turn, self.distractor_bytes)
        planted = [f for f in self.facts if f.turn == turn]
        for fact in planted:
            if fact.kind == "aside":
                at = rng.randrange(len(logs) + 1)
                logs.insert(at, f"by the way, ops mentioned (aside: {fact.key}={fact.value}).")
        lines.extend(logs)
        for fact in planted:
            if fact.kind == "recorded":
                lines.append(f"RECORD {fact.key}={fact.value}")
        for key in self.probes.get(turn, []):
            lines.append(f"RECALL {key}?")
        return "\n".join(lines)

    def score(self, answers: dict[str, str]) -> dict[str, Any]:
        """Quality from the ANSWER lines the model gave."""
        kept = [f for f in self.facts if answers.get(f.key) == f.value]
        lost = [f for f in self.facts if answers.get(f.key) != f.value]
        rec = [f for f in self.facts if f.kind == "recorded"]
        aside = [f for f in self.facts if f.kind == "aside"]

        def pct(group: list[Fact]) -> float | None:
            if not group:
                return None
            return round(100.0 * sum(1 for f in group if f in kept) / len(group), 1)

        def row(f: Fact) -> dict[str, Any]:
            return {
                "key": f.key,
                "kind": f.kind,
                "turn": f.turn,
                "expected": f.value,
                "answered": answers.get(f.key),
            }

        return {
            "recall_pct": pct(rec),
            "aside_recall_pct": pct(aside),
            "facts_kept": [row(f) for f in kept],
            "facts_lost": [row(f) for f in lost],
            "end_state_match": None,
        }

    def params(self) -> dict[str, Any]:
        return {
            "turns": self.turns,
            "seed": self.seed,
            "distractor_bytes": self.distractor_bytes,
            "recorded_facts": sum(1 for f in self.facts if f.kind == "recorded"),
            "aside_facts": sum(1 for f in self.facts if f.kind == "aside"),
            "probe_turns": sorted(self.probes),
        }


# -- tools: an in-memory issue tracker -------------------------------------------------------

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "list_issues",
            "description": "List issues with the given status and an id above cursor, 8 at "
            "a time; pass next_cursor back to get the next ones.",
            "parameters": {
                "type": "object",
                "properties": {
                    "status": {"type": "string", "enum": ["open", "closed"]},
                    "cursor": {"type": "integer", "minimum": 0},
                },
                "required": ["status", "cursor"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_issue",
            "description": "Full details of one issue: description and comments.",
            "parameters": {
                "type": "object",
                "properties": {"id": {"type": "integer"}},
                "required": ["id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "update_issue",
            "description": "Add labels, set assignee, priority or status of one issue.",
            "parameters": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "labels_add": {"type": "array", "items": {"type": "string"}},
                    "assignee": {"type": "string"},
                    "priority": {"type": "string"},
                    "status": {"type": "string", "enum": ["open", "closed"]},
                },
                "required": ["id"],
            },
        },
    },
]

PAGE_SIZE = 8
_RULES = (
    ("crash", "labels+=bug; priority=P1; assignee=oncall"),
    ("duplicate", "status=closed; labels+=duplicate"),
    ("feature", "labels+=enhancement; assignee=pm"),
    ("*", "labels+=needs-info"),
)
_KINDS = ("crash", "duplicate", "feature", "question")
_TITLES = {
    "crash": "{svc} worker crash after {n} requests",
    "duplicate": "{svc} returns stale results for tenant {n}",
    "feature": "Feature: export {svc} metrics per tenant",
    "question": "How should {svc} retries be configured for tenant {n}?",
}
_FILLER = (
    "Steps to reproduce: start the {svc} service with the default profile, send {n} requests "
    "through the gateway and watch the worker pool. Environment: build {b}, region {r}, "
    "kernel 6.{k}. Observed latency p99 {p}ms against a budget of 250ms. Attached logs: "
)


class IssueTracker:
    """The environment. Deterministic; ``call`` returns the tool result as JSON text."""

    def __init__(self, issues: dict[int, dict[str, Any]]) -> None:
        self.issues = issues
        self.calls = 0
        self._clock = 0

    def snapshot(self) -> dict[int, dict[str, Any]]:
        return {
            i: {k: iss[k] for k in ("status", "labels", "assignee", "priority")}
            for i, iss in sorted(self.issues.items())
        }

    def call(self, name: str, arguments: str) -> str:
        self.calls += 1
        try:
            args = orjson.loads(arguments or "{}")
        except orjson.JSONDecodeError:
            return _dump({"error": "arguments are not valid JSON"})
        if not isinstance(args, dict):
            return _dump({"error": "arguments must be an object"})
        if name == "list_issues":
            return _dump(self._list(args))
        if name == "get_issue":
            return _dump(self._get(args))
        if name == "update_issue":
            return _dump(self._update(args))
        return _dump({"error": f"unknown tool {name!r}"})

    def _list(self, args: dict[str, Any]) -> dict[str, Any]:
        status = args.get("status", "open")
        cursor = args.get("cursor", 0)
        if not isinstance(cursor, int) or cursor < 0:
            return {"error": "cursor must be an integer >= 0"}
        ids = [i for i, iss in sorted(self.issues.items()) if iss["status"] == status]
        after = [i for i in ids if i > cursor]
        chunk = after[:PAGE_SIZE]
        more = len(after) > PAGE_SIZE
        return {
            "status": status,
            "cursor": cursor,
            "next_cursor": chunk[-1] if more else None,
            "total": len(ids),
            "issues": [
                {
                    "id": i,
                    "title": self.issues[i]["title"],
                    "status": self.issues[i]["status"],
                    "labels": self.issues[i]["labels"],
                    "assignee": self.issues[i]["assignee"],
                    "priority": self.issues[i]["priority"],
                    "comments": len(self.issues[i]["comments"]),
                    "updated_at": self.issues[i]["updated_at"],
                    "excerpt": self.issues[i]["description"][:120],
                }
                for i in chunk
            ],
        }

    def _get(self, args: dict[str, Any]) -> dict[str, Any]:
        iss = self.issues.get(args.get("id"))  # type: ignore[arg-type]
        if iss is None:
            return {"error": f"no issue {args.get('id')!r}"}
        return copy.deepcopy(iss)

    def _update(self, args: dict[str, Any]) -> dict[str, Any]:
        iss = self.issues.get(args.get("id"))  # type: ignore[arg-type]
        if iss is None:
            return {"error": f"no issue {args.get('id')!r}"}
        for label in args.get("labels_add") or []:
            if isinstance(label, str) and label not in iss["labels"]:
                iss["labels"].append(label)
        for key in ("assignee", "priority", "status"):
            if isinstance(args.get(key), str):
                iss[key] = args[key]
        self._clock += 1
        iss["updated_at"] = f"2025-04-01T10:{self._clock // 60 % 60:02d}:{self._clock % 60:02d}Z"
        return {
            "ok": True,
            "issue": {k: iss[k] for k in ("id", "status", "labels", "assignee", "priority")},
        }


def _dump(obj: Any) -> str:
    return orjson.dumps(obj).decode()


@dataclass
class ToolsWorkload:
    steps: int = 20
    seed: int = 7
    distractor_bytes: int = 1500
    batch: int = 3

    name = "tools"
    schema_keys = ("step", "listed", "next_cursor", "queue", "done")

    def __post_init__(self) -> None:
        if self.steps < 3:
            raise ValueError("the tools workload needs at least 3 steps")
        # calls ~ 1 (first list) + ceil(open / batch) fetch turns + 1 (last updates) + 1 (DONE)
        self.n_open = max(1, (self.steps - 3) * self.batch)
        self.n_closed = max(1, self.n_open // 4)
        self._issues = self._generate()

    @property
    def max_calls(self) -> int:
        return self.steps * 3 + 5

    @property
    def initial_state(self) -> dict[str, Any]:
        return {"step": 0, "listed": False, "next_cursor": None, "queue": [], "done": []}

    @property
    def system(self) -> str:
        return SYSTEM_PROMPT

    @property
    def task(self) -> str:
        rules = "\n".join(f"RULE {k} => {v}" for k, v in _RULES)
        return (
            "TASK: triage every OPEN issue in the tracker.\n"
            "Page through list_issues(status='open', cursor=C), starting at cursor 0 and "
            "passing next_cursor back, until next_cursor is null; call "
            "get_issue(id) for the details of each listed issue; then call update_issue once "
            "per issue as the FIRST matching rule says (keyword found in the title or the "
            "description; * matches any issue):\n"
            f"{rules}\n"
            f"BATCH {self.batch}\n"
            "(fetch at most BATCH issues per turn; calls in one turn run in parallel)\n"
            "Reply DONE when every open issue has been updated."
        )

    @property
    def tools(self) -> list[dict[str, Any]]:
        return TOOLS

    def _generate(self) -> dict[int, dict[str, Any]]:
        rng = random.Random(f"tools:{self.seed}")
        total = self.n_open + self.n_closed
        closed = set(rng.sample(range(1, total + 1), self.n_closed))
        issues: dict[int, dict[str, Any]] = {}
        for i in range(1, total + 1):
            kind = _KINDS[(i * 5 + rng.randrange(4)) % 4]
            svc = rng.choice(_SERVICES)
            n = rng.randint(10, 9000)
            title = _TITLES[kind].format(svc=svc, n=n)
            desc = _FILLER.format(
                svc=svc,
                n=n,
                b=f"{rng.randrange(16**7):07x}",
                r=rng.choice(("eu-west", "us-east", "ap-south")),
                k=rng.randint(1, 12),
                p=rng.randint(80, 2400),
            )
            if kind == "crash":
                desc += "the worker process crashed with SIGSEGV in the pool allocator. "
            elif kind == "duplicate":
                desc += f"this looks like a duplicate of #{rng.randint(1, max(1, i - 1))}. "
            elif kind == "feature":
                desc += "this is a feature request from two tenants. "
            desc += "\n" + "\n".join(_log_block(rng, i, max(0, self.distractor_bytes - len(desc))))
            comments = [
                {
                    "author": rng.choice(("ana", "bo", "chen", "dee", "eli")),
                    "at": f"2025-03-{1 + (i + c) % 28:02d}T09:{(c * 17) % 60:02d}:00Z",
                    "body": f"Seen again on {rng.choice(_SERVICES)}-{rng.randint(1, 9)}; "
                    f"{rng.randint(2, 40)} occurrences since the last deploy.",
                }
                for c in range(rng.randint(1, 3))
            ]
            issues[i] = {
                "id": i,
                "title": title,
                "status": "closed" if i in closed else "open",
                "labels": ["triage"] if i not in closed else ["wontfix"],
                "assignee": None,
                "priority": None,
                "reporter": rng.choice(("ana", "bo", "chen", "dee", "eli")),
                "created_at": f"2025-02-{1 + i % 28:02d}T08:00:00Z",
                "updated_at": f"2025-03-{1 + i % 28:02d}T08:00:00Z",
                "description": desc,
                "comments": comments,
            }
        return issues

    def tracker(self) -> IssueTracker:
        return IssueTracker(copy.deepcopy(self._issues))

    def expected_end_state(self) -> dict[int, dict[str, Any]]:
        from skillstate.bench.simmodel import apply_rules, parse_rules

        env = self.tracker()
        rules = parse_rules(self.task)
        for _, iss in sorted(env.issues.items()):
            if iss["status"] == "open":
                env.call("update_issue", _dump(apply_rules(iss, rules)))
        return env.snapshot()

    def score(self, env: IssueTracker, finished: bool) -> dict[str, Any]:
        expected = self.expected_end_state()
        actual = env.snapshot()
        mismatches = [
            {"id": i, "expected": expected[i], "actual": actual.get(i)}
            for i in sorted(expected)
            if actual.get(i) != expected[i]
        ]
        return {
            "recall_pct": None,
            "aside_recall_pct": None,
            "facts_kept": [],
            "facts_lost": [],
            "end_state_match": not mismatches,
            "issues_expected_changed": self.n_open,
            "mismatches": mismatches[:20],
            "mismatch_count": len(mismatches),
            "finished": finished,
        }

    def params(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "seed": self.seed,
            "distractor_bytes": self.distractor_bytes,
            "batch": self.batch,
            "open_issues": self.n_open,
            "closed_issues": self.n_closed,
            "max_calls": self.max_calls,
        }
