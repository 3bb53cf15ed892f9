"""A ModelInferRequest read with its raw tensors left where they lie (server/grpc_request.py): the
same message protobuf parses, its tensors views of the received bytes, whatever the fields' order;
bytes that are no message refused with protobuf's own DecodeError, and any bytes read as protobuf
reads them (hypothesis). Built with tritonclient's
messages (Triton's proto, which ours matches: test_protocol)."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from unideploy.server.grpc_request import infer_call_parser

parse = infer_call_parser(pb.ModelInferRequest)


def _request(raw: list[bytes]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", model_version="3", id="request-1")
    request.parameters["sequence_id"].int64_param = 12
    for index in range(len(raw) or 1):
        tensor = request.inputs.add(name=f"in{index}", datatype="FP32", shape=[1, 3])
        tensor.parameters["binary_data_size"].int64_param = 12
    request.outputs.add(name="out")
    request.raw_input_contents.extend(raw)
    return request


def _without_raw(request: pb.ModelInferRequest) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest()
    message.CopyFrom(request)
    del message.raw_input_contents[:]
    return message


def test_raw_tensors_are_views_of_the_received_bytes_and_the_rest_is_protobufs_message():
    raw = [np.arange(3, dtype=np.float32).tobytes(), b"", np.ones(50_000, np.float32).tobytes()]  # 200 KB
    request = _request(raw)
    data = request.SerializeToString()
    call = parse(data)
    assert call.message == _without_raw(request)
    assert [bytes(view) for view in call.raw] == raw
    assert all(view.obj is data for view in call.raw)  # not copied


def test_fields_in_any_order_read_the_same():
    """Protobuf lets a message's fields come in any order and a repeated field's entries apart."""
    raw = [b"\x01" * 12, b"\x02" * 300]
    request = _request(raw)
    data = (
        pb.ModelInferRequest(raw_input_contents=raw[:1]).SerializeToString()
        + _without_raw(request).SerializeToString()
        + pb.ModelInferRequest(raw_input_contents=raw[1:]).SerializeToString()
    )
    call = parse(data)
    assert pb.ModelInferRequest.FromString(data) == request
    assert call.message == _without_raw(request) and [bytes(view) for view in call.raw] == raw


def test_a_request_without_raw_tensors_is_protobufs_message():
    request = _request([])
    request.inputs[0].contents.fp32_contents.extend([1.0, 2.0, 3.0])
    call = parse(request.SerializeToString())
    assert call.message == request and call.raw == []


@pytest.mark.parametrize(
    "data",
    [
        b"\x0a\xff",  # a name whose length runs past the message
        b"\x3a\x05ab",  # a raw tensor of 5 bytes with 2
        b"\xff" * 11,  # a varint past 10 bytes
        b"\x0b",  # a group's start
    ],
)
def test_bytes_that_are_no_message_are_refused_with_protobufs_words(data):
    with pytest.raises(DecodeError, match="Error parsing message"):
        parse(data)


def test_any_bytes_read_as_protobuf_reads_them():
    """Messages built field by field, then cut short, grown or changed at one byte (hypothesis,
    bounded): wherever protobuf refuses the bytes this refuses them, and wherever it reads them
    this reads the same fields and the same raw tensors."""
    hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is in the dev extra")
    from hypothesis import strategies as st

    text = st.text(max_size=8)
    request = st.builds(
        lambda name, rid, names, raw, params: _built(name, rid, names, raw, params),
        text,
        text,
        st.lists(text, max_size=3),
        st.lists(st.binary(max_size=300), max_size=3),
        st.dictionaries(text, st.integers(-(2**63), 2**63 - 1), max_size=2),
    )
    mutated = st.tuples(request, st.integers(0, 2), st.integers(0, 10_000), st.binary(min_size=1, max_size=4))

    @hypothesis.settings(max_examples=400, deadline=None, database=None)
    @hypothesis.given(mutated)
    def check(case):
        data, how, where, extra = case
        where %= len(data) + 1
        data = [data[:where], data[:where] + extra + data[where:], _changed(data, where, extra)][how]
        try:
            full = pb.ModelInferRequest.FromString(data)
        except DecodeError:
            with pytest.raises(DecodeError):
                parse(data)
            return
        call = parse(data)
        assert call.message == _without_raw(full)
        assert [bytes(view) for view in call.raw] == list(full.raw_input_contents)

    check()


def _built(name: str, rid: str, names: list[str], raw: list[bytes], params: dict[str, int]) -> bytes:
    request = pb.ModelInferRequest(model_name=name, id=rid, raw_input_contents=raw)
    for key, value in params.items():
        request.parameters[key].int64_param = value
    for tensor in names:
        request.inputs.add(name=tensor, datatype="FP32", shape=[1, 3])
    return request.SerializeToString()


def _changed(data: bytes, where: int, extra: bytes) -> bytes:
    """``data`` with the byte at ``where`` replaced by ``extra``'s first (where there is one)."""
    return data[:where] + extra[:1] + data[where + 1 :] if where < len(data) else data + extra
