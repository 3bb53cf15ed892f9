"""Host buffers kept for merged batches, and on a GPU page-locked so the device reads them directly.

A copy to the GPU from ordinary (pageable) host memory is made by the CPU through a staging buffer
of the driver's, a piece at a time; from page-locked (pinned) memory the GPU's copy engine reads
it directly. On the H200 the copy of a 19 MB batch was a third of a 6.3 ms call (docs/gpu.md).
The server writes every merged batch anyway (``server.batching.merged``): written into buffers
that are kept, and locked once, the copy costs the server nothing more.

Pages are locked with ``cudaHostRegister`` from NVIDIA's ``cuda-bindings`` (the ``gpu`` extra).
Each batch thread has its own buffers (one batch at a time uses them), one per input and shape,
the least recently used given back beyond a few, so a model whose shapes vary (a sequence length)
does not keep every size locked.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import Generic, TypeVar

import numpy as np

from unideploy.runtimes import cuda_api
from unideploy.runtimes.cuda_work import CUDA_WORK

log = logging.getLogger("unideploy.runtime")
KEPT = 16  # buffers kept per batch thread: a few inputs at each of the default six buckets
Buffer = TypeVar("Buffer")


class KeptBuffers(ABC, Generic[Buffer]):
    """Reused buffers, one per (input, shape, dtype), at most ``KEPT``: host arrays here, GPU memory
    in ``runtimes.device_batches``."""

    def __init__(self) -> None:
        self._arrays: OrderedDict[tuple[str, tuple[int, ...], str], Buffer] = OrderedDict()

    def array(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> Buffer:
        """The buffer for ``name`` at ``shape``: the same array each time, to be filled whole.
        Only the thread that runs the batch asks, and only once the previous one has run."""
        key = (name, tuple(shape), np.dtype(dtype).str)
        found = self._arrays.get(key)
        if found is not None:
            self._arrays.move_to_end(key)
            return found
        if len(self._arrays) >= KEPT:
            self._release(self._arrays.popitem(last=False)[1])
        found = self._arrays[key] = self._allocate(shape, np.dtype(dtype))
        return found

    @abstractmethod
    def _allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> Buffer:
        """A new buffer of ``shape`` and ``dtype``."""

    def _release(self, array: Buffer) -> None:
        """Give one buffer back (nothing to do for plain memory)."""

    def close(self) -> None:
        """Give every buffer back; called on the batch thread once its last batch has run."""
        while self._arrays:
            self._release(self._arrays.popitem()[1])


class BatchBuffers(KeptBuffers[np.ndarray]):
    """Reused host arrays."""

    def _allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.empty(shape, dtype)


def lock_pages(address: int, nbytes: int) -> str | None:
    """Page-lock ``nbytes`` of host memory at ``address`` for the GPU's copy engine
    (``cudaHostRegister``): None where it did, else CUDA's reason (page-locked memory is limited;
    no usable GPU)."""
    try:
        cudart = cuda_api.runtime()
    except ImportError as exc:
        return f"cuda-bindings is not installed ({exc})"
    with CUDA_WORK.shared():
        error = cudart.cudaHostRegister(address, nbytes, cudart.cudaHostRegisterDefault)[0]
    return None if cuda_api.succeeded(error) else cuda_api.describe(error)


def unlock_pages(address: int) -> None:
    """Undo ``lock_pages`` at ``address``."""
    with CUDA_WORK.shared():
        cuda_api.runtime().cudaHostUnregister(address)


class PinnedBuffers(BatchBuffers):
    """``BatchBuffers`` whose numeric arrays are page-locked for the GPU (``cudaHostRegister``). A
    buffer the driver will not lock (page-locked memory is limited) stays pageable, with a warning:
    the batch is slower to copy, never refused."""

    def __init__(self) -> None:
        super().__init__()
        self._locked: set[int] = set()  # addresses of the buffers this holds locked

    def _allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        array = np.empty(shape, dtype)
        if array.nbytes and dtype.kind in "biufc":  # text stays where ONNX Runtime reads it, on the host
            why_not = lock_pages(array.ctypes.data, array.nbytes)
            if why_not is None:
                self._locked.add(array.ctypes.data)
            else:
                log.warning("a %s batch buffer stays pageable: %s", "x".join(map(str, shape)), why_not)
        return array

    def _release(self, array: np.ndarray) -> None:
        if array.ctypes.data in self._locked:
            self._locked.discard(array.ctypes.data)
            unlock_pages(array.ctypes.data)
