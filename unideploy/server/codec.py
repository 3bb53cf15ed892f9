"""Tensors on the wire (Open Inference Protocol v2): datatypes, JSON data, binary data.

Both frontends decode into numpy here and encode from numpy here, so a tensor means the same over
REST JSON, REST binary (``Inference-Header-Content-Length``) and gRPC (``contents`` or
``raw_input_contents``). Every malformed tensor raises :class:`BadRequest` naming it.

Text travels as ``BYTES``: JSON strings, ``bytes_contents`` over gRPC, and in raw form (binary
extension, raw contents, shared memory) as Triton serializes it: each element a 4-byte
little-endian length, then its bytes. Here it is a numpy unicode array, as in every stage.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from unideploy.server.errors import BadRequest
from unideploy.server.unread import Unaligned

V2_TO_NUMPY = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
}
BYTES = "BYTES"
DATATYPES = (*V2_TO_NUMPY, BYTES)
NUMPY_TO_V2 = {**{v: k for k, v in V2_TO_NUMPY.items()}, "string": BYTES}
# Per request, lookups by dtype object: numpy computes ``dtype.name`` in Python on every read (6 %
# of the event loop's time at concurrency 1), and builds a dtype from its name or byte order anew.
_V2_OF_DTYPE = {np.dtype(v): k for k, v in V2_TO_NUMPY.items()}
_WIRE_DTYPE = {k: np.dtype(v).newbyteorder("<") for k, v in V2_TO_NUMPY.items()}  # little-endian on the wire
_BIG_ENDIAN_ORDERS = (">",) if sys.byteorder == "little" else (">", "=")

# gRPC InferTensorContents field per datatype (FP16 travels only as raw bytes).
GRPC_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    BYTES: "bytes_contents",
}
LENGTH_PREFIX = 4


MAX_DIM = 2**31 - 1


def numpy_dtype(datatype: Any, tensor: str) -> np.dtype:
    if not isinstance(datatype, str) or datatype not in V2_TO_NUMPY:
        raise BadRequest(
            f"input '{tensor}' has unsupported datatype {datatype!r}", f"use one of: {', '.join(DATATYPES)}"
        )
    return _WIRE_DTYPE[datatype]


def _count(found: int, shape: Sequence[int], tensor: str, what: str = "values") -> None:
    expected = math.prod(shape)  # Python ints: no int64 wrap-around to a count that happens to match
    if found != expected:
        raise BadRequest(f"input '{tensor}' has {found} {what}, but shape {list(shape)} needs {expected}")


def _texts(items: Sequence[str | bytes], shape: Sequence[int], tensor: str) -> np.ndarray:
    """BYTES elements (JSON's strings, or UTF-8 bytes) as a unicode array of ``shape``."""
    _count(len(items), shape, tensor, "BYTES elements")
    try:
        texts = [item if isinstance(item, str) else item.decode("utf-8") for item in items]
    except UnicodeDecodeError as exc:
        raise BadRequest(
            f"input '{tensor}' holds BYTES that are not UTF-8 text ({exc})", "this model takes text: send UTF-8"
        ) from exc
    return _shaped(np.array(texts, dtype=str), shape, tensor)


def _texts_from_raw(raw: bytes | memoryview, shape: Sequence[int], tensor: str) -> np.ndarray:
    """Triton's raw BYTES: each element a 4-byte little-endian length, then that many bytes."""
    view, items, offset, limit = memoryview(raw), [], 0, math.prod(shape)
    while offset < len(view):
        if offset + LENGTH_PREFIX > len(view):
            raise BadRequest(f"input '{tensor}': its BYTES data ends inside an element's 4-byte length")
        size = int.from_bytes(view[offset : offset + LENGTH_PREFIX], "little")
        offset += LENGTH_PREFIX
        if offset + size > len(view):
            raise BadRequest(f"input '{tensor}': a BYTES element of {size} bytes runs past the end of the data")
        items.append(bytes(view[offset : offset + size]))
        offset += size
        if len(items) > limit:
            break  # more elements than the shape holds: said by the count check
    return _texts(items, shape, tensor)


def check_shape(shape: Any, tensor: str) -> tuple[int, ...]:
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise BadRequest(f"input '{tensor}' has an invalid shape {shape!r}", "shape is a list of non-negative integers")
    if any(d < 0 for d in shape):
        raise BadRequest(f"input '{tensor}' has a negative dimension in shape {list(shape)}")
    if any(d > MAX_DIM for d in shape):  # no real tensor has one: say so, before any arithmetic on it
        raise BadRequest(f"input '{tensor}' has a dimension over {MAX_DIM} in shape {list(shape)}")
    return tuple(shape)


def from_json_data(data: Any, datatype: Any, shape: Sequence[int], tensor: str) -> np.ndarray:
    """JSON ``data`` (flat or nested, row-major) to an array of ``shape``."""
    if datatype == BYTES:
        try:
            flat = np.asarray(data, dtype=object).reshape(-1)
        except ValueError as exc:  # ragged nesting
            raise BadRequest(f"input '{tensor}' data is not a regular array of strings: {exc}") from exc
        # a list, not None, as the default: JSON's null is a value this refuses too (it was read as
        # "nothing strange" and reached str's decode, a 500 the REST fuzzing found)
        strange = next(([v] for v in flat if not isinstance(v, str)), [])
        if strange:
            raise BadRequest(
                f"input '{tensor}' is BYTES but its data holds {type(strange[0]).__name__} values",
                "send text as JSON strings",
            )
        return _texts(flat.tolist(), shape, tensor)
    dtype = numpy_dtype(datatype, tensor)
    try:
        flat = np.asarray(data, dtype=dtype if dtype.kind != "b" else None).reshape(-1)
    except (ValueError, TypeError, OverflowError) as exc:
        raise BadRequest(f"input '{tensor}' data does not hold {datatype} values: {exc}") from exc
    if dtype.kind == "b" and flat.dtype != np.bool_:
        raise BadRequest(f"input '{tensor}' is BOOL but its data holds {flat.dtype.name} values")
    if dtype.kind in "iu" and flat.dtype.kind == "f":
        raise BadRequest(f"input '{tensor}' is {datatype} but its data holds fractional numbers")
    _count(flat.size, shape, tensor)
    return _shaped(flat.astype(dtype, copy=False), shape, tensor)


def _shaped(flat: np.ndarray, shape: Sequence[int], tensor: str) -> np.ndarray:
    """``flat`` in ``shape``. Numpy refuses a shape whose other dims multiply past its limits even
    when a 0 among them leaves no values ([0, 1143, 42280, 57619, 414051]: found by the gRPC fuzz)."""
    try:
        return flat.reshape(shape)
    except ValueError as exc:
        raise BadRequest(f"input '{tensor}' cannot have shape {list(shape)}: {exc}") from exc


def sized_dtype(nbytes: int, datatype: Any, shape: Sequence[int], tensor: str) -> np.dtype:
    """``datatype``'s numpy dtype, where ``nbytes`` of raw data are what ``shape`` of it needs."""
    dtype = numpy_dtype(datatype, tensor)
    expected = math.prod(shape) * dtype.itemsize
    if nbytes != expected:
        raise BadRequest(f"input '{tensor}' has {nbytes} bytes of data, but {datatype} {list(shape)} needs {expected}")
    return dtype


def from_bytes(raw: bytes | memoryview, datatype: Any, shape: Sequence[int], tensor: str) -> np.ndarray | Unaligned:
    """Raw little-endian row-major bytes (binary extension, raw_input_contents) to an array, without
    a copy (a memoryview of the request body stays one); bytes not aligned to the type's size are
    ``Unaligned``, copied once where the model's call wants them (``server.unread``; a scalar at
    once); BYTES as Triton serializes it."""
    if datatype == BYTES:
        return _texts_from_raw(raw, shape, tensor)
    array = _shaped(np.frombuffer(raw, dtype=sized_dtype(len(raw), datatype, shape, tensor)), shape, tensor)
    if array.flags.aligned:
        return array
    return Unaligned(array) if array.ndim and array.size else array.copy()


def from_contents(contents: Any, datatype: str, shape: Sequence[int], tensor: str) -> np.ndarray:
    """gRPC ``InferTensorContents`` to an array."""
    field = GRPC_CONTENTS.get(datatype)
    if field is None:
        numpy_dtype(datatype, tensor)  # raises for unknown types
        raise BadRequest(f"input '{tensor}' is {datatype}, which travels only in raw_input_contents")
    if datatype == BYTES:
        return _texts(list(contents.bytes_contents), shape, tensor)
    return from_json_data(list(getattr(contents, field)), datatype, shape, tensor)


def to_bytes(array: np.ndarray) -> bytes:
    if array.dtype.kind == "U":
        encoded = [text.encode("utf-8") for text in array.ravel().tolist()]
        return b"".join(len(item).to_bytes(LENGTH_PREFIX, "little") + item for item in encoded)
    if array.dtype.byteorder in _BIG_ENDIAN_ORDERS:
        array = array.astype(array.dtype.newbyteorder("<"))
    return array.tobytes()  # row-major whatever the array's strides


def to_buffer(array: np.ndarray) -> bytes | memoryview:
    """``to_bytes``, but an array already laid out as the protocol's bytes (numeric, little-endian,
    row-major) is given as its own memory, for the caller to copy once, into the response: a
    binary answer of 1 GB held 4 GB at its peak with a copy here and another joining the body."""
    if (
        array.dtype.kind in "biuf"
        and array.flags.c_contiguous
        and array.size
        and array.dtype.byteorder not in _BIG_ENDIAN_ORDERS
    ):
        return array.data.cast("B")
    return to_bytes(array)


def v2_datatype(array: np.ndarray) -> str:
    found = _V2_OF_DTYPE.get(array.dtype)
    if found is None and array.dtype.kind == "U":
        return BYTES
    return found if found is not None else NUMPY_TO_V2[array.dtype.name]
