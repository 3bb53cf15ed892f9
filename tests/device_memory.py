"""Host memory standing in for a GPU's, for what of a batch merged in GPU memory is not CUDA's:
where each request's rows go, the padding and the rows of a request that could not be read, and a
runtime reading such a batch in place. These machines have no GPU; on one, the same path runs with
CUDA's copies and a client's real device memory (tests/server/test_cuda_shared_memory.py,
tests/runtimes/test_device_batches.py)."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from unideploy.runtimes.device_batches import DeviceBatches, DeviceBuffers
from unideploy.server.errors import BadRequest
from unideploy.server.unread import Unread


class HostDeviceBuffers(DeviceBuffers):
    """``DeviceBuffers`` whose buffers are ONNX Runtime's host memory and whose copies are
    ``memmove``s; it counts the copies and the waits, and names the threads that copied."""

    ORT_DEVICE = "cpu"

    def __init__(self, batches: DeviceBatches | None = None) -> None:
        super().__init__(batches or DeviceBatches())
        self.copied: list[int] = []  # each copy's bytes
        self.waits = 0
        self.threads: set[str] = set()

    def copy(self, destination: int, source: int, nbytes: int) -> None:
        ctypes.memmove(destination, source, nbytes)
        self.copied.append(nbytes)
        self.threads.add(threading.current_thread().name)

    def synchronize(self) -> None:
        self.waits += 1


class InDeviceMemory(Unread):
    """An input in memory the GPU copies from (a CUDA region, a page-locked segment), in host memory
    here; ``gone``: its region was unregistered before the batch read it."""

    def __init__(self, value: np.ndarray, gone: bool = False) -> None:
        super().__init__(value.shape, value.dtype)
        self.value, self.gone = np.ascontiguousarray(value), gone

    def _into(self, out: memoryview) -> None:
        out[:] = self.value.tobytes()

    def reaches_gpu(self, device: int) -> bool:
        return device == 0

    @contextmanager
    def on_gpu(self, device: int) -> Iterator[int]:
        if self.gone:
            raise BadRequest("input 'x' names shared memory region 'r', which is not registered")
        yield self.value.ctypes.data
