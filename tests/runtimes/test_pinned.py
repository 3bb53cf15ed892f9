"""Kept batch buffers, and page-locking them where a GPU is (``runtimes/pinned.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from unideploy.runtimes import cuda_api
from unideploy.runtimes.pinned import KEPT, BatchBuffers, PinnedBuffers


def test_a_buffer_is_kept_per_input_and_shape_and_the_least_recent_given_back():
    buffers = BatchBuffers()
    first = buffers.array("x", (4, 3), np.dtype(np.float32))
    assert buffers.array("x", (4, 3), np.dtype(np.float32)) is first  # the same memory for the next batch
    assert buffers.array("x", (8, 3), np.dtype(np.float32)) is not first  # another bucket, another buffer
    assert buffers.array("x", (4, 3), np.dtype(np.float16)) is not first
    for rows in range(KEPT):  # more shapes than are kept: the least recently used go first
        buffers.array("y", (rows + 1, 2), np.dtype(np.float32))
    assert buffers.array("x", (4, 3), np.dtype(np.float32)) is not first
    buffers.close()
    assert buffers.array("y", (KEPT, 2), np.dtype(np.float32)).shape == (KEPT, 2)


@pytest.mark.skipif(cuda_api.problem() is None, reason="this machine can page-lock memory (it has a CUDA GPU)")
def test_without_a_cuda_gpu_the_reason_is_named():
    why = cuda_api.problem()
    assert why is not None and ("cuda-bindings is not installed" in why or "CUDA runtime" in why), why


@pytest.mark.gpu
@pytest.mark.skipif(cuda_api.problem() is not None, reason=f"needs a CUDA GPU: {cuda_api.problem()}")
def test_buffers_are_page_locked_on_a_gpu_and_unlocked_on_close():
    from cuda.bindings import runtime

    buffers = PinnedBuffers()
    array = buffers.array("x", (32, 3, 224, 224), np.dtype(np.float32))
    error, _ = runtime.cudaHostGetFlags(array.ctypes.data)
    assert error == runtime.cudaError_t.cudaSuccess, error  # only page-locked memory has flags
    array[...] = 1.0
    buffers.close()
    assert runtime.cudaHostGetFlags(array.ctypes.data)[0] != runtime.cudaError_t.cudaSuccess
