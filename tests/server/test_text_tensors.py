"""BYTES tensors over both protocols: text in and out of a served model, with tritonclient's own
encodings (JSON strings, the binary extension, gRPC bytes_contents and raw contents, system shared
memory), and malformed text answered 400 / INVALID_ARGUMENT."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from serving import start_server, stop_server

tritonclient = pytest.importorskip("tritonclient", reason="the dev extra is not installed")
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
import tritonclient.utils.shared_memory as shm  # noqa: E402
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size  # noqa: E402


@pytest.fixture(scope="module")
def text_server(text_packages, tmp_path_factory):
    repo = tmp_path_factory.mktemp("text-repo")
    for name, package in text_packages.items():
        shutil.copytree(package, repo / name / "1")
    running = start_server(repo, tmp_path_factory.mktemp("text-server"))
    yield running
    stop_server(running)


def _clients(server):
    return {
        "http": httpclient.InferenceServerClient(server.http.removeprefix("http://")),
        "grpc": grpcclient.InferenceServerClient(server.grpc),
    }


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("binary", [True, False])
def test_text_in_and_out_with_tritonclient(text_server, text_models, protocol, binary):
    module = httpclient if protocol == "http" else grpcclient
    client = _clients(text_server)[protocol]
    truth = np.load(text_models["truth"])
    features = module.InferInput("X", [150, 4], "FP32")
    features.set_data_from_numpy(truth["features"], **({"binary_data": binary} if protocol == "http" else {}))
    wanted = module.InferRequestedOutput("label", **({"binary_data": binary} if protocol == "http" else {}))
    labels = client.infer("labels", [features], outputs=[wanted]).as_numpy("label")
    assert labels.dtype == object and (labels.astype(str) == truth["species"]).mean() > 0.95

    species = module.InferInput("species", [2, 1], "BYTES")
    names = np.array([["setosa"], ["virginica"]], dtype=object)
    species.set_data_from_numpy(names, **({"binary_data": binary} if protocol == "http" else {}))
    lengths = client.infer("species", [species]).as_numpy("variable")[:, 0]
    assert lengths[0] < 2.0 < 5.0 < lengths[1]
    metadata = client.get_model_metadata("species")
    datatype = metadata["inputs"][0]["datatype"] if protocol == "http" else metadata.inputs[0].datatype
    assert datatype == "BYTES"
    config = client.get_model_config("species")  # Triton's configuration calls text TYPE_STRING
    if protocol == "http":
        assert config["input"][0]["data_type"] == "TYPE_STRING"
    else:
        assert grpcclient.model_config_pb2.DataType.Name(config.config.input[0].data_type) == "TYPE_STRING"


def test_malformed_text_is_refused_with_its_reason(text_server):
    with text_server.client() as client:
        cases = [
            ({"name": "species", "shape": [2, 1], "datatype": "BYTES", "data": ["setosa", 3]}, "holds int values"),
            (
                {"name": "species", "shape": [3, 1], "datatype": "BYTES", "data": ["setosa", "x"]},
                "has 2 BYTES elements",
            ),
            ({"name": "species", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}, "expected string"),
        ]
        for tensor, said in cases:
            answer = client.post("/v2/models/species/infer", json={"inputs": [tensor]})
            assert answer.status_code == 400 and said in answer.json()["error"], answer.text
        # the binary extension: an element length running past the data, and bytes that are not UTF-8
        for raw, said in (
            (b"\x10\x00\x00\x00abc", "runs past the end"),
            (b"\x02\x00\x00\x00\xff\xfe", "not UTF-8"),
        ):
            header = (
                b'{"inputs":[{"name":"species","shape":[1,1],"datatype":"BYTES",'
                b'"parameters":{"binary_data_size":%d}}]}' % len(raw)
            )
            answer = client.post(
                "/v2/models/species/infer",
                content=header + raw,
                headers={"Inference-Header-Content-Length": str(len(header))},
            )
            assert answer.status_code == 400 and said in answer.json()["error"], answer.text
    species = grpcclient.InferInput("species", [1, 1], "BYTES")
    species._raw_content = b"\x02\x00\x00\x00\xff\xfe"  # what set_data_from_numpy writes, with non-UTF-8 bytes
    with pytest.raises(InferenceServerException, match="not UTF-8") as caught:
        _clients(text_server)["grpc"].infer("species", [species])
    assert "INVALID_ARGUMENT" in str(caught.value.status())


def test_text_through_system_shared_memory(text_server):
    client = _clients(text_server)["http"]
    names = np.array([["versicolor"], ["setosa"]], dtype=object)
    serialized = serialize_byte_tensor(names)
    size = serialized_byte_size(serialized)
    handle = shm.create_shared_memory_region("text-in", "/unideploy-test-text-in", size)
    try:
        shm.set_shared_memory_region(handle, [serialized])
        client.register_system_shared_memory("text-in", "/unideploy-test-text-in", size)
        species = httpclient.InferInput("species", [2, 1], "BYTES")
        species.set_shared_memory("text-in", size)
        lengths = client.infer("species", [species]).as_numpy("variable")[:, 0]
        assert 3.0 < lengths[0] < 5.0 and lengths[1] < 2.0  # versicolor's petals, then setosa's
    finally:
        client.unregister_system_shared_memory("text-in")
        shm.destroy_shared_memory_region(handle)


def test_text_through_a_front_end_process(text_packages, tmp_path):
    """Front ends hand tensors to the model process through shared-memory slots: text too."""
    repo = tmp_path / "repo"
    shutil.copytree(text_packages["species"], repo / "species" / "1")
    shutil.copytree(text_packages["labels"], repo / "labels" / "1")
    running = start_server(repo, tmp_path, "--frontends", "1")
    try:
        client = _clients(running)["grpc"]
        species = grpcclient.InferInput("species", [2, 1], "BYTES")
        species.set_data_from_numpy(np.array([["setosa"], ["virginica"]], dtype=object))
        lengths = client.infer("species", [species]).as_numpy("variable")[:, 0]
        assert lengths[0] < 2.0 < 5.0 < lengths[1]
        features = grpcclient.InferInput("X", [1, 4], "FP32")
        features.set_data_from_numpy(np.array([[6.9, 3.1, 5.4, 2.1]], np.float32))  # a virginica of iris
        assert client.infer("labels", [features]).as_numpy("label").tolist() == [b"virginica"]
    finally:
        stop_server(running)
