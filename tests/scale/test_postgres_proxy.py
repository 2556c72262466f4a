"""A real proxy process on a PostgreSQL store, driven by the openai SDK against the fake
provider: turns committed and read back through /state, client keys verified by two
replicas alike, and PostgreSQL going down and coming back (503 in the dialect, nothing
half-written, turns work again after)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.conftest import ProxyProcess, StartProxyProcess, proxy_env
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER, envelope

from .services import PostgresServer

SCHEMA = ("--schema", "facts,notes,step")
# A guard against a hang, not a performance threshold.
HANG = 60.0


def client(proxy: ProxyProcess, key: str = "k") -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.v1, api_key=key, max_retries=0, timeout=HANG)


def turn(c: openai.OpenAI, session: str, text: str) -> Any:
    return c.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": text}],
        extra_headers={SESSION_HEADER: session},
    )


def history(proxy: ProxyProcess, session: str) -> list[dict[str, Any]]:
    r = proxy.get("/state", params={"session": session, "history": "1"})
    assert r.status_code == 200, r.text
    return list(r.json()["history"])


def test_turns_commit_to_postgresql_and_read_back(
    fake: FakeProvider, start_proxy_process: StartProxyProcess, pg_url: str
) -> None:
    proxy = start_proxy_process(fake.url + "/v1", *SCHEMA, config={"store": pg_url})
    c = client(proxy)
    for i in range(1, 6):
        fake.enqueue(Reply(text=envelope({"step": i, "facts": {f"f{i}": i}}, f"turn {i}")))
        turn(c, "pg-e2e", f"go {i}")
    doc = proxy.state("pg-e2e")
    assert doc["step"] == 5
    assert doc["state"]["step"] == 5 and doc["state"]["facts"] == {f"f{i}": i for i in range(1, 6)}
    assert [h["step"] for h in history(proxy, "pg-e2e")] == [1, 2, 3, 4, 5]
    # What /state showed is what PostgreSQL holds: a second replica reads the same.
    other = start_proxy_process(fake.url + "/v1", *SCHEMA, config={"store": pg_url})
    assert other.state("pg-e2e") == doc
    fake.enqueue(Reply(text=envelope({"notes": "from the other replica"})))
    turn(client(other), "pg-e2e", "go 6")
    assert proxy.state("pg-e2e")["step"] == 6  # no stale cache on the first one
    cost = proxy.get("/cost").json()
    assert cost["totals"]["attempts"]["generation"] == 6


def cli_key(pg_url: str, tmp_path: Path, name: str, *flags: str) -> tuple[str, Path]:
    """``skillstate keys create --name NAME`` against the PostgreSQL store, from a data dir
    no replica uses: the new key, and the config file that names the store."""
    cfg = tmp_path / "keys.json"
    cfg.write_text(json.dumps({"store": pg_url}))
    made = subprocess.run(
        [sys.executable, "-m", "skillstate", "keys", "--config", str(cfg),
         "--data-dir", str(tmp_path / "cli-data"), "create", "--name", name, *flags],
        capture_output=True, text=True, timeout=HANG, env=proxy_env(),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    return next(w for w in made.stdout.split() if w.startswith("sk-ss-")), cfg


def test_a_key_made_by_the_cli_works_on_every_replica(
    fake: FakeProvider, start_proxy_process: StartProxyProcess, pg_url: str, tmp_path: Path
) -> None:
    key, cfg = cli_key(pg_url, tmp_path, "alice")
    # Replicas whose data dir is not the CLI's: the secret is the store's.
    a = start_proxy_process(fake.url + "/v1", *SCHEMA, config={"store": pg_url})
    fake.enqueue(Reply(text=envelope({"step": 1})))
    turn(client(a, key), "s1", "hi")
    b = start_proxy_process(fake.url + "/v1", *SCHEMA, config={"store": pg_url})
    fake.enqueue(Reply(text=envelope({"step": 2})))
    turn(client(b, key), "s1", "hi again")
    with pytest.raises(openai.AuthenticationError):
        turn(client(b, "sk-ss-not-a-key"), "s1", "no")
    listed = subprocess.run(
        [sys.executable, "-m", "skillstate", "keys", "--config", str(cfg), "list", "--json"],
        capture_output=True, text=True, timeout=HANG, env=proxy_env(),
    )  # fmt: skip
    assert listed.returncode == 0 and "alice" in listed.stdout, listed.stderr


def test_postgresql_down_is_503_and_nothing_half_written(
    fake: FakeProvider,
    start_proxy_process: StartProxyProcess,
    pg_url: str,
    postgres_server: PostgresServer,
) -> None:
    proxy = start_proxy_process(fake.url + "/v1", *SCHEMA, config={"store": pg_url})
    c = client(proxy)
    for i in (1, 2):
        fake.enqueue(Reply(text=envelope({"step": i})))
        turn(c, "down", f"go {i}")
    before = proxy.state("down")
    assert before["step"] == 2

    # PostgreSQL dies while a turn is upstream: its commit fails, nothing is written.
    release = threading.Event()
    fake.enqueue(Reply(text=envelope({"step": 3, "notes": "lost"}), hold=release))
    failures: list[BaseException] = []

    def held_turn() -> None:
        try:
            turn(c, "down", "go 3")
        except BaseException as e:
            failures.append(e)

    sent = len(fake.requests)
    worker = threading.Thread(target=held_turn)
    worker.start()
    fake.wait_for(lambda reqs: len(reqs) > sent, timeout=HANG)
    postgres_server.stop()
    try:
        release.set()
        worker.join(HANG)
        assert not worker.is_alive()
        (err,) = failures
        assert isinstance(err, openai.APIStatusError) and err.status_code == 503
        assert err.body["code"] == "store_unavailable"  # type: ignore[index]
        assert "could not commit the turn" in err.body["message"]  # type: ignore[index]

        # While it is down: the next turn is refused before it is sent upstream.
        sent = len(fake.requests)
        with pytest.raises(openai.APIStatusError) as refused:
            turn(c, "down", "go 3 again")
        assert refused.value.status_code == 503
        assert refused.value.response.headers.get("retry-after")
        assert len(fake.requests) == sent
        health = proxy.get("/health")
        assert health.status_code == 503 and health.json()["store"].startswith("error:")
    finally:
        postgres_server.start()

    # Back: the session is exactly where the last acknowledged commit left it. Its spend may
    # count the failed turn's call, which the upstream answered (and bills): its ledger row
    # is written off the turn's path, best effort, and lands if the store is back by then.
    after = proxy.state("down")
    assert after["spent_usd"] >= before["spent_usd"]
    assert {**after, "spent_usd": None} == {**before, "spent_usd": None}
    assert [h["step"] for h in history(proxy, "down")] == [1, 2]
    fake.enqueue(Reply(text=envelope({"step": 3})))
    turn(c, "down", "go 3 after")
    assert proxy.state("down")["step"] == 3
    assert [h["step"] for h in history(proxy, "down")] == [1, 2, 3]
    logged = proxy.stop()
    assert "Traceback" not in logged, logged  # the outage was expected, not a crash


def test_an_unreachable_store_at_start_is_one_line(tmp_path: Path, fake: FakeProvider) -> None:
    url = "postgresql://skillstate:hunter2@127.0.0.1:1/nothing"
    cfg = tmp_path / "skillstate.json"
    cfg.write_text(json.dumps({"store": url}))
    r = subprocess.run(
        [sys.executable, "-m", "skillstate", "--config", str(cfg), "--port", "0",
         "--upstream", fake.url, "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=HANG, env=proxy_env(SKILLSTATE_API_KEY="k"),
    )  # fmt: skip
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "store:" in r.stderr and "unreachable" in r.stderr
    assert "hunter2" not in r.stderr and ":***@127.0.0.1:1" in r.stderr


def test_health_names_the_store_without_its_password(
    fake: FakeProvider, start_proxy_process: StartProxyProcess, pg_url: str
) -> None:
    with_password = pg_url.replace("skillstate@", "skillstate:s3cret-pw@")
    proxy = start_proxy_process(fake.url + "/v1", *SCHEMA, config={"store": with_password})
    assert "s3cret-pw" not in proxy.get("/health").text
    # (The tier's server trusts loopback: any password is accepted.)
    assert "s3cret-pw" not in proxy.stop()


def _server_processes(server: PostgresServer) -> list[int]:
    """The postmaster and its children (the backends serving the proxy's connections)."""
    assert server.proc is not None
    root = server.proc.pid
    found = [root]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == root:
                found.append(int(entry.name))
    return found


def test_a_hung_postgresql_is_503_not_a_hang(
    fake: FakeProvider,
    start_proxy_process: StartProxyProcess,
    pg_url: str,
    postgres_server: PostgresServer,
) -> None:
    """The server stops answering (every process of it paused, as in a stalled VM):
    store_timeout bounds the turn, which gets a 503 in its dialect; resumed, turns go on."""
    config = {"store": pg_url, "store_timeout": 1.0}
    proxy = start_proxy_process(fake.url + "/v1", *SCHEMA, config=config)
    c = client(proxy)
    fake.enqueue(Reply(text=envelope({"step": 1})))
    turn(c, "hung", "go 1")
    paused = _server_processes(postgres_server)
    for pid in paused:
        os.kill(pid, signal.SIGSTOP)
    try:
        sent = len(fake.requests)
        with pytest.raises(openai.APIStatusError) as refused:
            turn(c, "hung", "go 2")  # the client's own timeout (HANG) is only a guard
        assert refused.value.status_code == 503
        assert refused.value.body["code"] == "store_unavailable"  # type: ignore[index]
        assert len(fake.requests) == sent
    finally:
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
    fake.enqueue(Reply(text=envelope({"step": 2})))
    turn(c, "hung", "go 2 again")
    assert [h["step"] for h in history(proxy, "hung")] == [1, 2]


def test_admin_keys_over_http_on_one_replica_hold_on_another(
    fake: FakeProvider, start_proxy_process: StartProxyProcess, pg_url: str, tmp_path: Path
) -> None:
    root, _ = cli_key(pg_url, tmp_path, "root", "--admin")
    config = {"store": pg_url, "auth_cache_ttl": 0}
    a = start_proxy_process(fake.url + "/v1", *SCHEMA, config=config)
    b = start_proxy_process(fake.url + "/v1", *SCHEMA, config=config)
    admin = {"authorization": f"Bearer {root}"}
    r = a.http.post(a.url + "/admin/keys", json={"name": "ci"}, headers=admin)
    assert r.status_code == 201, r.text
    ci = r.json()["key"]
    fake.enqueue(Reply(text=envelope({"step": 1})))
    turn(client(b, ci), "s1", "hi")  # made on one replica, verified on the other
    listed = b.get("/admin/keys", headers=admin).json()["data"]
    assert [k["name"] for k in listed] == ["ci", "root"]
    rotated = b.http.post(b.url + "/admin/keys/ci/rotate", headers=admin).json()["key"]
    with pytest.raises(openai.AuthenticationError):
        turn(client(a, ci), "s1", "old secret")
    assert a.get("/admin/keys", headers={"authorization": f"Bearer {rotated}"}).status_code == 403
    assert a.http.delete(a.url + "/admin/keys/ci", headers=admin).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        turn(client(b, rotated), "s1", "revoked")
