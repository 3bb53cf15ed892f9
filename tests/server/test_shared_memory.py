"""Triton's system shared memory extension, driven by tritonclient's own shared-memory utilities over
REST and gRPC, with real digit images: inputs read from and outputs written to regions, and every
bad key, region, offset and size refused with a message, the server healthy after each."""

from __future__ import annotations

import base64
import os
import subprocess

import numpy as np
import pytest

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient is in the dev extra")
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.utils.shared_memory as shm  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from unideploy.runtimes import cuda_api  # noqa: E402

CLIENTS = {
    "http": lambda server: httpclient.InferenceServerClient(server.http.removeprefix("http://")),
    "grpc": lambda server: grpcclient.InferenceServerClient(server.grpc),
}


@pytest.fixture
def images(digits) -> np.ndarray:
    return np.ascontiguousarray(np.load(digits["data"])["x"][:5])


def _module(protocol: str):
    return httpclient if protocol == "http" else grpcclient


@pytest.mark.parametrize("protocol", CLIENTS)
def test_inputs_and_outputs_travel_through_shared_memory(server, images, regions, protocol):
    client, module = CLIENTS[protocol](server), _module(protocol)
    expected_in = module.InferInput("x", list(images.shape), "FP32")
    expected_in.set_data_from_numpy(images)
    expected = client.infer("digits", [expected_in]).as_numpy("output")
    out_bytes = expected.nbytes
    in_handle, in_name, in_key = regions(images.nbytes)
    out_handle, out_name, out_key = regions(64 + out_bytes)  # the output 64 bytes into its segment
    shm.set_shared_memory_region(in_handle, [images])
    client.register_system_shared_memory(in_name, in_key, images.nbytes)
    client.register_system_shared_memory(out_name, out_key, out_bytes, offset=64)
    try:
        x = module.InferInput("x", list(images.shape), "FP32")
        x.set_shared_memory(in_name, images.nbytes)
        wanted = module.InferRequestedOutput("output")
        wanted.set_shared_memory(out_name, out_bytes)
        result = client.infer("digits", [x], outputs=[wanted])
        got = shm.get_contents_as_numpy(out_handle, np.float32, list(expected.shape), offset=64)
        np.testing.assert_array_equal(got, expected)
        answered = result.get_output("output")
        params = answered["parameters"] if protocol == "http" else answered.parameters
        region = params["shared_memory_region"] if protocol == "http" else params["shared_memory_region"].string_param
        assert region == out_name
        assert {in_name, out_name} <= _names(client.get_system_shared_memory_status(), protocol)
    finally:
        client.unregister_system_shared_memory(in_name)
        client.unregister_system_shared_memory(out_name)
    assert not _names(client.get_system_shared_memory_status(), protocol) & {in_name, out_name}


def _names(status, protocol: str) -> set[str]:
    return {r["name"] for r in status} if protocol == "http" else set(status.regions)


@pytest.mark.parametrize("protocol", CLIENTS)
def test_bad_keys_regions_offsets_and_sizes_are_refused(server, images, regions, protocol):
    client, module = CLIENTS[protocol](server), _module(protocol)
    handle, name, key = regions(images.nbytes)
    shm.set_shared_memory_region(handle, [images])

    def refused(call, fragment: str) -> None:
        with pytest.raises(InferenceServerException) as caught:
            call()
        assert fragment in str(caught.value), str(caught.value)

    # keys are shared-memory names, never paths
    for bad in ("/../etc/passwd", "a/b", "/", "../x"):
        refused(lambda bad=bad: client.register_system_shared_memory("p", bad, 16), "not a plain shared-memory name")
    refused(lambda: client.register_system_shared_memory("p", "/unideploy-nothing-here", 16), "cannot be opened")
    refused(
        lambda: client.register_system_shared_memory("p", key, images.nbytes, offset=8),
        f"is larger than the {images.nbytes}-byte segment",
    )
    client.register_system_shared_memory(name, key, images.nbytes)
    try:
        refused(lambda: client.register_system_shared_memory(name, key, 16), "already registered")

        def infer_with(region: str, size: int, offset: int = 0) -> None:
            x = module.InferInput("x", list(images.shape), "FP32")
            x.set_shared_memory(region, size, offset)
            client.infer("digits", [x])

        refused(lambda: infer_with("nope", images.nbytes), "'nope', which is not registered")
        refused(lambda: infer_with(name, images.nbytes, offset=4), "falls outside shared memory region")
        refused(lambda: infer_with(name, images.nbytes - 4), "bytes of data, but FP32")
        small = module.InferRequestedOutput("output")
        small.set_shared_memory(name, 8)
        x = module.InferInput("x", list(images.shape), "FP32")
        x.set_data_from_numpy(images)
        refused(lambda: client.infer("digits", [x], outputs=[small]), "more than the 8 given for it")
    finally:
        client.unregister_system_shared_memory(name)
    refused(lambda: client.unregister_system_shared_memory(name), "no shared memory region")
    assert client.is_server_ready()


