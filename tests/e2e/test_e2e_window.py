"""``mode: window`` (issue 23) end to end: the real proxy (in-process), the real openai and
anthropic SDKs on every route (chat completions, Messages, Responses), JSON and streams,
the fake provider as each upstream kind. What the upstream receives is checked: between
checkpoints each request is the previous one plus the new messages; a checkpoint asks for
the envelope after the latest observation and restarts the window at the kept exchanges; a
client that changes its transcript never gets a message sent twice or lost."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import anthropic
import openai
import pytest

from skillstate.engine.context import CORRECTION_MARK, STATE_MARK
from skillstate.engine.window import CHECKPOINT_MARK
from tests.conftest import Proxy, StartProxy
from tests.fakeprovider import FakeProvider, RecordedRequest, Reply
from tests.helpers import ant, oai, session

SYSTEM = "You are a careful builder. " * 250  # a prefix the provider caches (>= 1024 tokens)
BIG = "line of build output 0123456789\n" * 12  # ~100 tokens per tool result
TOOL = {
    "name": "run",
    "description": "Run a command.",
    "schema": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}


KIND = {"openai": "openai", "anthropic": "anthropic", "responses": "openai-responses"}  # its own


def upstream(fake: FakeProvider, kind: str) -> dict[str, Any]:
    url = fake.url if kind == "anthropic" else fake.url + "/v1"
    return {"name": "up", "url": url, "kind": kind, "api_key": "sk-upstream"}


def start(start_proxy: StartProxy, fake: FakeProvider, kind: str, **config: Any) -> Proxy:
    cfg = {
        "upstreams": [upstream(fake, kind)],
        "mode": "window",
        "schema": ["notes", "facts", "step"],
        "window_max_tokens": 1000,
        **config,
    }
    return start_proxy(config=cfg)


def request_text(req: RecordedRequest) -> str:
    return json.dumps(req.json)


def last_message_text(req: RecordedRequest) -> str:
    key = "input" if req.dialect == "responses" else "messages"
    return json.dumps(req.json[key][-1])


def asks_checkpoint(req: RecordedRequest) -> bool:
    last = last_message_text(req)
    return CHECKPOINT_MARK in last or CORRECTION_MARK in last


def envelope(patch: dict[str, Any]) -> str:
    return "Noted.\n```json\n" + json.dumps({"state_patch": patch, "action": "continue"}) + "\n```"


class Model:
    """A fake model that works only from what it receives: a tool call per turn, and the
    envelope only when the last message asks for a checkpoint."""

    def __init__(self) -> None:
        self.turn = 0

    def __call__(self, req: RecordedRequest) -> Reply:
        self.turn += 1
        call = ("run", {"cmd": f"step {self.turn}"})
        if asks_checkpoint(req):
            return Reply(text=envelope(self.patch(req)), tool_calls=[call])
        return Reply(text=f"Running step {self.turn}.", tool_calls=[call])

    def patch(self, req: RecordedRequest) -> dict[str, Any]:
        """The state patch of a checkpoint's envelope."""
        return {"step": self.turn}


# -- the three client dialects, driven through their SDKs ------------------------------------


@dataclass
class Client:
    """One agent loop through the proxy in one dialect: each turn sends the transcript and
    appends the reply and a tool result for each of its calls."""

    proxy: Proxy
    dialect: str
    session: str
    transcript: list[dict[str, Any]] = field(default_factory=list)
    marks_breakpoints: bool = True  # anthropic: Claude Code's moving breakpoint on the newest
    tool_choice: Any = None  # sent on every turn when set (in the dialect's own form)
    # One SDK client per proxy address, kept across turns as an agent keeps its own (a new
    # one loads the CA bundle: about 30 ms of CPU, in every turn of these long sessions).
    _sdks: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        task = "TASK: build the project, one step at a time."
        if self.dialect == "openai":
            self.transcript = [{"role": "system", "content": "You are a builder."}]
            self.transcript.append({"role": "user", "content": task})
        elif self.dialect == "anthropic":
            self.transcript = [{"role": "user", "content": task}]
        else:
            self.transcript = [{"type": "message", "role": "user", "content": task}]

    @property
    def headers(self) -> dict[str, str]:
        return {"x-skillstate-session": self.session}

    def say(self, text: str) -> None:
        """A user message (after the last reply)."""
        if self.dialect == "responses":
            self.transcript.append({"type": "message", "role": "user", "content": text})
        else:
            self.transcript.append({"role": "user", "content": text})

    def _sdk(self) -> Any:
        """The dialect's SDK client of the proxy (a restarted proxy has a new address)."""
        key = f"{self.dialect}@{self.proxy.url}"
        if key not in self._sdks:
            self._sdks[key] = (
                ant(self.proxy, "k") if self.dialect == "anthropic" else oai(self.proxy, "k")
            )
        return self._sdks[key]

    def turn(self, stream: bool, result: str = BIG) -> tuple[str, list[tuple[str, str]]]:
        """One turn: returns the reply's text and its calls (id, arguments)."""
        if self.dialect == "openai":
            return self._openai(stream, result)
        if self.dialect == "anthropic":
            return self._anthropic(stream, result)
        return self._responses(stream, result)

    def _openai(self, stream: bool, result: str) -> tuple[str, list[tuple[str, str]]]:
        c: openai.OpenAI = self._sdk()
        tools = [
            {"type": "function", "function": {"name": TOOL["name"], "parameters": TOOL["schema"]}}
        ]
        kw: dict[str, Any] = {"model": "m", "messages": self.transcript, "tools": tools}
        if self.tool_choice is not None:
            kw["tool_choice"] = self.tool_choice
        if stream:
            with c.chat.completions.stream(**kw, extra_headers=self.headers) as s:
                msg = s.get_final_completion().choices[0].message
        else:
            msg = c.chat.completions.create(**kw, extra_headers=self.headers).choices[0].message
        calls = [(t.id, t.function.arguments) for t in msg.tool_calls or []]  # type: ignore[union-attr]
        self.transcript.append(
            {
                "role": "assistant",
                "content": msg.content,
                "tool_calls": [t.model_dump() for t in msg.tool_calls or []],
            }
        )
        for cid, _ in calls:
            self.transcript.append({"role": "tool", "tool_call_id": cid, "content": result})
        return msg.content or "", calls

    def _anthropic(self, stream: bool, result: str) -> tuple[str, list[tuple[str, str]]]:
        c: anthropic.Anthropic = self._sdk()
        msgs = json.loads(json.dumps(self.transcript))
        if self.marks_breakpoints:  # like Claude Code: on the newest message only
            last = msgs[-1]
            if isinstance(last["content"], str):
                last["content"] = [{"type": "text", "text": last["content"]}]
            last["content"][-1]["cache_control"] = {"type": "ephemeral"}
        tools = [{"name": TOOL["name"], "input_schema": TOOL["schema"]}]
        kw: dict[str, Any] = {
            "model": "claude-x",
            "max_tokens": 500,
            "messages": msgs,
            "tools": tools,
            "system": SYSTEM,
        }
        if self.tool_choice is not None:
            kw["tool_choice"] = self.tool_choice
        if stream:
            with c.messages.stream(**kw, extra_headers=self.headers) as s:
                m = s.get_final_message()
        else:
            m = c.messages.create(**kw, extra_headers=self.headers)
        content = [b.model_dump(exclude_none=True) for b in m.content]
        self.transcript.append({"role": "assistant", "content": content})
        calls = [(b.id, json.dumps(b.input)) for b in m.content if b.type == "tool_use"]
        if calls:
            results = [
                {"type": "tool_result", "tool_use_id": cid, "content": result} for cid, _ in calls
            ]
            self.transcript.append({"role": "user", "content": results})
        text = "".join(b.text for b in m.content if b.type == "text")
        return text, calls

    def _responses(self, stream: bool, result: str) -> tuple[str, list[tuple[str, str]]]:
        c: openai.OpenAI = self._sdk()
        tools = [{"type": "function", "name": TOOL["name"], "parameters": TOOL["schema"]}]
        kw: dict[str, Any] = {"model": "m", "input": self.transcript, "tools": tools}
        if self.tool_choice is not None:
            kw["tool_choice"] = self.tool_choice
        if stream:
            with c.responses.stream(**kw, extra_headers=self.headers) as s:
                r = s.get_final_response()
        else:
            r = c.responses.create(**kw, extra_headers=self.headers)
        calls = []
        for item in r.output:
            d = item.model_dump(exclude_none=True)
            d.pop("status", None)
            if item.type == "message":
                d = {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": p["text"]} for p in d["content"]],
                }
            self.transcript.append(d)
            if item.type == "function_call":
                calls.append((item.call_id, item.arguments))
        for cid, _ in calls:
            self.transcript.append(
                {"type": "function_call_output", "call_id": cid, "output": result}
            )
        return r.output_text, calls


