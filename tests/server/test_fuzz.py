"""Fuzzing the protocol: whatever a client sends, well-formed or not, the answer is never a 5xx
(REST; 503 only where the description gives it: not ready) or UNKNOWN/INTERNAL (gRPC), and the
server stays healthy. REST: schemathesis generates
requests from the server's own OpenAPI description (unideploy/server/openapi.yaml), including ones
that break it. gRPC: hypothesis builds ModelInferRequest messages field by field. Both bounded in
examples and time."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is in the dev extra")
hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is in the dev extra")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2", reason="tritonclient is in the dev extra")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tritonclient.grpc import service_pb2_grpc  # noqa: E402

import unideploy.server  # noqa: E402

SPEC = Path(unideploy.server.__file__).parent / "openapi.yaml"
EXAMPLES = 40  # per REST operation and mode; the gRPC fuzz runs GRPC_EXAMPLES messages
GRPC_EXAMPLES = 300
GRPC_OK = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.FAILED_PRECONDITION,
}


def operations() -> list:
    schema = schemathesis.openapi.from_path(str(SPEC))
    # the repository's load/unload would take the model away from the rest of the run
    return [
        r.ok()
        for r in schema.get_all_operations()
        if r.ok().definition.raw.get("operationId") not in ("repositoryModelLoad", "repositoryModelUnload")
    ]


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_rest_never_answers_5xx(server, mode):
    """Valid requests (positive) and requests that break the description (negative), for every
    operation. Model names are drawn from the spec's strings: mostly unknown models (404), so half
    the cases are sent to the served model instead, for bodies to reach the decoder and its checks."""
    failures: list[str] = []
    for operation in operations():
        declared = set(operation.definition.raw["responses"])  # 503 is an answer where the spec gives it (not ready)

        @given(case=operation.as_strategy(schemathesis.GenerationMode(mode)))
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case) -> None:
            if "model" in (case.path_parameters or {}) and len(str(case.path_parameters["model"])) % 2:
                case.path_parameters["model"] = "digits"
            response = case.call(base_url=server.http, timeout=30)
            if response.status_code >= 500 and str(response.status_code) not in declared:  # noqa: B023 (run now)
                failures.append(f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:300]}")

        try:
            run()
        except hypothesis.errors.Unsatisfiable:  # nothing of it to break (no parameters, no body)
            assert mode == "negative"
    assert not failures, "\n".join(failures[:10])
    with server.client() as http:
        assert http.get("/v2/health/ready").status_code == 200


TENSOR_FIELDS = (
    "bool_contents",
    "int_contents",
    "int64_contents",
    "uint_contents",
    "uint64_contents",
    "fp32_contents",
    "fp64_contents",
    "bytes_contents",
)
DATATYPES = st.sampled_from(
    ["BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64", "UINT64", "FP16", "FP32", "FP64", "BYTES"]
) | st.text(max_size=8)
SHAPES = st.lists(st.integers(min_value=-2, max_value=2**62) | st.integers(min_value=0, max_value=16), max_size=6)


@st.composite
def infer_requests(draw) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(
        model_name=draw(st.sampled_from(["digits", "nope"]) | st.text(max_size=12)),
        model_version=draw(st.sampled_from(["", "1", "2", "01", "-1"]) | st.text(max_size=4)),
        id=draw(st.text(max_size=8)),
    )
    for _ in range(draw(st.integers(0, 3))):
        tensor = request.inputs.add(
            name=draw(st.sampled_from(["x", "y"]) | st.text(max_size=6)), datatype=draw(DATATYPES), shape=draw(SHAPES)
        )
        field = draw(st.sampled_from((*TENSOR_FIELDS, "raw")))
        count = draw(st.integers(0, 140))
        if field == "raw":
            request.raw_input_contents.append(draw(st.binary(max_size=600)))
        elif field == "bytes_contents":
            tensor.contents.bytes_contents.extend(draw(st.lists(st.binary(max_size=8), max_size=count)))
        elif field == "bool_contents":
            tensor.contents.bool_contents.extend([bool(i % 2) for i in range(count)])
        elif field in ("fp32_contents", "fp64_contents"):
            getattr(tensor.contents, field).extend(draw(st.lists(st.floats(width=32), min_size=count, max_size=count)))
        else:
            getattr(tensor.contents, field).extend(range(count))
        if draw(st.booleans()):
            tensor.parameters["binary_data_size"].int64_param = draw(st.integers(-1, 2**40))
    for _ in range(draw(st.integers(0, 2))):
        request.outputs.add(name=draw(st.sampled_from(["output", "other"]) | st.text(max_size=6)))
    if draw(st.booleans()):  # a valid tensor beside the noise, so some requests reach the model
        good = request.inputs.add(name="x", datatype="FP32", shape=[1, 1, 8, 8])
        good.contents.fp32_contents.extend([0.5] * 64)
    return request


def test_grpc_never_answers_unknown_or_internal(server):
    with grpc.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

        @given(infer_requests())
        @settings(max_examples=GRPC_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def fuzz(request) -> None:
            try:
                stub.ModelInfer(request, timeout=30)
            except grpc.RpcError as exc:
                assert exc.code() in GRPC_OK, f"{exc.code()}: {exc.details()} for {request}"[:2000]

        fuzz()
        assert stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=30).ready
