"""Triton's CUDA shared memory extension on a real GPU, driven by tritonclient's own CUDA shared-memory
utilities over REST and gRPC, in one process and through front ends: a signal in device memory the
client allocated, run through a small 1-D convolution network, its output written into another
region, and bad handles, devices and sizes refused with a message, the server healthy after each.
(The model is built here with onnx, so the check runs on a GPU machine without torch; where there is
no GPU, the refusals that need none are tested in test_shared_memory.py.)"""

from __future__ import annotations

import base64
import uuid

import numpy as np
import pytest

from unideploy.runtimes import cuda_api

pytestmark = pytest.mark.skipif(cuda_api.problem() is not None, reason=f"needs a CUDA GPU: {cuda_api.problem()}")
httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient is in the dev extra")
import tritonclient.grpc as grpcclient  # noqa: E402
from serving import FRONTEND_COUNTS, FRONTEND_IDS  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

CLIENTS = {
    "http": lambda server: httpclient.InferenceServerClient(server.http.removeprefix("http://")),
    "grpc": lambda server: grpcclient.InferenceServerClient(server.grpc),
}


@pytest.fixture(scope="module", params=FRONTEND_COUNTS, ids=FRONTEND_IDS)
def cuda_server(request, tmp_path_factory):
    from onnx_models import conv1d_model
    from serving import start_server, stop_server

    import unideploy

    root = tmp_path_factory.mktemp("cuda-shm")
    unideploy.export(conv1d_model(root / "conv1d.onnx"), root / "repo" / "conv" / "1").close()
    server = start_server(root / "repo", root, "--shared-memory", "cuda", "--frontends", request.param)
    yield server
    stop_server(server)


def _signal(rows: int) -> np.ndarray:
    """Tones with a little noise, [rows, 1, 64]: what the network's audio input takes."""
    t = np.arange(64, dtype=np.float32) / 64
    tones = np.sin(2 * np.pi * np.arange(1, rows + 1, dtype=np.float32)[:, None] * t)
    noise = np.random.default_rng(0).normal(0, 0.05, tones.shape)
    return np.ascontiguousarray((tones + noise)[:, None, :], dtype=np.float32)


@pytest.fixture
def device_regions():
    """Device memory allocated as a client allocates it, each freed afterwards."""
    import tritonclient.utils.cuda_shared_memory as cudashm

    made = []

    def make(size: int) -> tuple[object, str]:
        name = f"c{uuid.uuid4().hex[:8]}"
        made.append(cudashm.create_shared_memory_region(name, size, 0))
        return made[-1], name

    yield make
    for handle in made:
        cudashm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("protocol", CLIENTS)
def test_tensors_in_gpu_memory_in_and_out(cuda_server, device_regions, protocol):
    import tritonclient.utils.cuda_shared_memory as cudashm

    client, module = CLIENTS[protocol](cuda_server), httpclient if protocol == "http" else grpcclient
    images = _signal(5)
    plain = module.InferInput("audio", list(images.shape), "FP32")
    plain.set_data_from_numpy(images)
    expected = client.infer("conv", [plain]).as_numpy("y")
    (in_handle, in_name), (out_handle, out_name) = device_regions(images.nbytes), device_regions(expected.nbytes)
    cudashm.set_shared_memory_region(in_handle, [images])
    client.register_cuda_shared_memory(in_name, cudashm.get_raw_handle(in_handle), 0, images.nbytes)
    client.register_cuda_shared_memory(out_name, cudashm.get_raw_handle(out_handle), 0, expected.nbytes)
    try:
        x = module.InferInput("audio", list(images.shape), "FP32")
        x.set_shared_memory(in_name, images.nbytes)
        wanted = module.InferRequestedOutput("y")
        wanted.set_shared_memory(out_name, expected.nbytes)
        client.infer("conv", [x], outputs=[wanted])
        got = cudashm.get_contents_as_numpy(out_handle, np.float32, list(expected.shape))
        np.testing.assert_array_equal(got, expected)
        status = client.get_cuda_shared_memory_status()
        names = {r["name"] for r in status} if protocol == "http" else set(status.regions)
        assert {in_name, out_name} <= names
        metadata = client.get_server_metadata()
        assert "cuda_shared_memory" in (metadata["extensions"] if protocol == "http" else metadata.extensions)
    finally:
        client.unregister_cuda_shared_memory(in_name)
        client.unregister_cuda_shared_memory(out_name)


@pytest.mark.parametrize("protocol", CLIENTS)
def test_bad_handles_devices_and_sizes_are_refused(cuda_server, device_regions, protocol):
    import tritonclient.utils.cuda_shared_memory as cudashm

    client, module = CLIENTS[protocol](cuda_server), httpclient if protocol == "http" else grpcclient
    handle, name = device_regions(4096)
    raw = cudashm.get_raw_handle(handle)

    def refused(call, fragment: str) -> None:
        with pytest.raises(InferenceServerException) as caught:
            call()
        assert fragment in str(caught.value), str(caught.value)

    refused(lambda: client.register_cuda_shared_memory("z", base64.b64encode(bytes(64)), 0, 16), "cannot be opened")
    refused(lambda: client.register_cuda_shared_memory("z", base64.b64encode(bytes(8)), 0, 16), "not a 64-byte")
    refused(lambda: client.register_cuda_shared_memory("z", raw, 4096, 16), "GPU 4096 cannot be used")
    refused(lambda: client.register_cuda_shared_memory("z", raw, 0, 1 << 40), "is larger than its memory")
    client.register_cuda_shared_memory(name, raw, 0, 4096)
    try:
        refused(lambda: client.register_cuda_shared_memory(name, raw, 0, 16), "already registered")
        x = module.InferInput("audio", [1, 1, 64], "FP32")
        x.set_shared_memory(name, 256, offset=4000)
        refused(lambda: client.infer("conv", [x]), "falls outside shared memory region")
    finally:
        client.unregister_cuda_shared_memory(name)
    refused(lambda: client.unregister_cuda_shared_memory(name), "no shared memory region")
    assert client.is_server_ready()