# -- what the upstream received ----------------------------------------------------------


def _no_marks(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _no_marks(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_no_marks(v) for v in value]
    return value


def sent_prefix(req: RecordedRequest, *, drop_instruction: bool) -> str:
    """The request as a provider's cache sees it (cache markers aside): system, tools and
    the transcript, without the trailing ``]`` so that a longer transcript extends it. A
    checkpoint request's instruction is left out (it follows the latest observation)."""
    body = _no_marks(req.json)
    key = "input" if req.dialect == "responses" else "messages"
    items = list(body[key])
    if drop_instruction and asks_checkpoint(req):
        last = items[-1]
        if req.dialect == "anthropic" and isinstance(last.get("content"), list):
            kept = [b for b in last["content"] if CHECKPOINT_MARK not in json.dumps(b)]
            items[-1] = {**last, "content": kept}
        else:
            items.pop()
    head = [body.get("system"), body.get("instructions"), body.get("tools")]
    return json.dumps([head, items])[:-2]


PAIRS = [
    ("openai", "openai"),
    ("anthropic", "anthropic"),
    ("responses", "openai-responses"),
    ("anthropic", "openai"),
    ("openai", "anthropic"),
    ("responses", "openai"),
]


@pytest.mark.parametrize(("dialect", "kind"), PAIRS)
def test_thirty_window_turns_are_append_only_between_checkpoints(
    fake: FakeProvider, start_proxy: StartProxy, dialect: str, kind: str
) -> None:
    p = start(start_proxy, fake, kind)
    fake.responder = Model()
    client = Client(p, dialect, f"append-{dialect}-{kind}")
    for t in range(30):
        client.turn(stream=t % 2 == 1)
    reqs = fake.requests
    assert len(reqs) == 30
    checkpoints = [k for k, r in enumerate(reqs) if asks_checkpoint(r)]
    assert len(checkpoints) >= 3, checkpoints  # window_max_tokens forces them
    for k in range(29):
        if k in checkpoints:
            continue  # right after a checkpoint the window restarts
        a = sent_prefix(reqs[k], drop_instruction=False)
        b = sent_prefix(reqs[k + 1], drop_instruction=True)
        assert b.startswith(a), f"request {k + 1} does not extend request {k}"
    for k in checkpoints:
        assert k + 1 == 30 or STATE_MARK in request_text(reqs[k + 1])
        nxt = request_text(reqs[k + 1]) if k + 1 < 30 else ""
        if nxt:  # the state committed at the checkpoint is what the next turn carries
            assert f'\\"step\\":{k + 1}' in nxt or f'"step":{k + 1}' in nxt
    if kind == dialect == "anthropic":
        for r in reqs:
            marks = json.dumps(r.json).count('"cache_control"')
            assert 1 <= marks <= 4
            head = r.json["messages"][0]["content"]
            state = next(b for b in head if b.get("text", "").startswith(STATE_MARK))
            assert state.get("cache_control") == {"type": "ephemeral"}
    history = p.get("/state", params={"session": client.session, "history": "1"}).json()
    statuses = [h["status"] for h in history["history"]]
    assert statuses.count("valid") == len(checkpoints)
    assert statuses.count("window") == 30 - len(checkpoints)


def test_checkpoint_turns_and_untouched_window_replies(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(start_proxy, fake, "openai", window_keep=2)
    fake.responder = Model()
    client = Client(p, "openai", "cp")
    raw_replies = []
    c = oai(p, "k")
    for _ in range(12):
        r = c.chat.completions.with_raw_response.create(
            model="m",
            messages=client.transcript,
            extra_headers=client.headers,  # type: ignore[arg-type]
        )
        msg = r.parse().choices[0].message
        raw_replies.append((r.headers, r.http_response.content))
        client.transcript.append(
            {
                "role": "assistant",
                "content": msg.content,
                "tool_calls": [t.model_dump() for t in msg.tool_calls or []],
            }
        )
        for t in msg.tool_calls or []:
            client.transcript.append({"role": "tool", "tool_call_id": t.id, "content": BIG})
    checkpoint_seen = False
    for k, (req, (headers, body)) in enumerate(zip(fake.requests, raw_replies, strict=True)):
        if headers["x-skillstate-context"] == "checkpoint":
            checkpoint_seen = True
            msgs = req.json["messages"]
            # the instruction after the latest observation (a tool result)
            assert CHECKPOINT_MARK in msgs[-1]["content"] and msgs[-2]["role"] == "tool"
            assert headers["x-skillstate-transition"] == "valid"
            assert "```json" not in body.decode()  # stripped for the client
            if k + 1 == len(fake.requests):
                continue
            nxt = fake.requests[k + 1].json["messages"]
            # after the state: the last 2 exchanges (assistant call + result) and the new one
            after_state = [m for m in nxt[3:] if CHECKPOINT_MARK not in json.dumps(m)]
            assert STATE_MARK in nxt[2]["content"]
            assert [m["role"] for m in after_state] == ["assistant", "tool"] * 3, nxt
        else:
            assert headers["x-skillstate-context"] == "window"
            assert headers["x-skillstate-transition"] == "window"
            assert CHECKPOINT_MARK not in request_text(req)
            assert body == req.response_body  # the model's reply, byte for byte
            assert "response_format" not in req.json
    assert checkpoint_seen
    assert "step" in p.state("cp")["state"]


# -- memory: a model that answers only from what it receives ---------------------------------

FILE_LINE = "def compute_total(alpha, beta): return alpha * BETA_FACTOR_9921"


class Editor:
    """Reads a file, runs three more commands, then edits the file quoting the line it
    read, if it can still see it; at checkpoints it keeps only its progress in the state."""

    def __init__(self, reads_at: int) -> None:
        self.reads_at = reads_at
        self.n = 0

    def __call__(self, req: RecordedRequest) -> Reply:
        text = request_text(req)
        self.n += 1
        if asks_checkpoint(req):
            return Reply(
                text=envelope({"notes": f"progress {self.n}"}), tool_calls=[("run", {"cmd": "ls"})]
            )
        if self.n == self.reads_at:
            return Reply(tool_calls=[("read", {"path": "calc.py"})])
        if self.n == self.reads_at + 4:
            seen = re.search(r"def compute_total\([^\\\"]*BETA_FACTOR_\d+", text)
            old = seen.group(0) if seen else "UNKNOWN"
            return Reply(tool_calls=[("edit", {"path": "calc.py", "old_string": old})])
        return Reply(tool_calls=[("run", {"cmd": f"cmd {self.n}"})])


def edit_session(
    p: Proxy, fake: FakeProvider, session: str, mode: str, reads_at: int
) -> tuple[str, list[str]]:
    """Returns the Edit call's old_string and each turn's context form."""
    fake.responder = Editor(reads_at)
    c = oai(p, "k")
    transcript: list[dict[str, Any]] = [{"role": "user", "content": "TASK: fix calc.py"}]
    forms = []
    headers = {"x-skillstate-session": session, "x-skillstate-mode": mode}
    for _ in range(reads_at + 4):
        r = c.chat.completions.with_raw_response.create(
            model="m",
            messages=transcript,
            extra_headers=headers,  # type: ignore[arg-type]
        )
        forms.append(r.headers.get("x-skillstate-context", ""))
        msg = r.parse().choices[0].message
        transcript.append(
            {
                "role": "assistant",
                "content": msg.content,
                "tool_calls": [t.model_dump() for t in msg.tool_calls or []],
            }
        )
        for t in msg.tool_calls or []:
            args = json.loads(t.function.arguments)
            if t.function.name == "edit":
                return args["old_string"], forms
            out = FILE_LINE + "\n" if t.function.name == "read" else BIG
            transcript.append({"role": "tool", "tool_call_id": t.id, "content": out})
    raise AssertionError("no edit")


@pytest.mark.parametrize("mode", ["window", "state", "auto"])
def test_an_edit_quotes_a_tool_result_from_three_exchanges_earlier(
    fake: FakeProvider, start_proxy: StartProxy, mode: str
) -> None:
    p = start_proxy(
        fake.url + "/v1",
        config={
            "schema": ["notes"],
            "window_max_tokens": 4000,
            "prices": {
                "m": {
                    "input_per_mtok": 3,
                    "output_per_mtok": 15,
                    "cache_read_per_mtok": 0.3,
                    "cache_write_per_mtok": 3.75,
                }
            },
        },
    )
    reads_at = 20 if mode == "auto" else 3
    old, forms = edit_session(p, fake, f"edit-{mode}", mode, reads_at)
    if mode == "state":
        assert old == "UNKNOWN"  # one-turn memory: the Read left the context
    else:
        assert old.startswith("def compute_total(") and "BETA_FACTOR_9921" in old
    if mode == "auto":  # it switched to the window before the Read
        assert forms[0] == "passthrough"
        assert {"window", "checkpoint"} & set(forms[: reads_at - 1]), forms


def test_a_fact_checkpointed_into_the_state_is_answered_forty_turns_later(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    p = start(start_proxy, fake, "openai")

    def model(req: RecordedRequest) -> Reply:
        text = request_text(req)
        codes = sorted(set(re.findall(r"ZEBRA-\d+", text)))
        key = "messages"
        asked = [m for m in req.json[key] if m["role"] == "user"][
            -1 if not asks_checkpoint(req) else -2
        ]
        if "deploy code?" in json.dumps(asked):
            answer = f"The deploy code is {codes[0]}." if codes else "I do not know."
        else:
            answer = "OK, noted: " + "filler words " * 30
        if asks_checkpoint(req):
            patch = {"facts": codes} if codes else {}
            answer += "\n```json\n" + json.dumps({"state_patch": patch, "action": "go"}) + "\n```"
        return Reply(text=answer)

    fake.responder = model
    client = Client(p, "openai", "fact")
    client.transcript[-1]["content"] = "Remember: the deploy code is ZEBRA-7731."
    client.turn(stream=False)
    for t in range(40):
        client.say(f"Message {t}: " + "chatter " * 40)
        client.turn(stream=t % 3 == 0)
    client.say("What is the deploy code?")
    text, _ = client.turn(stream=False)
    assert text == "The deploy code is ZEBRA-7731."
    last = fake.requests[-1].json["messages"]
    # It came from the state: the message that said it is long out of the window.
    assert not any("Remember: the deploy code" in json.dumps(m) for m in last[2:])
    assert p.state("fact")["state"]["facts"] == ["ZEBRA-7731"]


# -- the client's transcript changes under the proxy -----------------------------------------


def _plain(message: dict[str, Any]) -> dict[str, Any]:
    """A transcript message as the SDK sends it (no nulls it would leave out)."""
    return {k: v for k, v in message.items() if v is not None or k == "content"}


def ids_in(req: RecordedRequest) -> list[str]:
    return [m["tool_call_id"] for m in req.json["messages"] if m.get("role") == "tool"]


@pytest.mark.parametrize("change", ["compaction", "edit", "restart"])
def test_a_changed_transcript_sends_no_message_twice_and_none_missing(
    fake: FakeProvider, start_proxy: StartProxy, change: str
) -> None:
    p = start(start_proxy, fake, "openai")
    fake.responder = Model()
    client = Client(p, "openai", f"change-{change}")
    for t in range(14):
        client.turn(stream=t % 2 == 0)
    state_before = p.state(client.session)["state"]
    assert state_before  # a checkpoint committed
    sys_msg = client.transcript[0]
    if change == "compaction":  # the client summarised its history itself
        client.transcript = [sys_msg, {"role": "user", "content": "SUMMARY: steps 1-14 ran."}]
    elif change == "edit":  # an earlier message edited, the rest as it was
        client.transcript[1] = {"role": "user", "content": "TASK: build it, edited."}
    else:  # a new conversation on the same session
        client.transcript = [sys_msg, {"role": "user", "content": "TASK: a new start."}]
    changed = json.loads(json.dumps(client.transcript))
    client.turn(stream=False)
    # The fresh window is the whole new transcript after the task (an edit's is over the
    # bound: that turn is a checkpoint, which folds it before the window restarts).
    first = [m for m in fake.last.json["messages"] if CHECKPOINT_MARK not in json.dumps(m)]
    assert first[3:] == [_plain(m) for m in changed[2:]]
    assert asks_checkpoint(fake.last) == (change == "edit")
    sent = [json.loads(json.dumps(m)) for m in client.transcript]
    client.turn(stream=True)
    for req in fake.requests[-2:]:
        msgs = req.json["messages"]
        ids = ids_in(req)
        assert len(ids) == len(set(ids))  # no tool result twice
        calls = [c["id"] for m in msgs if m.get("tool_calls") for c in m["tool_calls"]]
        assert sorted(calls) == sorted(ids)  # every call with its result
        texts = [json.dumps(m) for m in msgs]
        assert len(texts) == len(set(texts))  # no message twice
        assert STATE_MARK in request_text(req)
    last = fake.requests[-1].json["messages"]
    # Since the window's restart every message is sent, in order.
    after_state = [m for m in last[3:]]
    assert after_state == [_plain(m) for m in sent[-(len(after_state)) :]]
    assert len(after_state) >= 2 and after_state[-1]["role"] == "tool"
    if change != "edit":  # the new transcript is short: all of it after the task is there
        assert after_state == [_plain(m) for m in sent[2:]]
    assert p.state(client.session)["state"]["step"] >= state_before["step"]


def test_the_window_survives_a_proxy_restart(fake: FakeProvider, start_proxy: StartProxy) -> None:
    p = start(start_proxy, fake, "openai")
    fake.responder = Model()
    client = Client(p, "openai", "restart")
    for _ in range(20):  # until a checkpoint has restarted the window, and a turn followed
        client.turn(stream=False)
        if any(asks_checkpoint(r) for r in fake.requests) and not asks_checkpoint(fake.last):
            break
    before = fake.last
    assert not asks_checkpoint(before)
    p.stop()  # type: ignore[attr-defined]
    p.start()  # type: ignore[attr-defined]
    client.turn(stream=False)
    after = fake.last
    # The window continues where it was (read back from the store): append-only still.
    assert sent_prefix(after, drop_instruction=True).startswith(
        sent_prefix(before, drop_instruction=False)
    )
    assert STATE_MARK + '\n{"step":' in after.json["messages"][2]["content"]


def history(p: Proxy, session: str) -> list[dict[str, Any]]:
    """The session's transitions (none while ``auto`` keeps it in passthrough: a 404)."""
    r = p.get("/state", params={"session": session, "history": "1"})
    return [] if r.status_code == 404 else list(r.json()["history"])


def compacted_like_claude_code(summary: str) -> list[dict[str, Any]]:
    """The transcript Claude Code sends on the run after its ``/compact`` (the shape the
    pinned 2.1.332 sends, see tests/agents/test_claude_code_window_compact.py): the summary
    as the first user message, the last reply it keeps from before, the file it read again
    as a user message, then the new prompt joined to the command's caveat."""
    return [
        {"role": "user", "content": [{"type": "text", "text": summary}]},
        {"role": "assistant", "content": [{"type": "text", "text": "KEPT: the last reply."}]},
        {"role": "user", "content": "<system-reminder>Called the run tool: REREAD OUTPUT"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<command-name>/compact</command-name>"},
                {"type": "text", "text": "NEXT PROMPT: carry on."},
            ],
        },
    ]


@pytest.mark.parametrize("mode", ["window", "auto"])
def test_a_claude_code_compaction_sends_its_whole_new_transcript_once(
    fake: FakeProvider, start_proxy: StartProxy, mode: str
) -> None:
    """Claude Code's ``/compact`` after the window restarted at a checkpoint: the next request
    holds every message of the compacted transcript once, in order, after the state (the
    window restarted there, as its transition record says), and the state is intact."""
    up = {**upstream(fake, "anthropic"), "cache_pricing": "none"}  # (auto: the switch pays)
    p = start(start_proxy, fake, "anthropic", mode=mode, upstreams=[up])
    fake.responder = Model()
    client = Client(p, "anthropic", f"cc-compact-{mode}")
    for _ in range(30):  # until a checkpoint has moved the window's start past the task
        client.turn(stream=False)
        marks = [h["estimate"]["window"]["start"] for h in history(p, client.session)]
        if marks and marks[-1] > 0 and not asks_checkpoint(fake.last):
            break
    before = history(p, client.session)
    assert before[-1]["estimate"]["window"]["start"] > 0, before[-1]
    if mode == "auto":  # it had switched from passthrough to the window (a checkpoint)
        assert before[0]["context"] == "checkpoint" and before[0]["estimate"]["saving_usd"] > 0
        assert STATE_MARK not in request_text(fake.requests[0])  # it began in passthrough
    state_before = p.state(client.session)

    client.transcript = compacted_like_claude_code("This session is being continued. SUMMARY")
    compacted = json.loads(json.dumps(client.transcript))
    client.turn(stream=True)
    first = fake.last
    client.turn(stream=False)

    turn = history(p, client.session)[len(before)]
    assert turn["estimate"]["window_start"] == "changed"  # the window restarted
    assert turn["estimate"]["window"]["start"] == 0  # at the compacted transcript's start
    msgs = _no_marks(first.json["messages"])
    head = json.dumps(msgs[0])
    assert "SUMMARY" in head and STATE_MARK in head  # the summary is the task, then the state
    if asks_checkpoint(first):  # (the instruction follows the latest observation)
        msgs[-1]["content"] = [b for b in msgs[-1]["content"] if CHECKPOINT_MARK not in str(b)]
    assert msgs[1:] == compacted[1:]  # every message after the summary once, in order
    text = json.dumps(first.json)
    assert text.count("SUMMARY") == 1 and "build output" not in text  # no message of before
    # The window goes on append-only from there.
    assert sent_prefix(fake.last, drop_instruction=True).startswith(
        sent_prefix(first, drop_instruction=False)
    )
    after = p.state(client.session)
    assert after["step"] > state_before["step"]
    assert after["state"]["step"] >= state_before["state"]["step"]  # nothing lost


class Folder(Model):
    """A fake model that folds at each checkpoint every ``KEEP-``/``FACT-`` token it
    receives (the state's included) into the state's ``facts``, and otherwise calls a tool."""

    def patch(self, req: RecordedRequest) -> dict[str, Any]:
        return {"facts": sorted(set(re.findall(r"(?:KEEP|FACT)-\d+", request_text(req))))}


def long_rewritten_transcript(head: list[dict[str, Any]], rounds: int) -> list[dict[str, Any]]:
    """A transcript the client rewrote that is longer than the window's bound: its own
    summary (as Codex's local compaction keeps the user messages and a summary), then
    ``rounds`` exchanges the proxy never saw, each result with a ``KEEP-`` token."""
    out = [*head, {"role": "user", "content": "SUMMARY of the work: KEEP-900 was decided."}]
    for k in range(rounds):
        call = {"id": f"new{k}", "type": "function", "function": {"name": "run", "arguments": "{}"}}
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        out.append({"role": "tool", "tool_call_id": f"new{k}", "content": f"KEEP-{k} " + BIG})
    return out


@pytest.mark.parametrize("change", ["compaction", "restart"])
def test_a_changed_transcript_over_the_bound_is_folded_not_dropped(
    fake: FakeProvider, start_proxy: StartProxy, change: str
) -> None:
    """The client's new transcript is over ``window_max_tokens``: none of it may leave the
    window without being folded into the state first (issue 23: never a message missing)."""
    p = start(start_proxy, fake, "openai")
    fake.responder = Folder()
    client = Client(p, "openai", f"fold-{change}")
    for t in range(10):
        client.turn(stream=t % 2 == 0, result=f"FACT-{t} " + BIG)
    assert any(asks_checkpoint(r) for r in fake.requests)  # the window had restarted
    head = client.transcript[:2] if change == "compaction" else [
        client.transcript[0], {"role": "user", "content": "TASK: another build."}
    ]  # fmt: skip
    client.transcript = long_rewritten_transcript(head, 12)
    rewritten = json.loads(json.dumps(client.transcript))
    wanted = set(re.findall(r"KEEP-\d+", json.dumps(rewritten)))
    client.turn(stream=False)
    first = fake.last
    # Everything of the new transcript after the task went upstream once, in order, after
    # the state, and the turn folds it (over the bound: a checkpoint). The summary right
    # after the task is the task's (the user's messages before any reply): in the prefix.
    assert asks_checkpoint(first)
    msgs = [m for m in first.json["messages"] if CHECKPOINT_MARK not in json.dumps(m)]
    assert msgs[:3] == [_plain(m) for m in rewritten[:3]]
    assert STATE_MARK in msgs[3]["content"]
    assert msgs[4:] == [_plain(m) for m in rewritten[3:]]
    assert len(wanted) == 13 and "KEEP-900" in wanted
    for _ in range(3):
        client.turn(stream=False)
    state_facts = set(p.state(client.session)["state"].get("facts", []))
    window_text = json.dumps(fake.last.json["messages"][2:])
    visible = state_facts | set(re.findall(r"KEEP-\d+", window_text))
    assert wanted <= visible, sorted(wanted - visible)


def reserialised(transcript: list[dict[str, Any]], as_blocks: bool) -> list[dict[str, Any]]:
    """The transcript as a client that rebuilds its history from its own objects sends it:
    each text ``content`` as a string, or as the same text in one text block (``as_blocks``)."""
    out = []
    for m in json.loads(json.dumps(transcript)):
        content = m.get("content")
        kind = "text"
        if m.get("type") == "message":
            kind = "output_text" if m.get("role") == "assistant" else "input_text"
        if as_blocks and isinstance(content, str):
            m["content"] = [{"type": kind, "text": content}]
        elif not as_blocks and isinstance(content, list) and len(content) == 1:
            block = content[0]
            if block.get("type") == kind and set(block) <= {"type", "text"}:
                m["content"] = block["text"]
        out.append(m)
    return out


def assert_window_kept(p: Proxy, session: str) -> None:
    """The session's window checkpointed as usual and never restarted on a changed
    transcript: the client's rewrites were the same messages to it."""
    turns = history(p, session)
    assert sum(1 for h in turns if h["context"] == "checkpoint") >= 2
    assert [h["estimate"]["window_start"] for h in turns].count("changed") == 0


@pytest.mark.parametrize("dialect", list(KIND))
def test_a_client_that_reserialises_its_history_keeps_its_window(
    fake: FakeProvider, start_proxy: StartProxy, dialect: str
) -> None:
    """A string ``content`` and the same text as a one-block list are one message to the
    window's digest: a client that switches between them keeps its window (no restart)."""
    p = start(start_proxy, fake, KIND[dialect])
    fake.responder = Model()
    client = Client(p, dialect, f"reser-{dialect}", marks_breakpoints=False)
    for t in range(16):
        client.transcript = reserialised(client.transcript, as_blocks=t % 2 == 1)
        client.say(f"Carry on ({t}).")
        sent = json.loads(json.dumps(client.transcript[-3:]))
        client.turn(stream=False)
        if dialect == "openai" and t > 0 and not asks_checkpoint(fake.last):  # as sent
            assert fake.last.json["messages"][-3:] == [_plain(m) for m in sent]
    assert_window_kept(p, client.session)


def count_then_turn(
    fake: FakeProvider, client: Client, stream: bool
) -> tuple[RecordedRequest, RecordedRequest]:
    """``/v1/messages/count_tokens`` of the client's next request, then its turn: what the
    upstream was asked to count, and what the turn sent it."""
    n = len(fake.requests)
    anthropic.Anthropic(
        base_url=client.proxy.url, api_key="k", max_retries=0
    ).messages.count_tokens(
        model="claude-x",
        messages=client.transcript,  # type: ignore[arg-type]
        system=SYSTEM,
        tools=[{"name": TOOL["name"], "input_schema": TOOL["schema"]}],  # type: ignore[list-item]
        extra_headers=client.headers,
    )
    (counted,) = [r for r in fake.requests[n:] if r.path == "/v1/messages/count_tokens"]
    client.turn(stream=stream)
    return counted, fake.last


def test_count_tokens_counts_what_the_window_turn_sends(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """``/v1/messages/count_tokens`` in window mode counts the body the turn then sends (an
    Anthropic upstream counts it, so the body it got is compared): the window from the
    session's mark, also after a restart (the mark read back from the store), and the
    checkpoint instruction on a checkpoint turn."""
    p = start(start_proxy, fake, "anthropic")
    fake.responder = Model()
    client = Client(p, "anthropic", "count", marks_breakpoints=False)
    checkpoints = 0
    for t in range(12):
        if t == 7:
            p.stop()  # type: ignore[attr-defined]
            p.start()  # type: ignore[attr-defined]
        counted, sent = count_then_turn(fake, client, stream=t % 2 == 1)
        assert _no_marks(counted.json["messages"]) == _no_marks(sent.json["messages"]), t
        assert counted.json["system"] == _no_marks(sent.json["system"])
        checkpoints += asks_checkpoint(sent)
    assert checkpoints >= 2


def test_count_tokens_in_auto_counts_what_the_turn_sends_once_in_the_window(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """``/v1/messages/count_tokens`` in ``auto`` counts the body the turn then sends: the
    client's transcript while the session is in passthrough, the window turn's body once
    auto moved it into the window (checkpoints included), also after a restart (the session
    resumes in window from its stored state). Only the switch turn itself differs: auto
    decides it when the turn runs."""
    up = {**upstream(fake, "anthropic"), "cache_pricing": "none"}  # (auto: the switch pays)
    p = start(start_proxy, fake, "anthropic", mode="auto", upstreams=[up])
    fake.responder = Model()
    client = Client(p, "anthropic", "count-auto", marks_breakpoints=False)
    windowed = checkpoints = 0
    restarted = False
    for t in range(16):
        if windowed >= 3 and not restarted:
            p.stop()  # type: ignore[attr-defined]
            p.start()  # type: ignore[attr-defined]
            restarted = True
        steps_before = len(history(p, client.session))  # (a count commits no step)
        counted, sent = count_then_turn(fake, client, stream=t % 2 == 1)
        if steps_before == 0 and history(p, client.session):
            continue  # the switch: decided when the turn ran
        assert _no_marks(counted.json["messages"]) == _no_marks(sent.json["messages"]), t
        assert counted.json["system"] == _no_marks(sent.json["system"])
        if steps_before:
            windowed += 1
            checkpoints += asks_checkpoint(sent)
    assert restarted and windowed >= 6 and checkpoints >= 1, (windowed, checkpoints)


def with_nulls(transcript: list[dict[str, Any]], dialect: str, on: bool) -> list[dict[str, Any]]:
    """The transcript as a client that rebuilds its history from the SDK's objects sends it
    on one turn or the next: a Responses message item with its optional ``"type":
    "message"`` or without it, and the members an SDK object dumps as ``null`` (``id``,
    ``status``, ``refusal``, ``citations``, ``logprobs``...) either as ``null`` (``on``) or
    left out. The API reads each pair as the same item."""
    out = []
    for m in json.loads(json.dumps(transcript)):
        m = {k: v for k, v in m.items() if v is not None or (k == "content" and on)}
        if dialect == "responses":
            if m.get("type", "message") == "message":
                m.pop("type", None)
                if on:
                    m = {"type": "message", **m, "id": None, "status": None}
            elif on:
                m.setdefault("status", None)
        elif dialect == "openai" and m["role"] == "assistant" and on:
            m.update(refusal=None, audio=None, function_call=None, annotations=None)
        for part in m["content"] if isinstance(m.get("content"), list) else ():
            for key in [k for k, v in part.items() if v is None]:
                del part[key]
            if on and part.get("type") in ("text", "output_text", "input_text"):
                part["citations" if dialect == "anthropic" else "logprobs"] = None
        out.append(m)
    return out


@pytest.mark.parametrize("dialect", list(KIND))
def test_a_client_that_drops_its_nulls_and_message_types_keeps_its_window(
    fake: FakeProvider, start_proxy: StartProxy, dialect: str
) -> None:
    """A member sent as ``null`` and the member left out, and a Responses message item with
    and without ``"type": "message"``, are one message to the window's digest: a client that
    alternates between them (the openai SDK's ``model_dump()`` and ``exclude_none``, the
    Agents SDK's untyped ``{"role", "content"}``) keeps its window: no restart, checkpoints
    as usual."""
    p = start(start_proxy, fake, KIND[dialect])
    fake.responder = Model()
    client = Client(p, dialect, f"nulls-{dialect}", marks_breakpoints=False)
    for t in range(16):
        client.transcript = with_nulls(client.transcript, dialect, on=t % 2 == 1)
        client.turn(stream=t % 3 == 0)
    assert_window_kept(p, client.session)
    turns = history(p, client.session)
    assert max(h["estimate"]["window"]["start"] for h in turns) > 2  # past the task


@pytest.mark.parametrize(("change", "stream"), [("compaction", False), ("restart", True)])
def test_a_changed_transcript_past_the_models_context_is_folded_in_parts_that_fit(
    fake: FakeProvider, start_proxy: StartProxy, change: str, stream: bool
) -> None:
    """The client's new transcript is past the model's context (the upstream's
    ``context_tokens``): it cannot be sent whole, even once. Its oldest exchanges are folded
    into the state by calls of their own, each within the context, then the turn sends the
    rest: every request fits, every message is sent once and in order, none is lost."""
    from skillstate.cost.checkpoint import CONTEXT_SHARE
    from skillstate.cost.tokens import request_tokens

    limit = 4_000
    up = {**upstream(fake, "openai"), "context_tokens": limit}
    p = start(start_proxy, fake, "openai", upstreams=[up], window_max_tokens=1_000_000)
    fake.responder = Folder()
    client = Client(p, "openai", f"fit-{change}")
    for t in range(6):
        client.turn(stream=t % 2 == 0, result=f"FACT-{t} " + BIG)
    head = client.transcript[:2] if change == "compaction" else [
        client.transcript[0], {"role": "user", "content": "TASK: another build."}
    ]  # fmt: skip
    client.transcript = long_rewritten_transcript(head, 40)
    rewritten = json.loads(json.dumps(client.transcript))
    wanted = set(re.findall(r"KEEP-\d+", json.dumps(rewritten)))
    assert request_tokens({"messages": rewritten}) > limit  # it could never be sent whole
    before = len(fake.requests)
    client.turn(stream=stream)
    calls = fake.requests[before:]
    assert len(calls) > 2  # folds, then the turn's own call
    assert all(asks_checkpoint(r) for r in calls[:-1])
    assert "Do not answer" in last_message_text(calls[0])
    # Every message of the new transcript after the task went upstream once, in order (the
    # summary right after the task is the task's: in every call's prefix).
    shown: list[Any] = []
    for r in calls:
        msgs = [m for m in r.json["messages"] if CHECKPOINT_MARK not in json.dumps(m)]
        assert msgs[:3] == [_plain(m) for m in rewritten[:3]]
        assert STATE_MARK in msgs[3]["content"]
        shown += msgs[4:]
    assert shown == [_plain(m) for m in rewritten[3:]]
    # The folds' state is committed with the turn, in its one transition.
    committed = p.state(client.session)
    assert {"KEEP-900", "KEEP-0"} <= set(committed["state"]["facts"])
    for _ in range(3):
        client.turn(stream=False)
    sent = [request_tokens(r.json) for r in fake.requests]
    assert max(sent) <= limit * CONTEXT_SHARE + 300, sent  # within the share (+ one turn)
    state_facts = set(p.state(client.session)["state"].get("facts", []))
    window_text = json.dumps(fake.last.json["messages"][2:])
    visible = state_facts | set(re.findall(r"KEEP-\d+", window_text))
    assert wanted <= visible, sorted(wanted - visible)


class FolderWrongOnce(Folder):
    """A ``Folder`` whose first checkpoint answer is an envelope whose patch is not in the
    schema, and no tool call (invalid): re-asked."""

    erred = False

    def __call__(self, req: RecordedRequest) -> Reply:
        if asks_checkpoint(req) and not self.erred:
            self.erred = True
            return Reply(text=envelope({"bogus": 1}))
        return super().__call__(req)


def test_a_folds_re_ask_is_counted_in_the_turns_retries(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """``x-skillstate-retries`` counts the proxy's re-asks of the turn: a fold's included
    (the README: the rollback-retries used)."""
    up = {**upstream(fake, "openai"), "context_tokens": 4_000}
    p = start(start_proxy, fake, "openai", upstreams=[up], window_max_tokens=1_000_000)
    fake.responder = FolderWrongOnce()
    client = Client(p, "openai", "fold-reask")
    client.turn(stream=False, result="FACT-0 " + BIG)
    client.transcript = long_rewritten_transcript(client.transcript[:2], 40)
    before = len(fake.requests)
    c: openai.OpenAI = client._sdk()
    raw = c.chat.completions.with_raw_response.create(
        model="m", messages=client.transcript, extra_headers=client.headers
    )  # type: ignore[call-overload]
    calls = fake.requests[before:]
    assert any(CORRECTION_MARK in last_message_text(r) for r in calls)  # the fold re-asked
    assert raw.headers["x-skillstate-retries"] == "1"
    assert raw.headers["x-skillstate-transition"] == "valid"


FORCED = {"openai": "required", "anthropic": {"type": "any"}, "responses": "required"}


@pytest.mark.parametrize("dialect", ["openai", "anthropic", "responses"])
def test_a_client_forcing_tool_calls_has_its_checkpoints_folded(
    fake: FakeProvider, start_proxy: StartProxy, dialect: str
) -> None:
    """A client that forces a tool call on every turn gets replies that cannot carry the
    envelope, so an in-turn checkpoint would never land and the window would grow to the
    model's context. Where a checkpoint is due, what would leave the window is folded by a
    call of its own (without the tool_choice, asking for the envelope only); the turn then
    goes out as a window turn from the kept exchanges, its tool_choice kept, its reply the
    model's."""
    p = start(start_proxy, fake, KIND[dialect])
    forced = FORCED[dialect]
    folded: list[int] = []  # each fold's step, as its envelope says

    def model(req: RecordedRequest) -> Reply:
        call = ("run", {"cmd": f"step {len(fake.requests)}"})
        if "tool_choice" in req.json:  # the API answers a forced choice with calls only
            assert req.json["tool_choice"] == forced
            return Reply(tool_calls=[call])
        assert asks_checkpoint(req), "only a fold goes without the client's tool_choice"
        folded.append(len(fake.requests))
        return Reply(text=envelope({"step": folded[-1]}))

    fake.responder = model
    client = Client(p, dialect, f"forced-{dialect}", tool_choice=forced)
    for t in range(14):
        text, calls = client.turn(stream=t % 2 == 1)
        assert calls and text == ""
    assert all(r.status == 200 for r in fake.requests)
    folds = [r for r in fake.requests if "tool_choice" not in r.json]
    turns = [r for r in fake.requests if "tool_choice" in r.json]
    assert len(turns) == 14 and len(folds) >= 2
    assert not any(asks_checkpoint(r) for r in turns)  # no instruction it cannot follow
    # Each fold's patch is committed with its turn (recorded as the turn's own outcome).
    assert p.state(client.session)["state"]["step"] == folded[-1]
    # The window stays bounded (tool results per request: 12 lines each), where without
    # the folds every result piles up, one more each turn.
    key = "input" if dialect == "responses" else "messages"
    results = [json.dumps(r.json[key]).count("line of build output") // 12 for r in turns]
    assert max(results) <= 5 and results[-1] < 13, results


def test_a_fold_in_place_of_a_checkpoint_that_fails_leaves_the_turn_a_window_turn(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """The fold stands in for a checkpoint, which may fail: with no valid envelope from it
    (after its re-asks) the turn still goes out, as the window turn it was, its state and
    its window's start kept, never an error for the client."""
    p = start(start_proxy, fake, "openai")

    def model(req: RecordedRequest) -> Reply:
        if "tool_choice" in req.json:
            return Reply(tool_calls=[("run", {"cmd": "go"})])
        return Reply(text="I will not write an envelope.")

    fake.responder = model
    client = Client(p, "openai", "forced-unfolded", tool_choice="required")
    for _ in range(8):
        assert client.turn(stream=False)[1]
    folds = [r for r in fake.requests if "tool_choice" not in r.json]
    assert folds and all(r.status == 200 for r in fake.requests)
    assert p.state(client.session)["state"].get("step") is None  # nothing folded in
    records = history(p, client.session)
    assert len(records) == 8 and {h["status"] for h in records} == {"window"}
    assert "forced_tool_unfolded" in {h["estimate"]["reason"] for h in records}


def long_rewritten_exchanges(dialect: str, head: list[dict[str, Any]], rounds: int) -> list[Any]:
    """:func:`long_rewritten_transcript` in the Messages or the Responses format, as the API
    takes it: after the task, the summary, then ``rounds`` exchanges the proxy never saw,
    every third with two parallel calls (and, in Responses, a message item before them),
    each result with a ``KEEP-`` token; in Messages every fifth ends with a text reply and
    a new user prompt (an exchange that starts with no tool result). Messages alternate user
    and assistant turns (the summary opens the first assistant turn), and each ``tool_use``
    is answered by the next turn's ``tool_result``."""
    summary = "SUMMARY of the work: KEEP-900 was decided."
    out: list[Any] = list(head)
    if dialect == "responses":
        out.append({"type": "message", "role": "user", "content": summary})
    for k in range(rounds):
        ids = [f"new{k}"] + ([f"new{k}b"] if k % 3 == 0 else [])
        result = f"KEEP-{k} " + BIG
        if dialect == "anthropic":
            text = [{"type": "text", "text": summary}] if k == 0 else []
            uses = [{"type": "tool_use", "id": i, "name": "run", "input": {}} for i in ids]
            out.append({"role": "assistant", "content": [*text, *uses]})
            results = [{"type": "tool_result", "tool_use_id": i, "content": result} for i in ids]
            out.append({"role": "user", "content": results})
            if k % 5 == 4:
                done = [{"type": "text", "text": f"Done {k}."}]
                out.append({"role": "assistant", "content": done})
                prompt = [{"type": "text", "text": f"Next prompt {k}."}]
                out.append({"role": "user", "content": prompt})
            continue
        if k % 3 == 0:
            said = [{"type": "output_text", "text": f"Running {k}.", "annotations": []}]
            out.append({"type": "message", "role": "assistant", "content": said})
        for i in ids:
            out.append({"type": "function_call", "call_id": i, "name": "run", "arguments": "{}"})
        for i in ids:
            out.append({"type": "function_call_output", "call_id": i, "output": result})
    return out


def assert_pairs_as_the_api_wants(req: RecordedRequest) -> None:
    """What the real APIs refuse, beyond what the fake provider checks: Messages alternate
    user and assistant turns from a user turn, each ``tool_use`` answered in the next turn
    and each ``tool_result`` answering the turn before; every Responses ``function_call``
    has its ``function_call_output`` after it, and every output its call before it."""
    if req.dialect == "responses":
        items = req.json["input"]
        for k, item in enumerate(items):
            if item.get("type") == "function_call":
                assert any(
                    o.get("type") == "function_call_output" and o["call_id"] == item["call_id"]
                    for o in items[k + 1 :]
                ), (k, item)
            if item.get("type") == "function_call_output":
                assert any(
                    c.get("type") == "function_call" and c["call_id"] == item["call_id"]
                    for c in items[:k]
                ), (k, item)
        return
    msgs = req.json["messages"]
    roles = [m["role"] for m in msgs]
    assert roles == ["user", "assistant"] * (len(msgs) // 2) + ["user"] * (len(msgs) % 2), roles

    def ids(m: dict[str, Any], kind: str, key: str) -> set[str]:
        blocks = m["content"] if isinstance(m["content"], list) else []
        return {b[key] for b in blocks if b.get("type") == kind}

    for k, m in enumerate(msgs):
        uses = ids(m, "tool_use", "id")
        answered = ids(msgs[k + 1], "tool_result", "tool_use_id") if k + 1 < len(msgs) else set()
        assert uses <= answered or k + 1 == len(msgs), (k, uses - answered)
        offered = ids(msgs[k - 1], "tool_use", "id") if k else set()
        assert ids(m, "tool_result", "tool_use_id") <= offered, k


def window_after_state(req: RecordedRequest, task: int = 1) -> list[Any]:
    """What a request shows after its task (``task`` messages; Messages: its turn) and
    state (``cache_control`` markers and the checkpoint or fold instruction left out)."""
    if req.dialect == "responses":
        items = [i for i in req.json["input"] if CHECKPOINT_MARK not in json.dumps(i)]
        assert STATE_MARK in json.dumps(items[task])
        return items[task + 1 :]
    msgs = _no_marks(req.json["messages"])
    assert STATE_MARK in json.dumps(msgs[0])  # the task's turn holds the state
    last = msgs[-1]
    if isinstance(last["content"], list):
        kept = [b for b in last["content"] if CHECKPOINT_MARK not in json.dumps(b)]
        msgs[-1] = {**last, "content": kept}
    return [m for m in msgs[1:] if m["content"]]


@pytest.mark.parametrize(
    ("dialect", "kind", "stream"),
    [("anthropic", "anthropic", False), ("anthropic", "anthropic", True),
     ("responses", "openai-responses", False), ("responses", "openai-responses", True)],
)  # fmt: skip
def test_a_changed_transcript_past_the_models_context_is_folded_in_parts_on_every_route(
    fake: FakeProvider, start_proxy: StartProxy, dialect: str, kind: str, stream: bool
) -> None:
    """As on chat completions, a rewritten transcript past the model's context is folded in
    parts that fit before the turn, through the anthropic SDK on Messages and the openai
    SDK's ``responses`` on Responses: every request fits, keeps each tool call with its
    result (as the real APIs require) and, on Messages, user and assistant turns
    alternating; every message is sent once and in order; none is lost."""
    from skillstate.cost.checkpoint import CONTEXT_SHARE
    from skillstate.cost.tokens import request_tokens

    limit = 6_000 if dialect == "anthropic" else 4_000  # (the Messages client's system: ~1.6k)
    up = {**upstream(fake, kind), "context_tokens": limit}
    p = start(start_proxy, fake, kind, upstreams=[up], window_max_tokens=1_000_000)
    fake.responder = Folder()
    client = Client(p, dialect, f"fit-{dialect}-{stream}")
    for t in range(6):
        client.turn(stream=t % 2 == 0, result=f"FACT-{t} " + BIG)
    client.transcript = long_rewritten_exchanges(dialect, client.transcript[:1], 40)
    rewritten = json.loads(json.dumps(client.transcript))
    wanted = set(re.findall(r"KEEP-\d+", json.dumps(rewritten)))
    key = "input" if dialect == "responses" else "messages"
    system = {"system": SYSTEM} if dialect == "anthropic" else {}
    assert request_tokens({**system, key: rewritten}) > limit  # it could never be sent whole
    before = len(fake.requests)
    client.turn(stream=stream)
    calls = fake.requests[before:]
    assert len(calls) > 2  # folds, then the turn's own call
    assert all(asks_checkpoint(r) for r in calls[:-1])
    assert "Do not answer" in request_text(calls[0])
    assert all(r.status == 200 for r in calls), [r.status for r in calls]
    for r in calls:
        assert_pairs_as_the_api_wants(r)
    # Every message of the new transcript after the task went upstream once, in order (a
    # Responses summary is a user message right after the task: the task's, in the prefix).
    task = 2 if dialect == "responses" else 1
    shown = [m for r in calls for m in window_after_state(r, task)]
    assert shown == _no_marks(rewritten[task:])
    assert {"KEEP-900", "KEEP-0"} <= set(p.state(client.session)["state"]["facts"])
    for _ in range(3):
        client.turn(stream=False)
    for r in fake.requests[before:]:
        assert_pairs_as_the_api_wants(r)
    sent = [request_tokens(r.json) for r in fake.requests]
    assert max(sent) <= limit * CONTEXT_SHARE + 300, sent  # within the share (+ one turn)
    state_facts = set(p.state(client.session)["state"].get("facts", []))
    window_text = json.dumps(fake.last.json[key][1:])
    visible = state_facts | set(re.findall(r"KEEP-\d+", window_text))
    assert wanted <= visible, sorted(wanted - visible)


ROUTES = [("openai", "openai"), ("anthropic", "anthropic"), ("responses", "openai-responses")]


def folding_proxy(fake: FakeProvider, start_proxy: StartProxy, kind: str) -> Proxy:
    """A window whose upstream's context a 40-exchange rewrite is past (the Messages
    client's system is ~1.6k tokens of it)."""
    up = {**upstream(fake, kind), "context_tokens": 6_000 if kind == "anthropic" else 4_000}
    return start(start_proxy, fake, kind, upstreams=[up], window_max_tokens=1_000_000)


def send_rewritten(client: Client, tool_choice: Any = None) -> Any:
    """One turn of a rewritten transcript past the context through the route's SDK, with
    its default retries; ``tool_choice`` as the client forces it."""
    forced = {"tool_choice": tool_choice} if tool_choice is not None else {}
    if client.dialect == "openai":
        tool = {"name": TOOL["name"], "parameters": TOOL["schema"]}
        return openai.OpenAI(base_url=client.proxy.v1, api_key="k").chat.completions.create(
            model="m",
            messages=long_rewritten_transcript(client.transcript[:2], 40),  # type: ignore[arg-type]
            tools=[{"type": "function", "function": tool}],  # type: ignore[list-item]
            extra_headers=client.headers,
            **forced,
        )
    transcript = long_rewritten_exchanges(client.dialect, client.transcript[:1], 40)
    if client.dialect == "anthropic":
        return anthropic.Anthropic(base_url=client.proxy.url, api_key="k").messages.create(
            model="claude-x",
            max_tokens=500,
            system=SYSTEM,
            messages=transcript,
            tools=[{"name": TOOL["name"], "input_schema": TOOL["schema"]}],  # type: ignore[list-item]
            extra_headers=client.headers,
            **forced,
        )
    return openai.OpenAI(base_url=client.proxy.v1, api_key="k").responses.create(
        model="m",
        input=transcript,
        tools=[{"type": "function", "name": TOOL["name"], "parameters": TOOL["schema"]}],  # type: ignore[list-item]
        extra_headers=client.headers,
        **forced,
    )


@pytest.mark.parametrize(("dialect", "kind"), ROUTES)
def test_a_fold_on_every_route_goes_without_the_forced_tool_choice(
    fake: FakeProvider, start_proxy: StartProxy, dialect: str, kind: str
) -> None:
    """A client that forces a tool call on every turn (chat completions' and Responses'
    ``tool_choice: "required"``, as the Agents SDK's ``ModelSettings(tool_choice="required")``
    sends, Messages' ``{"type": "any"}``) still gets its window folded: a fold asks for the
    envelope only, which a forced tool call cannot carry, so the folds go without the
    client's tool_choice (as a compaction's checkpoint does); the turn's own call keeps it."""
    p = folding_proxy(fake, start_proxy, kind)
    forced = FORCED[dialect]
    folder = Folder()

    def obeys_tool_choice(req: RecordedRequest) -> Reply:
        if req.json.get("tool_choice") == forced:  # the API answers with calls only
            return Reply(text="", tool_calls=[("run", {"cmd": "forced"})])
        return folder(req)

    fake.responder = obeys_tool_choice
    client = Client(p, dialect, f"forced-{dialect}")
    for t in range(6):
        client.turn(stream=False, result=f"FACT-{t} " + BIG)
    before = len(fake.requests)
    reply = send_rewritten(client, forced)
    calls = fake.requests[before:]
    assert len(calls) > 2  # folds, then the turn's own call
    assert all("Do not answer" in request_text(r) for r in calls[:-1])
    assert all("tool_choice" not in r.json for r in calls[:-1])
    assert calls[-1].json["tool_choice"] == forced
    if dialect == "openai":
        made = reply.choices[0].message.tool_calls or []
    else:
        made = reply.content if dialect == "anthropic" else reply.output
    assert any(b.type in ("function", "tool_use", "function_call") for b in made)  # the call
    assert {"KEEP-900", "KEEP-0"} <= set(p.state(client.session)["state"]["facts"])


@pytest.mark.parametrize(("dialect", "kind"), ROUTES)
def test_a_fold_without_an_envelope_is_not_retried_by_the_sdk_on_every_route(
    fake: FakeProvider, start_proxy: StartProxy, dialect: str, kind: str
) -> None:
    """A fold that brings no valid envelope after its re-asks fails the turn with nothing
    committed. The proxy already re-asked: an SDK retrying the 502 on its own (the openai and
    anthropic SDKs retry 5xx unless ``x-should-retry: false``) would send every fold again,
    billed each time, as a checkpoint of a compaction would (``invalid_checkpoint``)."""
    p = folding_proxy(fake, start_proxy, kind)
    fake.responder = Folder()
    client = Client(p, dialect, f"fold-fails-{dialect}")
    for t in range(6):
        client.turn(stream=False, result=f"FACT-{t} " + BIG)
    step = p.state(client.session)["step"]
    fake.responder = lambda req: Reply(text="I would rather not.", tool_calls=[("run", {})])
    before = len(fake.requests)
    with pytest.raises((anthropic.APIStatusError, openai.APIStatusError)) as e:
        send_rewritten(client)
    calls = fake.requests[before:]
    assert calls and all(asks_checkpoint(r) for r in calls)
    key = "input" if dialect == "responses" else "messages"
    first = calls[0].json[key]
    assert [r.json[key] == first for r in calls].count(True) == 1  # one attempt
    assert e.value.status_code == 502
    assert e.value.response.headers.get("x-should-retry") == "false"
    assert p.state(client.session)["step"] == step  # nothing committed


def test_a_user_message_between_a_call_and_its_output_never_strands_the_output(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """A Responses input may hold a user message between a function call and its output (a
    user typing while the tool runs). A window restarted at that message sent the output
    without its call: the upstream refused every later turn and the window never moved."""
    p = start(start_proxy, fake, "openai-responses", window_keep=1)
    client = oai(p)
    big = "output line 0123456789 " * 150  # ~1,000 tokens: every turn checkpoints

    def call(i: int) -> dict[str, Any]:
        return {"type": "function_call", "call_id": f"c{i}", "name": "run", "arguments": "{}"}

    def output(i: int) -> dict[str, Any]:
        return {"type": "function_call_output", "call_id": f"c{i}", "output": f"out{i} {big}"}

    transcript: list[Any] = [{"role": "user", "content": "the task"}, call(1), output(1)]
    additions: list[list[Any]] = [
        [{"role": "assistant", "content": "ok1"}, {"role": "user", "content": f"u1 {big}"}],
        [call(2), {"role": "user", "content": f"also the tests {big}"}, output(2)],
        [{"role": "assistant", "content": "ok2"}, {"role": "user", "content": f"u2 {big}"}],
        [{"role": "assistant", "content": "ok3"}, {"role": "user", "content": "u3"}],
        [{"role": "assistant", "content": "ok4"}, {"role": "user", "content": "u4"}],
    ]
    for turn in range(len(additions) + 1):
        fake.enqueue(envelope({"step": turn}))
        client.responses.create(
            model="gpt-5", input=transcript, extra_headers=session("interjected")
        )  # a 400 from the upstream raises here
        sent = fake.last.json["input"]
        calls = [i["call_id"] for i in sent if i.get("type") == "function_call"]
        outputs = [i["call_id"] for i in sent if i.get("type") == "function_call_output"]
        assert set(outputs) <= set(calls), sent  # no output without its call
        if turn < len(additions):
            transcript = [*transcript, *additions[turn]]
    checkpoints = [h for h in history(p, "interjected") if h["context"] == "checkpoint"]
    assert len(checkpoints) >= 3  # the window went on restarting after the interjection
    assert p.state("interjected")["state"]["step"] >= 3


@pytest.mark.parametrize("mode", ["state", "window"])
def test_codexs_prompt_after_its_environment_message_stays_in_every_turn(
    fake: FakeProvider, start_proxy: StartProxy, mode: str
) -> None:
    """Codex CLI opens its input with developer messages, a user message of its
    environment, then the user's prompt as a second user message. The task is both: the
    prompt was sent only while it was the latest observation (state mode: the first turn)
    or in the window (until the first checkpoint), and the model worked on without it."""
    p = start(start_proxy, fake, "openai-responses", mode=mode, window_keep=1)
    client = oai(p)
    prompt = "Find what the notes in notes.txt say about the release."
    env = "<environment_context>\n  <cwd>/work</cwd>\n</environment_context>"
    big = "output line 0123456789 " * 150  # ~1,000 tokens: the window checkpoints
    transcript: list[Any] = [
        {"role": "developer", "content": "You are a coding agent running in the Codex CLI."},
        {"role": "user", "content": env},
        {"role": "user", "content": prompt},
    ]
    for turn in range(6):
        fake.enqueue(envelope({"step": turn}))
        client.responses.create(model="gpt-5", input=transcript, extra_headers=session(mode))
        sent = json.dumps(fake.last.json["input"])
        assert prompt in sent and "environment_context" in sent, (turn, sent)
        assert sent.count(prompt) == 1  # once, in the stable prefix
        call = {"type": "function_call", "call_id": f"c{turn}", "name": "run", "arguments": "{}"}
        out = {"type": "function_call_output", "call_id": f"c{turn}", "output": big}
        transcript = [*transcript, call, out]
    assert p.state(mode)["state"]["step"] >= 1
    if mode == "window":
        assert any(h["context"] == "checkpoint" for h in history(p, mode))


def test_a_sub_agent_and_side_calls_on_the_session_leave_its_window_as_it_was(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """Claude Code sends every request with the session header it is given: its sub-agents'
    transcripts and its side calls (a title, a command's prefix) too. Each conversation
    keeps its own window: before, every request of one restarted the other's (a ``changed``
    window: its whole transcript sent again, a checkpoint each turn from the first one on)."""
    p = start(start_proxy, fake, "anthropic", window_keep=1)
    client = ant(p)
    big = "file line 0123456789 " * 100  # ~600 tokens a result: checkpoints come

    def turn(transcript: list[Any], system: str, turn_no: int) -> list[Any]:
        fake.enqueue(envelope({"step": turn_no}))
        client.messages.create(
            model="claude-sonnet-4-5", max_tokens=512, system=system,
            messages=transcript, extra_headers=session("agents"),
        )  # fmt: skip
        use = {"type": "tool_use", "id": f"t{len(transcript)}", "name": "run", "input": {}}
        result = {"type": "tool_result", "tool_use_id": use["id"], "content": big}
        return [
            *transcript,
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
        ]

    main: list[Any] = [{"role": "user", "content": "MAIN: refactor the parser."}]
    sub: list[Any] = [{"role": "user", "content": "SUB: find every caller of parse()."}]
    for n in range(10):
        main = turn(main, "You are the main agent.", n)
        sub = turn(sub, "You are a sub-agent.", n)
        title = [{"role": "user", "content": f"Title for: MAIN {n}"}]
        fake.enqueue("A title")
        client.messages.create(
            model="claude-haiku-4-5", max_tokens=32, messages=title, extra_headers=session("agents")
        )
    starts = [h["estimate"]["window_start"] for h in history(p, "agents") if "estimate" in h]
    assert len(starts) == 30  # main, sub, title; main, sub, title; ...
    assert starts[0] == "new" and starts[1] == "changed"  # the first window; another task
    assert set(starts[3::3]) == {"kept"}  # main: its window went on, title calls between
    assert set(starts[4::3]) == {"kept"}  # and the sub-agent's
    assert set(starts[2::3]) == {"changed"}  # a title call: a conversation of its own
    last_main = next(r for r in reversed(fake.requests) if "MAIN: refactor" in json.dumps(r.json))
    assert len(last_main.json["messages"]) < len(main) - 2  # its window restarted, smaller


def test_a_round_of_side_calls_leaves_the_main_conversations_window(
    fake: FakeProvider, start_proxy: StartProxy
) -> None:
    """Claude Code makes a side call (the command's prefix) for each Bash call: a round of
    parallel calls is as many conversations of one request each between two main turns.
    The session keeps the mark of its 32 most recent conversations: the main one's stays."""
    p = start(start_proxy, fake, "anthropic")
    client = ant(p)
    main: list[Any] = [{"role": "user", "content": "MAIN: refactor the parser."}]
    for n in range(3):
        fake.enqueue(envelope({"step": n}))
        client.messages.create(
            model="claude-sonnet-4-5", max_tokens=512, messages=main, extra_headers=session("s")
        )
        use = {"type": "tool_use", "id": f"t{n}", "name": "run", "input": {}}
        result = {"type": "tool_result", "tool_use_id": f"t{n}", "content": f"out {n}"}
        main = [
            *main,
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
        ]
        for k in range(12):  # the round's side calls
            fake.enqueue("ls")
            ask = [{"role": "user", "content": f"Command: ls dir{n}-{k}\nIts prefix?"}]
            client.messages.create(
                model="claude-haiku-4-5", max_tokens=32, messages=ask, extra_headers=session("s")
            )
    starts = [h["estimate"]["window_start"] for h in history(p, "s") if "estimate" in h]
    assert [starts[k] for k in range(0, len(starts), 13)] == ["new", "kept", "kept"]
