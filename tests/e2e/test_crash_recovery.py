"""Crash recovery: the real proxy process SIGKILLed at chosen points of turns, restarted on
the same SQLite data dir, and each turn it cut retried with its ``Idempotency-Key``, as the
SDKs retry (the same request again).

Four lanes, each a way to drive a session: the openai SDK on chat completions and the
anthropic SDK on Messages, JSON and streamed, in ``state`` and ``window`` modes. Each lane
has three sessions, and at every kill each of them has turns cut at a chosen point:

- ``held``: one turn with its upstream call out (the fake holds it), a second queued behind
  it on the session, a third whose request is half sent;
- ``stalled``: the upstream sent part of its reply (a stream's first events, relayed to the
  client; a JSON body's first bytes) and hangs;
- ``main``: the upstream wrote its whole reply (the proxy is judging or committing it: the
  kill round), or the proxy's test hook kills it after the whole answer and before the
  commit, or after the commit and before the reply is sent (one lane per hook round).

The kill points are chosen by signals, never by sleeps: the fake's record of a request that
arrived, of the events it sent, of its whole reply written; the client holding a stream's
first bytes; the hook. After each restart, for every session:

- its step is the last acknowledged turn's, or the one after when a cut turn's commit
  landed; its history is steps 1..n, no gap or repeat, each step one call's patch whole;
- a retry gets the kept reply (``x-skillstate-replayed``, nothing sent upstream) when the
  commit landed, else runs the turn once; a second retry is the same bytes again;
- the ledger has at most one row per upstream call (each call's reply has its own output
  token count), a row for every acknowledged call, and a row for a call the kill cut, charged
  its worst case (``interrupted``, none left ``pending``); the session's spend (``GET
  /state``, under a session budget) never goes down and is the sum of its rows (cost, else
  estimate), and ``skillstate cost --by session --json`` reads the same.

And the WAL a crash leaves, damaged while the proxy is stopped (its header, a frame before
later commits, the database file emptied under it): the proxy refuses to start in one line
and leaves the files as they are, rather than let SQLite drop acknowledged turns.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from skillstate.cli.main import main
from tests.conftest import ProxyProcess, StartProxyProcess
from tests.fakeprovider import FakeProvider, RecordedRequest, Reply
from tests.helpers import SESSION_HEADER, ant, envelope, oai

# $0.001 per output token, input free: a ledger row's output tokens name its upstream call.
PRICES = {"m": {"input_per_mtok": 0, "output_per_mtok": 1_000}}
BUDGET = "50"
KILL_HOOK = "SKILLSTATE_TEST_KILL"
SIGNAL_WAIT = 120.0  # a liveness bound only: the signal must come at all


def key(label: str) -> str:
    return f"key-{label}"


@dataclass(frozen=True)
class Lane:
    sdk: str  # "openai" (chat completions) or "anthropic" (Messages)
    stream: bool
    mode: str

    @property
    def name(self) -> str:
        return f"{self.sdk}-{'stream' if self.stream else 'json'}-{self.mode}"


# The hook rounds kill lanes 0 and 2 before the commit, 1 and 3 after it: each point in a
# JSON and a streamed turn.
LANES = [
    Lane("openai", False, "state"),
    Lane("openai", True, "window"),
    Lane("anthropic", True, "state"),
    Lane("anthropic", False, "window"),
]


@dataclass
class Answer:
    """What the client got for one request: acknowledged (the whole reply) or not."""

    ok: bool = False
    status: int = 0
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    error: str = ""

    @property
    def step(self) -> int:
        if "x-skillstate-step" in self.headers:
            return int(self.headers["x-skillstate-step"])
        note = self.body.split(b"skillstate transition=", 1)[1]  # a stream's SSE comment
        return int(note.split(b"step=", 1)[1].split()[0])

    @property
    def replayed(self) -> bool:
        return self.headers.get("x-skillstate-replayed") == "true"


_CLIENTS: dict[tuple[str, str], Any] = {}


def sdk_client(proxy: ProxyProcess, sdk: str) -> Any:
    """One SDK client per proxy address and SDK: a new one loads the CA bundle, tens of
    milliseconds of CPU, and a turn is sent hundreds of times here."""
    made = _CLIENTS.get((proxy.url, sdk))
    if made is None:
        made = (oai if sdk == "openai" else ant)(proxy, timeout=SIGNAL_WAIT)
        _CLIENTS[(proxy.url, sdk)] = made
    return made


def send(
    proxy: ProxyProcess, lane: Lane, session: str, label: str, first: threading.Event | None
) -> Answer:
    """One turn with the lane's SDK; ``first`` is set when the client holds the reply's
    first bytes."""
    headers = {
        SESSION_HEADER: session,
        "Idempotency-Key": key(label),
        "x-skillstate-mode": lane.mode,
        "x-skillstate-budget-usd": BUDGET,
    }
    messages: Any = [{"role": "user", "content": f"<{label}>"}]
    answer = Answer()
    try:
        client = sdk_client(proxy, lane.sdk)
        made = client.chat.completions if lane.sdk == "openai" else client.messages
        cm = made.with_streaming_response.create(
            model="m", max_tokens=500, messages=messages, stream=lane.stream, extra_headers=headers
        )
        with cm as r:
            answer.status, answer.headers = r.status_code, dict(r.headers)
            for chunk in r.iter_bytes():
                answer.body += chunk
                if first is not None:
                    first.set()
    except Exception as e:  # the process died under the request: not acknowledged
        answer.error = f"{type(e).__name__}: {e}"
        return answer
    ended = not lane.stream or b"data: [DONE]" in answer.body or b"message_stop" in answer.body
    answer.ok = answer.status == 200 and ended
    return answer


@dataclass
class Session:
    """One session of a lane: what its client saw acknowledged."""

    world: World
    lane: Lane
    sid: str
    acked: int = 0  # the last acknowledged step
    patches: list[Any] = field(default_factory=list)  # per acknowledged step (state mode)
    acked_calls: set[int] = field(default_factory=set)  # output tokens of acknowledged calls
    spent: float = 0.0
    # Turns a kill cut, to retry: their labels, and whether their commit landed (None: the
    # kill raced the commit, either is right).
    cut: list[tuple[str, bool | None]] = field(default_factory=list)

    def label(self, what: str) -> str:
        self.world.turns += 1
        label = f"{self.sid}/{what}/{self.world.turns}"
        self.world.session_of[label] = self
        return label

    def send(self, label: str, first: threading.Event | None = None) -> Answer:
        return send(self.world.proxy, self.lane, self.sid, label, first)

    def in_thread(self, label: str, first: threading.Event | None = None) -> Callable[[], Answer]:
        """Send in a thread; the returned call joins it and gives the answer."""
        box: list[Answer] = []
        t = threading.Thread(target=lambda: box.append(self.send(label, first)))
        t.start()

        def join() -> Answer:
            t.join(SIGNAL_WAIT)
            assert not t.is_alive() and box, "the client never returned"
            return box[0]

        return join

    def ack(self, answer: Answer, label: str, calls_before: int) -> None:
        """A turn the client got whole that ran: the next step, with its one call."""
        assert answer.ok and not answer.replayed, (label, answer)
        assert answer.step == self.acked + 1, (label, answer.step, self.acked)
        calls = self.world.calls_of(label)
        assert len(calls) == calls_before + 1, (label, calls)  # this turn's one call
        self.acked = answer.step
        self.acked_calls.add(calls[-1])
        self.patches.append(self.world.answered[calls[-1]])

    def turn(self, what: str) -> None:
        """An ordinary turn, acknowledged."""
        label = self.label(what)
        self.ack(self.send(label), label, 0)

    def history(self) -> list[dict[str, Any]]:
        r = self.world.proxy.get("/state", params={"session": self.sid, "history": 1})
        assert r.status_code == 200, r.text
        return list(r.json()["history"])

    def check(self) -> None:
        """The invariants, on the running proxy."""
        proxy = self.world.proxy
        state = proxy.state(self.sid)
        history = self.history()
        steps = [h["step"] for h in history]
        assert steps == list(range(1, len(steps) + 1)), (self.sid, steps)
        assert state["step"] in (self.acked, self.acked + 1), (self.sid, state, self.acked)
        if self.lane.mode == "state":
            kept = [h["patch"] for h in history]
            assert kept[: self.acked] == self.patches, (self.sid, kept, self.patches)
            assert all(p in self.world.answered.values() for p in kept), kept  # whole patches
            assert state["state"]["notes"] == kept[-1]["notes"]
        all_rows = self.world.ledger(self.sid)
        # A call a kill cut is charged its worst case (its pending row, settled at the
        # restart: cost.pending); none is pending once the proxy is up again.
        cut = [r for r in all_rows if r[2] == "interrupted"]
        assert all(r[3] is not None and r[3] > 0 for r in cut), cut
        assert "pending" not in [r[2] for r in all_rows], all_rows
        rows = [r for r in all_rows if r[2] != "interrupted"]
        used = [r[0] for r in rows]
        assert len(used) == len(set(used)), f"two rows for one upstream call: {sorted(used)}"
        assert set(used) <= set(self.world.answered), (used, self.world.answered)
        assert self.acked_calls <= set(used), (self.sid, self.acked_calls, used)
        spent = float(state["spent_usd"])
        assert spent >= self.spent - 1e-9, (self.sid, spent, self.spent)  # never goes down
        charged = sum(r[1] if r[1] is not None else r[3] or 0 for r in all_rows)
        assert spent == pytest.approx(charged), (self.sid, spent, all_rows)
        self.spent = spent

    def retry(self, label: str, landed_expected: bool | None) -> None:
        """A cut turn sent again with its key: the kept reply if its commit landed (nothing
        sent upstream), else the turn runs once; a second retry is the same bytes again
        and sends nothing."""
        landed = self.world.proxy.state(self.sid)["step"] == self.acked + 1
        assert landed_expected in (None, landed), (label, landed)
        before = len(self.world.calls_of(label))
        again = self.send(label)
        assert again.ok and again.replayed == landed, (label, again, landed)
        if landed:
            assert len(self.world.calls_of(label)) == before  # nothing sent upstream
            assert again.step == self.acked + 1, (label, again.step)
            self.acked += 1
            call = self.world.committed_call(self)
            assert self.world.label_of[call] == label, (label, call)
            self.acked_calls.add(call)
            self.patches.append(self.world.answered[call])
        else:
            self.ack(again, label, before)
        third = self.send(label)
        assert third.ok and third.replayed and third.body == again.body, (label, third, again)
        assert len(self.world.calls_of(label)) == before + (0 if landed else 1)


@dataclass
class World:
    """The proxy process, its data dir and the fake: every call the fake answered has its
    own output token count (its name in the ledger) and patch; ``faults`` are the faults of
    the next call of a turn, by label."""

    fake: FakeProvider
    proxy: ProxyProcess
    data: Path
    turns: int = 0
    tokens: int = 100
    answered: dict[int, Any] = field(default_factory=dict)  # output tokens -> patch
    label_of: dict[int, str] = field(default_factory=dict)  # output tokens -> turn label
    session_of: dict[str, Session] = field(default_factory=dict)
    faults: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.fake.responder = self.reply

    def reply(self, rec: RecordedRequest) -> Reply:
        body = rec.body.decode()
        labels = [lb for lb in self.session_of if f"<{lb}>" in body]
        assert len(labels) == 1, labels
        self.tokens += 1
        patch = {"notes": f"call {self.tokens}"}
        self.answered[self.tokens], self.label_of[self.tokens] = patch, labels[0]
        mode = self.session_of[labels[0]].lane.mode
        text = envelope(patch) if mode == "state" else f"window answer {self.tokens}"
        faults = self.faults.pop(labels[0], {})
        return Reply(text=text, usage={"completion_tokens": self.tokens}, **faults)

    def calls_of(self, label: str) -> list[int]:
        return [t for t, lb in sorted(self.label_of.items()) if lb == label]

    def arrived(self, label: str) -> RecordedRequest:
        """The fake's record of the turn's (first) call, once it arrived."""

        def found(requests: list[RecordedRequest]) -> RecordedRequest | None:
            mine = [r for r in requests if f"<{label}>".encode() in r.body]
            return mine[0] if mine else None

        return self.fake.wait_for(found, timeout=SIGNAL_WAIT)  # type: ignore[no-any-return]

    def ledger(self, session: str) -> list[tuple[Any, ...]]:
        """(output tokens, cost, pricing, estimated cost) of the session's rows."""
        with contextlib.closing(sqlite3.connect(self.data / "skillstate.db")) as db:
            q = (
                "SELECT output_tokens, cost_usd, pricing, estimated_cost_usd FROM ledger"
                " WHERE session = ?"
            )
            return db.execute(q, (session,)).fetchall()

    def committed_call(self, s: Session) -> int:
        """The call whose answer the session's last commit kept: by its patch (state mode),
        or the newest of its ledger rows (window)."""
        if s.lane.mode == "state":
            patch = s.history()[-1]["patch"]
            return next(t for t, p in self.answered.items() if p == patch)
        return max(r[0] for r in self.ledger(s.sid) if r[0] is not None)

    def restart(self, hook: str | None) -> None:
        """The proxy again on the same data dir, with the kill hook armed for one turn."""
        env = {k: v for k, v in self.proxy.env.items() if k != KILL_HOOK}
        if hook is not None:
            env[KILL_HOOK] = hook
        self.proxy.env = env
        self.proxy.start()

    def check(self, sessions: list[Session]) -> None:
        """Every session's invariants, and ``skillstate cost --by session`` reads each one's
        spend from the store."""
        for s in sessions:
            s.check()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):  # the CLI's own entry point, in this process
            assert main(["cost", "--data-dir", str(self.data), "--by", "session", "--json"]) == 0
        groups = json.loads(out.getvalue())["groups"]
        read = {g["key"]: (g["cost_usd"] or 0) + (g["estimated_cost_usd"] or 0) for g in groups}
        assert read == pytest.approx({s.sid: s.spent for s in sessions}), read

    def died(self) -> None:
        assert self.proxy.proc is not None
        assert self.proxy.proc.wait(SIGNAL_WAIT) == -signal.SIGKILL
        self.proxy.stop()  # reaps its pipes


