"""Bearer tokens (inference and repository separately), TLS on both ports, graceful shutdown."""

from __future__ import annotations

import signal
import subprocess
import threading

import grpc
import httpx
import pytest

service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2", reason="tritonclient is in the dev extra")
from serving import FRONTEND_COUNTS, FRONTEND_IDS  # noqa: E402
from tritonclient.grpc import service_pb2_grpc  # noqa: E402

BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": [0.0] * 64}]}


# one process, and front-end processes that decode, check and encode for the model process
# (--frontends; none by default below 8 cores): each must guard and encrypt alike
FRONTENDS = pytest.mark.parametrize("frontends", FRONTEND_COUNTS, ids=FRONTEND_IDS)


@pytest.fixture(scope="module", params=FRONTEND_COUNTS, ids=FRONTEND_IDS)
def token_server(repo, tmp_path_factory, request):
    from serving import start_server, stop_server

    running = start_server(
        repo,
        tmp_path_factory.mktemp("auth"),
        "--frontends",
        request.param,
        env={"UNIDEPLOY_INFERENCE_TOKEN": "infer-secret", "UNIDEPLOY_REPOSITORY_TOKEN": "repo-secret"},
    )
    yield running
    stop_server(running)


def test_tokens_guard_inference_and_repository_separately(token_server):
    with token_server.client() as http:
        assert http.get("/v2/health/ready").status_code == 200  # probes need no token
        assert http.post("/v2/models/digits/infer", json=BODY).status_code == 401
        assert (
            http.post("/v2/models/digits/infer", json=BODY, headers={"Authorization": "Bearer wrong"}).status_code
            == 401
        )
        assert (
            http.post(
                "/v2/models/digits/infer", json=BODY, headers={"Authorization": "Bearer infer-secret"}
            ).status_code
            == 200
        )
        assert http.get("/v2/models/stats").status_code == 401  # statistics say what a model serves
        assert http.get("/v2/models/stats", headers={"Authorization": "Bearer infer-secret"}).status_code == 200
        assert http.post("/v2/repository/index", headers={"Authorization": "Bearer infer-secret"}).status_code == 401
        assert http.post("/v2/repository/index", headers={"Authorization": "Bearer repo-secret"}).status_code == 200
    with grpc.insecure_channel(token_server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="digits"), timeout=30)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        meta = stub.ModelMetadata(
            service_pb2.ModelMetadataRequest(name="digits"),
            timeout=30,
            metadata=[("authorization", "Bearer infer-secret")],
        )
        assert meta.name == "digits"
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name="digits"), timeout=30)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # a stream is authorized once, as it opens: without the token it is closed unanswered
        request = service_pb2.ModelInferRequest(model_name="digits", id="a")
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.ModelStreamInfer(iter([request]), timeout=30))
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        streamed = list(
            stub.ModelStreamInfer(iter([request]), timeout=30, metadata=[("authorization", "Bearer infer-secret")])
        )
        assert [s.infer_response.id for s in streamed] == ["a"] and streamed[0].error_message == "request has no inputs"


@FRONTENDS
def test_tls_on_both_ports(repo, tmp_path, frontends):
    from serving import start_server, stop_server

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    running = start_server(repo, tmp_path, "--frontends", frontends, tls=(cert, key))
    try:
        assert running.http.startswith("https://")
        assert httpx.post(f"{running.http}/v2/models/digits/infer", json=BODY, verify=str(cert)).status_code == 200
        credentials = grpc.ssl_channel_credentials(cert.read_bytes())
        with grpc.secure_channel(running.grpc, credentials) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=30).live
    finally:
        stop_server(running)


@FRONTENDS
def test_sigterm_drains_in_flight_requests(repo, tmp_path, frontends):
    """Through front ends too: the first one answers while the second still starts, and the model
    process's handler was installed only once both had (a SIGTERM then killed it, exit -15, with
    requests in flight: 3 of 4 runs with two CPU hogs beside the test)."""
    from serving import start_server

    running = start_server(repo, tmp_path, "--frontends", frontends)
    results: list[int] = []

    def hammer() -> None:
        with running.client() as http:
            for _ in range(200):
                try:
                    results.append(http.post("/v2/models/digits/infer", json=BODY).status_code)
                except httpx.HTTPError:
                    return  # the listener closed: requests after shutdown are refused, not failed

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    running.wait_for(lambda: len(results) > 20, what="traffic")
    running.process.send_signal(signal.SIGTERM)
    assert running.process.wait(timeout=30) == 0
    for t in threads:
        t.join(timeout=30)
    assert results and set(results) == {200}
    assert "shutting down: draining in-flight requests" in running.log.read_text()


def test_logs_are_json_lines(server):
    import json

    lines = [line for line in server.log.read_text().splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]
    assert any("version 1 ready" in e["message"] for e in entries)
    assert all({"time", "level", "logger", "message"} <= set(e) for e in entries)


def test_a_body_shorter_than_its_content_length_is_answered_408(repo, tmp_path):
    """A client that stops sending used to hold its connection (and a SIGTERM'd server) forever."""
    import socket
    import time
    from urllib.parse import urlparse

    from serving import start_server, stop_server

    config = tmp_path / "server.yaml"
    config.write_text("body_timeout_s: 1\nmax_connections: 64\n")
    running = start_server(repo, tmp_path, "--config", str(config))
    try:
        url = urlparse(running.http)
        started = time.monotonic()
        with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
            sock.sendall(
                b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 1000\r\n\r\n{"inputs": ['
            )
            answer = ""
            while "did not arrive" not in answer and time.monotonic() - started < 8:
                answer += sock.recv(4096).decode()
        assert answer.startswith("HTTP/1.1 408") and "did not arrive within 1 s (12 bytes came)" in answer
        assert time.monotonic() - started < 8
        with running.client() as http:
            assert http.get("/v2/health/ready").status_code == 200
    finally:
        stop_server(running)
