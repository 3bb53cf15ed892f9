"""CUDA work in this process against a CUDA graph being captured: shared among themselves, exclusive
of a capture.

ONNX Runtime's CUDA provider captures a graph in CUDA's global capture mode (cuda_graph.cc), where
a CUDA call any other thread of the process makes meanwhile (an allocation, a copy, a stream
synchronized) fails with error 900 and breaks the capture. A server capturing a model's graphs as
it loads while another model serves on the GPU (a hot reload, or two models loading together)
would fail calls of both. So every place here that calls CUDA holds ``CUDA_WORK.shared()`` (the
runtime's sessions on a GPU, page-locked buffers, CUDA shared-memory regions), and a capture holds
``CUDA_WORK.exclusive()``: it waits for the calls under way, and new ones wait for it (a few
milliseconds a bucket, at load). The thread holding the exclusive side may take either side again.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class CudaWork:
    """Many holders of the shared side at once, or one of the exclusive side; a capture waiting
    keeps new shared holders out, so that steady traffic cannot postpone a load indefinitely."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._shared = 0  # holders of the shared side
        self._owner: int | None = None  # the thread holding the exclusive side
        self._depth = 0  # how many times the owner took it
        self._waiting = 0  # threads waiting for the exclusive side
        self._mine = threading.local()  # this thread's holds of the shared side

    @contextmanager
    def shared(self) -> Iterator[None]:
        me = threading.get_ident()
        held = getattr(self._mine, "held", 0)
        if self._owner == me or held:  # within its own capture, or already holding: never waits on itself
            self._mine.held = held + 1
            try:
                yield
            finally:
                self._mine.held = held
            return
        with self._changed:
            self._changed.wait_for(lambda: self._owner is None and not self._waiting)
            self._shared += 1
        self._mine.held = 1
        try:
            yield
        finally:
            self._mine.held = 0
            with self._changed:
                self._shared -= 1
                self._changed.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        me = threading.get_ident()
        if getattr(self._mine, "held", 0) and self._owner != me:
            raise RuntimeError("a CUDA graph capture asked for by a thread in the middle of other CUDA work")
        with self._changed:
            if self._owner != me:
                self._waiting += 1
                self._changed.wait_for(lambda: self._owner is None and not self._shared)
                self._waiting -= 1
                self._owner = me
            self._depth += 1
        try:
            yield
        finally:
            with self._changed:
                self._depth -= 1
                if not self._depth:
                    self._owner = None
                self._changed.notify_all()


CUDA_WORK = CudaWork()
