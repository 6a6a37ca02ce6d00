"""The collectors' own thread: order, errors, and a hung call that must not hold up exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from moptd.worker import Worker


def test_calls_run_in_order_on_one_thread() -> None:
    w = Worker("test-worker")
    seen: list[tuple[int, str]] = []

    def note(i: int) -> int:
        seen.append((i, threading.current_thread().name))
        return i * 2

    futures = [w.submit(note, i) for i in range(5)]
    assert [f.result(timeout=5) for f in futures] == [0, 2, 4, 6, 8]
    assert [i for i, _ in seen] == [0, 1, 2, 3, 4]
    assert {name for _, name in seen} == {"test-worker"}
    w.shutdown()


def test_an_error_reaches_the_future_and_the_thread_goes_on() -> None:
    w = Worker("test-worker")

    def fail() -> None:
        raise OSError("stale file handle")

    with pytest.raises(OSError, match="stale file handle"):
        w.submit(fail).result(timeout=5)
    assert w.submit(lambda: "still here").result(timeout=5) == "still here"
    w.shutdown()


def test_post_runs_without_a_future() -> None:
    w = Worker("test-worker")
    done = threading.Event()
    w.post(done.set)
    assert done.wait(5)
    w.shutdown()


def test_a_cancelled_call_is_skipped() -> None:
    w = Worker("test-worker")
    gate = threading.Event()
    first = w.submit(gate.wait, 5)
    second = w.submit(lambda: "ran")
    assert second.cancel()  # still queued behind the first
    gate.set()
    assert first.result(timeout=5) is True
    assert w.submit(lambda: "after").result(timeout=5) == "after"
    w.shutdown()


def test_a_hung_call_does_not_keep_the_process_from_exiting() -> None:
    # A ThreadPoolExecutor joins its threads at exit: a statvfs hung on a dead NFS mount,
    # or an NVML call on a GPU in recovery, would keep the daemon from ever exiting.
    code = textwrap.dedent(
        """
        import threading
        from moptd.worker import Worker
        w = Worker("hung")
        w.submit(threading.Event().wait)  # never returns
        print("exiting", flush=True)
        """
    )
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "exiting"
    assert time.monotonic() - t0 < 20


def test_a_failing_posted_call_is_logged_and_the_thread_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = Worker("test-worker")

    def fail() -> None:
        raise RuntimeError("boom")

    w.post(fail)
    assert w.submit(lambda: "still here").result(timeout=5) == "still here"
    assert "a posted call failed" in caplog.text
    w.shutdown()
