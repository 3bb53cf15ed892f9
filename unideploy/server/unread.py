"""Inputs not yet copied into the server: windows of a client's shared memory, read where the model
wants them.

A request whose input lies in a shared-memory region is checked on the event loop (the region, the
window, the byte count, the shape and dtype against the model's signature) and queued as an
``Unread``: its shape and dtype, and a way to copy its bytes into memory it is given. The batch
thread's merge then copies it straight into the merged batch's rows (page-locked on a GPU), so the
merge is its one copy and the event loop makes none; a call that merges nothing reads it into an
array of its own where the call runs. Reading through the segment's descriptor costs the kernel
three times a ``memcpy`` (a mapping cannot be read safely: docs/server.md, Shared-memory tensors),
so this keeps that copy off the loop and in place of the merge's. An input in a CUDA region
(``device``) is merged in GPU memory where the runtime reads batches there
(``runtimes.device_batches``): copied from device to device, never through the host.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, wait
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from unideploy.errors import InputError


class Unread(ABC):
    """An input of known ``shape`` and ``dtype`` (at least one dimension, at least one byte) whose
    bytes are still elsewhere: in host memory, or in GPU ``device``'s (a CUDA region's)."""

    device: int | None = None

    def __init__(self, shape: Sequence[int], dtype: np.dtype) -> None:
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def stand_in(self) -> np.ndarray:
        """An array of this shape and dtype for checks of shape and dtype, its memory never written
        (no page of it is touched). C-contiguous, so a check that wants contiguous arrays copies
        nothing: a zero-stride stand-in was copied whole by ``Signature.validate_inputs`` (0.03 ms for
        a 600 KB input)."""
        return np.empty(self.shape, self.dtype)

    @abstractmethod
    def _into(self, out: memoryview) -> None:
        """Copy the bytes into ``out`` (``nbytes`` of contiguous memory); raises ``InputError``."""

    def on_device(self) -> AbstractContextManager[int]:
        """The bytes' address in GPU ``device``'s memory, valid until the block ends; raises
        ``InputError`` where they are no longer there. Only for an input whose ``device`` is set."""
        raise TypeError(f"{type(self).__name__} holds its bytes in host memory")

    def into(self, out: np.ndarray) -> None:
        """Copy the input into ``out`` (its shape and dtype): straight in where ``out`` is contiguous."""
        if out.flags.c_contiguous:
            self._into(out.reshape(-1).view(np.uint8).data)
        else:
            out[...] = self.read()

    def read(self) -> np.ndarray:
        """The input, in an array of its own."""
        out = np.empty(self.shape, self.dtype)
        self.into(out)
        return out


def read_all(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """``inputs`` with every ``Unread`` one read into an array of its own (the same dict where none is)."""
    if not any(isinstance(v, Unread) for v in inputs.values()):
        return inputs if isinstance(inputs, dict) else dict(inputs)
    return {k: v.read() if isinstance(v, Unread) else v for k, v in inputs.items()}


def read_into(jobs: Sequence[tuple[Unread, np.ndarray]], readers: Executor | None = None) -> list[InputError | None]:
    """Each job's input copied into its rows, and the error of each that could not be (None where
    it was). With ``readers``, side by side: the kernel's copy from a segment holds no GIL, and a
    merged batch's rows read one after the other took 1.6-2.3 ms of a 5.4 ms call for 8-9 rows of
    600 KB on the H200's host (docs/gpu.md); the calling thread reads the first itself."""

    def read(unread: Unread, out: np.ndarray) -> InputError | None:
        try:
            unread.into(out)
        except InputError as exc:
            return exc
        return None

    if readers is None or len(jobs) < 2:
        return [read(*job) for job in jobs]
    others = [readers.submit(read, *job) for job in jobs[1:]]
    try:
        first = read(*jobs[0])
    finally:
        wait(others)  # even when the first read fails unexpectedly: no read outlives its batch's buffer
    return [first, *(f.result() for f in others)]