def cut_with_calls_out(world: World, s: Session) -> Callable[[], None]:
    """Three turns of one session at once: one with its upstream call out (held by the
    fake), one queued behind it on the session, one whose request is half sent. Returns
    what to do after the kill."""
    never = threading.Event()
    held, queued, half = s.label("held"), s.label("queued"), s.label("half")
    world.faults[held] = {"hold": never}
    held_answer = s.in_thread(held)
    world.arrived(held)  # the call is out
    queued_answer = s.in_thread(queued)
    sock = socket.create_connection(("127.0.0.1", int(world.proxy.url.rsplit(":", 1)[1])))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"{SESSION_HEADER}: {s.sid}\r\nidempotency-key: {key(half)}\r\n".encode()
        + b'content-length: 400\r\n\r\n{"model": "m", "mess'
    )

    def after() -> None:
        never.set()
        sock.close()
        assert not held_answer().ok and not queued_answer().ok
        assert world.calls_of(queued) == []  # it never reached the upstream
        s.cut += [(half, False), (queued, False), (held, False)]

    return after


def cut_mid_reply(world: World, s: Session) -> Callable[[], None]:
    """The upstream sent part of its reply and hangs: a stream's first events (the client
    holds them), a JSON body's first bytes."""
    label = s.label("stalled")
    world.faults[label] = {"stall_after": 2 if s.lane.stream else 10}
    first = threading.Event()
    answer = s.in_thread(label, first)
    rec = world.arrived(label)
    world.fake.wait_for(lambda _: rec.events_sent >= 1, timeout=SIGNAL_WAIT)
    if s.lane.stream:
        assert first.wait(SIGNAL_WAIT), "the client never got the stream's first bytes"

    def after() -> None:
        assert not answer().ok
        s.cut.append((label, False))

    return after


