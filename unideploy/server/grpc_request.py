"""A ``ModelInferRequest``'s raw tensors read where they lie in the message grpc received.

protobuf's Python messages copy a bytes field into the parsed message and again into a new bytes
object each time it is read, so a 600 KB ``raw_input_contents`` was copied twice after grpc's own
copy of the message (docs/server.md, Benchmark). Here the message's top-level fields are walked
once (a handful: names, parameters, one entry per input, output and raw tensor): the raw tensors
are kept as views of the received bytes, and everything else is parsed by protobuf as before, from
those fields alone. A message this walk cannot follow is parsed whole by protobuf, which refuses it
with its own ``DecodeError`` (or reads it, tensors and all, as before).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_RAW_INPUT_FIELD = 7  # ModelInferRequest.raw_input_contents
_LENGTH_DELIMITED, _VARINT, _FIXED64, _FIXED32 = 2, 0, 1, 5  # protobuf's wire types


@dataclass(frozen=True)
class InferCall:
    """A received ``ModelInferRequest``: ``message`` holds every field but the raw tensors, which
    are ``raw``, in order, views of the bytes grpc received."""

    message: Any
    raw: list[memoryview]


class _Unfollowed(Exception):
    """The bytes are no message this walk can follow (protobuf says why)."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """The base-128 varint at ``at`` and where it ends."""
    value = shift = 0
    for index in range(at, min(at + 10, len(data))):
        value |= (data[index] & 0x7F) << shift
        if data[index] < 0x80:
            return value, index + 1
        shift += 7
    raise _Unfollowed


def _split(data: bytes) -> tuple[bytes, list[memoryview]]:
    """``data``'s fields but the raw tensors, as bytes, and the raw tensors as views of ``data``."""
    view, kept, raw = memoryview(data), [], []
    at = start = 0
    while at < len(data):
        field_start = at
        key, at = _varint(data, at)
        wire = key & 7
        if wire == _LENGTH_DELIMITED:
            length, at = _varint(data, at)
            if at + length > len(data):
                raise _Unfollowed
            if key >> 3 == _RAW_INPUT_FIELD:
                kept.append(view[start:field_start])
                raw.append(view[at : at + length])
                start = at + length
            at += length
        elif wire == _VARINT:
            at = _varint(data, at)[1]
        elif wire in (_FIXED64, _FIXED32):
            at += 8 if wire == _FIXED64 else 4
        else:  # groups: no field of this message is one
            raise _Unfollowed
    if at > len(data):
        raise _Unfollowed
    if not raw:
        return data, raw
    kept.append(view[start:])
    return b"".join(kept), raw


def infer_call_parser(message_type: Any) -> Callable[[bytes], InferCall]:
    """A request deserializer giving ``InferCall``s of ``message_type`` (a ``ModelInferRequest``)."""

    def parse(data: bytes) -> InferCall:
        try:
            rest, raw = _split(data)
        except _Unfollowed:
            message = message_type.FromString(data)
            return InferCall(message, [memoryview(blob) for blob in message.raw_input_contents])
        return InferCall(message_type.FromString(rest), raw)

    return parse