def test_a_system_segment_is_page_locked_and_copied_into_a_batch_by_the_gpu(regions):
    """A system shared-memory segment on a GPU machine: page-locked on the first batch that wants it
    in GPU memory, its rows copied into the batch by the GPU's copy engine (the model process's CPU
    reads nothing), the batch what a host merge makes; a segment the client shrank afterwards is
    refused for its request alone, and unregistering unlocks every segment."""
    import os

    import tritonclient.utils.shared_memory as shm

    from unideploy.runtimes.device_batches import DeviceArray, DeviceBatches
    from unideploy.server.batching import merged
    from unideploy.server.errors import BadRequest
    from unideploy.server.shared_memory import Placement, SharedMemoryRegions

    held, signals, keys, inputs = SharedMemoryRegions("system"), _signal(3), [], []
    for row in signals:
        handle, name, key = regions(row.nbytes)
        shm.set_shared_memory_region(handle, [np.ascontiguousarray(row[None])])
        held.register(name, key, 0, row.nbytes)
        keys.append(key)
        inputs.append({"audio": held.input(Placement(name, row.nbytes), "FP32", (1, *row.shape), "audio")})
    buffers = DeviceBatches().buffers()
    try:
        batch = merged(inputs, 4, None, None, {}, None, buffers)["audio"]
        assert isinstance(batch, DeviceArray)
        np.testing.assert_array_equal(batch.value.numpy(), np.concatenate([signals, signals[-1:]]))
        os.truncate(f"/dev/shm/{keys[1].lstrip('/')}", 4)
        failed: dict = {}
        batch = merged(inputs, 4, None, None, failed, None, buffers)["audio"]
        assert list(failed) == [1] and isinstance(failed[1], BadRequest) and "which now holds 4" in str(failed[1])
        np.testing.assert_array_equal(batch.value.numpy()[[0, 2]], signals[[0, 2]])
        assert buffers.batches.problem is None
    finally:
        buffers.close()
        held.close()  # each segment's pages unlocked, its mapping closed


@pytest.mark.parametrize("memory", ["cuda", "system"])
def test_eight_clients_inputs_in_shared_memory_are_copied_into_batches_by_the_gpu(
    cuda_server, device_regions, regions, memory
):
    """Eight clients at once, each signal in a region of its own (device memory, or a system
    segment the server page-locks), against a model on the GPU: the batches they merge into are
    assembled in GPU memory by the GPU's copies (``runtimes/device_batches.py``), each answer the
    model's for its own signal, and the model's account still says ``device_batches: on``
    afterwards (a CUDA call that failed would have turned it off, saying why)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import tritonclient.utils.cuda_shared_memory as cudashm
    import tritonclient.utils.shared_memory as shm

    signals = _signal(8)
    plain = CLIENTS["http"](cuda_server)
    assert plain.get_model_metadata("conv")["parameters"]["device_batches"] == "on"
    expected = []
    for row in signals:
        x = httpclient.InferInput("audio", [1, 1, 64], "FP32")
        x.set_data_from_numpy(row[None])
        expected.append(plain.infer("conv", [x]).as_numpy("y"))
    names = []
    for row in signals:
        value = [np.ascontiguousarray(row[None])]
        if memory == "cuda":
            handle, name = device_regions(row.nbytes)
            cudashm.set_shared_memory_region(handle, value)
            plain.register_cuda_shared_memory(name, cudashm.get_raw_handle(handle), 0, row.nbytes)
        else:
            handle, name, key = regions(row.nbytes)
            shm.set_shared_memory_region(handle, value)
            plain.register_system_shared_memory(name, key, row.nbytes)
        names.append(name)
    together = threading.Barrier(len(signals), timeout=60)

    def ask(i: int) -> np.ndarray:
        client = CLIENTS["http"](cuda_server)
        x = httpclient.InferInput("audio", [1, 1, 64], "FP32")
        x.set_shared_memory(names[i], signals[i].nbytes)
        together.wait()
        return client.infer("conv", [x]).as_numpy("y")

    try:
        with ThreadPoolExecutor(len(signals)) as pool:
            answers = list(pool.map(ask, range(len(signals))))
        for got, want in zip(answers, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert plain.get_model_metadata("conv")["parameters"]["device_batches"] == "on"
    finally:
        for name in names:
            if memory == "cuda":
                plain.unregister_cuda_shared_memory(name)
            else:
                plain.unregister_system_shared_memory(name)
