"""Every malformed request is answered 4xx / INVALID_ARGUMENT / NOT_FOUND with a message naming
the problem, and the server stays healthy. gRPC requests are built with tritonclient's own stubs."""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest

service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2", reason="tritonclient is in the dev extra")
from tritonclient.grpc import service_pb2_grpc  # noqa: E402

GOOD_X = np.zeros((2, 1, 8, 8), np.float32)


def good_input(**changes) -> dict:
    return {"name": "x", "datatype": "FP32", "shape": [2, 1, 8, 8], "data": GOOD_X.ravel().tolist(), **changes}


def body(*inputs, **extra) -> bytes:
    return json.dumps({"inputs": list(inputs), **extra}).encode()


def binary_body(header: dict, blob: bytes) -> tuple[bytes, dict]:
    text = json.dumps(header).encode()
    return text + blob, {"Inference-Header-Content-Length": str(len(text))}


BLOB = GOOD_X.tobytes()
REST_CASES = [
    # (id, path, body bytes, extra headers, expected status, message fragment)
    ("unknown model", "/v2/models/nope/infer", body(good_input()), {}, 404, "unknown model 'nope'"),
    ("unknown version", "/v2/models/digits/versions/9/infer", body(good_input()), {}, 404, "no version '9'"),
    ("not json", "/v2/models/digits/infer", b"{not json", {}, 400, "not valid JSON"),
    ("json array", "/v2/models/digits/infer", b"[1, 2]", {}, 400, "must be a JSON object"),
    ("empty body", "/v2/models/digits/infer", b"", {}, 400, "not valid JSON"),
    ("binary garbage", "/v2/models/digits/infer", b"\xff\xfe\x00garbage", {}, 400, "not valid JSON"),
    ("no inputs", "/v2/models/digits/infer", json.dumps({"outputs": []}).encode(), {}, 400, "no 'inputs'"),
    ("inputs not a list", "/v2/models/digits/infer", json.dumps({"inputs": {"x": 1}}).encode(), {}, 400, "no 'inputs'"),
    ("input without name", "/v2/models/digits/infer", body({"datatype": "FP32"}), {}, 400, "needs a 'name'"),
    ("wrong input name", "/v2/models/digits/infer", body(good_input(name="image")), {}, 400, "unknown input"),
    ("input twice", "/v2/models/digits/infer", body(good_input(), good_input()), {}, 400, "given twice"),
    ("unknown datatype", "/v2/models/digits/infer", body(good_input(datatype="FP99")), {}, 400, "unsupported datatype"),
    (
        "BYTES datatype with numbers",
        "/v2/models/digits/infer",
        body(good_input(datatype="BYTES")),
        {},
        400,
        "is BYTES but its data holds float values",
    ),
    (
        "BYTES datatype with a null",  # JSON's null once passed the check as "nothing strange": a 500
        "/v2/models/digits/infer",
        body(good_input(datatype="BYTES", shape=[2], data=["seven", None])),
        {},
        400,
        "is BYTES but its data holds NoneType values",
    ),
    (
        "text for a float input",
        "/v2/models/digits/infer",
        body(good_input(datatype="BYTES", shape=[1, 1, 1, 1], data=["seven"])),
        {},
        400,
        "input 'x' has dtype string, expected float32",
    ),
    (
        "wrong dtype",
        "/v2/models/digits/infer",
        body(good_input(datatype="FP64")),
        {},
        400,
        "dtype float64, expected float32",
    ),
    ("wrong rank", "/v2/models/digits/infer", body(good_input(shape=[2, 64], data=[0.0] * 128)), {}, 400, "rank 2"),
    ("wrong fixed dim", "/v2/models/digits/infer", body(good_input(shape=[2, 2, 8, 4])), {}, 400, "size 2 on axis 1"),
    ("negative dim", "/v2/models/digits/infer", body(good_input(shape=[-2, 1, 8, 8])), {}, 400, "negative dimension"),
    ("shape not ints", "/v2/models/digits/infer", body(good_input(shape=["2", 1, 8, 8])), {}, 400, "invalid shape"),
    ("too few values", "/v2/models/digits/infer", body(good_input(data=[0.0] * 10)), {}, 400, "has 10 values"),
    ("strings as data", "/v2/models/digits/infer", body(good_input(data=["a"] * 128)), {}, 400, "does not hold FP32"),
    (
        "no data",
        "/v2/models/digits/infer",
        body({"name": "x", "datatype": "FP32", "shape": [2, 1, 8, 8]}),
        {},
        400,
        "neither 'data' nor",
    ),
    ("empty batch", "/v2/models/digits/infer", body(good_input(shape=[0, 1, 8, 8], data=[])), {}, 400, "is empty"),
    (
        "unknown output",
        "/v2/models/digits/infer",
        body(good_input(), outputs=[{"name": "logits"}]),
        {},
        400,
        "unknown output",
    ),
    ("bad parameters", "/v2/models/digits/infer", body(good_input(), parameters=[1]), {}, 400, "parameters must be"),
    (
        "empty shape numpy cannot hold",
        "/v2/models/digits/infer",  # found by tests/server/test_fuzz.py
        body(good_input(datatype="INT64", shape=[0, 1143, 42280, 57619, 414051], data=[])),
        {},
        400,
        "cannot have shape",
    ),
    (
        "header length not a number",
        "/v2/models/digits/infer",
        body(good_input()),
        {"Inference-Header-Content-Length": "abc"},
        400,
        "does not fit",
    ),
    (
        "header length of 5000 digits",  # more than int() converts: refused as not fitting, not a 500
        "/v2/models/digits/infer",
        body(good_input()),
        {"Inference-Header-Content-Length": "9" * 5000},
        400,
        "does not fit",
    ),
    (
        "header length a digit int() refuses",
        "/v2/models/digits/infer",
        body(good_input()),
        {"Inference-Header-Content-Length": b"\xb2"},  # "²" once read as Latin-1, as HTTP headers are
        400,
        "does not fit",
    ),
    (
        "header length past the body",
        "/v2/models/digits/infer",
        body(good_input()),
        {"Inference-Header-Content-Length": "999999"},
        400,
        "does not fit",
    ),
    (
        "binary size too big",
        "/v2/models/digits/infer",
        *binary_body(
            {
                "inputs": [
                    {
                        "name": "x",
                        "datatype": "FP32",
                        "shape": [2, 1, 8, 8],
                        "parameters": {"binary_data_size": len(BLOB) + 4},
                    }
                ]
            },
            BLOB,
        ),
        400,
        "does not fit",
    ),
    (
        "binary bytes short",
        "/v2/models/digits/infer",
        *binary_body(
            {
                "inputs": [
                    {"name": "x", "datatype": "FP32", "shape": [2, 1, 8, 8], "parameters": {"binary_data_size": 16}}
                ]
            },
            BLOB[:16],
        ),
        400,
        "needs 512",
    ),
    (
        "unclaimed binary bytes",
        "/v2/models/digits/infer",
        *binary_body(
            {
                "inputs": [
                    {
                        "name": "x",
                        "datatype": "FP32",
                        "shape": [2, 1, 8, 8],
                        "parameters": {"binary_data_size": len(BLOB)},
                    }
                ]
            },
            BLOB + b"extra",
        ),
        400,
        "not claimed by any input",
    ),
    ("oversized body", "/v2/models/digits/infer", b"x" * (1024 * 1024 + 10), {}, 400, "exceeds the limit"),
    (
        "shape overflowing int64",
        "/v2/models/digits/infer",
        body(good_input(shape=[4611686018427387904, 4, 1, 1], data=[])),
        {},
        400,
        "dimension over 2147483647",
    ),
    (
        "binary, shape overflowing int64",
        "/v2/models/digits/infer",
        *binary_body(
            {
                "inputs": [
                    {
                        "name": "x",
                        "datatype": "FP32",
                        "shape": [4611686018427387904, 4, 1, 1],
                        "parameters": {"binary_data_size": 0},
                    }
                ]
            },
            b"",
        ),
        400,
        "dimension over",
    ),
    (
        "element count wrapping int64 to 0",
        "/v2/models/digits/infer",
        body(good_input(shape=[1073741824, 1073741824, 16, 1], data=[])),
        {},
        400,
        "has 0 values",
    ),
    (
        "binary, element count wrapping int64 to 0",
        "/v2/models/digits/infer",
        *binary_body(
            {
                "inputs": [
                    {
                        "name": "x",
                        "datatype": "FP32",
                        "shape": [1073741824, 1073741824, 16, 1],
                        "parameters": {"binary_data_size": 0},
                    }
                ]
            },
            b"",
        ),
        400,
        "has 0 bytes of data",
    ),
    (
        "JSON nested 2000 deep",
        "/v2/models/digits/infer",
        b'{"inputs": ' + b"[" * 2000 + b"]" * 2000 + b"}",
        {},
        400,
        "not valid JSON",
    ),
    (
        "output parameters not an object",
        "/v2/models/digits/infer",
        body(good_input(), outputs=[{"name": "output", "parameters": 5}]),
        {},
        400,
        "'parameters', if any, an object",
    ),
    ("index nested 2000 deep", "/v2/repository/index", b"[" * 2000 + b"]" * 2000, {}, 400, "not valid JSON"),
    (
        "variant name outside Latin-1",
        "PUT /v2/models/digits/routing",
        json.dumps({"variants": [{"name": "контроль", "version": "1", "weight": 1}]}).encode(),
        {},
        400,
        "variant name",
    ),
    (
        "variant name with CR/LF",
        "PUT /v2/models/digits/routing",
        json.dumps({"variants": [{"name": "a\r\nSet-Cookie: x", "version": "1", "weight": 1}]}).encode(),
        {},
        400,
        "variant name",
    ),
    (
        "NaN weight",
        "PUT /v2/models/digits/routing",
        b'{"variants": [{"name": "a", "version": "1", "weight": NaN}]}',
        {},
        400,
        "not valid JSON",
    ),
    (
        "infinite weight",
        "PUT /v2/models/digits/routing",
        b'{"variants": [{"name": "a", "version": "1", "weight": 1e999}]}',
        {},
        400,
        "",
    ),
    (
        "version as a path",
        "PUT /v2/models/digits/routing",
        json.dumps({"variants": [{"name": "a", "version": "../../../../etc", "weight": 1}]}).encode(),
        {},
        400,
        "must be a version number",
    ),
    (
        "shadow version as a path",
        "PUT /v2/models/digits/routing",
        json.dumps({"variants": [{"name": "a", "version": "1", "weight": 1}], "shadow": {"version": "/etc"}}).encode(),
        {},
        400,
        "must be a version number",
    ),
    (
        "rows over --max-request-rows",
        "/v2/models/digits/infer",
        body(good_input(shape=[65, 1, 8, 8], data=[0.0] * 65 * 64)),
        {},
        400,
        "request of 65 rows exceeds the limit of 64",
    ),
    ("metadata of unknown model", "GET /v2/models/nope", b"", {}, 404, "unknown model"),
    ("ready of unknown version", "GET /v2/models/digits/versions/7/ready", b"", {}, 404, "no version '7' loaded"),
    ("config of unknown model", "GET /v2/models/nope/config", b"", {}, 404, "unknown model"),
    ("statistics of unknown model", "GET /v2/models/nope/stats", b"", {}, 404, "unknown model"),
    ("statistics of unknown version", "GET /v2/models/digits/versions/7/stats", b"", {}, 404, "no version '7' loaded"),
    ("load unknown model", "/v2/repository/models/nope/load", b"", {}, 404, "not in the repository"),
    ("unload unknown model", "/v2/repository/models/nope/unload", b"", {}, 404, "not loaded"),
    (
        "bad routing",
        "PUT /v2/models/digits/routing",
        json.dumps({"variants": []}).encode(),
        {},
        400,
        "non-empty 'variants'",
    ),
    (
        "routing to a missing version",
        "PUT /v2/models/digits/routing",
        json.dumps({"variants": [{"name": "a", "version": "42", "weight": 1}]}).encode(),
        {},
        400,
        "lacks",
    ),
    ("wrong method", "GET /v2/models/digits/infer", b"", {}, 405, ""),
    ("unknown path", "GET /v2/nothing/here", b"", {}, 404, ""),
]


