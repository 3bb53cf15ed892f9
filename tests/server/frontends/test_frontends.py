"""``deploy serve --frontends N``: front-end processes that decode and encode for one model process.

Real servers on 127.0.0.1 with the digits package, driven by real clients (httpx, tritonclient over
REST and gRPC, with tritonclient's own shared-memory utilities): answers equal the model's, requests
from every front end merge into one batch, a killed front end is replaced while the other answers,
hot reload and the SIGTERM drain lose nothing, and no shared memory is left behind."""

from __future__ import annotations

import shutil
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from serving import start_server, stop_server

import unideploy
from unideploy.server.config import default_frontends

psutil = pytest.importorskip("psutil", reason="psutil is in the dev extra")
httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient is in the dev extra")
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.utils.shared_memory as shm  # noqa: E402

SHM = Path("/dev/shm")


@pytest.fixture
def images(digits) -> np.ndarray:
    with np.load(digits["data"]) as d:
        return np.ascontiguousarray(d["x"][:16])


@pytest.fixture
def expected(digits, images) -> np.ndarray:
    """The package's own answers, computed in this process."""
    return unideploy.run(digits["package"], {"x": images})["output"]


@pytest.fixture
def merging_repo(digits, tmp_path) -> Path:
    """digits version 1, whose batcher merges up to 32 queued rows."""
    shutil.copytree(digits["package"], tmp_path / "repo" / "digits" / "1")
    (tmp_path / "repo" / "digits" / "model.yaml").write_text("max_batch_size: 32\nmax_queue_delay_ms: 5\n")
    return tmp_path / "repo"


def frontends(server) -> list:
    return psutil.Process(server.process.pid).children(recursive=True)


def infer(http: str, x: np.ndarray) -> httpx.Response:
    """One request on a connection of its own (the kernel gives each connection to one front end)."""
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
    return httpx.post(f"{http}/v2/models/digits/infer", json=body, timeout=30)


def test_default_count_follows_the_cores():
    assert [default_frontends(c) for c in (1, 2, 4, 7, 8, 16, 64)] == [0, 0, 0, 0, 1, 3, 8]


def test_two_frontends_answer_exactly_and_their_requests_merge(merging_repo, images, expected, tmp_path):
    server = start_server(merging_repo, tmp_path, "--frontends", "2")
    try:
        server.wait_for(lambda: "2 front-end processes" in server.log.read_text(), what="both front ends")
        assert len(frontends(server)) == 2
        with ThreadPoolExecutor(16) as pool:  # one row each, on connections of their own
            answers = list(pool.map(lambda i: infer(server.http, images[i : i + 1]), range(16)))
        assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200]
        got = np.concatenate([np.asarray(a.json()["outputs"][0]["data"], np.float32).reshape(1, 10) for a in answers])
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)

        # 8 gRPC connections (spread over both front ends by the kernel), 8 requests each at once; the
        # digits model answers in a fraction of a millisecond, so on a loaded machine a burst can
        # arrive one request at a time and nothing queues to merge: up to five bursts, until one merged
        clients = [grpcclient.InferenceServerClient(server.grpc) for _ in range(8)]
        done: list = []
        finished = threading.Semaphore(0)
        for _ in range(5):
            rows, calls = server.metric("unideploy_batch_rows_sum"), server.metric("unideploy_batch_rows_count")
            done.clear()
            for client in clients:
                for i in range(8):
                    tensor = grpcclient.InferInput("x", [1, 1, 8, 8], "FP32")
                    tensor.set_data_from_numpy(images[i : i + 1])
                    client.async_infer(
                        "digits", [tensor], lambda result, error: (done.append((result, error)), finished.release())
                    )
            for _ in range(64):
                assert finished.acquire(timeout=60)
            assert not [e for _, e in done if e is not None]
            # one observation per runtime call, of its rows: 64 rows in fewer than 64 calls once merged
            seen_rows = server.metric("unideploy_batch_rows_sum") - rows
            seen_calls = server.metric("unideploy_batch_rows_count") - calls
            assert seen_rows == 64
            if seen_calls < 64:
                break
        assert seen_calls < 64  # one batcher merged them, whichever front end took them
        assert all(server.metric("unideploy_frontend_requests_total", frontend=i) for i in ("0", "1"))
        assert server.metric("unideploy_frontends") == 2.0

        # gRPC and REST binary through the front ends, the same answers; errors keep their status
        for module, url in ((grpcclient, server.grpc), (httpclient, server.http.removeprefix("http://"))):
            client = module.InferenceServerClient(url)
            tensor = module.InferInput("x", list(images.shape), "FP32")
            tensor.set_data_from_numpy(images)
            np.testing.assert_allclose(client.infer("digits", [tensor]).as_numpy("output"), expected, rtol=1e-5)
            assert client.is_model_ready("digits") and client.get_model_config("digits") is not None
        assert httpx.get(f"{server.http}/v2/models/nope/ready").status_code == 404
        wrong = infer(server.http, images[:1, :, :4])
        assert wrong.status_code == 400 and "expected 8" in wrong.json()["error"]
    finally:
        stop_server(server)
    assert not list(SHM.glob(f"unideploy-frontend-{server.process.pid}-*"))
    assert not [p for p in SHM.glob("unideploy-frontend-*") if not _running(p.name.split("-")[2])]


