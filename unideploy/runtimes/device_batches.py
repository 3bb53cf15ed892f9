"""Merged batches assembled in GPU memory by the GPU's own copies, from shared memory it can read.

A request whose input lies in a client's shared memory names a region instead of sending bytes.
Read on the host (into the merged batch's page-locked rows, then copied to the device by ONNX
Runtime), each such input cost the model process a read: on the H200's host a merged batch's
600 KB rows took 0.17 ms each at concurrency 32, a third of the call, mostly the reads' Python
waiting for the GIL, and a batch of 32's copy to the device about 1.3 ms of its 5.4 (docs/gpu.md);
an input in CUDA shared memory crossed the host twice. Here an input that the GPU can copy where
every request of a batch holds it is merged in GPU memory instead: one ``cudaMemcpyAsync`` per
request, on the batch thread's own stream, into a buffer of ONNX Runtime's on that GPU, which the
session reads in place (``DeviceArray``). The GPU copies from a CUDA region device to device (the
tensor never crosses the host, as issue 44 asks) and from a system segment the server has mapped
and page-locked (``server.shared_memory.SystemRegion.reaches_gpu``) by its copy engine, so the
model process's CPU copies nothing either way.

The buffers are ONNX Runtime's own allocations (``OrtValue`` on ``cuda``), kept per batch thread as
the host ones are (``pinned.KeptBuffers``); the copies go through NVIDIA's ``cuda-bindings`` (the
``gpu`` extra). Where a CUDA call here fails, that batch and every later one of the version are
merged on the host as before, and the version's account says why (``DeviceBatches``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from unideploy.runtimes import cuda_api
from unideploy.runtimes.cuda_work import CUDA_WORK
from unideploy.runtimes.pinned import KeptBuffers


class DeviceBatchFailure(RuntimeError):
    """A batch could not be assembled in GPU memory (a CUDA call failed): it is merged on the host."""


@dataclass(frozen=True)
class DeviceArray:
    """A tensor in GPU memory that ONNX Runtime reads in place: a merged batch's input. ``value`` is
    the ``OrtValue`` holding it; ``copies`` the buffers (and stream) it belongs to."""

    value: Any
    shape: tuple[int, ...]
    dtype: np.dtype
    copies: DeviceBuffers

    @property
    def pointer(self) -> int:
        return int(self.value.data_ptr())

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    @property
    def row_nbytes(self) -> int:
        """The bytes of one row along axis 0, where a merged batch's rows lie in GPU memory."""
        return self.nbytes // self.shape[0]

    def copy_to(self, pointer: int) -> None:
        """Its bytes into other GPU memory at ``pointer`` (a CUDA graph's bound input), done on return."""
        self.copies.copy(pointer, self.pointer, self.nbytes)
        self.copies.synchronize()


class DeviceBatches:
    """Whether one version's batch threads have the GPU copy shared-memory inputs into batches in its
    memory (``device``: the GPU its sessions run on): on until a CUDA call here fails, then off for
    every batch thread, the reason told to ``on_failure`` once (the version's account and a warning)."""

    def __init__(self, device: int = 0, on_failure: Callable[[str], None] | None = None) -> None:
        self.device = device
        self.problem: str | None = None
        self._on_failure = on_failure

    def buffers(self) -> DeviceBuffers:
        """A batch thread's own buffers and stream."""
        return DeviceBuffers(self)

    def failed(self, why: str) -> None:
        if self.problem is None:
            self.problem = why
            if self._on_failure is not None:
                self._on_failure(why)


class DeviceBuffers(KeptBuffers[DeviceArray]):
    """One batch thread's merged batches in GPU memory: buffers kept per (input, shape, dtype), and
    the thread's own CUDA stream for the copies (non-blocking: it never waits for, nor holds up, the
    sessions' streams or the other batch thread's copies). Every copy is ordered on that stream, and
    ``synchronize`` waits for all of them, before the session reads the batch."""

    ORT_DEVICE = "cuda"  # where ONNX Runtime allocates the buffers

    def __init__(self, batches: DeviceBatches) -> None:
        super().__init__()
        self.batches = batches
        self._stream: Any = None

    @property
    def device(self) -> int:
        return self.batches.device

    @property
    def usable(self) -> bool:
        return self.batches.problem is None

    def _allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> DeviceArray:
        import onnxruntime as ort

        try:
            with CUDA_WORK.shared():
                value = ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype.type, self.ORT_DEVICE, self.device)
        except Exception as exc:  # ONNX Runtime's own errors: out of GPU memory, no CUDA provider
            raise DeviceBatchFailure(f"a {'x'.join(map(str, shape))} buffer in GPU memory: {exc}") from exc
        return DeviceArray(value, tuple(shape), dtype, self)

    def copy(self, destination: int, source: int, nbytes: int) -> None:
        """``nbytes`` to GPU memory at ``destination`` from ``source`` (GPU memory, or page-locked
        host memory: CUDA tells which from the address), queued on the stream."""
        cudart = cuda_api.runtime()
        kind = cudart.cudaMemcpyKind.cudaMemcpyDefault
        with CUDA_WORK.shared():
            error = cudart.cudaMemcpyAsync(destination, source, nbytes, kind, self._on())[0]
        self._checked(error, "a copy into GPU memory")

    def synchronize(self) -> None:
        """Wait until every copy queued so far is done."""
        if self._stream is not None:
            with CUDA_WORK.shared():
                error = cuda_api.runtime().cudaStreamSynchronize(self._stream)[0]
            self._checked(error, "waiting for the copies in GPU memory")

    def _on(self) -> Any:
        """The stream, made on first use, on this version's GPU."""
        if self._stream is None:
            cudart = cuda_api.runtime()
            self._checked(cudart.cudaSetDevice(self.device)[0], f"selecting GPU {self.device}")
            with CUDA_WORK.shared():
                error, stream = cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking)
            self._checked(error, "a CUDA stream for the copies")
            self._stream = stream
        return self._stream

    def _checked(self, error: Any, what: str) -> None:
        if not cuda_api.succeeded(error):
            raise DeviceBatchFailure(f"{what} failed ({cuda_api.describe(error)})")

    def close(self) -> None:
        super().close()
        if self._stream is not None:
            with CUDA_WORK.shared():
                cuda_api.runtime().cudaStreamDestroy(self._stream)
            self._stream = None