def cut_reply_written(world: World, sessions: list[Session]) -> Callable[[], None]:
    """Turns whose upstream wrote its whole reply: the proxy is reading, judging or
    committing it at the kill (any outcome is right: the check and the retry take both)."""
    labels = [s.label("written") for s in sessions]
    answers = [s.in_thread(lb) for s, lb in zip(sessions, labels, strict=True)]
    for lb in labels:
        rec = world.arrived(lb)
        world.fake.wait_for(lambda _, rec=rec: rec.completed, timeout=SIGNAL_WAIT)

    def after() -> None:
        for s, lb, answer in zip(sessions, labels, answers, strict=True):
            got = answer()
            if got.ok:  # the reply beat the kill: an acknowledged turn
                s.ack(got, lb, 0)
            else:
                s.cut.append((lb, None))

    return after


def kill_round(world: World, lanes: dict[Lane, dict[str, Session]], hook: Hook) -> None:
    """Cut turns in every session at once, then the proxy dies: the test kills it once every
    main session's reply is written, or the hook does in the armed turn."""
    afters = [cut_with_calls_out(world, roles["held"]) for roles in lanes.values()]
    afters += [cut_mid_reply(world, roles["stalled"]) for roles in lanes.values()]
    if hook is None:
        afters.append(cut_reply_written(world, [roles["main"] for roles in lanes.values()]))
        assert world.proxy.proc is not None
        world.proxy.proc.send_signal(signal.SIGKILL)
    else:
        point, hooked, label = hook
        got = hooked.send(label)  # the hook kills the proxy in this turn
        assert not got.ok, got
        hooked.cut.append((label, point == "after-commit"))
    world.died()
    for after in afters:
        after()


