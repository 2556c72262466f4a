"""The SQLite store's thread (``skillstate.store.sqlite.thread.StoreThread``): calls run one at a
time in the order they were handed over, results and errors reach ``submit``'s futures and
``run_in_executor``, nothing is accepted after shutdown, and the thread ends."""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import pytest

from skillstate.store.sqlite.thread import StoreThread


def test_calls_run_in_order_on_one_thread_and_submit_returns_results() -> None:
    ex = StoreThread("t-order")
    seen: list[tuple[int, str]] = []
    for i in range(200):
        if i % 3:
            ex.post(lambda i=i: seen.append((i, threading.current_thread().name)))
        else:
            ex.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
    assert ex.submit(lambda: 41 + 1).result(timeout=5) == 42
    assert [i for i, _ in seen] == list(range(200))
    assert {name for _, name in seen} == {"t-order"}
    ex.shutdown()


def test_submit_carries_the_exception_and_post_logs_it_without_stopping(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ex = StoreThread("t-errors")

    def boom() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        ex.submit(boom).result(timeout=5)
    ex.post(boom)
    assert ex.submit(lambda: "still running").result(timeout=5) == "still running"
    assert "store thread: a call failed" in caplog.text
    ex.shutdown()


def test_shutdown_runs_what_was_handed_over_then_refuses() -> None:
    ex = StoreThread("t-shutdown")
    done: list[int] = []
    ex.post(time.sleep, 0.05)
    ex.post(done.append, 1)
    ex.shutdown(wait=True)
    assert done == [1]
    with pytest.raises(RuntimeError):
        ex.post(done.append, 2)
    with pytest.raises(RuntimeError):
        ex.submit(done.append, 3)
    assert done == [1]


def test_a_store_thread_nobody_holds_ends_its_thread() -> None:
    ex = StoreThread("t-dropped")
    assert ex.submit(lambda: 1).result(timeout=5) == 1
    thread = ex._thread
    assert thread is not None and thread.is_alive()
    del ex
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_run_in_executor_goes_through_submit() -> None:
    ex = StoreThread("t-loop")

    async def main() -> str:
        return await asyncio.get_running_loop().run_in_executor(
            ex, lambda: threading.current_thread().name
        )

    assert asyncio.run(main()) == "t-loop"
    ex.shutdown()
