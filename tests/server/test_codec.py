"""Tensors to and from the wire: every datatype both ways, in little-endian byte order, read in place."""

from __future__ import annotations

import numpy as np
import pytest

from unideploy.server import codec


@pytest.mark.parametrize("datatype", sorted(codec.V2_TO_NUMPY))
def test_every_datatype_round_trips_through_raw_bytes(datatype):
    array = np.arange(6).reshape(2, 3).astype(codec.V2_TO_NUMPY[datatype])
    assert codec.v2_datatype(array) == datatype
    back = codec.from_bytes(codec.to_bytes(array), datatype, [2, 3], "x")
    np.testing.assert_array_equal(back, array)


def test_big_endian_and_strided_arrays_go_out_little_endian_and_row_major():
    array = np.arange(6, dtype=">f4").reshape(3, 2).T  # big-endian, not contiguous
    assert codec.v2_datatype(array) == "FP32"
    assert codec.to_bytes(array) == np.ascontiguousarray(array, dtype="<f4").tobytes()


def test_a_memoryview_of_the_body_is_read_in_place():
    """REST's binary tensors are slices of the request body: decoding them copies nothing."""
    body = bytearray(np.arange(4, dtype="<f4").tobytes() * 2)
    array = codec.from_bytes(memoryview(body)[16:], "FP32", [4], "x")
    body[16:20] = np.float32(7).tobytes()
    assert array[0] == 7


def test_only_a_large_json_part_is_decoded_off_the_event_loop():
    """A binary body's tensors are read in place at any size: its JSON header alone decides."""
    from unideploy.server.rest import DECODE_INLINE_BYTES, _decode_off_loop

    large = b"x" * (DECODE_INLINE_BYTES + 1)
    assert _decode_off_loop(large, None)  # all JSON
    assert not _decode_off_loop(large, "120")  # a 120-byte header before binary tensors
    assert _decode_off_loop(large, str(len(large)))
    assert _decode_off_loop(large, "not a number")  # refused later, by the decoder, with its message
