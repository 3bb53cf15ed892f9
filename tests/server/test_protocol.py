"""Real clients nobody here wrote (tritonclient HTTP and gRPC) against the server: metadata and
inference must match what `deploy run` computes from the same package."""

from __future__ import annotations

import numpy as np
import pytest

import unideploy

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient is in the dev extra")
grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient is in the dev extra")


@pytest.fixture(scope="module")
def images(digits) -> np.ndarray:
    with np.load(digits["data"]) as data:
        return np.ascontiguousarray(data["x"][:5])


@pytest.fixture(scope="module")
def expected(digits, images) -> np.ndarray:
    return unideploy.run(digits["package"], {"x": images})["output"]


def test_health_and_metadata_over_http(server):
    client = httpclient.InferenceServerClient(server.http.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("digits") and client.is_model_ready("digits", "1")
    assert client.get_server_metadata()["name"] == "unideploy"
    meta = client.get_model_metadata("digits")
    assert meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    assert meta["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 10]}]
    config = client.get_model_config("digits")
    assert config["max_batch_size"] == 32 and config["input"][0]["dims"] == [1, 8, 8]
    assert config["instance_group"] == [{"count": 1, "kind": "KIND_CPU"}]  # one batch at a time on the CPU


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_http_infer_matches_deploy_run(server, images, expected, binary):
    client = httpclient.InferenceServerClient(server.http.removeprefix("http://"))
    tensor = httpclient.InferInput("x", list(images.shape), "FP32")
    tensor.set_data_from_numpy(images, binary_data=binary)
    output = httpclient.InferRequestedOutput("output", binary_data=binary)
    result = client.infer("digits", [tensor], outputs=[output])
    np.testing.assert_array_equal(result.as_numpy("output"), expected)
    assert result.get_response()["model_version"] == "1"


def test_http_infer_with_client_defaults(server, images, expected):
    client = httpclient.InferenceServerClient(server.http.removeprefix("http://"))
    tensor = httpclient.InferInput("x", list(images.shape), "FP32")
    tensor.set_data_from_numpy(images)
    np.testing.assert_array_equal(client.infer("digits", [tensor]).as_numpy("output"), expected)


def test_grpc_metadata_and_infer_match(server, images, expected):
    client = grpcclient.InferenceServerClient(server.grpc)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("digits")
    meta = client.get_model_metadata("digits", as_json=True)
    assert meta["inputs"][0]["name"] == "x" and meta["inputs"][0]["shape"] == ["-1", "1", "8", "8"]
    config = client.get_model_config("digits", as_json=True)["config"]
    assert config["max_batch_size"] == 32 and config["instance_group"] == [{"count": 1, "kind": "KIND_CPU"}]
    tensor = grpcclient.InferInput("x", list(images.shape), "FP32")
    tensor.set_data_from_numpy(images)
    result = client.infer("digits", [tensor], outputs=[grpcclient.InferRequestedOutput("output")])
    np.testing.assert_array_equal(result.as_numpy("output"), expected)
    assert result.get_response().model_version == "1"


def test_grpc_tensors_at_any_alignment_in_the_message_are_answered_alone_and_merged(server, images, expected):
    """A raw tensor lies wherever the message's other fields put it (here the request id's length
    moves it through every offset modulo 4: unaligned in three of five requests), and is read where it lies or copied once, into the
    merged batch, a front end's slot or an array of its own (``server.unread.Unaligned``). Each
    image sent alone, then 40 sent at once so that they merge: every answer is its own image's."""
    import functools
    import threading

    client = grpcclient.InferenceServerClient(server.grpc)

    def request(index: int) -> tuple[str, list]:
        tensor = grpcclient.InferInput("x", [1, *images.shape[1:]], "FP32")
        tensor.set_data_from_numpy(images[index % 5 : index % 5 + 1])
        return "x" * (index % 5), [tensor]  # ids of 0-4 bytes (fields of 0, 3-6): every offset modulo 4

    for index in range(8):
        request_id, inputs = request(index)
        answer = client.infer("digits", inputs, request_id=request_id).as_numpy("output")
        np.testing.assert_array_equal(answer, expected[index % 5 : index % 5 + 1])
    answers: dict[int, np.ndarray] = {}
    done = threading.Event()

    def answered(index: int, result, error) -> None:
        answers[index] = error if error is not None else result.as_numpy("output")
        if len(answers) == 40:
            done.set()

    for index in range(40):
        request_id, inputs = request(index)
        client.async_infer("digits", inputs, functools.partial(answered, index), request_id=request_id)
    assert done.wait(60)
    for index, answer in answers.items():
        np.testing.assert_array_equal(answer, expected[index % 5 : index % 5 + 1])


def test_repository_index_over_both_protocols(server):
    index = httpclient.InferenceServerClient(server.http.removeprefix("http://")).get_model_repository_index()
    assert {"name": "digits", "version": "1", "state": "READY", "reason": ""} in index
    grpc_index = grpcclient.InferenceServerClient(server.grpc).get_model_repository_index(as_json=True)
    assert grpc_index["models"][0]["state"] == "READY"


def test_metrics_count_requests(server, images):
    client = httpclient.InferenceServerClient(server.http.removeprefix("http://"))
    tensor = httpclient.InferInput("x", list(images.shape), "FP32")
    tensor.set_data_from_numpy(images)
    client.infer("digits", [tensor])
    with server.client() as http:
        text = http.get("/metrics").text
    assert 'unideploy_requests_total{model="digits",protocol="rest",variant="",version="1"}' in text
    for stage in ("decode", "queue", "compute", "encode", "total"):  # where a request's server time goes
        assert (
            f'unideploy_request_duration_seconds_count{{model="digits",stage="{stage}",variant="",version="1"}}' in text
        ), stage
    assert 'unideploy_model_ready{model="digits",version="1"} 1.0' in text


def test_every_message_and_method_of_our_proto_is_tritons():
    """Clients built on Triton's protos (tritonclient, perf_analyzer) read our answers by field
    number: each message of ours has the name, number, type and label of Triton's field by field
    (ours may leave fields out), and each RPC Triton's request and response types. Both protos
    declare package ``inference``, which one descriptor pool cannot hold twice: ours is read in a
    process of its own."""
    import subprocess
    import sys

    from google.protobuf import descriptor_pb2
    from tritonclient.grpc import service_pb2

    ours = descriptor_pb2.FileDescriptorProto.FromString(
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from unideploy.server.protocol import grpc_predict_v2_pb2 as p; "
                "sys.stdout.buffer.write(p.DESCRIPTOR.serialized_pb)",
            ],
            capture_output=True,
            check=True,
        ).stdout
    )
    pool = service_pb2.DESCRIPTOR.pool

    def messages(found, prefix):
        for message in found:
            yield f"{prefix}.{message.name}", message
            yield from messages(message.nested_type, f"{prefix}.{message.name}")

    checked = set()
    for name, message in messages(ours.message_type, ours.package):
        theirs = {f.name: (f.number, f.type, f.label) for f in pool.FindMessageTypeByName(name).fields}
        for field in message.field:
            assert theirs.get(field.name) == (field.number, field.type, field.label), f"{name}.{field.name}"
        checked.add(name)
    assert {"inference.ModelInferRequest", "inference.ModelStatistics", "inference.InferBatchStatistics"} <= checked
    (service,) = ours.service
    triton = pool.FindServiceByName(f"{ours.package}.{service.name}")
    for method in service.method:
        found = triton.methods_by_name[method.name]
        assert (f".{found.input_type.full_name}", f".{found.output_type.full_name}") == (
            method.input_type,
            method.output_type,
        ), method.name