def test_an_operator_can_turn_shared_memory_off(repo, images, regions, tmp_path):
    from serving import start_server, stop_server

    server = start_server(repo, tmp_path, "--shared-memory", "off")
    try:
        _, _, key = regions(images.nbytes)
        client = httpclient.InferenceServerClient(server.http.removeprefix("http://"))
        with pytest.raises(InferenceServerException, match="shared memory is turned off"):
            client.register_system_shared_memory("r", key, images.nbytes)
        with pytest.raises(InferenceServerException, match="shared memory is turned off"):
            client.register_cuda_shared_memory("r", base64.b64encode(bytes(64)), 0, 16)
        assert "system_shared_memory" not in client.get_server_metadata()["extensions"]
    finally:
        stop_server(server)
    assert os.path.exists(f"/dev/shm{key}")  # the client's segment is the client's: never removed by the server


@pytest.mark.parametrize("protocol", CLIENTS)
def test_cuda_shared_memory_is_refused_unless_turned_on(server, images, regions, protocol):
    """The default (--shared-memory system) offers no CUDA regions: registering one is refused
    with how to turn it on, its status is empty, and a system region is not reachable as CUDA."""
    client = CLIENTS[protocol](server)
    handle = base64.b64encode(bytes(64))
    with pytest.raises(InferenceServerException, match="CUDA shared memory is turned off.*--shared-memory cuda"):
        client.register_cuda_shared_memory("c", handle, 0, 16)
    assert not _names(client.get_cuda_shared_memory_status(), protocol)
    metadata = client.get_server_metadata()
    extensions = metadata["extensions"] if protocol == "http" else metadata.extensions
    assert "system_shared_memory" in extensions and "cuda_shared_memory" not in extensions
    _, name, key = regions(images.nbytes)
    client.register_system_shared_memory(name, key, images.nbytes)
    try:
        with pytest.raises(InferenceServerException, match=f"'{name}' is system shared memory, not cuda"):
            client.unregister_cuda_shared_memory(name)
        assert _names(client.get_system_shared_memory_status(), protocol) == {name}
    finally:
        client.unregister_system_shared_memory(name)


def test_a_cuda_handle_over_rest_must_be_base64(server):
    import httpx

    url = f"{server.http}/v2/cudasharedmemory/region/c/register"
    for body in ({"raw_handle": "AAAA", "device_id": 0, "byte_size": 16}, {"raw_handle": {"b64": "@@"}}):
        answer = httpx.post(url, json=body)
        assert answer.status_code == 400 and "raw_handle must be" in answer.json()["error"], answer.text
    # perf_analyzer's libb64 breaks its base64 every 72 characters: a well-formed handle gets past the
    # decoding (to the refusal of a server whose CUDA shared memory is off)
    encoded = base64.b64encode(bytes(range(64))).decode()
    wrapped = "\n".join(encoded[i : i + 72] for i in range(0, len(encoded), 72)) + "\n"
    answer = httpx.post(url, json={"raw_handle": {"b64": wrapped}, "device_id": 0, "byte_size": 16})
    assert answer.status_code == 400 and "CUDA shared memory is turned off" in answer.json()["error"], answer.text


