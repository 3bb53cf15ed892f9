"""CUDA work against a graph's capture (runtimes/cuda_work.py): real threads, sequenced by events
and by the lock's own state, never by sleeping."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from unideploy.runtimes.cuda_work import CudaWork

WAIT = 30  # seconds: only a broken lock ever waits this long


def _until(condition) -> None:
    """Until ``condition()`` holds (another thread has reached a wait), bounded."""
    done = threading.Event()
    for _ in range(300_000):
        if condition():
            return
        done.wait(0.0001)
    raise AssertionError("the other thread never got there")


def test_shared_holders_run_together():
    work, both = CudaWork(), threading.Barrier(2, timeout=WAIT)

    def hold() -> None:
        with work.shared():
            both.wait()  # broken (BrokenBarrierError) unless both hold the shared side at once

    with ThreadPoolExecutor(2) as threads:
        list(threads.map(lambda _: hold(), range(2)))


def test_a_capture_waits_for_the_work_under_way_and_holds_new_work_off():
    work, order = CudaWork(), []
    holding, release = threading.Event(), threading.Event()

    def running_call() -> None:
        with work.shared():
            order.append("call in")
            holding.set()
            assert release.wait(WAIT)
            order.append("call out")

    def capture() -> None:
        with work.exclusive():
            order.append("capture")

    def next_call() -> None:
        with work.shared():
            order.append("next call")

    with ThreadPoolExecutor(3) as threads:
        first = threads.submit(running_call)
        assert holding.wait(WAIT)
        captured = threads.submit(capture)
        _until(lambda: work._waiting == 1)  # the capture waits for the call under way
        later = threads.submit(next_call)
        _until(lambda: len(work._changed._waiters) == 2)  # and the next call waits behind it
        release.set()
        for future in (first, captured, later):
            future.result(WAIT)
    assert order == ["call in", "call out", "capture", "next call"]


def test_the_capturing_thread_may_take_either_side_again_and_a_worker_may_not_capture():
    work = CudaWork()
    with work.exclusive(), work.shared(), work.exclusive():
        pass  # a capture makes its calls (shared) within its exclusive hold, and nests
    nested_work = pytest.raises(RuntimeError, match="capture asked for by a thread in the middle of other CUDA work")
    with work.shared(), work.shared(), nested_work, work.exclusive():  # nested work never waits on itself
        pass

    def capture() -> bool:
        with work.exclusive():
            return True

    with ThreadPoolExecutor(1) as other:  # and the lock is free again for others
        assert other.submit(capture).result(WAIT)