@pytest.fixture(scope="module")
def small_limit_server(repo, tmp_path_factory):
    from serving import start_server, stop_server

    running = start_server(
        repo, tmp_path_factory.mktemp("limit"), "--max-request-bytes", str(1024 * 1024), "--max-request-rows", "64"
    )
    yield running
    stop_server(running)


@pytest.mark.parametrize("case", REST_CASES, ids=[c[0] for c in REST_CASES])
def test_rest_bad_requests(small_limit_server, case):
    _, target, payload, headers, status, fragment = case
    method, _, path = target.rpartition(" ")
    with small_limit_server.client() as http:
        response = http.request(method or "POST", path, content=payload, headers=headers)
        assert response.status_code == status, response.text
        if fragment:
            assert fragment in response.json()["error"]
        assert http.get("/v2/health/ready").status_code == 200


def _grpc_request(**changes) -> object:
    request = service_pb2.ModelInferRequest(model_name="digits")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[2, 1, 8, 8])
    tensor.contents.fp32_contents.extend(GOOD_X.ravel().tolist())
    for key, value in changes.items():
        value(request) if callable(value) else setattr(request, key, value)
    return request


def _raw(request):
    del request.inputs[0].contents.fp32_contents[:]
    request.raw_input_contents.append(BLOB[:100])