# A kill by the proxy's hook: at which point, in which session's turn (by its label).
Hook = tuple[str, Session, str] | None


def test_a_proxy_killed_at_any_point_of_a_turn_keeps_state_and_commits_each_turn_once(
    fake: FakeProvider, start_proxy_process: StartProxyProcess, tmp_path: Path
) -> None:
    proxy = start_proxy_process(fake.url + "/v1", "--schema", "notes", config={"prices": PRICES})
    world = World(fake, proxy, tmp_path / "data")
    roles = ("held", "stalled", "main")
    lanes = {lane: {r: Session(world, lane, f"{lane.name}-{r}") for r in roles} for lane in LANES}
    sessions = [s for by_role in lanes.values() for s in by_role.values()]
    for s in sessions:
        s.turn("first")
    # The test kills the first round; the hook each of the next, in one lane's main turn,
    # before the commit or after it, lane by lane.
    points = [None] + [
        (("before-commit", "after-commit")[i % 2], lane) for i, lane in enumerate(LANES)
    ]
    hook: Hook = None
    for i in range(len(points)):
        kill_round(world, lanes, hook)
        nxt = points[i + 1] if i + 1 < len(points) else None
        hook = None
        if nxt is not None:
            main_session = lanes[nxt[1]]["main"]
            hook = (nxt[0], main_session, main_session.label(nxt[0]))
        world.restart(None if hook is None else f"{hook[0]}:{key(hook[2])}")
        world.check(sessions)
        for s in sessions:
            for label, landed in s.cut:
                s.retry(label, landed)
            s.cut = []
            s.turn("after")
        world.check(sessions)
    for s in sessions:
        assert s.acked == len(s.history()), s.sid