@pytest.mark.skipif(cuda_api.problem() is None, reason="this machine has a CUDA GPU: the server would start")
def test_cuda_shared_memory_without_a_gpu_is_refused_before_any_port_opens(repo):
    from serving import DEPLOY, free_port

    result = subprocess.run(
        [DEPLOY, "serve", str(repo), "--shared-memory", "cuda", "--http-port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "--shared-memory cuda needs a CUDA GPU" in lines[0] and cuda_api.problem() in lines[0]


@pytest.mark.parametrize("protocol", CLIENTS)
def test_inputs_in_shared_memory_count_against_the_request_size_limit(server, regions, protocol):
    """A region's bytes are copied into the server, so a window of 256 MiB in a sparse segment (no
    memory on the client's side) is refused as a request of that size would be, before any byte is
    read, with the limit and the option named."""
    client, module = CLIENTS[protocol](server), _module(protocol)
    rows = (256 << 20) // (8 * 8 * 4)
    _, name, key = regions(16)
    os.truncate(f"/dev/shm/{key.lstrip('/')}", 256 << 20)  # sparse: nothing is written
    client.register_system_shared_memory(name, key, 256 << 20)
    try:
        x = module.InferInput("x", [rows, 1, 8, 8], "FP32")
        x.set_shared_memory(name, 256 << 20)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("digits", [x])
        assert f"come to {256 << 20} bytes, over the limit of {64 << 20} bytes" in str(caught.value)
        assert "--max-request-bytes" in str(caught.value)
    finally:
        client.unregister_system_shared_memory(name)
    assert client.is_server_ready()


def test_an_input_stays_in_its_region_until_read_and_unregistering_closes_the_segment(regions):
    """An input in a client's region is checked as its request arrives and read through the
    descriptor registration opened when its batch is merged (``Unread``: straight into the batch's
    rows, or into an array of its own), as Triton reads in place: the client must not rewrite it
    before its response. Unregistering frees the name at once and closes the descriptor once no
    read is using it; a read after that is refused."""
    from unideploy.server.errors import BadRequest
    from unideploy.server.shared_memory import Placement, SharedMemoryRegions
    from unideploy.server.unread import Unread

    def descriptors() -> int:  # of the segment in this process: the client's own, and the server's
        return sum(key.lstrip("/") in os.readlink(f"/proc/self/fd/{fd}") for fd in _open_fds())

    rows = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    handle, name, key = regions(rows.nbytes)
    shm.set_shared_memory_region(handle, [rows])
    client_only = descriptors()
    held = SharedMemoryRegions("system")
    held.register(name, key, 0, rows.nbytes)
    assert descriptors() == client_only + 1
    place = Placement(name, rows.nbytes)
    unread = held.input(place, "FP32", rows.shape, "x")
    assert isinstance(unread, Unread) and unread.shape == rows.shape and unread.dtype == np.float32
    np.testing.assert_array_equal(unread.read(), rows)
    strided = np.zeros((2, 3, 8), np.float32)[:, :, ::2]  # rows a batch keeps along another axis
    unread.into(strided)
    np.testing.assert_array_equal(strided, rows)
    with pytest.raises(BadRequest, match="has 96 bytes of data, but FP32 \\[2, 3, 3\\] needs 72"):
        held.input(place, "FP32", (2, 3, 3), "x")

    with held.using(place, "input 'x'") as region:  # a read in progress (a batch thread's)
        held.unregister(name)
        assert held.status() == [] and descriptors() == client_only + 1  # the name goes, the descriptor stays
        got = np.empty(rows.shape, np.float32)
        region.into(place.offset, got.reshape(-1).view(np.uint8).data)
        np.testing.assert_array_equal(got, rows)
    assert descriptors() == client_only  # closed once the read was done
    with pytest.raises(BadRequest, match="not registered"):
        unread.read()
    held.register(name, key, 0, rows.nbytes)  # the name is free again
    held.close()
    assert descriptors() == client_only


def test_a_server_holds_a_bounded_number_of_regions(regions):
    """Each region keeps a descriptor open: past ``max_regions`` (1024 by default) registering is
    refused with what to do, so a client registering in a loop cannot take every descriptor the
    server needs to accept connections; unregistering makes room again."""
    from unideploy.server.errors import BadRequest
    from unideploy.server.shared_memory import MAX_REGIONS, SharedMemoryRegions

    assert SharedMemoryRegions("system").max_regions == MAX_REGIONS == 1024
    _, _, key = regions(16)
    held = SharedMemoryRegions("system", max_regions=2)
    held.register("a", key, 0, 16)
    held.register("b", key, 0, 16)
    with pytest.raises(BadRequest, match="already holds 2 shared memory regions") as refused:
        held.register("c", key, 0, 16)
    assert "unregister the regions no longer used" in refused.value.hint
    held.unregister("a")
    held.register("c", key, 0, 16)
    assert sorted(r["name"] for r in held.status()) == ["b", "c"]
    held.close()


def _open_fds() -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            os.readlink(f"/proc/self/fd/{fd}")
            found.append(fd)
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return found


@pytest.mark.parametrize("protocol", CLIENTS)
def test_a_segment_made_smaller_after_registration_is_refused_and_the_server_stays_up(
    server, images, regions, protocol
):
    """The client owns its segment and may shrink it while the region is registered (tritonclient's
    ``create_shared_memory_region`` does, making a key again smaller). A server reading it through a
    mapping died of SIGBUS on the next request naming the region; the request, and an output that
    no longer fits, are refused with 400 / INVALID_ARGUMENT naming the region and the sizes."""
    client, module = CLIENTS[protocol](server), _module(protocol)
    handle, name, key = regions(images.nbytes)
    shm.set_shared_memory_region(handle, [images])
    client.register_system_shared_memory(name, key, images.nbytes)
    try:
        os.truncate(f"/dev/shm/{key.lstrip('/')}", 64)
        x = module.InferInput("x", list(images.shape), "FP32")
        x.set_shared_memory(name, images.nbytes)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("digits", [x])
        assert f"needs {images.nbytes} bytes of segment '{key}', which now holds 64" in str(caught.value)
        assert "made smaller after the region was registered" in str(caught.value)
        x = module.InferInput("x", list(images.shape), "FP32")
        x.set_data_from_numpy(images)
        out = module.InferRequestedOutput("output")
        out.set_shared_memory(name, 5 * 10 * 4)  # the ten scores of each of the five images
        with pytest.raises(InferenceServerException) as caught:
            client.infer("digits", [x], outputs=[out])
        assert "which now holds 64" in str(caught.value)
        assert os.stat(f"/dev/shm/{key.lstrip('/')}").st_size == 64  # not grown back by the server
    finally:
        client.unregister_system_shared_memory(name)
    assert client.is_server_ready()


def test_a_segment_locked_for_the_gpu_is_copied_at_its_window_and_refused_once_shrunk(regions, monkeypatch):
    """A system segment a GPU copies from: mapped once, its window's rows copied into a batch in GPU
    memory from where they lie (a region at an offset), a segment the client then shrinks refused
    for its request before anything reads it, and unregistering closes the mapping and unlocks it.
    Here CUDA's page-locking and copies are stood in for (host memory, ``memmove``: no GPU on CI);
    tests/server/test_cuda_shared_memory.py runs the same with CUDA on a GPU."""
    from device_memory import HostDeviceBuffers

    from unideploy.runtimes.device_batches import DeviceArray
    from unideploy.server import shared_memory
    from unideploy.server.batching import merged
    from unideploy.server.errors import BadRequest
    from unideploy.server.shared_memory import Placement, SharedMemoryRegions

    locked: list[int] = []
    monkeypatch.setattr(shared_memory, "lock_pages", lambda address, nbytes: locked.append(address))
    monkeypatch.setattr(shared_memory, "unlock_pages", locked.remove)
    rows = np.arange(24, dtype=np.float32).reshape(2, 12)
    handle, name, key = regions(4096 + rows.nbytes)
    shm.set_shared_memory_region(handle, [rows], offset=4096)
    other, other_name, other_key = regions(rows[:1].nbytes)
    shm.set_shared_memory_region(other, [rows[1:] * 10])
    held = SharedMemoryRegions("system")
    held.register(name, key, 4096, rows.nbytes)
    held.register(other_name, other_key, 0, rows[:1].nbytes)
    parts = [
        {"x": held.input(Placement(name, rows.nbytes), "FP32", rows.shape, "x")},
        {"x": held.input(Placement(other_name, rows[:1].nbytes), "FP32", (1, 12), "x")},
    ]
    devices = HostDeviceBuffers()
    batch = merged(parts, 4, None, None, {}, None, devices)["x"]
    assert isinstance(batch, DeviceArray) and len(locked) == 2  # each segment locked once
    np.testing.assert_array_equal(batch.value.numpy(), np.concatenate([rows, rows[1:] * 10, rows[1:] * 10]))
    os.truncate(f"/dev/shm/{key.lstrip('/')}", 4096)  # the client shrinks the first segment
    failed: dict = {}
    batch = merged(parts, 4, None, None, failed, None, devices)["x"]
    assert list(failed) == [0] and isinstance(failed[0], BadRequest) and "which now holds 4096" in str(failed[0])
    assert batch.value.numpy()[:2].tolist() == [(rows[1] * 10).tolist()] * 2 and len(locked) == 2
    held.close()
    assert locked == []  # both unlocked, their mappings closed


def test_ids_checked_against_their_table_fail_their_own_request_and_merge_on_the_host(regions, monkeypatch):
    """Ids in shared memory whose input has a table (``table_rows``) are checked as a batch reads
    them: a request holding an id past the table fails alone (its rows then hold another's), and on a
    GPU they are merged on the host, never copied by the GPU as they lie, whose Gather would answer
    zeros for them. CUDA's page-locking is stood in for as above (no GPU on CI)."""
    from device_memory import HostDeviceBuffers

    from unideploy.errors import RefusedValues
    from unideploy.server import shared_memory
    from unideploy.server.batching import merged
    from unideploy.server.shared_memory import Placement, SharedMemoryRegions
    from unideploy.signature import TensorSpec

    monkeypatch.setattr(shared_memory, "lock_pages", lambda address, nbytes: None)
    monkeypatch.setattr(shared_memory, "unlock_pages", lambda address: None)
    sent = [np.array([[1, 2, 3]], np.int64), np.array([[4, 10, 5]], np.int64), np.array([[-10, 9, 0]], np.int64)]
    held = SharedMemoryRegions("system")
    for i, ids in enumerate(sent):
        handle, _, key = regions(ids.nbytes)
        shm.set_shared_memory_region(handle, [ids])
        held.register(f"ids{i}", key, 0, ids.nbytes)
    spec = TensorSpec("ids", "int64", ("batch", 3), table_rows=10)

    def parts() -> list[dict]:
        made = [{"ids": held.input(Placement(f"ids{i}", 24), "INT64", (1, 3), "ids")} for i in range(3)]
        for part in made:
            part["ids"].check_values_with(spec)
        return made

    for devices in (None, HostDeviceBuffers()):
        failed: dict = {}
        batch = merged(parts(), 3, None, None, failed, None, devices)["ids"]
        assert isinstance(batch, np.ndarray)  # read on the host, where its values were checked
        assert list(failed) == [1] and isinstance(failed[1], RefusedValues)
        assert "input 'ids' holds 10, past the 10 rows" in str(failed[1])
        np.testing.assert_array_equal(batch, [[1, 2, 3], [1, 2, 3], [-10, 9, 0]])
    unchecked = [{"ids": held.input(Placement(f"ids{i}", 24), "INT64", (1, 3), "ids")} for i in (0, 2)]
    assert not isinstance(merged(unchecked, 2, None, None, {}, None, HostDeviceBuffers())["ids"], np.ndarray)
    with pytest.raises(RefusedValues, match="holds 10"):
        merged(parts()[1:2], 1)
    held.close()


def test_token_ids_past_the_table_are_refused_over_json_and_through_shared_memory(regions, tmp_path):
    """A served embedding model whose export recorded its ids' table (10 rows): ids past it are
    refused naming the input, sent as tensors on arrival, through shared memory as their batch is
    merged (where they are first read); both 400, and good ids through shared memory answer as
    sent inline."""
    from onnx_models import embedding_package
    from serving import start_server, stop_server

    embedding_package(tmp_path / "src", tmp_path / "repo" / "words" / "1")
    server = start_server(tmp_path / "repo", tmp_path)
    try:
        client = httpclient.InferenceServerClient(server.http.removeprefix("http://"))

        def sent(ids: np.ndarray, through_shm: bool) -> np.ndarray:
            given = httpclient.InferInput("ids", list(ids.shape), "INT64")
            if not through_shm:
                given.set_data_from_numpy(ids)
                return client.infer("words", [given]).as_numpy("y")
            handle, name, key = regions(ids.nbytes)
            shm.set_shared_memory_region(handle, [ids])
            client.register_system_shared_memory(name, key, ids.nbytes)
            try:
                given.set_shared_memory(name, ids.nbytes)
                return client.infer("words", [given]).as_numpy("y")
            finally:
                client.unregister_system_shared_memory(name)

        good = np.array([[0, 1, 2, 3], [9, 9, 8, 8]], np.int64)
        np.testing.assert_array_equal(sent(good, through_shm=True), sent(good, through_shm=False))
        bad = np.array([[0, 1, 10, 3]], np.int64)
        with pytest.raises(InferenceServerException, match=r"\[400\] input 'ids' holds 10, past the 10 rows"):
            sent(bad, through_shm=False)
        with pytest.raises(InferenceServerException, match=r"\[400\] input 'ids' holds 10, past the 10 rows"):
            sent(bad, through_shm=True)
        np.testing.assert_array_equal(sent(good, through_shm=True), [[1.5] * 3, [8.5] * 3])
    finally:
        stop_server(server)
