"""Inputs not yet copied into the server: windows of a client's shared memory, and tensors of a
request whose bytes are not aligned to their type, read where the model wants them.

A request whose input lies in a shared-memory region is checked on the event loop (the region, the
window, the byte count, the shape and dtype against the model's signature) and queued as an
``Unread``: its shape and dtype, and a way to copy its bytes into memory it is given. The batch
thread's merge then copies it straight into the merged batch's rows (page-locked on a GPU), so the
merge is its one copy and the event loop makes none; a call that merges nothing reads it into an
array of its own where the call runs. Reading through the segment's descriptor costs the kernel
three times a ``memcpy`` (a mapping cannot be read safely: docs/server.md, Shared-memory tensors),
so this keeps that copy off the loop and in place of the merge's. Where the runtime reads batches
in GPU memory, an input the GPU can copy where it lies (``reaches_gpu``: a CUDA region, or a
system segment page-locked for it) is merged there instead (``runtimes.device_batches``), and the
model process's CPU copies nothing.

A tensor of a request's body or message whose address is no multiple of its type's size (binary
tensors after a JSON header of any length, a gRPC message's raw tensor wherever its fields put it)
cannot be run where it lies: ONNX Runtime reads an unaligned array element by element (a 600 KB
image: 0.17 ms a call against 0.03). It is ``Unaligned``: its one copy is the merge's, or the slot's
of a front end, or its own where a call merges nothing, where it was copied on arrival before and
then again into the batch or the slot.

An input whose values the model looks up in a table (``TensorSpec.table_rows``: token ids) is
checked as it is read (``checked_by``), each request's own rows, so an id past the table fails its
own request only (400), and such an input is always merged on the host: the GPU's Gather would
answer zeros for it without a word, and ids are a few bytes a row.
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
from unideploy.signature import TensorSpec


class Unread(ABC):
    """An input of known ``shape`` and ``dtype`` (at least one dimension, at least one byte) whose
    bytes are still elsewhere: in a client's shared memory, system or CUDA."""

    def __init__(self, shape: Sequence[int], dtype: np.dtype) -> None:
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.checked_by: TensorSpec | None = None  # whose values' range each read is checked against

    def check_values_with(self, spec: TensorSpec) -> None:
        """Check the values against ``spec``'s range (``TensorSpec.check_values``) wherever they are
        read, where it has one."""
        if spec.table_rows:
            self.checked_by = spec

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

    def reaches_gpu(self, device: int) -> bool:
        """Whether GPU ``device`` can copy the bytes where they are (its own memory, or page-locked
        host memory), so that a batch is merged in its memory (``runtimes.device_batches``)."""
        return False

    def on_gpu(self, device: int) -> AbstractContextManager[int]:
        """The address GPU ``device`` copies the bytes from, valid until the block ends; raises
        ``InputError`` where they are no longer there. Only where ``reaches_gpu``."""
        raise TypeError(f"GPU {device} cannot copy {type(self).__name__}'s bytes")

    def into(self, out: np.ndarray) -> None:
        """Copy the input into ``out`` (its shape and dtype): straight in where ``out`` is contiguous;
        raises ``InputError`` where the bytes are gone, ``RefusedValues`` where ``checked_by`` refuses
        the values (then in ``out``, for the caller to overwrite)."""
        if out.flags.c_contiguous:
            self._into(out.reshape(-1).view(np.uint8).data)
        else:
            out[...] = self.read()
            return  # read() checked them
        if self.checked_by is not None:
            self.checked_by.check_values(out)

    def read(self) -> np.ndarray:
        """The input, in an array of its own."""
        out = np.empty(self.shape, self.dtype)
        self.into(out)
        return out


class Unaligned(Unread):
    """A request's tensor in bytes whose address is no multiple of its type's size."""

    def __init__(self, array: np.ndarray) -> None:
        super().__init__(array.shape, array.dtype)
        self._bytes = array.reshape(-1).view(np.uint8).data  # the request's own memory

    def _into(self, out: memoryview) -> None:
        out[:] = self._bytes

    def __reduce__(self) -> tuple[Any, tuple[np.ndarray]]:
        """Pickled (to another process) as the aligned array it is read into."""
        return np.asarray, (self.read(),)


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
