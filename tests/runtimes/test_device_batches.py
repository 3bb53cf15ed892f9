"""Batches merged in GPU memory (runtimes/device_batches.py): the buffers and copies are CUDA's and
run on a GPU only; what reads such a batch in place (the ONNX Runtime plug-in's sessions, a bound
run) is the same on the CPU, with ONNX Runtime's host memory standing in for the GPU's
(``device_memory``), on the digits network trained on real digits."""

from __future__ import annotations

import numpy as np
import pytest
from device_memory import HostDeviceBuffers

from unideploy.package import Package
from unideploy.runtimes import cuda_api
from unideploy.runtimes.device_batches import DeviceArray, DeviceBatches, DeviceBatchFailure
from unideploy.runtimes.ort_bound import BoundRun
from unideploy.runtimes.selection import open_runtime


def _in_memory(buffers: HostDeviceBuffers, array: np.ndarray) -> DeviceArray:
    held = buffers.array("x", array.shape, array.dtype)
    held.value.update_inplace(array)
    return held


def test_the_onnx_runtime_plugin_reads_a_batch_in_its_own_memory_in_place(digits):
    images, labels = np.load(digits["data"])["x"][:8], np.load(digits["data"])["labels"][:8]
    with Package.open(digits["package"]) as package:
        _, engine = open_runtime(package)
        try:
            expected = engine.run({"x": images})["output"]
            got = engine.run_checked({"x": _in_memory(HostDeviceBuffers(), images)})["output"]
        finally:
            engine.close()
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert (got.argmax(1) == labels).mean() >= 0.75  # the real digits, classified


def test_only_sessions_on_the_cuda_provider_take_batches_in_gpu_memory(digits):
    """The server hands a runtime batches in GPU memory only where it says it takes them: the
    ONNX Runtime plug-in's sessions on the CUDA provider."""
    with Package.open(digits["package"]) as package:
        _, engine = open_runtime(package)
        try:
            on_cuda = "CUDAExecutionProvider" in engine.describe()["providers"]
            assert engine.takes_device_batches is on_cuda
            if cuda_api.problem() is not None:
                assert not engine.takes_device_batches
        finally:
            engine.close()


def test_a_bound_run_copies_a_batch_in_its_memory_into_its_buffers(digits):
    """A bucket whose session replays a CUDA graph on its own thread: a batch merged in GPU memory is
    copied into its bound input by the calling thread (which holds the process's CUDA work: a copy
    made on the graph's thread would wait for a capture that waits for the caller), then replayed."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import onnxruntime as ort

    from unideploy.runtimes.ort_bound import fix_batch

    with Package.open(digits["package"]) as package:
        path = package.path_of(package.manifest.artifact("onnx-fp32"))
        options = ort.SessionOptions()
        fix_batch(options, ["batch"], 4)
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    images, buffers = np.load(digits["data"])["x"], HostDeviceBuffers()
    with ThreadPoolExecutor(1, thread_name_prefix="graph") as graph:
        bound = BoundRun(session, "cpu", thread=graph)
        for start in (0, 4):
            batch = images[start : start + 4]
            got = bound.run({"x": _in_memory(buffers, batch)})["output"]
            np.testing.assert_allclose(got, session.run(None, {"x": batch})[0], rtol=1e-6, atol=1e-6)
        assert buffers.copied == [images[:4].nbytes] * 2 and buffers.waits == 2
        assert buffers.threads == {threading.current_thread().name}
        with pytest.raises(ValueError, match=r"input 'x' \(8, 1, 8, 8\) does not fit its bound \(4, 1, 8, 8\)"):
            bound.run({"x": _in_memory(buffers, images[:8])})


@pytest.mark.skipif(cuda_api.problem() is None, reason="a GPU is here: the copies work (the test below)")
def test_without_a_gpu_the_first_copy_fails_naming_cudas_error():
    batches = DeviceBatches()
    with pytest.raises(DeviceBatchFailure, match=r"selecting GPU 0 failed \(cudaError"):
        batches.buffers().copy(0, 0, 16)


@pytest.mark.skipif(cuda_api.problem() is not None, reason=f"needs a CUDA GPU: {cuda_api.problem()}")
def test_rows_copied_in_gpu_memory_arrive_whole():
    batches = DeviceBatches()
    buffers = batches.buffers()
    try:
        source = buffers.array("a", (3, 5), np.dtype(np.float32))
        target = buffers.array("b", (3, 5), np.dtype(np.float32))
        values = np.arange(15, dtype=np.float32).reshape(3, 5)
        source.value.update_inplace(values)
        buffers.copy(target.pointer + 20, source.pointer, 40)  # rows 0-1 into rows 1-2
        buffers.synchronize()
        assert target.value.numpy()[1:].tolist() == values[:2].tolist()
    finally:
        buffers.close()
    assert batches.problem is None
