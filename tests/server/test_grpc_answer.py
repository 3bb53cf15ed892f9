"""A ModelInferResponse written with its tensors appended reads, with tritonclient's own messages
(Triton's proto, protobuf's parser), as the message protobuf would have built: every output, in
order, whatever its size or layout. (Our proto's module is not imported here: both declare package
``inference``, which one descriptor pool cannot hold twice; test_protocol checks they agree.)"""

from __future__ import annotations

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from unideploy.server import codec, grpc_answer


def _outputs() -> list[np.ndarray]:
    return [
        np.arange(6, dtype=np.float32).reshape(2, 3),  # a length of one varint byte
        np.arange(200, dtype=np.int64),  # two bytes (1,600)
        np.zeros(0, np.float32),  # an empty blob keeps its place
        np.arange(6, dtype=">f4").reshape(3, 2).T,  # big-endian and strided: written as its bytes
        np.array(["ab", "ç"]),  # text: length-prefixed
        np.ones((5, 1000, 10), np.float32),  # 200,000 bytes: three varint bytes
    ]


def _message(outputs: list[np.ndarray]) -> pb.ModelInferResponse:
    message = pb.ModelInferResponse(model_name="m", model_version="2", id="request-7")
    message.parameters["variant"].string_param = "b"
    for index, array in enumerate(outputs):
        message.outputs.add(name=f"out{index}", datatype=codec.v2_datatype(array), shape=list(array.shape))
    return message


def test_an_answer_reads_as_the_message_protobuf_builds():
    outputs = _outputs()
    expected = _message(outputs)
    expected.raw_output_contents.extend(codec.to_bytes(array) for array in outputs)
    wire = grpc_answer.infer_response(_message(outputs), [codec.to_buffer(array) for array in outputs])
    assert pb.ModelInferResponse.FromString(wire) == expected
    assert wire == b"".join(  # the only difference from protobuf's own bytes is the raw entries' place
        [_message(outputs).SerializeToString()]
        + [pb.ModelInferResponse(raw_output_contents=[codec.to_bytes(a)]).SerializeToString() for a in outputs]
    )


def test_a_streamed_answer_reads_as_the_stream_message_holding_it():
    outputs = _outputs()
    expected = _message(outputs)
    expected.raw_output_contents.extend(codec.to_bytes(array) for array in outputs)
    wire = grpc_answer.infer_response(_message(outputs), [codec.to_buffer(array) for array in outputs], streamed=True)
    assert pb.ModelStreamInferResponse.FromString(wire) == pb.ModelStreamInferResponse(infer_response=expected)


def test_the_serializer_passes_wire_bytes_on_and_serializes_any_other_message():
    serialize = grpc_answer.serializer(pb.ModelStreamInferResponse)
    error = pb.ModelStreamInferResponse(error_message="no such model")
    assert serialize(error) == error.SerializeToString()
    assert serialize(b"\x12\x00") == b"\x12\x00"