def start_or_refuse(proxy: ProxyProcess) -> tuple[bool, str]:
    """Start ``proxy``'s process: (True, "") when it serves, else (False, its stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "skillstate", *proxy.args],
        env=proxy.env, cwd=proxy.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    if "listening" in proc.stdout.readline():
        proc.kill()
        proc.communicate()
        return True, ""
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, (proc.returncode, err)
    return False, err


def damaged_header(data: Path) -> None:
    wal = data / "skillstate.db-wal"
    raw = bytearray(wal.read_bytes())
    raw[8:12] = b"\x00\x00\x07\x00"  # the page size field, its checksum now wrong
    wal.write_bytes(bytes(raw))


def damaged_frame(data: Path) -> None:
    """A byte of the second frame's page flipped: the commits after it fail the chain."""
    wal = data / "skillstate.db-wal"
    raw = bytearray(wal.read_bytes())
    page = int.from_bytes(raw[8:12], "big")
    raw[32 + (24 + page) + 24 + 100] ^= 0xFF
    wal.write_bytes(bytes(raw))


def emptied_database(data: Path) -> None:
    (data / "skillstate.db").write_bytes(b"")


def test_a_damaged_wal_after_a_crash_is_refused_in_one_line_and_left_as_it_is(
    fake: FakeProvider, start_proxy_process: StartProxyProcess, tmp_path: Path
) -> None:
    """After a kill -9 the committed turns are in the WAL. A WAL that SQLite would read
    only in part (a damaged header, a damaged frame before later commits) or a database
    file emptied under it would drop them in silence, and the first checkpoint would
    overwrite them: ``skillstate cost`` refuses to read it and the proxy to start, each in
    one line naming the file, and the files are left as they are; the same data dir
    undamaged starts with every acknowledged turn."""
    proxy = start_proxy_process(fake.url + "/v1", "--schema", "notes", config={"prices": PRICES})
    world = World(fake, proxy, tmp_path / "data")
    sessions = [Session(world, LANES[i], f"torn-{i}") for i in range(3)]
    for s in sessions * 2:
        s.turn("acked")
    assert proxy.proc is not None
    proxy.proc.send_signal(signal.SIGKILL)
    world.died()
    data = tmp_path / "data"
    assert (data / "skillstate.db-wal").stat().st_size > 0  # the turns are in the WAL
    kept = tmp_path / "kept"
    shutil.copytree(data, kept)
    store = ("skillstate.db", "skillstate.db-wal", "skillstate.db-shm")
    for damage in (damaged_header, damaged_frame, emptied_database):
        shutil.rmtree(data)
        shutil.copytree(kept, data)
        damage(data)
        files = {f.name: f.read_bytes() for f in data.iterdir() if f.name in store}
        err = io.StringIO()
        with contextlib.redirect_stderr(err):  # a reader first: its close would checkpoint
            assert main(["cost", "--data-dir", str(data), "--json"]) == 2
        assert err.getvalue().startswith("skillstate: store: ") and "-wal" in err.getvalue()
        assert len(err.getvalue().strip().splitlines()) == 1, err.getvalue()
        started, refusal = start_or_refuse(proxy)
        assert not started, f"the proxy started on a WAL with a {damage.__name__}"
        lines = refusal.strip().splitlines()
        assert "Traceback" not in refusal and len(lines) == 1, refusal
        assert lines[0].startswith("skillstate: data_dir: ") and "skillstate.db-wal" in lines[0]
        assert "committed" in lines[0] or "every frame" in lines[0], lines[0]
        for name, before in files.items():
            assert (data / name).read_bytes() == before, name  # nothing opened, nothing lost
    shutil.rmtree(data)
    shutil.copytree(kept, data)
    proxy.start()
    for s in sessions:
        assert proxy.state(s.sid)["step"] == s.acked == 2
    world.check(sessions)