def _running(pid: str) -> bool:
    return psutil.pid_exists(int(pid))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_shared_memory_regions_serve_every_frontend(repo, images, expected, tmp_path, protocol):
    """A region registered through one connection (one front end) is read by requests on others:
    regions live in the model process, which reads inputs from them and writes outputs into them."""
    server = start_server(repo, tmp_path, "--frontends", "2")
    module = httpclient if protocol == "http" else grpcclient
    url = server.http.removeprefix("http://") if protocol == "http" else server.grpc
    key = f"/unideploy-test-{uuid.uuid4().hex[:12]}"
    inputs = shm.create_shared_memory_region("in", key, images.nbytes)
    outputs = shm.create_shared_memory_region("out", key + "o", expected.nbytes)
    try:
        shm.set_shared_memory_region(inputs, [images])
        registrar = module.InferenceServerClient(url)
        registrar.register_system_shared_memory("in", key, images.nbytes)
        registrar.register_system_shared_memory("out", key + "o", expected.nbytes)
        for _ in range(6):  # new clients: new connections, spread over both front ends
            client = module.InferenceServerClient(url)
            tensor = module.InferInput("x", list(images.shape), "FP32")
            tensor.set_shared_memory("in", images.nbytes)
            wanted = module.InferRequestedOutput("output")
            wanted.set_shared_memory("out", expected.nbytes)
            result = client.infer("digits", [tensor], outputs=[wanted])
            assert result.get_output("output") is not None
            got = shm.get_contents_as_numpy(outputs, np.float32, list(expected.shape))
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        status = module.InferenceServerClient(url).get_system_shared_memory_status()
        assert "in" in str(status) and "out" in str(status)
        registrar.unregister_system_shared_memory()
    finally:
        shm.destroy_shared_memory_region(inputs)
        shm.destroy_shared_memory_region(outputs)
        stop_server(server)


def test_a_killed_frontend_is_replaced_while_the_other_answers(repo, images, expected, tmp_path):
    server = start_server(repo, tmp_path, "--frontends", "2")
    answered: list[int] = []
    refused: list[str] = []
    stop = threading.Event()

    def hammer() -> None:  # fresh connections: a request reaches whichever front end the kernel picks
        deadline = time.monotonic() + 90
        while not stop.is_set() and time.monotonic() < deadline and len(answered) < 20_000:
            try:
                answered.append(infer(server.http, images[:1]).status_code)
            except httpx.TransportError as exc:  # the connection the killed process held
                refused.append(type(exc).__name__)

    thread = threading.Thread(target=hammer)
    try:
        victim = frontends(server)[0]
        thread.start()
        server.wait_for(lambda: len(answered) > 20, what="traffic")
        victim.send_signal(signal.SIGKILL)
        server.wait_for(
            lambda: len([p for p in frontends(server) if p.pid != victim.pid]) == 2,
            what="a replacement front end",
        )
        server.wait_for(lambda: server.metric("unideploy_frontends") == 2.0, what="it to connect")
        served = len(answered)
        server.wait_for(lambda: len(answered) > served + 50, what="traffic after the restart")
    finally:
        stop.set()
        thread.join(timeout=60)
        stop_server(server)
    assert set(answered) == {200}
    assert len(refused) <= 5, refused  # at most what was in flight on the killed process's connections
    assert f"(pid {victim.pid}) exited with code -9; starting another" in server.log.read_text()


def test_hot_reload_and_sigterm_drain_through_frontends(digits, tmp_path):
    """Version 2 arrives while four clients send; every request is answered (by version 1, then
    by version 2); SIGTERM then drains what the front ends hold, and the server exits 0."""
    repo = tmp_path / "repo"
    shutil.copytree(digits["package"], repo / "digits" / "1")
    server = start_server(repo, tmp_path, "--frontends", "2")
    results: list[tuple[int, str]] = []
    stop = threading.Event()

    def client() -> None:
        deadline = time.monotonic() + 90
        with server.client() as http:
            while not stop.is_set() and time.monotonic() < deadline and len(results) < 20_000:
                body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": [0.0] * 64}]}
                try:
                    r = http.post("/v2/models/digits/infer", json=body)
                except httpx.TransportError:
                    return  # after SIGTERM the listeners close: later requests are refused, not failed
                results.append((r.status_code, r.headers.get("x-unideploy-model-version", "")))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        server.wait_for(lambda: len(results) > 20, what="traffic")
        shutil.copytree(digits["package"], tmp_path / "v2")
        (tmp_path / "v2").rename(repo / "digits" / "2")
        server.wait_for(lambda: results[-1][1] == "2", what="version 2 to answer")
        served = len(results)
        server.wait_for(lambda: len(results) > served + 20, what="traffic on version 2")
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=60) == 0
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
        if server.process.poll() is None:
            stop_server(server)
    errors = [line for line in server.log.read_text().splitlines() if '"level": "ERROR"' in line][:3]
    assert {status for status, _ in results} == {200}, ([r for r in results if r[0] != 200][:3], errors)
    versions = [v for _, v in results]
    assert versions[0] == "1" and versions[-1] == "2"
    log = server.log.read_text()
    assert "shutting down: draining in-flight requests" in log and "did not stop in time" not in log
