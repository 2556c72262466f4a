"""The floor forwarders of `bench overhead --floor`: both servers relay a call as sent.

The floor is what the proxy's cost is divided by, so it must do a forwarder's whole job
(method, path, query, headers and body up; status, headers and body down) on either server,
or a ratio to it would flatter or wrong the proxy.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.fakeprovider import FakeProvider, Reply


def _wait_listening(url: str, proc: subprocess.Popen[str]) -> None:
    """The line comes before the server accepts: wait (the forwarder must not have died)."""
    port = int(url.rsplit(":", 1)[1])
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, "the floor forwarder exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.fixture(params=["aiohttp", "uvicorn"])
def floor(request: pytest.FixtureRequest) -> Iterator[tuple[FakeProvider, str]]:
    fake = FakeProvider().start()
    cmd = [sys.executable, "-m", "skillstate.bench.overhead.floor", "--upstream", fake.url]
    proc = subprocess.Popen([*cmd, "--server", request.param], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("floor listening on http://127.0.0.1:"), line
        url = line.split()[-1]
        _wait_listening(url, proc)
        yield fake, url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        fake.stop()


def test_a_call_goes_up_and_its_answer_comes_back_as_sent(
    floor: tuple[FakeProvider, str],
) -> None:
    fake, url = floor
    fake.enqueue(Reply(text="from upstream"))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi ✓"}]}
    with httpx.Client(timeout=30) as c:
        r = c.post(
            url + "/v1/chat/completions?trace=1&x=2",
            json=body,
            headers={"authorization": "Bearer sk-floor", "x-custom": "kept"},
        )
    seen = fake.requests[-1]
    assert (seen.method, seen.path, seen.query) == ("POST", "/v1/chat/completions", "trace=1&x=2")
    assert seen.json == body
    assert seen.headers["authorization"] == "Bearer sk-floor"
    assert seen.headers["x-custom"] == "kept"
    assert r.status_code == 200
    assert r.content == seen.response_body
    assert r.json()["choices"][0]["message"]["content"] == "from upstream"
    assert r.headers["content-type"].startswith("application/json")


def test_an_upstream_error_comes_back_with_its_status_and_body(
    floor: tuple[FakeProvider, str],
) -> None:
    fake, url = floor
    fake.enqueue(Reply(status=429, retry_after=7))
    with httpx.Client(timeout=30) as c:
        r = c.post(
            url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": "Bearer sk-floor"},
        )
    assert r.status_code == 429
    assert r.headers["retry-after"] == "7"
    assert r.content == fake.requests[-1].response_body
    assert r.json()["error"]