GRPC_CASES = [
    (
        "empty shape numpy cannot hold",
        _grpc_request(
            inputs=lambda r: (  # found by tests/server/test_fuzz.py
                r.inputs[0].ClearField("shape"),
                r.inputs[0].shape.extend([0, 1143, 42280, 57619, 414051]),
                setattr(r.inputs[0], "datatype", "INT64"),
                r.inputs[0].contents.ClearField("fp32_contents"),
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "cannot have shape",
    ),
    ("unknown model", _grpc_request(model_name="nope"), grpc.StatusCode.NOT_FOUND, "unknown model"),
    ("unknown version", _grpc_request(model_version="9"), grpc.StatusCode.NOT_FOUND, "no version '9'"),
    ("empty model name", _grpc_request(model_name=""), grpc.StatusCode.INVALID_ARGUMENT, "model_name is empty"),
    (
        "no inputs",
        _grpc_request(inputs=lambda r: r.ClearField("inputs")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "no inputs",
    ),
    (
        "wrong name",
        _grpc_request(inputs=lambda r: setattr(r.inputs[0], "name", "image")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "unknown input",
    ),
    (
        "unknown datatype",
        _grpc_request(inputs=lambda r: setattr(r.inputs[0], "datatype", "FP99")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "unsupported datatype",
    ),
    (
        "FP16 in contents",
        _grpc_request(inputs=lambda r: setattr(r.inputs[0], "datatype", "FP16")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "raw_input_contents",
    ),
    (
        "wrong count",
        _grpc_request(inputs=lambda r: r.inputs[0].contents.fp32_contents.append(1.0)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "has 129 values",
    ),
    (
        "negative dim",
        _grpc_request(inputs=lambda r: r.inputs[0].shape.__setitem__(0, -2)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "negative dimension",
    ),
    ("raw bytes short", _grpc_request(inputs=_raw), grpc.StatusCode.INVALID_ARGUMENT, "100 bytes"),
    (
        "raw count mismatch",
        _grpc_request(inputs=lambda r: r.raw_input_contents.extend([b"", b""])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "2 raw_input_contents for 1 inputs",
    ),
    (
        "unknown output",
        _grpc_request(outputs=lambda r: r.outputs.add(name="logits")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "unknown output",
    ),
    (
        "shape overflowing int64",
        _grpc_request(inputs=lambda r: (r.inputs[0].shape.__setitem__(0, 4611686018427387904), _raw(r))),
        grpc.StatusCode.INVALID_ARGUMENT,
        "dimension over",
    ),
]


@pytest.mark.parametrize("case", GRPC_CASES, ids=[c[0] for c in GRPC_CASES])
def test_grpc_bad_requests(server, case):
    _, request, code, fragment = case
    with grpc.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request, timeout=30)
        assert caught.value.code() == code
        assert fragment in caught.value.details()
        assert stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=30).ready


def test_grpc_unknown_model_metadata(server):
    with grpc.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="nope"), timeout=30)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


ROWS = np.zeros((65, 1, 8, 8), np.float32)
LIMIT_CASES = [
    # just over --max-request-bytes, gRPC answers as REST does: the size, the limit, the option
    (
        "bytes",
        _grpc_request(inputs=lambda r: r.raw_input_contents.append(b"\0" * (1024 * 1024 + 10))),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "exceeds the limit of 1048576 bytes (the server's --max-request-bytes)",
    ),
    (
        "rows",
        _grpc_request(
            inputs=lambda r: (
                r.inputs[0].ClearField("shape"),
                r.inputs[0].shape.extend(ROWS.shape),
                r.inputs[0].contents.ClearField("fp32_contents"),
                r.raw_input_contents.append(ROWS.tobytes()),
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "request of 65 rows exceeds the limit of 64 (send it in smaller batches, or raise --max-request-rows)",
    ),
]


@pytest.mark.parametrize("case", LIMIT_CASES, ids=[c[0] for c in LIMIT_CASES])
def test_grpc_requests_over_a_limit_get_the_limit_and_the_option(small_limit_server, case):
    _, request, code, fragment = case
    with grpc.insecure_channel(small_limit_server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request, timeout=30)
        assert caught.value.code() == code
        assert fragment in caught.value.details()
        assert stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=30).ready


UNDECODABLE = [b"\x0a\xff\xff\xff\xff\x07abc", b"\xff" * 16, b"\x12\x05ab"]  # bad varint, bad tag, truncated


@pytest.mark.parametrize("method", ["ModelInfer", "ModelMetadata", "ModelReady", "RepositoryIndex"])
def test_undecodable_grpc_bytes_are_invalid_argument_with_no_traceback(server, method):
    with grpc.insecure_channel(server.grpc) as channel:
        call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")  # raw bytes both ways
        for raw in UNDECODABLE:
            with pytest.raises(grpc.RpcError) as caught:
                call(raw, timeout=30)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
            assert "not a valid inference" in caught.value.details()
    log = server.log.read_text()
    assert "DecodeError" not in log and "Traceback" not in log


def test_ready_of_an_unknown_model_or_version_is_not_found(server):
    """A load balancer reads 503 as an unhealthy server: an unknown name is the client's mistake."""
    with server.client() as client:
        for path in ("/v2/models/AAA/ready", "/v2/models/digits/versions/AAA/ready"):
            reply = client.get(path)
            assert reply.status_code == 404, (path, reply.text)
        assert client.get("/v2/models/digits/ready").status_code == 200
    with grpc.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelReady(service_pb2.ModelReadyRequest(name="AAA"), timeout=30)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert stub.ModelReady(service_pb2.ModelReadyRequest(name="digits"), timeout=30).ready


def test_a_client_that_leaves_mid_body_is_one_info_line(server):
    import socket
    import time

    host, port = server.http.removeprefix("http://").split(":")
    before = server.log.read_text()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n" + b'{"inputs": [' + b" " * 1000
        )
    server.wait_for(lambda: "disconnected" in server.log.read_text()[len(before) :], what="the disconnect's log line")
    time.sleep(0.2)  # any traceback would follow the line at once
    added = server.log.read_text()[len(before) :]
    assert "Traceback" not in added and "ERROR" not in added and added.count("disconnected") == 1
    with server.client() as client:
        assert client.get("/v2/health/ready").status_code == 200


def test_refused_oversized_grpc_messages_do_not_grow_memory(repo, tmp_path):
    """gRPC's own receive limit sits just above --max-request-bytes: a message far over it is refused
    before it is buffered. At twice the limit, eight such messages grew the server by about 850 MB
    for good (about 106 MB each: every message held whole). Now only a prefix of each is read before
    the refusal, and glibc may keep what it freed for reuse (server/memory.py keeps request-sized
    buffers: up to 64 MB free per heap; each message here is larger than the last, the worst case
    for reuse): measured 5-110 MB for eight after four, under load. Eight whole messages would be
    at least 528 MB. Once the process is quiet, that kept memory is given back too."""
    from serving import start_server, stop_server

    def rss_mb(pid: int) -> float:
        return int(open(f"/proc/{pid}/status").read().split("VmRSS:")[1].split()[0]) / 1024

    def refuse(stub: service_pb2_grpc.GRPCInferenceServiceStub, mb: int) -> None:
        request = _grpc_request(inputs=lambda r: r.raw_input_contents.append(b"\0" * (mb << 20)))
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request, timeout=60)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max" in caught.value.details()

    server = start_server(repo, tmp_path, "--max-request-bytes", str(64 << 20))
    try:
        with grpc.insecure_channel(server.grpc, options=[("grpc.max_send_message_length", -1)]) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            for extra in range(4):  # the heaps' reserve
                refuse(stub, 66 + 3 * extra)
            before = rss_mb(server.process.pid)
            for extra in range(8):
                refuse(stub, 66 + 3 * extra)
            assert stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=30).ready
        grown = rss_mb(server.process.pid) - before
        assert grown < 250  # never the messages themselves (>= 528 MB)
        # and what glibc kept of the prefixes goes back once the process is quiet (no model ran:
        # the release follows growth too, not only runtime calls)
        server.wait_for(
            lambda: rss_mb(server.process.pid) - before < 32, what=f"the server to give back {grown:.0f} MB"
        )
    finally:
        stop_server(server)


@pytest.mark.skipif(
    __import__("shutil").which("prlimit") is None, reason="prlimit (util-linux) sets the server's limit"
)
def test_running_out_of_descriptors_closes_the_excess_quietly_and_recovers(repo, tmp_path):
    """300 idle connections against a 256-descriptor limit: a connection the server has no
    descriptor for is closed at once, unanswered (uvloop's libuv accepts it on a spare descriptor
    and closes it), without a log line for each (asyncio's loop logged its failed accept with a
    traceback on every retry, 39,866 lines in 5 s, until ``logs.OncePerInterval``), and the server
    answers again as soon as descriptors are free."""
    import socket

    import httpx
    from serving import start_server, stop_server

    # one process (the default only below 8 cores): front ends would each have 256 descriptors
    server = start_server(repo, tmp_path, "--frontends", "0", wrapper=("prlimit", "--nofile=256"))
    idle: list[socket.socket] = []
    try:
        # the start-up line names the loop that runs; it is written just after the listeners answer
        server.wait_for(lambda: "uvloop event loop" in server.log.read_text(), what="the start-up line")
        host, port = server.http.removeprefix("http://").split(":")
        for _ in range(300):
            idle.append(socket.create_connection((host, int(port)), timeout=10))
        with pytest.raises(httpx.TransportError):  # closed unanswered: no descriptor left for it
            httpx.get(f"{server.http}/v2/health/ready", timeout=10)
        for sock in idle:
            sock.close()
        idle.clear()
        server.wait_for(server.ready, what="the server to accept again")
        assert server.log.read_text().count("out of system resource") <= 1
        assert len(server.log.read_text().splitlines()) < 20, server.log.read_text()[-2000:]
    finally:
        for sock in idle:
            sock.close()
        stop_server(server)


@pytest.fixture(scope="module")
def large_answers(tmp_path_factory):
    """A repository of two models whose answers outgrow their requests: token ids looked up in a
    table 1,000 wide (8 bytes in, 4,000 out, as a language model's logits), and 'n' ones (an answer
    an input's value sizes)."""
    from onnx_models import ones_model, token_vectors_model

    import unideploy

    work = tmp_path_factory.mktemp("large-answers")
    np.savez(work / "ids.npz", ids=np.array([[1, 2, 3, 4]], np.int64))
    np.savez(work / "n.npz", n=np.array([5], np.int64))
    made = [
        (token_vectors_model(work / "vectors.onnx", 1000), "vectors", "ids.npz"),
        (ones_model(work / "ones.onnx"), "ones", "n.npz"),
    ]
    for model, name, example in made:
        unideploy.export(model, work / "repo" / name / "1", example_inputs=str(work / example)).close()
    return work / "repo"


def test_an_answer_over_max_response_bytes_is_refused_before_the_model_runs_or_before_it_is_encoded(
    large_answers, tmp_path
):
    """A request whose answer the signature says would pass --max-response-bytes is refused before
    any runtime call, naming the output and the option (400 / RESOURCE_EXHAUSTED); one under it is
    answered. An answer whose size is the model's own (n ones) is refused once computed, before it
    is encoded; the server serves on."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from serving import start_server, stop_server
    from tritonclient.utils import InferenceServerException

    server = start_server(large_answers, tmp_path, "--max-response-bytes", "1000000")
    try:
        http = httpclient.InferenceServerClient(server.http.removeprefix("http://"))
        grpc_client = grpcclient.InferenceServerClient(server.grpc)

        def infer(module, client, model: str, name: str, value: np.ndarray) -> np.ndarray:
            given = module.InferInput(name, list(value.shape), "INT64")
            given.set_data_from_numpy(value)
            return client.infer(model, [given]).as_numpy("vectors" if model == "vectors" else "ones")

        ids = np.full((1, 250), 7, np.int64)  # 1,000,000 bytes of answer: at the limit
        np.testing.assert_array_equal(infer(httpclient, http, "vectors", "ids", ids), np.full((1, 250, 1000), 7.0))
        long = np.full((2, 200), 7, np.int64)  # 1,600,000 bytes
        said = (
            "the answer would hold 1600000 bytes, over the limit of 1000000 bytes (the server's --max-response-bytes)"
        )
        with pytest.raises(InferenceServerException) as refused:
            infer(httpclient, http, "vectors", "ids", long)
        assert "[400]" in str(refused.value) and said in str(refused.value)
        assert "its largest output, 'vectors', is [2, 200, 1000] float32, 1600000 bytes" in str(refused.value)
        with pytest.raises(InferenceServerException) as refused:
            infer(grpcclient, grpc_client, "vectors", "ids", long)
        assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED" and said in refused.value.message()
        with server.client() as client:
            metrics = client.get("/metrics").text
        ran = [line for line in metrics.splitlines() if line.startswith('unideploy_batch_rows_count{model="vectors"')]
        assert ran == ['unideploy_batch_rows_count{model="vectors",version="1"} 1.0']  # the good request only
        assert len(infer(httpclient, http, "ones", "n", np.array([250_000], np.int64))) == 250_000
        with pytest.raises(InferenceServerException, match=r"\[400\] the answer holds 1000004 bytes, over the limit"):
            infer(httpclient, http, "ones", "n", np.array([250_001], np.int64))
        assert http.is_server_ready()
    finally:
        stop_server(server)


def test_a_run_over_max_run_memory_is_refused_and_the_server_keeps_its_memory(large_answers, tmp_path):
    """Eight bytes asking the model for 200 MB (n ones) against --max-run-memory 100 MB: the run's
    arena refuses the block, answered 400 / RESOURCE_EXHAUSTED naming the size and the option
    (ONNX Runtime's allocation failure was a 500 before; without the cap, 12 GB asked the same way
    would be allocated and filled), the server's memory never near it; smaller runs answer."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from serving import start_server, stop_server
    from tritonclient.utils import InferenceServerException

    def rss_mb(pid: int) -> float:
        return int(open(f"/proc/{pid}/status").read().split("VmHWM:")[1].split()[0]) / 1024

    server = start_server(large_answers, tmp_path, "--max-run-memory", str(100 * 1000 * 1000))
    try:
        http = httpclient.InferenceServerClient(server.http.removeprefix("http://"))
        grpc_client = grpcclient.InferenceServerClient(server.grpc)

        def ones(module, client, n: int) -> np.ndarray:
            given = module.InferInput("n", [1], "INT64")
            given.set_data_from_numpy(np.array([n], np.int64))
            return client.infer("ones", [given]).as_numpy("ones")

        assert len(ones(httpclient, http, 1_000_000)) == 1_000_000
        said = "needs a block of 200000000 bytes, where its runs may hold"
        with pytest.raises(InferenceServerException) as refused:
            ones(httpclient, http, 50_000_000)
        assert "[400]" in str(refused.value) and said in str(refused.value)
        assert "(at most 100000000 at once: the server's --max-run-memory)" in str(refused.value)
        with pytest.raises(InferenceServerException) as refused:
            ones(grpcclient, grpc_client, 3_000_000_000)  # 12 GB
        assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "needs a block of 12000000000 bytes" in refused.value.message()
        assert len(ones(grpcclient, grpc_client, 10_000_000)) == 10_000_000
        assert rss_mb(server.process.pid) < 400  # the peak: never the 200 MB or 12 GB asked for
    finally:
        stop_server(server)


def test_an_answer_past_what_one_grpc_message_carries_is_refused_naming_the_ways_that_can(large_answers, tmp_path):
    """With --max-response-bytes raised past 2 GiB, an answer of 2.16 GB (n ones) cannot be one gRPC
    message (protobuf's limit; serializing it failed with UNKNOWN and a traceback): refused with
    RESOURCE_EXHAUSTED naming REST and shared memory, the server serving on."""
    import tritonclient.grpc as grpcclient
    from serving import start_server, stop_server
    from tritonclient.utils import InferenceServerException

    server = start_server(large_answers, tmp_path, "--max-response-bytes", str(3 << 30))
    try:
        client = grpcclient.InferenceServerClient(server.grpc)
        given = grpcclient.InferInput("n", [1], "INT64")
        given.set_data_from_numpy(np.array([540_000_000], np.int64))
        with pytest.raises(InferenceServerException) as refused:
            client.infer("ones", [given])
        assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "the answer holds 2160000000 bytes, more than one gRPC message can carry" in refused.value.message()
        assert client.is_server_ready() and "Traceback" not in server.log.read_text()
    finally:
        stop_server(server)


def test_grpc_calls_beyond_max_connections_are_refused_at_once(large_answers, tmp_path):
    """--max-connections bounds gRPC calls in the server at once as it bounds REST connections: with
    two streams open (each a call while it lasts) and a limit of 2, a third call is answered
    RESOURCE_EXHAUSTED at once instead of being read into memory; once they close, calls are served."""
    import grpc
    from serving import start_server, stop_server

    server = start_server(large_answers, tmp_path, "--max-connections", "2")
    try:
        with grpc.insecure_channel(server.grpc) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            request = service_pb2.ModelInferRequest(model_name="ones", id="x")
            request.inputs.add(name="n", datatype="INT64", shape=[1])
            request.raw_input_contents.append(np.array([3], np.int64).tobytes())
            held = [stub.ModelStreamInfer(iter([request] * 1000 * 1000)) for _ in range(2)]  # never finish
            for stream in held:
                assert next(stream).infer_response.id == "x"  # each is running
            with pytest.raises(grpc.RpcError) as caught:
                stub.ModelInfer(request, timeout=30)
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            for stream in held:
                stream.cancel()
            answered: list = []

            def served() -> bool:  # once the server has let go of the cancelled calls (the transport says so)
                try:
                    answered.append(stub.ModelInfer(request, timeout=30))
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                return bool(answered)

            server.wait_for(served, what="the cancelled streams' slots")
            assert np.frombuffer(answered[0].raw_output_contents[0], np.float32).tolist() == [1.0, 1.0, 1.0]
    finally:
        stop_server(server)
