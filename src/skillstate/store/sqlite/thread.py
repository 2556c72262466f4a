"""The one thread a SQLite store's connection is used on, with a cheap hand-off.

Every turn hands its commit to the store thread, and a ``ThreadPoolExecutor.submit`` costs
the event loop about 4 µs of its own CPU (a lock, a semaphore probe, a ``Future`` with its
condition variable), the biggest single item of a state turn in a profile. ``StoreThread``
is an ``Executor`` over one thread and a ``queue.SimpleQueue``: ``post`` hands over a call
whose outcome the caller learns another way (the group commit answers its waiters itself)
for the price of one queue put, and ``submit`` (for ``loop.run_in_executor``) adds only the
``Future``. Calls run one at a time, in the order they were handed over, like a
one-worker ``ThreadPoolExecutor``.

``idle`` says whether every call handed over has finished: the store commits a lone turn
on the event loop's thread only then (``SQLiteStore.commit_at_once``), never while the
thread may be using the connection.

Lifetime, as with ``ThreadPoolExecutor``: the thread starts with the first call; it ends
after ``shutdown``, or once the executor is garbage collected; at interpreter exit the calls
already handed over still run before it ends.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

__all__ = ["StoreThread"]

log = logging.getLogger("skillstate")
T = TypeVar("T")

_Call = tuple[Callable[..., Any], tuple[Any, ...]]
_LIVE: weakref.WeakSet[StoreThread] = weakref.WeakSet()


class StoreThread(Executor):
    """A one-thread executor with a fire-and-forget ``post`` (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._lock = threading.Lock()  # start and shutdown, from any thread
        # Calls handed over, and calls finished: each written by one side only (the
        # caller, under the lock; the thread), so that reading both needs no lock.
        self._posted = 0
        self._finished = [0]

    @property
    def idle(self) -> bool:
        """Whether every call handed over so far has finished (the thread waits for work)."""
        return self._finished[0] == self._posted

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the thread after everything handed over before; nothing
        is returned (an exception it raises is logged). RuntimeError after shutdown."""
        if self._thread is None:
            self._start()
        with self._lock:  # (a C lock: cheap) no call lands behind shutdown's end marker
            if self._closed:
                raise RuntimeError("cannot schedule new calls after shutdown")
            self._posted += 1
            self._calls.put((fn, args))

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()

        def call() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:
                future.set_exception(e)
            else:
                future.set_result(result)

        self.post(call)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new calls; the thread ends after those already handed over (which still run:
        ``cancel_futures`` is not supported)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._calls.put(None)
            thread = self._thread
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None or self._closed:
                return
            calls = self._calls
            # The thread holds the executor only weakly: an executor nobody holds any more
            # (a store never closed) ends its thread, as ThreadPoolExecutor's does.
            owner = weakref.ref(self, lambda _: calls.put(None))
            self._thread = threading.Thread(
                target=_work, args=(calls, owner, self._finished), name=self._name, daemon=True
            )
            self._thread.start()
            _LIVE.add(self)


def _work(
    calls: queue.SimpleQueue[_Call | None], owner: weakref.ref[StoreThread], finished: list[int]
) -> None:
    # ``owner`` is not read: it is the weak reference whose callback ends this loop, kept
    # alive (so that the callback runs) by the thread's own arguments.
    while (item := calls.get()) is not None:
        fn, args = item
        try:
            fn(*args)
        except BaseException:
            log.exception("store thread: a call failed")
        del item, fn, args  # drop the finished call's references before waiting again
        finished[0] += 1  # only this thread writes it (see StoreThread.idle)


@atexit.register
def _finish_at_exit() -> None:
    # A daemon thread would be stopped mid-call at exit: the calls handed over run first.
    for executor in list(_LIVE):
        executor.shutdown(wait=True)
