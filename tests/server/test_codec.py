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


def test_an_answer_laid_out_as_the_wire_is_given_as_its_own_memory_and_any_other_as_its_bytes():
    """REST's binary outputs: an array already little-endian and row-major is handed over as its
    memory, copied once, into the body; others (big-endian, strided, text, empty) as ``to_bytes``."""
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    given = codec.to_buffer(array)
    array[0, 0] = 7  # the same memory: nothing was copied
    assert isinstance(given, memoryview) and bytes(given) == codec.to_bytes(array)
    others = [
        np.arange(6, dtype=">f4").reshape(3, 2),
        np.arange(6, dtype=np.float32).reshape(3, 2).T,
        np.array(["ab", "c"]),
        np.zeros((0, 3), np.float32),
    ]
    for other in others:
        assert isinstance(codec.to_buffer(other), bytes) and codec.to_buffer(other) == codec.to_bytes(other)


def test_a_memoryview_of_the_body_is_read_in_place():
    """REST's binary tensors are slices of the request body: decoding them copies nothing."""
    body = bytearray(np.arange(4, dtype="<f4").tobytes() * 2)
    array = codec.from_bytes(memoryview(body)[16:], "FP32", [4], "x")
    body[16:20] = np.float32(7).tobytes()
    assert array[0] == 7


def test_bytes_not_aligned_to_their_type_are_copied_once_where_the_call_wants_them():
    """After a JSON header of odd length (or in a gRPC message) a tensor's bytes start anywhere;
    ONNX Runtime reads such an array element by element (several times slower for an image), so it
    is copied once: into the merged batch, a front end's slot, or an array of its own, whichever
    the call needs (``Unaligned``), and when it leaves the process (pickled) as the aligned array.
    A scalar is copied at once (an input left unread has a dimension)."""
    import pickle

    from unideploy.server.unread import Unaligned

    values = np.arange(12, dtype="<f4")
    body = bytearray(b"{" + values.tobytes())
    found = codec.from_bytes(memoryview(body)[1:], "FP32", [3, 4], "x")
    assert isinstance(found, Unaligned) and (found.shape, found.dtype) == ((3, 4), np.float32)
    rows = np.zeros((5, 4), np.float32)
    found.into(rows[1:4])  # as a merge reads it into its rows
    np.testing.assert_array_equal(rows[1:4], values.reshape(3, 4))
    for array in (found.read(), pickle.loads(pickle.dumps(found))):
        assert isinstance(array, np.ndarray) and array.flags.aligned and array.flags.c_contiguous
        np.testing.assert_array_equal(array, values.reshape(3, 4))
    scalar = codec.from_bytes(memoryview(bytearray(b"{" + values[:1].tobytes()))[1:], "FP32", [], "x")
    assert isinstance(scalar, np.ndarray) and scalar.flags.aligned and scalar == 0


def test_the_json_part_of_a_body_is_all_of_it_or_what_its_header_says():
    """Only the JSON part decides whether decoding leaves the event loop: binary tensors are read in
    place at any size. A header that does not fit the body is refused, whatever its digits."""
    from unideploy.server.errors import BadRequest
    from unideploy.server.rest_decode import DECODE_INLINE_BYTES, json_length

    large = b"x" * (DECODE_INLINE_BYTES + 1)  # all JSON: decoded off the loop; after a 120-byte header: on it
    assert json_length(len(large), "120") <= DECODE_INLINE_BYTES < json_length(len(large), None)
    body = b"x" * 1000
    assert json_length(len(body), None) == 1000
    assert json_length(len(body), "120") == 120 and json_length(len(body), "1000") == 1000
    for header in ("not a number", "1001", "9" * 5000, "\u00b2", "-1"):
        with pytest.raises(BadRequest, match="does not fit"):
            json_length(len(body), header)
