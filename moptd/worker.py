"""A collector's own thread.

Why not a ThreadPoolExecutor: a call that never returns (NVML on a GPU in recovery, a
statvfs on a dead NFS mount) must not keep the daemon from exiting, and the pool joins
its threads at exit; this thread is a daemon thread.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


class Worker:
    """One daemon thread running handed-over calls one at a time, in order."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[
            tuple[concurrent.futures.Future[Any] | None, Callable[[], Any]] | None
        ] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.put((fut, functools.partial(fn, *args)))
        return fut

    def post(self, fn: Callable[..., object], *args: Any) -> None:
        """Run fn(*args) on the thread with no future to report through: fn hands its
        results over itself (an exception is only logged)."""
        self._queue.put((None, functools.partial(fn, *args)))

    def shutdown(self) -> None:
        """Let the thread end after the calls handed over so far; never waits for it (a
        call may be hung)."""
        self._queue.put(None)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            fut, call = item
            if fut is None:
                try:
                    call()
                except Exception:  # nobody to hand it to; the thread must go on
                    log.exception("%s: a posted call failed", self._thread.name)
                continue
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(call())
            except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits the future
                fut.set_exception(exc)
