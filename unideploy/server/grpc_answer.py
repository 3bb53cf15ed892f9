"""A ``ModelInferResponse`` on the wire with each output tensor's bytes copied once.

Built as protobuf's Python messages build it, an output is copied into bytes (``tobytes``), into
the message (setting a bytes field copies it), and into the serialized message, before grpc copies
that into its own buffer: a 600 KB answer cost 0.2 ms more server CPU over gRPC than over REST
(docs/server.md). Here the message is serialized without its ``raw_output_contents`` and each
output is appended as that field's entry, its bytes joined straight from the array's memory. The
protocol allows a message's fields in any order, and a repeated field's entries wherever they come,
so every protobuf parser reads the same message.
"""

from __future__ import annotations

from typing import Any

# the key of a length-delimited entry: (field number << 3) | wire type 2
_RAW_OUTPUT_KEY = bytes([6 << 3 | 2])  # ModelInferResponse.raw_output_contents
_INFER_RESPONSE_KEY = bytes([2 << 3 | 2])  # ModelStreamInferResponse.infer_response


def _varint(value: int) -> bytes:
    """``value`` as protobuf's base-128 varint (a length's encoding)."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def infer_response(message: Any, outputs: list[bytes | memoryview], streamed: bool = False) -> bytes:
    """The wire bytes of ``message`` (a ``ModelInferResponse`` without raw contents) with
    ``outputs`` as its ``raw_output_contents``, in order (a ``memoryview`` one-dimensional bytes, as
    ``codec.to_buffer`` gives them); ``streamed``: as the ``infer_response`` of a
    ``ModelStreamInferResponse``."""
    pieces: list[bytes | memoryview] = [message.SerializeToString()]
    for blob in outputs:
        pieces += (_RAW_OUTPUT_KEY, _varint(len(blob)), blob)
    if streamed:
        pieces[:0] = (_INFER_RESPONSE_KEY, _varint(sum(len(piece) for piece in pieces)))
    return b"".join(pieces)


def serializer(message_type: Any) -> Any:
    """A response serializer passing on what is already wire bytes (an answer built here) and
    serializing any other message of ``message_type`` (an error on a stream, a metadata answer)."""

    def serialize(message: Any) -> bytes:
        return message if isinstance(message, bytes) else message_type.SerializeToString(message)

    return serialize
